// Element types and the switch that turns a runtime DType into a C++ scalar type.
#pragma once
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>

#include "tensor/error.h"
#include "tensor/half.h"

namespace mu {

// Bool is the result of comparisons (one byte per element, like torch.bool).
// The compute dtypes are float32, float64, int64 and bool: every CPU kernel takes them.
// The others are storage dtypes (as in a safetensors file): tensors hold them, copies and
// .to() convert them, elementwise ops compute on them through float32 (the 16-bit floats)
// or int64 (the narrow integers) and round back; other ops name them and ask for a .to().
// New enumerators go last: the values appear in no file, but keep them stable anyway.
enum class DType : uint8_t { Float32, Float64, Int64, Bool, BFloat16, Float16, Int8, Int16, Int32, UInt8 };

inline constexpr DType kFloat32 = DType::Float32;
inline constexpr DType kFloat64 = DType::Float64;
inline constexpr DType kInt64 = DType::Int64;
inline constexpr DType kBool = DType::Bool;
inline constexpr DType kBFloat16 = DType::BFloat16;
inline constexpr DType kFloat16 = DType::Float16;
inline constexpr DType kInt8 = DType::Int8;
inline constexpr DType kInt16 = DType::Int16;
inline constexpr DType kInt32 = DType::Int32;
inline constexpr DType kUInt8 = DType::UInt8;

inline constexpr DType kAllDTypes[] = {kFloat32, kFloat64, kInt64,  kBool,  kBFloat16,
                                       kFloat16, kInt8,    kInt16, kInt32, kUInt8};

inline size_t element_size(DType t) {
  switch (t) {
    case DType::Float32: return 4;
    case DType::Float64: return 8;
    case DType::Int64: return 8;
    case DType::Bool: return 1;
    case DType::BFloat16: return 2;
    case DType::Float16: return 2;
    case DType::Int8: return 1;
    case DType::Int16: return 2;
    case DType::Int32: return 4;
    case DType::UInt8: return 1;
  }
  return 0;
}

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::Float32: return "float32";
    case DType::Float64: return "float64";
    case DType::Int64: return "int64";
    case DType::Bool: return "bool";
    case DType::BFloat16: return "bfloat16";
    case DType::Float16: return "float16";
    case DType::Int8: return "int8";
    case DType::Int16: return "int16";
    case DType::Int32: return "int32";
    case DType::UInt8: return "uint8";
  }
  return "?";
}

// A DType cast from an integer (or read from a file) may hold a value no enumerator has.
inline void check_dtype(DType t, const char* op) {
  MU_CHECK(int(t) <= int(DType::UInt8), op, ": dtype ", int(t), " is not a DType (float32, float64, int64, bool, "
           "bfloat16, float16, int8, int16, int32, uint8)");
}

inline bool is_floating(DType t) {
  return t == DType::Float32 || t == DType::Float64 || t == DType::BFloat16 || t == DType::Float16;
}

// bfloat16 and float16: stored in 16 bits, computed in float32 (sums, means and numbers
// beside them are kept in float32 and the result rounded once).
inline bool is_16bit_float(DType t) { return t == DType::BFloat16 || t == DType::Float16; }

inline bool is_integral(DType t) {
  return t == DType::Int64 || t == DType::Int8 || t == DType::Int16 || t == DType::Int32 || t == DType::UInt8;
}

// float32, float64, int64, bool: the dtypes CPU kernels take.
inline bool is_compute_dtype(DType t) {
  return t == DType::Float32 || t == DType::Float64 || t == DType::Int64 || t == DType::Bool;
}

// The compute dtype a storage dtype is widened to for arithmetic: float32 for the 16-bit
// floats, int64 for the narrow integers (whose wrap-around a cast back reproduces).
inline DType compute_dtype(DType t) {
  if (is_compute_dtype(t)) return t;
  return is_floating(t) ? DType::Float32 : DType::Int64;
}

// Refuses a number that an integer (or bool) dtype cannot hold exactly: a fraction, NaN,
// an infinity, or a value outside the dtype's range. Used where a number becomes an
// element (full, fill_, set, from_vector), where a silent truncation or wrap would be a
// wrong answer. Floating dtypes take any number (rounding is their nature).
// The least and the greatest value of an integer or bool dtype, as doubles (int64's
// greatest, 2^63 - 1, rounds up to 2^63).
inline std::pair<double, double> integer_range(DType t) {
  switch (t) {
    case DType::Bool: return {0, 1};
    case DType::Int8: return {-128, 127};
    case DType::Int16: return {-32768, 32767};
    case DType::Int32: return {-2147483648.0, 2147483647.0};
    case DType::UInt8: return {0, 255};
    default: return {-9223372036854775808.0, 9223372036854775808.0};
  }
}

inline void check_value_fits(double v, DType t, const char* op) {
  if (is_floating(t)) return;
  if (t == DType::Bool) {
    MU_CHECK(v == 0 || v == 1, op, ": value ", v, " is not a bool (0 or 1)");
    return;
  }
  const auto [lo, most] = integer_range(t);
  // [-2^63, 2^63) for int64, whose greatest value is not a double.
  const double hi = t == DType::Int64 ? most : most + 1;
  MU_CHECK(v == std::trunc(v), op, ": value ", v, " is not an integer but the dtype is ", dtype_name(t));
  MU_CHECK(v >= lo && v < hi, op, ": value ", v, " does not fit in ", dtype_name(t), " (range [", lo, ", ", hi - 1,
           "])");
}

