// bfloat16 operands of the CPU's matmul and attention kernels (autocast,
// autograd/autocast.h): the CPU has no bfloat16 arithmetic, so those kernels widen the
// operands to float32 (exactly), compute in float32 and round the result to bfloat16
// once, which is what a bfloat16 tensor-core kernel with float32 accumulation gives, up
// to the order of its sums.
#pragma once
#include "autograd/grad_mode.h"
#include "tensor/tensor.h"

namespace mu::cpu {

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
