// The fused core of the CP μMoE layer: a Hadamard product of matrix products, computed
// without writing any of the products to memory (the kernel multiplies each output
// tile's factors as it computes them).
#pragma once
#include <vector>

#include "tensor/tensor.h"

namespace mu {

// scale ∗ (a_0 · b_0) ∗ ... ∗ (a_{n-1} · b_{n-1}) for a_k (M, K_k), b_k (K_k, R), ∗
// elementwise; scale (M, R), or undefined for none. n >= 1; all float32, float64 or
// bfloat16 on one device (float32 runs in bfloat16 under autocast, as matmul does).
// Differentiable in every input.
Tensor hadamard_gemm(const std::vector<Tensor>& a, const std::vector<Tensor>& b, const Tensor& scale = Tensor());

// The CP μMoE layer's core h = (z · U_in) ∗ (a_1 · U_1) ∗ ... ∗ (a_E · U_E), shape (M, R),
// for z (M, I), U_in (I, R), a_e (M, N_e), U_e (N_e, R); the layer's output is h · U_outᵀ.
Tensor cp_hadamard(const Tensor& z, const Tensor& u_in, const std::vector<Tensor>& a, const std::vector<Tensor>& u);

}  // namespace mu
