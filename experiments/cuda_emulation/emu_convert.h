// A harness's values to and from double: bfloat16 goes through float (the only type it
// converts to and from on the host), rounding to nearest even.
#pragma once
#include <cuda_bf16.h>
#include <cstdio>
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

// Calls body(T{}, name) for float32, float64 and bfloat16, then prints PASS or FAIL as
// `failures` (the harness's count) says: the harness's exit status.
template <class Body>
int emu_each_float_type(Body body, const int& failures) {
  body(float{}, "float32");
  body(double{}, "float64");
  body(__nv_bfloat16{}, "bfloat16");
  std::printf("%s\n", failures ? "FAIL" : "PASS");
  return failures ? 1 : 0;
}
