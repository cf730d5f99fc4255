// What both CUDA attention paths share (ops/cuda/attention.cu's tiled kernels and
// ops/cuda/attention_gemm.cu's cuBLAS path), so that they compute the same function:
// the dropout factor of one probability, and the backward's per-row terms. nvcc only.
#pragma once
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

#include "ops/cuda/dtypes.cuh"
#include "ops/cuda/packs.cuh"
#include "ops/kernels/attention.h"

namespace mu::cuda_kernels {

// The dropout factor of query i, key j of head bh (ops/kernels/attention.h's mask): 0
// when dropped, `keep` (1 / (1 - p)) when kept.
template <class W>
__device__ __forceinline__ W attention_keep_factor(uint64_t key, uint64_t threshold, W keep, int64_t bh, int64_t Tq,
                                                   int64_t Tk, int64_t i, int64_t j) {
  const uint64_t n = (uint64_t(bh) * uint64_t(Tq) + uint64_t(i)) * uint64_t(Tk) + uint64_t(j);
  return uint64_t(kernels::attention_dropout_bits(key, n)) >= threshold ? keep : W(0);
}

// Whether MUMOE_ATTENTION names `path` (cudnn, flash, tiled, gemm: benchmarks and tests
// force one path with it; unset, each call takes the first path that accepts it).
inline bool attention_path_forced(const char* path) {
  const char* choice = std::getenv("MUMOE_ATTENTION");
  return choice != nullptr && std::strcmp(choice, path) == 0;
}
inline bool attention_path_unset() { return std::getenv("MUMOE_ATTENTION") == nullptr; }

// Whether every tensor's data start on 16 bytes (kernels that move rows as 16-byte vectors).
// A template on the tensor type only so that the host emulation runs it on its own.
template <class TensorT>
bool attention_aligned16(std::initializer_list<const TensorT*> ts) {
  for (const TensorT* t : ts)
    if (!cuda::aligned16(t->raw_data())) return false;
  return true;
}

// What the tensor-core paths' kernels (attention_gemm.cu's row kernels, attention_flash.cu)
// need to know about a call.
struct AttentionGeo {
  int64_t Tq, Tk;
  int64_t bh0;  // the first (batch · head) a launch sees: the dropout counter's offset
  float scale;
  bool causal, dropout;
  uint64_t key, threshold;  // the dropout mask (ops/kernels/attention.h)
  float keep;               // 1 / (1 - p) for a kept entry
};

inline AttentionGeo attention_geo(int64_t Tq, int64_t Tk, const kernels::AttentionParams& p) {
  AttentionGeo g{};
  g.Tq = Tq;
  g.Tk = Tk;
  g.scale = float(p.scale);
  g.causal = p.causal;
  g.dropout = p.dropout_p > 0;
  g.key = kernels::attention_dropout_key(p.seed);
  g.threshold = kernels::attention_dropout_threshold(p.dropout_p);
  g.keep = p.dropout_p < 1 ? float(1 / (1 - p.dropout_p)) : 0.f;
  return g;
}

// di[r] = dO_r · O_r for every row r of every head, and, when lse and lw are given,
// lw[r] = lse[r] widened: one warp per row, lanes striding over D, a shuffle sum at the end.
template <class T, class W, class L>
__global__ void __launch_bounds__(256)
    attention_row_terms_kernel(const T* __restrict__ dout, const T* __restrict__ out, const L* __restrict__ lse,
                               W* __restrict__ di, W* __restrict__ lw, int64_t rows, int D) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  for (int64_t r = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; r < rows; r += warps) {
    W s = 0;
    for (int d = lane; d < D; d += 32) s += W(cuda::widen(dout[r * D + d])) * W(cuda::widen(out[r * D + d]));
#pragma unroll
    for (int w = 16; w > 0; w /= 2) s += __shfl_xor_sync(0xffffffffu, s, w);
    if (lane == 0) {
      di[r] = s;
      if (lw != nullptr) lw[r] = W(lse[r]);
    }
  }
}

}  // namespace mu::cuda_kernels
