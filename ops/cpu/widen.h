// bfloat16 operands of the CPU's kernels (autocast, autograd/autocast.h). The CPU has no
// bfloat16 arithmetic, so its kernels widen the operands to float32 (exactly), compute in
// float32 and round the result to bfloat16 once, which is what a bfloat16 tensor-core
// kernel with float32 accumulation gives, up to the order of its sums. Here: the
// per-value widening and rounding, the dispatch over the floating dtypes, and the whole
// widened copies matmul and attention take.
#pragma once
#include <type_traits>

#include "autograd/grad_mode.h"
#include "tensor/tensor.h"

namespace mu::cpu {

// The type the CPU computes a T in: float for bfloat16 (it has no bfloat16 arithmetic),
// T itself otherwise; widen_value converts a value to it, narrow_value rounds a result
// back to T once.
template <class T> struct Compute { using type = T; };
template <> struct Compute<bfloat16_t> { using type = float; };
template <class T> using compute_t = typename Compute<T>::type;

template <class T>
compute_t<T> widen_value(T x) {
  if constexpr (std::is_same_v<T, bfloat16_t>) return float(x);
  else return x;
}

template <class T, class W>
T narrow_value(W x) {
  if constexpr (std::is_same_v<T, bfloat16_t>) return bfloat16_t(float(x));
  else return T(x);
}

// body(T{}) for a float32, float64 or bfloat16 dtype; any other is an error naming `op`.
template <class Body>
void dispatch_float_bf16(DType dtype, const char* op, Body&& body) {
  switch (dtype) {
    case DType::Float32: body(float{}); return;
    case DType::Float64: body(double{}); return;
    case DType::BFloat16: body(bfloat16_t{}); return;
    default: break;
  }
  MU_FAIL(op, ": dtype ", dtype_name(dtype), " is not supported (float32, float64 or bfloat16)");
}

// A dense float32 copy of t, outside any graph (a kernel's operands may require grad).
inline Tensor widened(const Tensor& t) {
  NoGradGuard no_grad;
  return t.detach().to(kFloat32).contiguous();
}

// An empty float32 twin of out, for the kernel to write; narrow_into copies it back.
inline Tensor wide_like(const Tensor& out) { return empty(out.shape(), TensorOptions(kFloat32)); }
inline void narrow_into(const Tensor& out, const Tensor& wide) {
  NoGradGuard no_grad;
  Tensor(out).detach().copy_(wide);
}

}  // namespace mu::cpu
