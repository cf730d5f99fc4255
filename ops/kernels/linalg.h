// The matrix-product kernel (ops/linalg.cpp).
#pragma once
#include "ops/dispatch.h"
#include "tensor/tensor.h"

namespace mu::kernels {

// out = a · b for two rank-2 (M x K, K x N) or two rank-3 (batch x M x K, batch x K x N)
// operands of one floating dtype; out is dense, a and b have in each matrix a unit stride
// along rows or columns (the op copies other layouts).
MU_DECLARE_KERNEL(matmul, void(const Tensor& out, const Tensor& a, const Tensor& b));

}  // namespace mu::kernels
