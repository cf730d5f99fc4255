// Automatic mixed precision: inside an AutocastGuard, the ops that gain most from
// 16-bit tensor cores (matmul, mm, bmm, einsum, linear layers, attention) run on
// bfloat16 copies of their float32 operands, with float32 accumulation, and return
// bfloat16; the ops whose range or precision matters (softmax and log_softmax, layer and
// batch norm, entmax, the losses) turn 16-bit inputs back into float32 and compute in it.
// Parameters stay float32 (the optimiser's master weights): each cast is a node of the
// graph, so their gradients arrive in float32. Elementwise ops on a bfloat16 and a
// float32 operand compute in float32 (type promotion), as in PyTorch, reading each
// operand in its own dtype (no conversion copy); cross_entropy with class indices reads
// bfloat16 logits the same way and returns their gradient in bfloat16.
//
// The state is per thread, like grad mode, and nests; a backward pass runs without it
// (gradient formulas use the dtypes the forward saved).
//
//   {
//     mu::AutocastGuard amp;              // bfloat16
//     Tensor loss = model.forward(x, y);  // the matmuls in bf16, the loss in fp32
//     loss.backward();
//   }
//   opt.step();                           // float32 weights, float32 update
#pragma once
#include "tensor/tensor.h"

namespace mu::autograd {

bool is_autocast_enabled();
// The 16-bit dtype of the innermost enabled guard (bfloat16).
DType autocast_dtype();

class AutocastGuard {
 public:
  // dtype: kBFloat16 (the only one: float16 would need loss scaling); enabled = false
  // turns autocast off inside an enclosing guard.
  explicit AutocastGuard(DType dtype = kBFloat16, bool enabled = true);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  bool prev_enabled_;
  DType prev_dtype_;
};

namespace autocast {
// x in the autocast dtype when autocast is on and x is float32; x itself otherwise. For
// the operands of the low-precision ops. A parameter (a leaf that requires grad) cast
// where no graph is recorded is cast once and kept until the thread's last AutocastGuard
// ends, unless changed in place or given other data since (as torch.autocast's cache of
// weight casts): a sampling loop casts each weight once, not once a step.
Tensor to_low(const Tensor& x);
// How many parameter casts the cache holds now (for tests).
size_t cached_casts();
// x in float32 when autocast is on and x is a 16-bit float; x itself otherwise. For the
// inputs of the full-precision ops.
Tensor to_full(const Tensor& x);
// The dtype to_low(x) would have, without converting anything (for an op's checks).
DType low_dtype(const Tensor& x);
}  // namespace autocast

}  // namespace mu::autograd

namespace mu {
using autograd::AutocastGuard;
}
