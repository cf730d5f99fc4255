// The grouped matrix product behind sparse Mixture-of-Experts execution: the tokens are
// sorted by expert, and each expert's contiguous block of rows is multiplied by that
// expert's own weight matrix, as one op (one kernel call) rather than one product per
// expert.
#pragma once
#include <cstdint>
#include <vector>

#include "tensor/tensor.h"

namespace mu {

// y[offsets[g]:offsets[g+1]] = x[offsets[g]:offsets[g+1]] · w[g]  for g = 0 .. G-1.
// x (M, K) and w (G, K, N), any strides (a transposed view such as w.transpose(1, 2)
// included); offsets: G + 1 host integers with offsets[0] = 0, non-decreasing,
// offsets[G] = M. Groups may be empty (no rows: their part of dw is zero). Returns (M, N).
// float32, float64 or bfloat16 (summed in float32, rounded once), both operands of one
// dtype and on one device; float32 runs in bfloat16 under autocast, as matmul does.
// Differentiable in x and w.
Tensor grouped_mm(const Tensor& x, const Tensor& w, const std::vector<int64_t>& offsets);

}  // namespace mu
