// The two 16-bit floating-point storage types, as bits with conversions to and from
// float. Tensors of these dtypes hold values (safetensors files, model weights kept
// small); CPU arithmetic widens them to float32 first (ops/pointwise.h), as PyTorch's
// CPU kernels do.
//
//   half_t      IEEE 754 binary16: 1 sign, 5 exponent, 10 mantissa bits (torch.float16)
//   bfloat16_t  the upper half of a binary32: 1 sign, 8 exponent, 7 mantissa bits
//
// float -> 16 bits rounds to nearest, ties to even; overflow gives infinity; NaN stays
// NaN (quiet, as PyTorch's: half keeps the sign, bfloat16 is 0x7fc0). 16 bits -> float is exact. A double goes through float, as PyTorch's
// conversions do.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace mu {

namespace detail {
// The bits of `from` read as a To (std::bit_cast, which the CUDA compiler's C++17 lacks).
template <class To, class From>
inline To bits_as(From from) {
  static_assert(sizeof(To) == sizeof(From), "bits_as: sizes differ");
  To to;
  std::memcpy(&to, &from, sizeof to);
  return to;
}
}  // namespace detail

struct half_t {
  uint16_t bits = 0;

  half_t() = default;
  explicit half_t(float f) : bits(from_float(f)) {}
  explicit operator float() const { return to_float(bits); }

  static half_t from_bits(uint16_t b) {
    half_t h;
    h.bits = b;
    return h;
  }

  static uint16_t from_float(float f) {
    const uint32_t x = detail::bits_as<uint32_t>(f);
    const uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7fffffffu;
    // NaN: the quiet NaN of that sign (PyTorch's conversion drops the payload too).
    if (ax > 0x7f800000u) return uint16_t(sign | 0x7e00u);
    // 65520 = 0x477ff000 is the midpoint between the largest half (65504) and 2^16; it
    // and everything above round to infinity (the tie goes to the even 2^16).
    if (ax >= 0x477ff000u) return uint16_t(sign | 0x7c00u);
    // Below 2^-14, the smallest normal half: a subnormal m * 2^-24. The scaling by 2^24
    // is exact in float, and nearbyint rounds half to even; m = 1024 is 2^-14 itself,
    // whose bits are those of the smallest normal.
    if (ax < 0x38800000u) return uint16_t(sign | uint32_t(std::nearbyint(detail::bits_as<float>(ax) * 16777216.0f)));
    // A normal: rebias the exponent (127 -> 15: subtract 112 << 23) and round away the
    // low 13 mantissa bits, ties to even (add 0xfff plus the lowest kept bit); a carry
    // out of the mantissa moves into the exponent, which is the right answer.
    ax += 0xc8000fffu + ((ax >> 13) & 1u);
    return uint16_t(sign | (ax >> 13));
  }

  static float to_float(uint16_t h) {
    const uint32_t sign = uint32_t(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    if (exp == 0) {  // zero or subnormal: mant * 2^-24, exact in float
      float f = float(mant) * 5.9604644775390625e-8f;
      return sign ? -f : f;
    }
    if (exp == 31) return detail::bits_as<float>(sign | 0x7f800000u | (mant << 13));  // inf, NaN
    return detail::bits_as<float>(sign | ((exp + 112u) << 23) | (mant << 13));
  }
};

struct bfloat16_t {
  uint16_t bits = 0;

  bfloat16_t() = default;
  explicit bfloat16_t(float f) : bits(from_float(f)) {}
  explicit operator float() const { return to_float(bits); }

  static bfloat16_t from_bits(uint16_t b) {
    bfloat16_t h;
    h.bits = b;
    return h;
  }

  static uint16_t from_float(float f) {
    const uint32_t x = detail::bits_as<uint32_t>(f);
    // NaN: one canonical quiet NaN, as PyTorch gives (truncating could clear every
    // mantissa bit left, which would be an infinity).
    if ((x & 0x7fffffffu) > 0x7f800000u) return 0x7fc0u;
    // Round to nearest, ties to even, on the 16 bits dropped; the largest finite floats
    // carry into the exponent and become infinity, which is the rounded value.
    return uint16_t((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
  }

  static float to_float(uint16_t b) { return detail::bits_as<float>(uint32_t(b) << 16); }
};

template <class T>
inline constexpr bool is_16bit_float_v = std::is_same_v<T, half_t> || std::is_same_v<T, bfloat16_t>;

// v as a TO, for any two element types of a tensor: the 16-bit floats go through float;
// everything else is the C++ conversion (bool: nonzero is true).
template <class TO, class FROM>
inline TO convert_element(FROM v) {
  if constexpr (std::is_same_v<TO, FROM>) {
    return v;
  } else if constexpr (is_16bit_float_v<FROM>) {
    return convert_element<TO>(static_cast<float>(v));
  } else if constexpr (is_16bit_float_v<TO>) {
    return TO(static_cast<float>(v));
  } else {
    return static_cast<TO>(v);
  }
}

}  // namespace mu
