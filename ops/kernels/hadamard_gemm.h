// The fused Hadamard-of-GEMMs kernel behind the CP μMoE layer (ops/hadamard_gemm.cpp).
#pragma once
#include <vector>

#include "ops/dispatch.h"
#include "tensor/tensor.h"

namespace mu::kernels {

// out = scale ∗ (a_0 · b_0) ∗ (a_1 · b_1) ∗ ... ∗ (a_{n-1} · b_{n-1}), ∗ elementwise.
// out: dense (M, R); a_k: dense (M, K_k); b_k: dense (K_k, R); scale: dense (M, R) or
// undefined (then 1). Every tensor has the same floating dtype (float32, float64 or
// bfloat16) and device; n >= 1; K_k may be 0 (an empty sum: that product is 0). The
// kernel never writes a product a_k · b_k to memory: each output tile's factors are
// multiplied as they are computed. Sums: float64 in float64; float32 in double on the CPU
// and in float32 on CUDA (as cuBLAS's float32 GEMM); bfloat16 in float32 on both, the
// result rounded to bfloat16 once; `out` may be the same tensor as `scale` (each
// element of scale is read only by the thread that writes that element of out).
MU_DECLARE_KERNEL(hadamard_gemm, void(const Tensor& out, const std::vector<Tensor>& a, const std::vector<Tensor>& b,
                                      const Tensor& scale));

}  // namespace mu::kernels
