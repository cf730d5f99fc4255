// The elementwise map kernel, one table per functor of ops/functors.h:
// out[i] = f(in[0][i], ..., in[arity-1][i]) over broadcast operands.
#pragma once
#include <array>

#include "ops/dispatch.h"
#include "ops/functors.h"
#include "tensor/tensor.h"

namespace mu::kernels {

// `out` may be any strided view (an in-place op passes its destination, which may also
// be in[0]); each input is read through its strides broadcast to out's shape. Slots
// past the functor's arity are undefined tensors. Dtypes (checked by the op,
// ops/pointwise.h): the functor computes in T, that of the first value operand's compute
// dtype; each value operand and the output (bool for a comparison) hold T, or, when T
// is float32, bfloat16 or float16, widened as read and rounded as written.
template <class F>
using MapFn = void(const Tensor& out, const std::array<Tensor, 3>& in, const F& f);

// The table of functor F, defined in the library (ops/kernel_tables.cpp) for every
// functor of fn::AllFunctors.
template <class F>
KernelTable<MapFn<F>>& map();

}  // namespace mu::kernels

namespace mu::kernels {

// Calls body(T{}) with T the scalar type of `dtype`, among those the functor F allows
// (its `types`); any other dtype is one error naming the functor. Backends use it to
// pick the instantiation of their map loop.
template <class F, class Body>
void dispatch_functor(DType dtype, Body&& body) {
  switch (dtype) {
    case DType::Float32: body(float{}); return;
    case DType::Float64: body(double{}); return;
    case DType::Int64:
      if constexpr (F::types != fn::Types::Float) {
        body(int64_t{});
        return;
      }
      break;
    case DType::Bool:
      if constexpr (F::types == fn::Types::All) {
        body(bool{});
        return;
      }
      break;
    default: break;
  }
  MU_FAIL(F::name, ": dtype ", dtype_name(dtype), " is not supported");
}

}  // namespace mu::kernels
