// Attention on the tensor cores, forward and backward, for bfloat16 and float32 at head
// dim 64 (ops/cuda/attention_flash.cu), which ops/cuda/attention.cu tries after cuDNN,
// before the cuBLAS path and its tiled kernels. nvcc only.
#pragma once
#include "ops/kernels/attention.h"
#include "tensor/tensor.h"

namespace mu::cuda_kernels {

// Runs the forward (kernels::attention_forward's contract) and returns true when it takes
// the call: bfloat16 or float32 q, k, v with D = 64 and at least 64 queries (fewer, as in
// decoding steps, would leave the tiles to padding), float32 lse, q, k and v 16-byte
// aligned, MUMOE_ATTENTION not naming the tiled or cuBLAS path; false, having done
// nothing, otherwise.
bool attention_forward_flash(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                             const kernels::AttentionParams& params);

// Runs the backward (kernels::attention_backward's contract) and returns true when it
// takes the call: bfloat16 or float32 q, k, v with D = 64, float32 lse, q, k, v and dO
// 16-byte aligned, dQ's scratch within kDqSlabsCap (attention_common.cuh),
// MUMOE_ATTENTION not naming the tiled or cuBLAS path; false, having done nothing,
// otherwise.
bool attention_backward_flash(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                              const Tensor& grad_out, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                              const kernels::AttentionParams& params);

}  // namespace mu::cuda_kernels
