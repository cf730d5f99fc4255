// The CPU map kernel of every functor in ops/functors.h: one instantiation of the
// strided loop of ops/cpu/map.h per functor and scalar type, registered into the
// functor's table (ops/kernels/map.h). The CPU has no 16-bit float arithmetic: 16-bit
// float operands and outputs (autocast's bfloat16 activations) are widened to float32
// copies, computed in float32 and rounded once into the output.
#include "ops/cpu/map.h"

#include <algorithm>
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
// erf-based loop: 0.9), 4e-7 relative over [-13, -3] (the former: 1). Speed is about the
// same: forward 5-10% faster on one Zen 3 core in cache, no change measurable in an
// MLP-Mixer step on two threads (the loop is bound by its dependency chains).
namespace {

using VF = Vec<float>::type;
constexpr int kWF = Vec<float>::width;

// P(t) by Estrin's scheme (depth 4 rather than Horner's 9: the chains, not the
// multiply-adds, bound this loop).
[[gnu::always_inline]] inline VF erfc_exponent(VF t) {
  const VF t2 = t * t, t4 = t2 * t2, t8 = t4 * t4;
  const VF p01 = t * 9.992070121e-01f + -1.265476167e+00f, p23 = t * 5.813736116e-02f + 3.817069003e-01f;
  const VF p45 = t * 4.903826187e-02f + -6.770736322e-02f, p67 = t * 1.273219788e+00f + -8.519480150e-01f;
  const VF p89 = t * 1.539476802e-01f + -7.301254041e-01f;
  return (p89 * t8 + ((p67 * t2 + p45) * t4 + (p23 * t2 + p01)));
}

// |x| capped at 16 (NaN passes: comparisons are false for it), t, x² and its rounding
// error (exact where the multiply-add fuses, which GCC does by default).
struct GeluParts {
  VF ax, t, sq, sq_lo;
};
[[gnu::always_inline]] inline GeluParts gelu_parts(VF x) {
  const VF a = x < 0.0f ? -x : x;
  GeluParts p;
  p.ax = a > 16.0f ? 16.0f : a;
  p.t = 1.0f / (p.ax * float(0.5 * fn::kSqrt1_2) + 1.0f);
  p.sq = p.ax * p.ax;
  p.sq_lo = p.ax * p.ax - p.sq;
  return p;
}

// x Φ(x) on every lane. The exponent -x²/2 + (P - sq_lo/2) is summed exactly as s + e
// (Knuth's two-sum) and exp(s + e) taken as exp(s) (1 + e): rounding s alone would cost
// up to half an ulp of s, relative in the result (4e-6 at x = -13).
[[gnu::always_inline]] inline VF gelu_lanes(VF x) {
  const GeluParts p = gelu_parts(x);
  const VF a = -0.5f * p.sq, b = erfc_exponent(p.t) - 0.5f * p.sq_lo;
  const VF s = a + b, bv = s - a, e = (a - (s - bv)) + (b - bv);
  const VF q = 0.5f * p.t * (exp_lanes(s) * (1.0f + e));
  return x * (x >= 0.0f ? 1.0f - q : q);
}

// g (Φ(x) + x φ(x)), φ(x) = exp(-x²/2) / √(2π), on every lane; exp(-z² + P) is taken as
// exp(-x²/2) exp(P - sq_lo/2) so that φ's exponential serves both.
[[gnu::always_inline]] inline VF gelu_grad_lanes(VF g, VF x) {
  const GeluParts p = gelu_parts(x);
  const VF gauss = exp_lanes(-0.5f * p.sq);
  const VF q = 0.5f * p.t * gauss * exp_lanes(erfc_exponent(p.t) - 0.5f * p.sq_lo);
  return g * ((x >= 0.0f ? 1.0f - q : q) + x * gauss * float(fn::kInvSqrt2Pi));
}

// out[0, n) = f(in[0, n)) for n a multiple of the vector width. Never inlined, so that a
// run's whole vectors, its last partial vector (zero-padded) and a strided element (alone
// in a padded vector) all execute these very instructions: inlined at each of those
// places, GCC contracted different multiply-adds, and GELU's derivative differed by an
// ulp at the points where 4 threads cut a run of 77100 elements.
template <class F>
[[gnu::noinline]] void whole_vectors(const F& f, float* o, int64_t n, const float* a) {
  for (int64_t i = 0; i < n; i += kWF) store(o + i, f(load(a + i)));
}
template <class F>
[[gnu::noinline]] void whole_vectors(const F& f, float* o, int64_t n, const float* a, const float* b) {
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
struct ExpLanes {
  VF operator()(VF x) const { return exp_full_lanes(x); }
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
using GeluFloat = UnaryLanesFloat<GeluLanes>;
// float32 exp: libm's expf keeps a loop scalar (3.2M floats: 7.4 ms on one Zen 5 core).
using ExpFloat = UnaryLanesFloat<ExpLanes>;
// The same for GELU's derivative, of two inputs (g, x).
struct GeluGradFloat {
  float operator()(float g, float x) const {
    float r;
    run_lanes(GeluGradLanes{}, &r, 1, &g, &x);
    return r;
  }
  void run(float* o, const float* g, const float* x, int64_t n) const { run_lanes(GeluGradLanes{}, o, n, g, x); }
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


template <class F>
static void map_kernel(const Tensor& out, const std::array<Tensor, 3>& in_given, const F& f) {
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
  if constexpr (std::is_same_v<F, fn::Exp>) {
    if (typed.dtype() == kFloat32) return map_n<float, float>(out, {in[0]}, ExpFloat{});
  } else if constexpr (std::is_same_v<F, fn::Gelu>) {
    if (typed.dtype() == kFloat32) return map_n<float, float>(out, {in[0]}, GeluFloat{});
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
      map_n<TO, bool, T, T>(out, {in[0], in[1], in[2]}, f);
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
