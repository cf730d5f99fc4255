// Kernels of the optimisers (optim/): fused update loops over every parameter of a step
// (on CUDA one launch for them all, not one per parameter) and the gradient-norm
// reduction of clipping. Tensors are dense, of one dtype and device.
#pragma once
#include <vector>

#include "ops/dispatch.h"
#include "tensor/tensor.h"

namespace mu::kernels {

// One AdamW step's scalars, in double; the kernel rounds each once to the parameter's
// dtype, as torch does when it hands a Python float to an in-place op.
struct AdamWStep {
  double decay;      // 1 - lr * wd
  double beta1, one_minus_beta1;
  double beta2, one_minus_beta2;
  double bc2_sqrt;   // sqrt(1 - beta2^t)
  double eps;
  double neg_step;   // -lr / (1 - beta1^t)
  bool amsgrad;      // the denominator uses the running max of exp_avg_sq (kept in max_exp_avg_sq)
  bool maximize;     // ascend: the gradient's sign is flipped
};
// Parameters that take one AdamW step with the same scalars: element k of every list
// belongs to parameter k (max_exp_avg_sqs empty unless amsgrad).
struct AdamWTensors {
  std::vector<Tensor> params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs;
};
// Every param, exp_avg, exp_avg_sq (and max_exp_avg_sq when amsgrad) updated in place
// from its grad, with torch.optim.AdamW's roundings.
MU_DECLARE_KERNEL(adamw_update, void(const AdamWTensors& t, const AdamWStep& s));

struct SGDStep {
  double neg_lr;
  double weight_decay;    // read only when has_decay
  double momentum;        // read only when has_momentum
  double one_minus_damp;  // 1 - dampening
  bool has_decay, has_momentum, nesterov;
  bool first;             // the momentum buffer is created from this step's direction
};
// Parameters that take one SGD step with the same scalars (momentum_buffers empty
// unless has_momentum).
struct SGDTensors {
  std::vector<Tensor> params, grads, momentum_buffers;
};
// Every param (and momentum_buffer when has_momentum) updated in place from its grad,
// with torch.optim.SGD's roundings.
MU_DECLARE_KERNEL(sgd_update, void(const SGDTensors& t, const SGDStep& s));

// Σ |x|^p over every element of the dense xs (one device and dtype), or max |x| (NaN if
// any element is NaN) when p is infinite, in double, in an order that depends neither on
// the thread count nor on the device: each tensor's own sum, combined in list order.
// One result for the whole list: a device reads one value back, not one per tensor.
MU_DECLARE_KERNEL(norm_power_sum, double(const std::vector<Tensor>& xs, double p));

// Combines two partial results of norm_power_sum: sums add; maxima (inf) keep the
// larger, and NaN once seen.
inline double combine_norm_parts(double a, double b, bool inf) {
  if (!inf) return a + b;
  if (a != a || b != b) return a != a ? a : b;
  return a > b ? a : b;
}

}  // namespace mu::kernels
