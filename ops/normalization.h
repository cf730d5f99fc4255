// Fused normalisation ops: one forward kernel and one backward kernel each.
//
//   Tensor y = layer_norm(x, {768}, weight, bias);                      // F.layer_norm
//   Tensor z = batch_norm(x, running_mean, running_var, weight, bias,   // F.batch_norm
//                         /*training=*/true, /*momentum=*/0.1, /*eps=*/1e-5);
#pragma once
#include "tensor/tensor.h"

namespace mu {

// As torch.nn.functional.layer_norm: each sample's trailing dims named by
// normalized_shape are normalised by their mean and biased variance, then scaled by
// weight and shifted by bias (each of normalized_shape, or undefined for none).
// Differentiable in x, weight and bias.
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5);

// Where the channels of a batch_norm input lie. Said explicitly, never guessed from the
// shape: a (B, T, C) tensor with T == C would be ambiguous.
enum class ChannelLayout {
  First,  // torch's layout: (N, C) or (N, C, L...), channels at dim 1
  Last,   // channels-last: (N, C) or (N, L..., C), e.g. token-major (B, T, C)
};

// As torch.nn.functional.batch_norm, per channel over every other dim. training: the
// batch mean and biased variance normalise, and running_mean / running_var (both (C),
// or both undefined) move in place towards the batch mean and the unbiased variance by
// `momentum` (r = (1 - momentum) r + momentum · batch value). Otherwise the running
// statistics normalise and must be given. weight and bias are (C) or undefined.
// Differentiable in x, weight and bias; the running statistics are state, not inputs.
Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                  const Tensor& weight = Tensor(), const Tensor& bias = Tensor(), bool training = false,
                  double momentum = 0.1, double eps = 1e-5, ChannelLayout layout = ChannelLayout::First);

}  // namespace mu
