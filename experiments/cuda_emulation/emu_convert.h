// A harness's values to and from double: bfloat16 goes through float (the only type it
// converts to and from on the host), rounding to nearest even.
#pragma once
#include <cuda_bf16.h>
#include <type_traits>

template <class T>
double to_d(T x) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return double(__bfloat162float(x));
  else return double(x);
}
template <class T>
T from_d(double x) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return __float2bfloat16_rn(float(x));
  else return T(x);
}
