// The CPU map kernel of every functor in ops/functors.h: one instantiation of the
// strided loop of ops/cpu/map.h per functor and scalar type, registered into the
// functor's table (ops/kernels/map.h). The CPU has no 16-bit float arithmetic: 16-bit
// float operands and outputs (autocast's bfloat16 activations) are widened to float32
// copies, computed in float32 and rounded once into the output. float32 exp, log, tanh,
// sigmoid and GELU (and GELU's gradient) are written on whole vectors below, since libm's
// functions keep a loop scalar; where is a select on its dense runs.
#include "ops/cpu/map.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <type_traits>

#include "ops/cpu/simd.h"
#include "ops/cpu/vec_exp.h"
#include "ops/cpu/widen.h"
#include "ops/kernels/map.h"

namespace mu::cpu {

// float32 GELU and its derivative, written on whole vectors (ops/cpu/simd.h), with
// Φ(x) = 1 - q for x >= 0 and q for x < 0, q = Φ(-|x|) = erfc(|x|/√2) / 2. One formula
// for every x (no branch between a small-x and a large-x form), and no cancellation in
// the lower tail, where x/2 (1 + erf(x/√2)), torch's formula, loses every digit below
// about -5.5. erfc(z) = t exp(-z² + P(t)) with t = 1 / (1 + z/2) and P of degree 9,
// fitted here: least squares on 4000 Chebyshev nodes of t for z in [0, 12] against
// 40-digit erfc, reweighted toward the largest error, which is 5.4e-8 in P, that is
// relative in erfc. |x| is capped at 16, where q is below 1e-57 (zero in float32).
// Worst error over [-10, 10] 1.7 ulp-units of tests/test_elementwise.cpp (the former
// erf-based loop: 0.9).
//
// The loop is bound by its instruction count (two 512-bit operations a cycle on Zen 5),
// so each step is written in as few as it takes: |x| by its bits, the caps by the
// hardware's min and max, q/2's factor 1/2 inside t, and the rounding of the exponent
// -x²/2 + P folded into exp's own range reduction instead of a two-sum. Forward 0.70 ->
// 0.48 ns, derivative 0.80 -> 0.64 ns per element on one Zen 5 core in cache, same
// accuracy (scratch comparison of both forms over the test's grid).
namespace {

using VF = Vec<float>::type;
using VI = Vec<int32_t>::type;
constexpr int kWF = Vec<float>::width;

// P(2u) for u = t/2, by Estrin's scheme (the chains, not the operations, bound it: 5%
// faster than Horner's), each coefficient c_k scaled by 2^k, exactly: every partial
// result is the one of P(t) scaled by a power of two, so the rounding is the same.
[[gnu::always_inline]] inline VF erfc_exponent(VF u) {
  const VF u2 = u * u, u4 = u2 * u2, u8 = u4 * u4;
  const VF p01 = u * (9.992070121e-01f * 2) + -1.265476167e+00f;
  const VF p23 = u * (5.813736116e-02f * 8) + 3.817069003e-01f * 4;
  const VF p45 = u * (4.903826187e-02f * 32) + -6.770736322e-02f * 16;
  const VF p67 = u * (1.273219788e+00f * 128) + -8.519480150e-01f * 64;
  const VF p89 = u * (1.539476802e-01f * 512) + -7.301254041e-01f * 256;
  return (p89 * u8 + ((p67 * u2 + p45) * u4 + (p23 * u2 + p01)));
}

// The tails of GELU come out of products that end below float32's normals (x Φ(x) near
// x = -13.2, x φ(x) near -13.6), so the exponentials are built 2^64 times too large (their
// 2^n stays normal for every |x| <= 16) and each product is scaled back last, rounded once:
// results keep their digits down to the normals and are correctly rounded subnormals
// below. Beyond the cap of 16, where the capped formula would be wrong and the results
// are x Φ(x) = 0 on the left (x on the right, gradient 1), the exponentials are set to 0.
constexpr float kUp = 64, kDown = 0x1p-64f;  // the exponent added, and the scale back

// |x| on every lane: the sign bit cleared.
[[gnu::always_inline]] inline VF abs_lanes(VF x) { return VF(VI(x) & 0x7fffffff); }

// What GELU and its derivative share, on every lane: u = t/2 = 1 / (2 + |x|/√2) and one
// exponential, 2^64 times its value: exp(-x²/2 + P(t)) for GELU (Φ(-|x|) = u e 2^-64),
// exp(-x²/2) for the derivative (WithP false; see gelu_grad_lanes). |x| is capped at 16.
struct GeluTail {
  VF u;
  VF e;  // 0 where |x| >= 16
};

// With ax = min(|x|, 16) (NaN passes), the exponential is exp(a + b), a = -ax²/2 and b =
// P(t) (for GELU) - (the rounding error of ax²)/2 ~ O(1). exp(a + b) = 2^n exp(r) with n =
// round((a + b) / ln 2) and r = (a - n ln2_hi) + b - n ln2_lo: a - n ln2_hi is exact (both
// are multiples of 2^-17 and the difference is below 2), so a + b is never rounded as a
// whole (rounding it cost up to 4e-6 relative at x = -13).
template <bool WithP>
[[gnu::always_inline]] inline GeluTail gelu_tail(VF x) {
  using namespace exp_constants;
  GeluTail g;
  const VF ax = min_of(16.0f, abs_lanes(x));
  g.u = 1.0f / (ax * float(fn::kSqrt1_2) + 2.0f);
  const VF sq = ax * ax, sq_lo = ax * ax - sq;  // exact where the multiply-add fuses (GCC's default)
  VF b = sq_lo * -0.5f;
  if constexpr (WithP) b += erfc_exponent(g.u);
  const VF a = sq * -0.5f;
  const VF t = (a + b) * kLog2e + kRound;  // n in the low mantissa bits (see kRound)
  const VF n = t - kRound;
  const VF r = ((a - n * kLn2Hi) + b) - n * kLn2Lo;
  const VF e = exp_reduced(r) * exp2_of_rounded(t, int(kUp));
  g.e = ax < 16.0f ? e : VF{};
  return g;
}

// x Φ(x) on every lane: x (1 - q) on the right, x q on the left, q = Φ(-|x|) = u e 2^-64
// with x u e formed before the scale (x u is about -1.2 where the product underflows).
[[gnu::always_inline]] inline VF gelu_lanes(VF x) {
  const GeluTail g = gelu_tail<true>(x);
  const VF q = (g.u * g.e) * kDown;
  return x >= 0.0f ? x * (1.0f - q) : ((x * g.u) * g.e) * kDown;
}

// The derivative's Φ(-|x|) as u exp(-x²/2) Q(u), u = t/2 as in gelu_tail, so that one
// exponential, 2^64 exp(-x²/2), serves both Φ and φ (gelu_tail's exp(-x²/2 + P(t)) and a
// second one for φ took a quarter more time: 1.06 -> 0.82 ns per element on one Zen 4
// core, in cache). Q(u) = Φ(-|x|) / (u exp(-x²/2)) = exp(P(2u)), as a polynomial of degree
// 10 in s = u - 0.28755528 (the middle of u's range [0.0751, 0.5] for |x| <= 16), fitted
// here the way P was (least squares on 3000 Chebyshev nodes against 40-digit values,
// reweighted toward the largest error, each float32 coefficient rounded in turn and the
// rest refitted): 5.0e-8 relative, as P's 5.4e-8.
[[gnu::always_inline]] inline VF phi_ratio(VF u) {
  const VF s = u - 0.28755528f;
  const VF s2 = s * s, s4 = s2 * s2, s8 = s4 * s4;
  const VF p01 = s * 1.5465726f + 0.56561375f;
  const VF p23 = s * 0.7128989f + 2.3423293f;
  const VF p45 = s * -1.7612443f + -3.2370932f;
  const VF p67 = s * 1.0199456f + 7.53923f;
  const VF p89 = s * 5.9270763f + -25.22428f;
  return (s2 * 86.665016f + p89) * s8 + ((p67 * s2 + p45) * s4 + (p23 * s2 + p01));
}

// g (Φ(x) + x φ(x)), φ(x) = exp(-x²/2) / √(2π), on every lane, with gauss = 2^64
// exp(-x²/2) (gelu_tail without P: 0 beyond the cap, the rounding error of x² folded into
// exp's own range reduction): Φ(-|x|) = u gauss Q(u) 2^-64 and x φ(x) = x gauss 2^-64 /
// √(2π), each scaled back last, so that both keep their digits down to the normals.
[[gnu::always_inline]] inline VF gelu_grad_lanes(VF g, VF x) {
  const GeluTail tl = gelu_tail<false>(x);
  const VF q = ((tl.u * tl.e) * phi_ratio(tl.u)) * kDown;
  const VF x_phi = ((x * float(fn::kInvSqrt2Pi)) * tl.e) * kDown;
  return g * ((x >= 0.0f ? 1.0f - q : q) + x_phi);
}

// out[0, n) = f(in[0, n)) for n a multiple of the vector width. Never inlined, so that a
// run's whole vectors, its last partial vector (zero-padded) and a strided element (alone
// in a padded vector) all execute these very instructions: inlined at each of those
// places, GCC contracted different multiply-adds, and GELU's derivative differed by an
// ulp at the points where 4 threads cut a run of 77100 elements. Flattened: the lane
// function is inlined into the loop whatever its size (in the AVX2 build GCC had kept
// GELU's, its gradient's and tanh's as calls, each reloading two dozen constants: GELU
// 1.86 ns an element on one Zen 3 core, 1.46 inlined; torch's 0.86 there).
template <class F>
[[gnu::noinline, gnu::flatten]] void whole_vectors(const F& f, float* o, int64_t n, const float* a) {
  for (int64_t i = 0; i < n; i += kWF) store(o + i, f(load(a + i)));
}
template <class F>
[[gnu::noinline, gnu::flatten]] void whole_vectors(const F& f, float* o, int64_t n, const float* a, const float* b) {
  for (int64_t i = 0; i < n; i += kWF) store(o + i, f(load(a + i), load(b + i)));
}

// out[0, n) = f(in[0, n)) over a dense run: whole vectors, then the last partial one
// through a zero-padded copy, so that every element's result is the same whatever its
// position (the results do not depend on how threads split the runs).
template <class F>
void run_lanes(const F& f, float* o, int64_t n, const float* a) {
  const int64_t whole = n / kWF * kWF;
  whole_vectors(f, o, whole, a);
  if (whole < n) {
    float pa[kWF] = {}, res[kWF];
    std::copy(a + whole, a + n, pa);
    whole_vectors(f, res, kWF, pa);
    std::copy(res, res + (n - whole), o + whole);
  }
}
// The same with two inputs.
template <class F>
void run_lanes(const F& f, float* o, int64_t n, const float* a, const float* b) {
  const int64_t whole = n / kWF * kWF;
  whole_vectors(f, o, whole, a, b);
  if (whole < n) {
    float pa[kWF] = {}, pb[kWF] = {}, res[kWF];
    std::copy(a + whole, a + n, pa);
    std::copy(b + whole, b + n, pb);
    whole_vectors(f, res, kWF, pa, pb);
    std::copy(res, res + (n - whole), o + whole);
  }
}

// exp over float32's whole range on every lane: exp_lanes where it is valid, and beyond
// it exp(x / 2) squared: above 88.37 (so that large x overflow to +inf) and below -87,
// where results approach the subnormals that exp_lanes flushes to zero (from -87.68;
// float32's smallest normal is exp(-87.34)). x / 2 is exact; squaring doubles exp_lanes'
// error of about 1 ulp.
[[gnu::always_inline]] inline VF exp_full_lanes(VF x) {
  const auto halve = x > exp_constants::kHi || x < -87.0f;
  const VF e = exp_lanes(halve ? x * 0.5f : x);
  return halve ? e * e : e;
}

// The lane functions as types, so that each whole_vectors instantiation inlines its own.
struct GeluLanes {
  VF operator()(VF x) const { return gelu_lanes(x); }
};
struct GeluGradLanes {
  VF operator()(VF g, VF x) const { return gelu_grad_lanes(g, x); }
};
// float32 exp: libm's expf kept the loop scalar (3.2M floats: 7.4 ms on one Zen 5 core).
struct ExpLanes {
  VF operator()(VF x) const { return exp_full_lanes(x); }
};

// tanh on every lane, computed for |x| and given x's sign (tanh(-0) is -0). |x| < 0.55
// (tanh < 0.5): |x| + |x|³ Q(x²), Q a polynomial of degree 5 for (tanh x - x) / x³,
// fitted here as gelu's P was (least squares on 4000 Chebyshev nodes of x² against
// long-double tanh, reweighted toward the largest error, each float32 coefficient rounded
// in turn and the rest refitted): 0.75 ulp over that range. Beyond: 1 - 2e / (1 + e) with
// e = exp(-2|x|) <= 1/3, no cancellation; e underflows to 0 and the result to 1 for large
// |x|; NaN stays NaN. At most 1.43 ulp from long-double tanh over every 97th float32 bit
// pattern ((1 - e) / (1 + e) there: 1.50; libm's tanhf 2.13, and it kept the loop scalar,
// 17 ns an element on one Zen 5 core).
[[gnu::always_inline]] inline VF tanh_lanes(VF x) {
  const VF ax = abs_lanes(x), s = x * x;
  VF q = s * 0.002923103f + -0.008854963f;
  q = q * s + 0.021917323f;
  q = q * s + -0.05397769f;
  q = q * s + 0.13333394f;
  q = q * s + -0.33333334f;
  const VF near = (ax * s) * q + ax;
  const VF e = exp_full_lanes(-2.0f * ax);
  const VF far = 1.0f - (e + e) / (1.0f + e);
  return VF(VI(ax < 0.55f ? near : far) | (VI(x) & ~0x7fffffff));  // x's sign bit
}
struct TanhLanes {
  VF operator()(VF x) const { return tanh_lanes(x); }
};

// log on every lane. x = m 2^e with m in [√½, √2) (read off the bits: x's exponent less
// that of √½'s bits, so that m's mantissa wraps past √2 into the next exponent), f = m - 1,
// log x = e ln 2 + f - f²/2 + f³ R(f), R a polynomial of degree 8 for (log(1 + f) - f +
// f²/2) / f³ on [√½ - 1, √2 - 1], fitted as tanh's Q was; e ln 2 in two parts (its high
// part exact: kLn2Hi, vec_exp.h) added last. Subnormal x are scaled by 2^23 first. 0 gives
// -inf, +inf +inf, a negative x or NaN NaN. (libm's logf kept the loop scalar.)
[[gnu::always_inline]] inline VF log_lanes(VF x) {
  using namespace exp_constants;
  const auto sub = x < 0x1p-126f;  // subnormal (and 0 or negative, set aside below)
  // The bits as unsigned, whose arithmetic wraps (a negative x's would overflow as int);
  // e from an arithmetic shift of the difference read as signed.
  using VU = Vec<uint32_t>::type;
  const VU bits = VU(sub ? x * 0x1p23f : x);
  const VI e = VI(bits - 0x3f3504f3u) >> 23;  // 0x3f3504f3: √½
  const VF f = VF(bits - (VU(e) << 23)) - 1.0f;
  VF r = f * 0.07342003f + -0.116628826f;
  r = r * f + 0.11632271f;
  r = r * f + -0.12396117f;
  r = r * f + 0.14251377f;
  r = r * f + -0.16669185f;
  r = r * f + 0.2000068f;
  r = r * f + -0.2499998f;
  r = r * f + 0.3333333f;
  const VF ef = __builtin_convertvector(e, VF) - (sub ? VF{} + 23.0f : VF{});
  const VF tail = (f * f) * (f * r - 0.5f) + f;
  const VF y = (ef * kLn2Lo + tail) + ef * kLn2Hi;
  const VF inf = VF{} + __builtin_inff();
  return x > 0.0f ? (x == inf ? inf : y) : (x == 0.0f ? -inf : VF{} + __builtin_nanf(""));
}
struct LogLanes {
  VF operator()(VF x) const { return log_lanes(x); }
};

// sigmoid on every lane: e = exp(-|x|), 1 / (1 + e) for x >= 0 and e / (1 + e) below (one
// division either way), so that neither side overflows and the left tail keeps its
// digits down to the subnormals (1 / (1 + exp(-x)) loses them where exp(-x) overflows).
// NaN stays NaN. At most 2.40 ulp from long double where the result is a normal float,
// over every 97th float32 bit pattern (1 / (1 + expf(-x)): 2.30), and 0.96 ulp where it
// is subnormal (where that form flushed to zero, from x = -88.7).
struct SigmoidLanes {
  VF operator()(VF x) const {
    const VF e = exp_full_lanes(-abs_lanes(x));
    return (x >= 0.0f ? VF{} + 1.0f : e) / (1.0f + e);
  }
};

}  // namespace

// A float32 functor of the map loop (ops/cpu/map.h) from a lane function of one input:
// dense runs through run_lanes, and one element (of a strided run) through the same
// vector code as a padded run of one, so that strided and dense runs give the same bits.
template <class Lanes>
struct UnaryLanesFloat {
  float operator()(float v) const {
    float r;
    run_lanes(Lanes{}, &r, 1, &v);
    return r;
  }
  void run(float* o, const float* x, int64_t n) const { run_lanes(Lanes{}, o, n, x); }
};
// The same for GELU's derivative, of two inputs (g, x).
struct GeluGradFloat {
  float operator()(float g, float x) const {
    float r;
    run_lanes(GeluGradLanes{}, &r, 1, &g, &x);
    return r;
  }
  void run(float* o, const float* g, const float* x, int64_t n) const { run_lanes(GeluGradLanes{}, o, n, g, x); }
};

// The same lane functions on bfloat16 operands and result (autocast's MLP activations):
// a dense run goes through float32 buffers of kChunk values on the stack, widened, run by
// run_lanes (the very instructions of the float32 path) and rounded back (simd.h:
// widen_run, narrow_run), so that each result is the float32 path's rounded once, bit for
// bit, without float32 copies of the whole operands and result (GELU forward and backward
// of (8, 128, 1024): 1.33 -> 1.22 ms, float32's 1.15; the lane arithmetic, not the
// copies, is most of it).
constexpr int64_t kChunk = 512;
template <class Lanes>
struct UnaryLanesBFloat16 {
  bfloat16_t operator()(bfloat16_t v) const {
    float x = float(v), r;
    run_lanes(Lanes{}, &r, 1, &x);
    return bfloat16_t(r);
  }
  void run(bfloat16_t* o, const bfloat16_t* x, int64_t n) const {
    alignas(64) float in[kChunk], res[kChunk];
    for (int64_t i0 = 0; i0 < n; i0 += kChunk) {
      const int64_t m = std::min(kChunk, n - i0);
      widen_run(x + i0, m, in);
      run_lanes(Lanes{}, res, m, in);
      narrow_run(res, m, o + i0);
    }
  }
};
struct GeluGradBFloat16 {
  bfloat16_t operator()(bfloat16_t g, bfloat16_t v) const {
    float gf = float(g), x = float(v), r;
    run_lanes(GeluGradLanes{}, &r, 1, &gf, &x);
    return bfloat16_t(r);
  }
  void run(bfloat16_t* o, const bfloat16_t* g, const bfloat16_t* x, int64_t n) const {
    alignas(64) float gin[kChunk], in[kChunk], res[kChunk];
    for (int64_t i0 = 0; i0 < n; i0 += kChunk) {
      const int64_t m = std::min(kChunk, n - i0);
      widen_run(g + i0, m, gin);
      widen_run(x + i0, m, in);
      run_lanes(GeluGradLanes{}, res, m, gin, in);
      narrow_run(res, m, o + i0);
    }
  }
};

// The tanh form likewise, through 0.5 (1 + tanh(u)) = sigmoid(2u) with the vectorisable
// exp (libm's tanhf keeps the loop scalar): x / (1 + exp(-2u)), u = k (x + c x³), which
// has no cancellation at either end; its derivative s + 2 x s (1 - s) k (1 + 3 c x²).
struct GeluTanhFloat {
  [[gnu::always_inline]] float operator()(float x) const {
    const float u = float(fn::kGeluK) * (x + float(fn::kGeluC) * x * x * x);
    return x / (1.0f + exp_vec(-2.0f * u));
  }
};
struct GeluTanhGradFloat {
  [[gnu::always_inline]] float operator()(float g, float x) const {
    const float u = float(fn::kGeluK) * (x + float(fn::kGeluC) * x * x * x);
    const float s = 1.0f / (1.0f + exp_vec(-2.0f * u));
    return g * (s + 2.0f * x * s * (1.0f - s) * float(fn::kGeluK) * (1.0f + float(3 * fn::kGeluC) * x * x));
  }
};


// The four arithmetic operators on bfloat16 operands and result, read and written as they
// are. Each float32 result is one correctly rounded operation, the same bits however it
// is computed, so rounding it here gives what widening both operands, computing and
// rounding the float32 result gives, without those three float32 copies (autocast's bias
// and residual adds: (127, 3072) plus a row 57 -> 28 us on two threads; GPT-2 124M's
// whole-context sampling loop under autocast 3.88 -> 3.67 s).
template <class F>
constexpr bool kBFloat16Direct =
    std::is_same_v<F, fn::Add> || std::is_same_v<F, fn::Sub> || std::is_same_v<F, fn::Mul> || std::is_same_v<F, fn::Div>;
template <class F>
struct BFloat16Direct {
  F f;
  bfloat16_t operator()(bfloat16_t u, bfloat16_t v) const { return bfloat16_t(f(float(u), float(v))); }
  // A dense run: whole vectors widened in registers (simd.h, load_as), the operator on
  // float32 lanes, rounded in registers (store_as); the last partial vector element by
  // element, the same operation and rounding.
  void run(bfloat16_t* o, const bfloat16_t* a, const bfloat16_t* b, int64_t n) const {
    int64_t i = 0;
    for (; i + kWF <= n; i += kWF) {
      const VF u = load_as<float>(a + i), v = load_as<float>(b + i);
      if constexpr (std::is_same_v<F, fn::Add>) store_as(o + i, u + v);
      else if constexpr (std::is_same_v<F, fn::Sub>) store_as(o + i, u - v);
      else if constexpr (std::is_same_v<F, fn::Mul>) store_as(o + i, u * v);
      else store_as(o + i, u / v);
    }
    for (; i < n; ++i) o[i] = (*this)(a[i], b[i]);
  }
};

// where's runs, dense or with broadcast operands (a scalar: masked_fill's value, the zero
// of where's gradient), as a select the compiler vectorises: both values loaded whatever
// the condition, which is read as its byte. (As `c ? a : b` on bool elements GCC branches
// on every one, and a random mask mispredicts half of them: 2.2 ns an element on Zen 5.)
// C, A, B: whether the condition and each value step along the run (else one element).
template <bool C, bool A, bool B, class T>
void select_run(T* o, const bool* c, const T* a, const T* b, int64_t n) {
  const auto* byte = reinterpret_cast<const uint8_t*>(c);  // 0 or 1
  for (int64_t i = 0; i < n; ++i) {
    const T u = a[A ? i : 0], v = b[B ? i : 0];
    o[i] = byte[C ? i : 0] ? u : v;
  }
}
struct WhereRuns {
  template <class T>
  T operator()(bool c, T a, T b) const {
    return fn::Where{}(c, a, b);
  }
  template <class T>
  void run(T* o, const bool* c, const T* a, const T* b, int64_t n) const {
    select_run<true, true, true>(o, c, a, b, n);
  }
  // A run of dense output whose operands' strides st[1..3] are each 0 or 1.
  template <class T, class Strides>
  void run_broadcast(T* o, const bool* c, const T* a, const T* b, const Strides& st, int64_t n) const {
    switch ((st[1] != 0) * 4 + (st[2] != 0) * 2 + (st[3] != 0)) {
      case 0: return select_run<false, false, false>(o, c, a, b, n);
      case 1: return select_run<false, false, true>(o, c, a, b, n);
      case 2: return select_run<false, true, false>(o, c, a, b, n);
      case 3: return select_run<false, true, true>(o, c, a, b, n);
      case 4: return select_run<true, false, false>(o, c, a, b, n);
      case 5: return select_run<true, false, true>(o, c, a, b, n);
      case 6: return select_run<true, true, false>(o, c, a, b, n);
      default: return select_run<true, true, true>(o, c, a, b, n);
    }
  }
};

// The functors with float32 lane functions of one input (UnaryLanesFloat, and
// UnaryLanesBFloat16 on bfloat16 operands).
template <class F>
struct UnaryLanesOf {};
template <> struct UnaryLanesOf<fn::Exp> { using type = ExpLanes; };
template <> struct UnaryLanesOf<fn::Log> { using type = LogLanes; };
template <> struct UnaryLanesOf<fn::Tanh> { using type = TanhLanes; };
template <> struct UnaryLanesOf<fn::Sigmoid> { using type = SigmoidLanes; };
template <> struct UnaryLanesOf<fn::Gelu> { using type = GeluLanes; };
template <class F>
constexpr bool kUnaryLanes = requires { typename UnaryLanesOf<F>::type; };

template <class F>
static void map_kernel(const Tensor& out, const std::array<Tensor, 3>& in_given, const F& f) {
  if constexpr (kBFloat16Direct<F>) {
    if (out.dtype() == kBFloat16 && in_given[0].dtype() == kBFloat16 && in_given[1].dtype() == kBFloat16)
      return map_n<bfloat16_t, bfloat16_t, bfloat16_t>(out, {in_given[0], in_given[1]}, BFloat16Direct<F>{f});
  }
  if constexpr (kUnaryLanes<F>) {
    using Lanes = typename UnaryLanesOf<F>::type;
    if (out.dtype() == kBFloat16 && in_given[0].dtype() == kBFloat16)
      return map_n<bfloat16_t, bfloat16_t>(out, {in_given[0]}, UnaryLanesBFloat16<Lanes>{});
  } else if constexpr (std::is_same_v<F, fn::GeluGrad>) {
    if (out.dtype() == kBFloat16 && in_given[0].dtype() == kBFloat16 && in_given[1].dtype() == kBFloat16)
      return map_n<bfloat16_t, bfloat16_t, bfloat16_t>(out, {in_given[0], in_given[1]}, GeluGradBFloat16{});
  }
  std::array<Tensor, 3> in = in_given;
  for (int k = 0; k < F::arity; ++k)
    if (!is_compute_dtype(in[size_t(k)].dtype())) in[size_t(k)] = widened(in[size_t(k)]);
  if (!is_compute_dtype(out.dtype())) {
    Tensor wide = wide_like(out);
    map_kernel(wide, in, f);
    narrow_into(out, wide);
    return;
  }
  // The scalar type comes from the first value operand (after where's condition).
  const Tensor& typed = in[F::select ? 1 : 0];
  if constexpr (kUnaryLanes<F>) {
    if (typed.dtype() == kFloat32)
      return map_n<float, float>(out, {in[0]}, UnaryLanesFloat<typename UnaryLanesOf<F>::type>{});
  } else if constexpr (std::is_same_v<F, fn::GeluGrad>) {
    if (typed.dtype() == kFloat32) return map_n<float, float, float>(out, {in[0], in[1]}, GeluGradFloat{});
  } else if constexpr (std::is_same_v<F, fn::GeluTanh>) {
    if (typed.dtype() == kFloat32) return map_n<float, float>(out, {in[0]}, GeluTanhFloat{});
  } else if constexpr (std::is_same_v<F, fn::GeluTanhGrad>) {
    if (typed.dtype() == kFloat32) return map_n<float, float, float>(out, {in[0], in[1]}, GeluTanhGradFloat{});
  }
  kernels::dispatch_functor<F>(typed.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using TO = std::conditional_t<F::result == fn::Result::Bool, bool, T>;
    if constexpr (F::arity == 1) {
      map_n<TO, T>(out, {in[0]}, f);
    } else if constexpr (F::arity == 2) {
      map_n<TO, T, T>(out, {in[0], in[1]}, f);
    } else if constexpr (F::select) {
      static_assert(std::is_same_v<F, fn::Where>, "where is the one select functor");
      map_n<TO, bool, T, T>(out, {in[0], in[1], in[2]}, WhereRuns{});
    } else {
      map_n<TO, T, T, T>(out, {in[0], in[1], in[2]}, f);
    }
  });
}

template <class... F>
static bool register_map_kernels(fn::FunctorList<F...>) {
  (kernels::map<F>().set(DeviceType::CPU, &map_kernel<F>), ...);
  return true;
}

[[maybe_unused]] static const bool registered = register_map_kernels(fn::AllFunctors{});

}  // namespace mu::cpu
