// Kernels of layer_norm and batch_norm (ops/normalization.cpp). Every tensor is dense;
// an optional one (weight, bias, running statistics, a gradient nobody asked for) is
// passed undefined.
#pragma once
#include "ops/dispatch.h"
#include "tensor/tensor.h"

namespace mu::kernels {

// x viewed as (rows, n): per row, mean and rstd = 1 / sqrt(biased var + eps) (written
// to `mean` and `rstd`, shape (rows)), and y = (x - mean) * rstd * weight + bias, with
// weight and bias of n elements each.
MU_DECLARE_KERNEL(layer_norm_forward, void(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& y,
                                           const Tensor& mean, const Tensor& rstd, int64_t rows, int64_t n,
                                           double eps));
// From the output gradient g (rows, n), x and the saved mean and rstd: dx (rows, n), and
// dweight and dbias (n) summed over the rows. dweight needs weight defined.
MU_DECLARE_KERNEL(layer_norm_backward, void(const Tensor& g, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                                            const Tensor& weight, const Tensor& dx, const Tensor& dweight,
                                            const Tensor& dbias, int64_t rows, int64_t n));

// x viewed as (outer, c, inner), channel k's values being x[o, k, i] for every o and i:
// (N, C, L) is (N, C, L) and channels-last (N, L, C) is (N·L, C, 1).
// training: save_mean and save_invstd (c) get the batch mean and 1 / sqrt(biased var +
// eps); the running statistics, when defined, move in place: r = (1 - momentum) r +
// momentum · batch value, the variance's being the unbiased estimate.
// Otherwise: save_mean is running_mean and save_invstd is 1 / sqrt(running_var + eps).
// Then y = (x - save_mean) * save_invstd * weight + bias, per channel.
MU_DECLARE_KERNEL(batch_norm_forward, void(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                           const Tensor& running_mean, const Tensor& running_var, const Tensor& y,
                                           const Tensor& save_mean, const Tensor& save_invstd, int64_t outer,
                                           int64_t c, int64_t inner, bool training, double momentum, double eps));
// dx, dweight and dbias from g, x and what the forward saved. training: the mean and
// variance depend on x, so dx carries their terms; otherwise dx = g · weight · invstd.
MU_DECLARE_KERNEL(batch_norm_backward, void(const Tensor& g, const Tensor& x, const Tensor& save_mean,
                                            const Tensor& save_invstd, const Tensor& weight, const Tensor& dx,
                                            const Tensor& dweight, const Tensor& dbias, int64_t outer, int64_t c,
                                            int64_t inner, bool training));

}  // namespace mu::kernels
