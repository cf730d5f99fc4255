// Matrix products. matmul follows torch.matmul: 1-D operands are promoted and the
// added dim removed; batch dims broadcast.
#pragma once
#include "tensor/tensor.h"

namespace mu {

Tensor matmul(const Tensor& a, const Tensor& b);
Tensor mm(const Tensor& a, const Tensor& b);   // (M,K) @ (K,N)
Tensor bmm(const Tensor& a, const Tensor& b);  // (B,M,K) @ (B,K,N)

// torch.nn.functional.linear: x (..., in) · wᵀ + b for w (out, in) and b (out) or
// undefined. On the CPU, in float32 and float64, the bias is added as the product is
// stored (one pass over the output, not two) and one node computes all three gradients;
// elsewhere (a CUDA tensor, autocast's bfloat16) it is matmul(x, wᵀ) + b.
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b = Tensor());

}  // namespace mu
