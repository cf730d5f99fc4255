// The grouped matrix-product kernels (ops/grouped_mm.cpp): one GEMM per group of rows,
// all groups in one kernel call.
#pragma once
#include <cstdint>
#include <vector>

#include "ops/dispatch.h"
#include "tensor/tensor.h"

namespace mu::kernels {

// What both kernels may assume of their operands (ops/grouped_mm.cpp ensures it): one
// floating dtype (float32, float64 or bfloat16) and one device; offsets has G + 1
// entries, offsets[0] = 0, non-decreasing, offsets[G] = M. Each matrix of x, dy and w
// (the last two dims) has a unit stride along its rows or its columns, with the other
// stride at least the matching extent (a layout BLAS can read as it is); w's stride
// between groups is free (0 too). Outputs are dense and overlap no input.

// out (M, N) rows offsets[g] .. offsets[g+1] = x (M, K) rows offsets[g] .. offsets[g+1]
// · w[g] (G, K, N). K == 0 gives zeros.
MU_DECLARE_KERNEL(grouped_mm, void(const Tensor& out, const Tensor& x, const Tensor& w,
                                   const std::vector<int64_t>& offsets));

// The weight gradient: dw[g] (G, K, N) = x_gᵀ · dy_g, x_g and dy_g the rows
// offsets[g] .. offsets[g+1] of x (M, K) and dy (M, N). An empty group gets zeros.
MU_DECLARE_KERNEL(grouped_mm_weight_grad, void(const Tensor& dw, const Tensor& x, const Tensor& dy,
                                               const std::vector<int64_t>& offsets));

}  // namespace mu::kernels
