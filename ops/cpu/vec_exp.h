// exp for float32 written so that a loop calling it vectorises: straight-line float and
// integer arithmetic, no branch and no library call. (glibc's expf has vector variants
// only under -ffast-math, which the library does not use, so a plain std::exp loop runs
// one element at a time; in a softmax-like kernel that costs more than the memory
// traffic.)
#pragma once
#include <bit>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "ops/cpu/simd.h"

namespace mu::cpu {

// The constants of exp_vec and exp_lanes.
namespace exp_constants {
inline constexpr float kLo = -88.0f;  // n = round(-88 log2 e) = -127: 2^n is +0.0
inline constexpr float kHi = 88.37f;  // keeps n <= 127
inline constexpr float kLog2e = 1.44269504088896341f;
// ln 2 = kLn2Hi + kLn2Lo, kLn2Hi with its low 12 mantissa bits clear so that n * kLn2Hi
// is exact for |n| <= 127, and r keeps its accuracy.
inline constexpr float kLn2Hi = std::bit_cast<float>(std::bit_cast<uint32_t>(0.693147180559945309f) & 0xFFFFF000u);
inline constexpr float kLn2Lo = float(0.693147180559945309 - double(kLn2Hi));
// Adding 1.5 * 2^23 rounds to the nearest integer (the fraction bits fall off) and
// leaves that integer in the low mantissa bits: n without a float-to-int conversion,
// which would be undefined for NaN.
inline constexpr float kRound = 12582912.0f;
}  // namespace exp_constants

// exp(x) = 2^n exp(r) with n = round(x / ln 2) and r = x - n ln 2 in [-ln2/2, ln2/2],
// exp(r) by its Taylor series to degree 7 (truncation below 1e-8 relative) and 2^n built
// in the exponent bits. About 1 ulp (tests/test_loss.cpp checks 3 ulp over the range).
// Exactly 0 below about -87.68, where n would reach -127 (exp(x) < 2^-126.5, a subnormal
// float: flushed), -inf included; NaN for NaN. Valid for x <= 88.37; larger x (where
// float exp is about to overflow at 88.72) returns exp(88.37). The losses call it on
// x - max <= 0.
//
// No select on the result: with GCC's default -ftrapping-math a final `x < lo ? 0 : y`
// keeps a loop that sums the results in double from vectorising. The zero comes from
// the bits instead: n = -127 makes the exponent field 0, so 2^n is built as +0.0.
[[gnu::always_inline]] inline float exp_vec(float x) {
  using namespace exp_constants;
  float xc = x < kLo ? kLo : x;  // comparisons are false for NaN: NaN passes through
  xc = xc > kHi ? kHi : xc;
  float t = xc * kLog2e + kRound;
  float n = t - kRound;
  int32_t ni = int32_t(std::bit_cast<uint32_t>(t) - std::bit_cast<uint32_t>(kRound));
  float r = std::fma(-n, kLn2Hi, xc);
  r = std::fma(-n, kLn2Lo, r);
  // Horner: 1 + r (1 + r/2 (1 + r/3 (... (1 + r/7)))) written with the 1/k! coefficients.
  float p = 1.0f / 5040;
  p = std::fma(p, r, 1.0f / 720);
  p = std::fma(p, r, 1.0f / 120);
  p = std::fma(p, r, 1.0f / 24);
  p = std::fma(p, r, 1.0f / 6);
  p = std::fma(p, r, 0.5f);
  p = std::fma(p, r, 1.0f);
  p = std::fma(p, r, 1.0f);
  float scale = std::bit_cast<float>(uint32_t(ni + 127) << 23);  // 2^n, +0.0 for n = -127
  return p * scale;
}

// erf for float32, written like exp_vec so that a loop calling it vectorises (glibc's
// erff has no vector variant): for |x| < 0.921875, x P(x²) with P of degree 8; for
// 0.921875 <= |x| < 4, 1 - exp(-x²) R(|x|) with R of degree 9 fitted to erfc(x) e^(x²) on
// [0.921875, 2) and [2, 4), each in a variable scaled to [-1, 1] (the two coefficient
// sets are picked per element); ±1 beyond 4 (erfc(4) < 2^-25). The coefficients are
// least-squares fits of the relative error on 6000 Chebyshev nodes; the largest error
// over [-6, 6] is 2.4 ulp (tests/test_loss.cpp checks 3). NaN gives NaN.
// Always inlined: an out-of-line call in a loop body keeps the loop scalar, and GCC's
// heuristics leave it out of line in the larger bodies (GELU's derivative).
// The second form also hands back exp(-x²), which it computes on the way: GELU's
// derivative needs exp(-x²/2) for its density, the same value at x/√2.
[[gnu::always_inline]] inline float erf_vec(float x, float& exp_neg_sq) {
  const float ax = std::fabs(x), u = ax * ax;
  float p = 1.132861087e-06f;
  p = std::fma(p, u, -1.416631258e-05f);
  p = std::fma(p, u, 1.199280030e-04f);
  p = std::fma(p, u, -8.545294190e-04f);
  p = std::fma(p, u, 5.223891115e-03f);
  p = std::fma(p, u, -2.686615687e-02f);
  p = std::fma(p, u, 1.128379156e-01f);
  p = std::fma(p, u, -3.761263890e-01f);
  p = std::fma(p, u, 1.128379167e+00f);
  const float small = x * p;
  // Every select below picks between values already computed or constants: an
  // arithmetic operation inside a branch of one would keep the loop scalar under GCC's
  // default -ftrapping-math.
  const bool near = ax < 2.0f;
  const float t_near = (ax - 1.4609375f) * 1.855072463768116f, t_far = ax - 3.0f;
  const float t = near ? t_near : t_far;
  float q = near ? -3.335343784e-07f : -1.381574929e-06f;
  q = std::fma(q, t, near ? 1.926556372e-06f : 5.929884103e-06f);
  q = std::fma(q, t, near ? -9.725928310e-06f : -2.089957448e-05f);
  q = std::fma(q, t, near ? 5.084228140e-05f : 8.285520085e-05f);
  q = std::fma(q, t, near ? -2.553610128e-04f : -3.241304662e-04f);
  q = std::fma(q, t, near ? 1.218283085e-03f : 1.223289236e-03f);
  q = std::fma(q, t, near ? -5.498555484e-03f : -4.479438365e-03f);
  q = std::fma(q, t, near ? 2.328650871e-02f : 1.588434014e-02f);
  q = std::fma(q, t, near ? -9.149303695e-02f : -5.437225907e-02f);
  q = std::fma(q, t, near ? 3.280951285e-01f : 1.790011518e-01f);
  exp_neg_sq = exp_vec(-u);
  float big = std::fma(-exp_neg_sq, q, 1.0f);
  big = ax >= 4.0f ? 1.0f : big;
  const float signed_big = std::copysign(big, x);
  return ax < 0.921875f ? small : signed_big;
}
[[gnu::always_inline]] inline float erf_vec(float x) {
  float unused;
  return erf_vec(x, unused);
}

// The steps of exp_lanes, for kernels that reduce their argument their own way (GELU):
// exp(r) for r in [-ln2/2, ln2/2], Taylor to degree 7 (Horner), and 2^n in float bits
// from t = x log2e + kRound, whose low mantissa bits hold n (+0.0 for n = -127).
template <class V>
[[gnu::always_inline]] inline V exp_reduced(V r) {
  V p = r * (1.0f / 5040) + 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  return p * r + 1.0f;
}
// 2^(n + k) for the n held in t; k > 0 keeps the scale normal for n down to -126 - k.
template <class V>
[[gnu::always_inline]] inline V exp2_of_rounded(V t, int k = 0) {
  using VI [[gnu::vector_size(sizeof(V))]] = int32_t;
  const VI ni = (VI)t - std::bit_cast<int32_t>(exp_constants::kRound);  // (VI) reinterprets the bits
  return (V)((ni + (127 + k)) << 23);
}

// exp_lanes for x already in [kLo, kHi] (or NaN).
template <class V>
[[gnu::always_inline]] inline V exp_lanes_in_range(V xc) {
  using namespace exp_constants;
  const V t = xc * kLog2e + kRound;
  const V n = t - kRound;
  V r = xc - n * kLn2Hi;  // exact: n * kLn2Hi needs no rounding
  r = r - n * kLn2Lo;
  return exp_reduced(r) * exp2_of_rounded(t);
}

// exp_vec on every lane of a GCC vector of floats (ops/cpu/simd.h), the same steps on
// whole vectors, for kernels written on vectors. A loop of exp_vec calls vectorises too,
// but GCC then turns each clamp into selects after most later steps (it folds the
// clamped lanes' constants forward): seven blends per vector, and 1.4x the time of this
// form (0.76 against 0.55 ns per element on one Zen 3 core, in cache).
// The clamps are the hardware's max and min (max_of, min_of), one instruction each where
// the selects were a compare and a blend: 2 of about 20 instructions a vector.
template <class V>
[[gnu::always_inline]] inline V exp_lanes(V x) {
  using namespace exp_constants;
  if constexpr (std::is_same_v<V, Vec<float>::type>) {
    return exp_lanes_in_range(min_of(kHi, max_of(kLo, x)));
  } else {
    V xc = x < kLo ? kLo : x;  // comparisons are false for NaN: NaN passes through
    xc = xc > kHi ? kHi : xc;
    return exp_lanes_in_range(xc);
  }
}

// exp in the kernels' scalar type: the vectorisable version for float32, the library's
// for float64 (the reference precision: accuracy over speed). Always inlined: out of line
// (GCC's choice once a file had more loops calling it) it kept the loops scalar, and the
// cross-entropy forward over 1024 x 50257 logits took 95 ms instead of 14.
template <class T>
[[gnu::always_inline]] inline T exp_fast(T x) {
  if constexpr (std::is_same_v<T, float>)
    return exp_vec(x);
  else
    return std::exp(x);
}

}  // namespace mu::cpu