// C++ type -> DType, for templated factories and data_ptr<T>() checks.
template <class T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::Float32; }
template <> constexpr DType dtype_of<double>() { return DType::Float64; }
template <> constexpr DType dtype_of<int64_t>() { return DType::Int64; }
template <> constexpr DType dtype_of<bool>() { return DType::Bool; }
template <> constexpr DType dtype_of<bfloat16_t>() { return DType::BFloat16; }
template <> constexpr DType dtype_of<half_t>() { return DType::Float16; }
template <> constexpr DType dtype_of<int8_t>() { return DType::Int8; }
template <> constexpr DType dtype_of<int16_t>() { return DType::Int16; }
template <> constexpr DType dtype_of<int32_t>() { return DType::Int32; }
template <> constexpr DType dtype_of<uint8_t>() { return DType::UInt8; }

}  // namespace mu

// Runs the body with `scalar_t` bound to the C++ type of `dtype`.
// MU_DISPATCH_FLOAT: float32/float64. MU_DISPATCH_ALL: also int64 and bool.
#define MU_DISPATCH_CASE_(enum_v, type, ...) \
  case enum_v: {                             \
    using scalar_t = type;                   \
    __VA_ARGS__();                           \
    break;                                   \
  }

#define MU_DISPATCH_FLOAT(dtype, opname, ...)                                           \
  [&] {                                                                                 \
    switch (dtype) {                                                                    \
      MU_DISPATCH_CASE_(::mu::DType::Float32, float, __VA_ARGS__)                       \
      MU_DISPATCH_CASE_(::mu::DType::Float64, double, __VA_ARGS__)                      \
      default:                                                                          \
        MU_FAIL(opname, ": expected a floating-point tensor (float32 or float64), got ", \
                ::mu::dtype_name(dtype));                                               \
    }                                                                                   \
  }()

#define MU_DISPATCH_NUMERIC(dtype, opname, ...)                                         \
  [&] {                                                                                 \
    switch (dtype) {                                                                    \
      MU_DISPATCH_CASE_(::mu::DType::Float32, float, __VA_ARGS__)                       \
      MU_DISPATCH_CASE_(::mu::DType::Float64, double, __VA_ARGS__)                      \
      MU_DISPATCH_CASE_(::mu::DType::Int64, int64_t, __VA_ARGS__)                       \
      default:                                                                          \
        MU_FAIL(opname, ": expected float32, float64 or int64, got ", ::mu::dtype_name(dtype)); \
    }                                                                                   \
  }()

// Every dtype, storage dtypes included: copies, fills, element reads and writes.
#define MU_DISPATCH_STORAGE(dtype, opname, ...)                                         \
  [&] {                                                                                 \
    switch (dtype) {                                                                    \
      MU_DISPATCH_CASE_(::mu::DType::Float32, float, __VA_ARGS__)                       \
      MU_DISPATCH_CASE_(::mu::DType::Float64, double, __VA_ARGS__)                      \
      MU_DISPATCH_CASE_(::mu::DType::Int64, int64_t, __VA_ARGS__)                       \
      MU_DISPATCH_CASE_(::mu::DType::Bool, bool, __VA_ARGS__)                           \
      MU_DISPATCH_CASE_(::mu::DType::BFloat16, ::mu::bfloat16_t, __VA_ARGS__)           \
      MU_DISPATCH_CASE_(::mu::DType::Float16, ::mu::half_t, __VA_ARGS__)                \
      MU_DISPATCH_CASE_(::mu::DType::Int8, int8_t, __VA_ARGS__)                         \
      MU_DISPATCH_CASE_(::mu::DType::Int16, int16_t, __VA_ARGS__)                       \
      MU_DISPATCH_CASE_(::mu::DType::Int32, int32_t, __VA_ARGS__)                       \
      MU_DISPATCH_CASE_(::mu::DType::UInt8, uint8_t, __VA_ARGS__)                       \
    }                                                                                   \
  }()

#define MU_DISPATCH_ALL(dtype, opname, ...)                                             \
  [&] {                                                                                 \
    switch (dtype) {                                                                    \
      MU_DISPATCH_CASE_(::mu::DType::Float32, float, __VA_ARGS__)                       \
      MU_DISPATCH_CASE_(::mu::DType::Float64, double, __VA_ARGS__)                      \
      MU_DISPATCH_CASE_(::mu::DType::Int64, int64_t, __VA_ARGS__)                       \
      MU_DISPATCH_CASE_(::mu::DType::Bool, bool, __VA_ARGS__)                           \
      default:                                                                          \
        MU_FAIL(opname, ": dtype ", ::mu::dtype_name(dtype),                            \
                " is a storage dtype; convert the tensor with .to(kFloat32) or .to(kInt64)"); \
    }                                                                                   \
  }()
