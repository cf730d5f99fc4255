// Element types and the switch that turns a runtime DType into a C++ scalar type.
#pragma once
#include <cstdint>
#include <string>

#include "tensor/error.h"

namespace mu {

// Bool is the result of comparisons (one byte per element, like torch.bool).
// BFloat16 is reserved for CUDA mixed precision; CPU kernels do not take it.
enum class DType : uint8_t { Float32, Float64, Int64, Bool, BFloat16 };

inline constexpr DType kFloat32 = DType::Float32;
inline constexpr DType kFloat64 = DType::Float64;
inline constexpr DType kInt64 = DType::Int64;
inline constexpr DType kBool = DType::Bool;

inline size_t element_size(DType t) {
  switch (t) {
    case DType::Float32: return 4;
    case DType::Float64: return 8;
    case DType::Int64: return 8;
    case DType::Bool: return 1;
    case DType::BFloat16: return 2;
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
  }
  return "?";
}

inline bool is_floating(DType t) {
  return t == DType::Float32 || t == DType::Float64 || t == DType::BFloat16;
}

// C++ type -> DType, for templated factories and data_ptr<T>() checks.
template <class T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::Float32; }
template <> constexpr DType dtype_of<double>() { return DType::Float64; }
template <> constexpr DType dtype_of<int64_t>() { return DType::Int64; }
template <> constexpr DType dtype_of<bool>() { return DType::Bool; }

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

#define MU_DISPATCH_ALL(dtype, opname, ...)                                             \
  [&] {                                                                                 \
    switch (dtype) {                                                                    \
      MU_DISPATCH_CASE_(::mu::DType::Float32, float, __VA_ARGS__)                       \
      MU_DISPATCH_CASE_(::mu::DType::Float64, double, __VA_ARGS__)                      \
      MU_DISPATCH_CASE_(::mu::DType::Int64, int64_t, __VA_ARGS__)                       \
      MU_DISPATCH_CASE_(::mu::DType::Bool, bool, __VA_ARGS__)                           \
      default:                                                                          \
        MU_FAIL(opname, ": dtype ", ::mu::dtype_name(dtype), " is not supported on CPU"); \
    }                                                                                   \
  }()
