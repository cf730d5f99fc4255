// Matrix products. matmul follows torch.matmul: 1-D operands are promoted and the
// added dim removed; batch dims broadcast.
#pragma once
#include "tensor/tensor.h"

namespace mu {

Tensor matmul(const Tensor& a, const Tensor& b);
Tensor mm(const Tensor& a, const Tensor& b);   // (M,K) @ (K,N)
Tensor bmm(const Tensor& a, const Tensor& b);  // (B,M,K) @ (B,K,N)

}  // namespace mu
