// Neural-network functions composed of (or fused from) the core ops.
#pragma once
#include "ops/loss.h"  // cross_entropy and Reduction, which lived here before
#include "tensor/tensor.h"

namespace mu {

Tensor softmax(const Tensor& x, int64_t dim);
Tensor log_softmax(const Tensor& x, int64_t dim);

// Zeroes each element with probability p and scales the rest by 1/(1-p) when training;
// the identity otherwise. Draws the mask from `gen`, or from the global generator (seeded
// by manual_seed) when it is null.
Tensor dropout(const Tensor& x, double p, bool training = true, Generator* gen = nullptr);

}  // namespace mu
