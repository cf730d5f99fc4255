// The fused ring-contraction GEMM behind the TR μMoE layer's output (ops/ring_gemm.cpp).
#pragma once

#include "ops/dispatch.h"
#include "tensor/tensor.h"

namespace mu::kernels {

// out = A · w with A[m, s P + p] = Σ_r c[m, p, r] h[m, r, s]: each row of A is the matrix
// product c[m] · h[m] (P x S), laid out column by column (s-major). out: dense (M, N);
// c: dense (M, P, R); h: dense (M, R, S); w: dense (S P, N). Every tensor has the same
// floating dtype (float32, float64 or bfloat16) and device; R, P or S may be 0 (then out
// is 0). A is never whole in memory: the CUDA kernel forms each entry as the GEMM reads
// it, the CPU kernel a cache-sized block of rows at a time for its GEMM. Sums: float64 in
// float64; float32: A's entries in double on the CPU and float32 on CUDA, the GEMM in
// float32 (as matmul's); bfloat16: each entry of A summed in float32 and rounded to
// bfloat16 (as a bfloat16 product c[m] · h[m] would be stored), the GEMM summed in
// float32 and the result rounded to bfloat16 once.
MU_DECLARE_KERNEL(ring_gemm, void(const Tensor& out, const Tensor& c, const Tensor& h, const Tensor& w));

}  // namespace mu::kernels
