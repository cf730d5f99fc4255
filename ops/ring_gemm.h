// The fused output of the TR μMoE layer: the GEMM whose left operand is a per-row ring
// contraction, formed as the GEMM reads it and never stored.
#pragma once

#include "tensor/tensor.h"

namespace mu {

// out[m, n] = Σ_{s, p} (c[m] · h[m])[p, s] · w[s P + p, n], for c (M, P, R), h (M, R, S),
// w (S P, N): each row's (P, S) product c[m] · h[m], flattened column by column (s-major),
// times w. All float32, float64 or bfloat16 on one device (float32 runs in bfloat16 under
// autocast, as matmul does). Differentiable in every input; the backward recomputes the
// products c[m] · h[m] (one batched matmul) rather than keeping them from the forward.
//
// In the TR μMoE layer c is the chain of the coefficient-contracted expert cores
// (B, R_1, R_{E+1}), h the input-contracted core (B, R_{E+1}, R_{E+2}) and w the output core
// U_O (R_{E+2}, O, R_1) as the matrix (R_{E+2} R_1, O): y = ring_gemm(c, h, w).
Tensor ring_gemm(const Tensor& c, const Tensor& h, const Tensor& w);

}  // namespace mu
