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

namespace mu::cpu {

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
inline float exp_vec(float x) {
  constexpr float kLo = -88.0f;  // n = round(-88 log2 e) = -127: 2^n is +0.0
  constexpr float kHi = 88.37f;  // keeps n <= 127
  constexpr float kLog2e = 1.44269504088896341f;
  // ln 2 = kLn2Hi + kLn2Lo, kLn2Hi with its low 12 mantissa bits clear so that n * kLn2Hi
  // is exact for |n| <= 127, and r keeps its accuracy.
  constexpr float kLn2Hi = std::bit_cast<float>(std::bit_cast<uint32_t>(0.693147180559945309f) & 0xFFFFF000u);
  constexpr float kLn2Lo = float(0.693147180559945309 - double(kLn2Hi));
  // Adding 1.5 * 2^23 rounds to the nearest integer (the fraction bits fall off) and
  // leaves that integer in the low mantissa bits: n without a float-to-int conversion,
  // which would be undefined for NaN.
  constexpr float kRound = 12582912.0f;

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

// exp in the kernels' scalar type: the vectorisable version for float32, the library's
// for float64 (the reference precision: accuracy over speed).
template <class T>
inline T exp_fast(T x) {
  if constexpr (std::is_same_v<T, float>)
    return exp_vec(x);
  else
    return std::exp(x);
}

}  // namespace mu::cpu
