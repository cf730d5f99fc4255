// The dropout mask kernel (ops/nn_functional.cpp). The mask is a pure function of a seed
// and each element's position, drawn with the counter-based hash of attention's dropout
// (ops/kernels/attention.h): the same seed gives the same mask on every device, in any
// thread order, and no state but the seed is needed to draw it again.
#pragma once
#include <cstdint>

#include "ops/dispatch.h"
#include "ops/kernels/attention.h"
#include "tensor/tensor.h"

namespace mu::kernels {

// mask (dense, floating) element i = scale when attention_dropout_bits(
// attention_dropout_key(seed), i) >= threshold (element i kept), 0 otherwise.
MU_DECLARE_KERNEL(dropout_mask, void(const Tensor& mask, uint64_t seed, uint64_t threshold, double scale));

}  // namespace mu::kernels
