// The cuBLAS path of attention (ops/cuda/attention_gemm.cu), which attention.cu takes
// for long sequences before its tiled kernels. nvcc only.
#pragma once
#include "ops/kernels/attention.h"
#include "tensor/tensor.h"

namespace mu::cuda_kernels {

// True when the cuBLAS path should run this call: float32 or bfloat16, non-empty, scores
// of at least 128 x 128 per head (or as MUMOE_ATTENTION=gemm|tiled says), and one head's
// scratch within the workspace cap.
bool attention_gemm_wanted(const Tensor& q, const Tensor& k);
// The same contract as kernels::attention_forward / attention_backward.
void attention_forward_gemm(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                            const kernels::AttentionParams& params);
void attention_backward_gemm(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                             const Tensor& grad_out, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                             const kernels::AttentionParams& params);

}  // namespace mu::cuda_kernels
