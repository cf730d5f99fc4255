// The tensor-core attention backwards, for bfloat16 (ops/cuda/attention_flash.cu) and for
// float32 at float32 accuracy (ops/cuda/attention_flash_f32.cu), which
// ops/cuda/attention.cu tries before the cuBLAS path and its tiled kernels. nvcc only.
#pragma once
#include "ops/kernels/attention.h"
#include "tensor/tensor.h"

namespace mu::cuda_kernels {

// Runs the backward (kernels::attention_backward's contract) and returns true when it
// takes the call: bfloat16 q, k, v with D = 64, float32 lse, every operand 16-byte
// aligned, MUMOE_ATTENTION not naming another path; false, having done nothing,
// otherwise.
bool attention_backward_flash(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                              const Tensor& grad_out, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                              const kernels::AttentionParams& params);

// The same for float32 q, k, v with D = 64 (float32 lse), every operand but dq 16-byte
// aligned, dQ's scratch within kDqSlabsCap, MUMOE_ATTENTION not naming the tiled or cuBLAS
// path; false, having done nothing, otherwise.
bool attention_backward_flash_f32(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                  const Tensor& lse, const Tensor& grad_out, const Tensor& dq, const Tensor& dk,
                                  const Tensor& dv, const kernels::AttentionParams& params);

}  // namespace mu::cuda_kernels
