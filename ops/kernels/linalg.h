// The matrix-product kernel (ops/linalg.cpp).
#pragma once
#include "ops/dispatch.h"
#include "tensor/tensor.h"

namespace mu::kernels {

// out = a · b for two rank-2 (M x K, K x N) or two rank-3 (batch x M x K, batch x K x N)
// operands of one floating dtype; out is dense, a and b have in each matrix a unit stride
// along rows or columns (the op copies other layouts).
MU_DECLARE_KERNEL(matmul, void(const Tensor& out, const Tensor& a, const Tensor& b));

// out (M x N) = Σ_b a[b] · b[b] for rank-3 operands (batch x M x K, batch x K x N), with
// the same layouts as matmul's. Not every device has it: the op composes matmul and sum
// where it is missing.
MU_DECLARE_KERNEL(matmul_batch_sum, void(const Tensor& out, const Tensor& a, const Tensor& b));

// out = a · b + bias for rank-2 operands and a dense bias (N) of the same dtype (float32,
// float64 or bfloat16), the bias added to every row as out is stored (linear's forward);
// out dense. bfloat16: the bias added to the product's float32 sums, the total rounded
// once. Not every device has it: the op composes matmul and add where it is missing.
MU_DECLARE_KERNEL(matmul_bias, void(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& bias));

// out = a · b + bias 1ᵀ with matmul's operands (rank 2, or rank 3 for a batch) and a dense
// bias (M) of the same dtype, one value per row of every product, added as out is stored
// (matmul_row_bias's forward); out dense. bfloat16: the bias added to the product's
// float32 sums, the total rounded once. Not every device has it: the op composes matmul
// and add where it is missing.
MU_DECLARE_KERNEL(matmul_row_bias, void(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& bias));

// out (M x N, dense) += a · b for rank-2 operands with matmul's layouts: one GEMM that adds
// its product to what out holds (beta = 1), for a sum of products taken in pieces (the
// chunks of linear_cross_entropy). out has a's dtype, or float32 beside bfloat16 operands:
// the products then stay in float32 across the pieces instead of being rounded to
// bfloat16 at each. Not every device has it: linear_cross_entropy composes matmul and add
// where it is missing.
MU_DECLARE_KERNEL(matmul_accumulate, void(const Tensor& out, const Tensor& a, const Tensor& b));

}  // namespace mu::kernels
