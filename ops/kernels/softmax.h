// Kernels of softmax and log_softmax along one dim (ops/nn_functional.cpp).
#pragma once
#include "ops/dispatch.h"
#include "tensor/tensor.h"

namespace mu::kernels {

// y = softmax(x) (log_softmax when `log`) along the middle axis of the dense (outer, n,
// inner) tensors x and y. A NaN anywhere in a line, or a line of only -inf, makes the
// whole line NaN, as in PyTorch.
MU_DECLARE_KERNEL(softmax_forward, void(const Tensor& x, const Tensor& y, int64_t outer, int64_t n, int64_t inner,
                                        bool log));
// dx from the output y and its gradient g (all dense, same shape): softmax dx = y (g -
// sum(g y)); log_softmax dx = g - exp(y) sum(g).
MU_DECLARE_KERNEL(softmax_backward, void(const Tensor& g, const Tensor& y, const Tensor& dx, int64_t outer,
                                         int64_t n, int64_t inner, bool log));

}  // namespace mu::kernels
