// The cuBLAS path of attention (ops/cuda/attention_gemm.cu), which attention.cu takes
// for long sequences before its tiled kernels. nvcc only.
#pragma once
#include "ops/kernels/attention.h"
#include "tensor/tensor.h"

namespace mu::cuda_kernels {

// True when the cuBLAS path should run this call (the forward, or with `backward` the
// backward): float32 or bfloat16, non-empty, D <= 128, scores of at least 128 x 128 per
// head (not the float32 forward), or as MUMOE_ATTENTION=gemm|tiled says; one head's
// scratch within the workspace cap.
bool attention_gemm_wanted(const Tensor& q, const Tensor& k, bool backward);
// The same contract as kernels::attention_forward / attention_backward.
void attention_forward_gemm(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                            const kernels::AttentionParams& params);
void attention_backward_gemm(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                             const Tensor& grad_out, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                             const kernels::AttentionParams& params);

}  // namespace mu::cuda_kernels
