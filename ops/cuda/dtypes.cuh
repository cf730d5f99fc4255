// Scalar types on the device: the C++ type of every DType, the type arithmetic on it is
// done in (float for the 16-bit floats, int64 for the narrow integers, as on the CPU),
// conversions between any two, and the switches from a runtime DType to a kernel's
// instantiation. nvcc only.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "tensor/dtype.h"
#include "tensor/error.h"

namespace mu::cuda {

using bf16 = __nv_bfloat16;
using fp16 = __half;

// The type a value of T is computed in.
template <class T> struct Wide { using type = T; };
template <> struct Wide<bf16> { using type = float; };
template <> struct Wide<fp16> { using type = float; };
template <> struct Wide<int8_t> { using type = int64_t; };
template <> struct Wide<int16_t> { using type = int64_t; };
template <> struct Wide<int32_t> { using type = int64_t; };
template <> struct Wide<uint8_t> { using type = int64_t; };
template <class T> using wide_t = typename Wide<T>::type;

// The accumulator of a sum over T: double for float32 (as the CPU kernels carry their
// float32 sums), float for the 16-bit floats' (already widened) values, T otherwise.
template <class T> struct Acc { using type = wide_t<T>; };
template <> struct Acc<float> { using type = double; };
template <class T> using acc_t = typename Acc<T>::type;

template <class T>
__device__ __forceinline__ wide_t<T> widen(T x) {
  if constexpr (std::is_same_v<T, bf16>) return __bfloat162float(x);
  else if constexpr (std::is_same_v<T, fp16>) return __half2float(x);
  else return static_cast<wide_t<T>>(x);
}

// x (of T's wide type or any arithmetic type) stored as a T: round to nearest even for
// the 16-bit floats (a double goes through float first, as on the host), a C++ cast
// otherwise, x != 0 for bool.
template <class T, class W>
__device__ __forceinline__ T narrow(W x) {
  if constexpr (std::is_same_v<T, bool>) return x != W(0);
  else if constexpr (std::is_same_v<T, bf16>) return __float2bfloat16_rn(static_cast<float>(x));
  else if constexpr (std::is_same_v<T, fp16>) return __float2half_rn(static_cast<float>(x));
  else return static_cast<T>(x);
}

// Any scalar to any other, through the source's wide type.
template <class To, class From>
__device__ __forceinline__ To convert(From x) {
  if constexpr (std::is_same_v<To, From>) return x;
  else return narrow<To>(widen(x));
}

// Calls body(T{}) with T the device type of `dtype`, for every DType.
template <class Body>
void dispatch_all(DType dtype, const char* op, Body&& body) {
  switch (dtype) {
    case DType::Float32: body(float{}); return;
    case DType::Float64: body(double{}); return;
    case DType::Int64: body(int64_t{}); return;
    case DType::Bool: body(bool{}); return;
    case DType::BFloat16: body(bf16{}); return;
    case DType::Float16: body(fp16{}); return;
    case DType::Int8: body(int8_t{}); return;
    case DType::Int16: body(int16_t{}); return;
    case DType::Int32: body(int32_t{}); return;
    case DType::UInt8: body(uint8_t{}); return;
  }
  MU_FAIL(op, ": dtype ", int(dtype), " is not a DType");
}

// Calls body(T{}) for float32 and float64; any other dtype is one error naming the op.
template <class Body>
void dispatch_float(DType dtype, const char* op, Body&& body) {
  switch (dtype) {
    case DType::Float32: body(float{}); return;
    case DType::Float64: body(double{}); return;
    default: break;
  }
  MU_FAIL(op, ": dtype ", dtype_name(dtype), " is not supported on CUDA (float32 or float64)");
}

// float32, float64 and bfloat16 (the mixed-precision kernels: matmul, attention, copies).
template <class Body>
void dispatch_float_bf16(DType dtype, const char* op, Body&& body) {
  switch (dtype) {
    case DType::Float32: body(float{}); return;
    case DType::Float64: body(double{}); return;
    case DType::BFloat16: body(bf16{}); return;
    default: break;
  }
  MU_FAIL(op, ": dtype ", dtype_name(dtype), " is not supported on CUDA (float32, float64 or bfloat16)");
}

}  // namespace mu::cuda
