// Gradient clipping by total norm, as torch.nn.utils.clip_grad_norm_ (PyTorch 1.13,
// error_if_nonfinite off).
#pragma once
#include <vector>

#include "tensor/tensor.h"

namespace mu::optim {

// The norm of all gradients of `params` taken together as one vector (parameters without
// a gradient are ignored; none at all gives 0). When that total exceeds max_norm, every
// gradient is scaled in place by max_norm / (total + 1e-6). Returns the pre-clip total.
// norm_type is any p > 0, or INFINITY for the max-abs norm. A non-finite total is not an
// error: as in torch, an infinite one scales the gradients by 0 (inf entries become NaN)
// and a NaN one makes every gradient NaN, so the caller can detect and skip the step.
double clip_grad_norm(const std::vector<Tensor>& params, double max_norm, double norm_type = 2.0);

// The same total norm without touching the gradients.
double grad_norm(const std::vector<Tensor>& params, double norm_type = 2.0);

}  // namespace mu::optim
