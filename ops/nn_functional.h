// Neural-network functions composed of (or fused from) the core ops.
#pragma once
#include "tensor/tensor.h"

namespace mu {

Tensor softmax(const Tensor& x, int64_t dim);
Tensor log_softmax(const Tensor& x, int64_t dim);

enum class Reduction { None, Mean, Sum };
// logits (N, C) or (C), integer targets (N) or (); as torch.nn.functional.cross_entropy:
// targets equal to ignore_index contribute nothing and are left out of the mean.
Tensor cross_entropy(const Tensor& logits, const Tensor& target, Reduction reduction = Reduction::Mean,
                     int64_t ignore_index = -100);
// Zeroes each element with probability p and scales the rest by 1/(1-p) when training;
// the identity otherwise. Draws from the global generator (seeded by manual_seed).
Tensor dropout(const Tensor& x, double p, bool training = true);

}  // namespace mu
