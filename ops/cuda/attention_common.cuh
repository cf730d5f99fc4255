// What the CUDA attention paths share (ops/cuda/attention.cu's tiled kernels,
// attention_gemm.cu's cuBLAS path, attention_flash.cu's tensor-core kernels), so that
// they compute the same function: the dropout factor of one probability, the forward's
// online-softmax step, the backward's per-row terms, and the scratch slabs of a dQ summed
// over key tiles. nvcc only.
#pragma once
#include <cmath>
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

// exp in the math type (float32 or float64).
__device__ __forceinline__ float attention_exp(float x) { return expf(x); }
__device__ __forceinline__ double attention_exp(double x) { return exp(x); }

// One step of a row's online softmax, the row's scores of a key tile spread over a group
// of G consecutive lanes (G a power of two up to 32; every lane of the warp takes part):
// s holds this lane's N scores (-inf where masked) and becomes exp(s - shift); m and l,
// the row's running max and sum of exponentials (the same in every lane of the group),
// move on to include the tile. Returns exp(m_old - m_new), the factor by which the row's
// output sums must be rescaled. A NaN score is never taken as the max (as on the CPU); a
// row that has seen only masked keys keeps m = -inf, and its exps are taken against 0 so
// that no -inf - -inf appears. The tiled forward (attention.cu, 8 lanes a row) and the
// tensor-core one (attention_flash.cu, a warp a row) both take it.
template <int G, class W, int N>
__device__ __forceinline__ W online_softmax_step(W (&s)[N], W& m, W& l) {
  W mx = m;
#pragma unroll
  for (int n = 0; n < N; ++n) mx = s[n] > mx ? s[n] : mx;
#pragma unroll
  for (int w = 1; w < G; w *= 2) {
    const W other = __shfl_xor_sync(0xffffffffu, mx, w);
    mx = other > mx ? other : mx;
  }
  const W shift = mx == W(-INFINITY) ? W(0) : mx;
  const W alpha = attention_exp(m - shift);
  m = mx;
  W sum = 0;
#pragma unroll
  for (int n = 0; n < N; ++n) {
    s[n] = attention_exp(s[n] - shift);
    sum += s[n];
  }
#pragma unroll
  for (int w = 1; w < G; w *= 2) sum += __shfl_xor_sync(0xffffffffu, sum, w);
  l = l * alpha + sum;
  return alpha;
}

// Whether MUMOE_ATTENTION names `path` (cudnn, flash, tiled, gemm: benchmarks and tests
// force one path with it; unset, each call takes the first path that accepts it).
inline bool attention_path_forced(const char* path) {
  const char* choice = std::getenv("MUMOE_ATTENTION");
  return choice != nullptr && std::strcmp(choice, path) == 0;
}
inline bool attention_path_unset() { return std::getenv("MUMOE_ATTENTION") == nullptr; }

// A decoding step: at most 8 queries against more keys (a key-value cache one key longer
// every step). cuDNN leaves these to the tiled kernels (attention_cudnn.cu: it would build
// a plan per step), and so do the paths for long sequences: the tiled kernels take them
// all, reading a cache's keys and values in place.
inline bool attention_decoding_step(int64_t Tq, int64_t Tk) { return Tq <= 8 && Tq < Tk; }

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

// The scratch of a backward whose key-tile blocks also compute their share of dQ
// (attention.cu's fused tiled kernels, attention_flash.cu): key tile kt of head bh
// writes its partial dQ (rows of the queries it sees) to rows [first, rows) of its slab,
// the slabs of one head one after the other (under a causal mask each key tile's slab
// starts at its first query tile, which halves the scratch). rows is Tq, or Tq rounded up
// to a whole query tile for a kernel that stores whole tiles. Host and device code: the
// launch sizes it, the kernels index it.
struct DqSlabs {
  int64_t Tq, Tk;
  int BK, BQ;
  bool causal;
  int64_t rows;  // a slab's row extent, Tq <= rows
  __host__ __device__ int64_t first(int64_t kt) const {  // the key tile's first query row
    if (!causal) return 0;
    const int64_t q0 = kt * BK / BQ * BQ;
    return q0 < rows ? q0 : rows;
  }
  __host__ __device__ int64_t before(int64_t kt) const {  // rows of the slabs before kt's
    int64_t n = 0;
    for (int64_t t = 0; t < kt; ++t) n += rows - first(t);
    return n;
  }
  __host__ __device__ int64_t tiles() const { return (Tk + BK - 1) / BK; }
  __host__ __device__ int64_t per_head() const { return before(tiles()); }
};

// The slabs at most (GPT-2 124M, B 8, T 1024, causal: 214 MB of float32); larger calls
// take a path without them.
constexpr size_t kDqSlabsCap = size_t(1) << 30;

// dQ[bh][i][d] = scale · Σ_kt part_kt[i][d] over the key tiles that query i sees (under a
// causal mask those with first key <= i), in ascending kt: one thread per element, a
// fixed order, deterministic. Consecutive threads read consecutive d of one row of each
// slab: coalesced.
template <class T, class W>
__global__ void dq_sum_kernel(const W* __restrict__ dq_part, T* __restrict__ dq, DqSlabs slabs, int64_t BH, int D,
                              W scale) {
  const int64_t n = BH * slabs.Tq * D, per_head = slabs.per_head(), tiles = slabs.tiles();
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t bh = e / (slabs.Tq * D), i = e / D % slabs.Tq, d = e % D;
    const W* head = dq_part + bh * per_head * D;
    W sum = 0;
    int64_t row0 = 0;  // the slab's first row in the head's scratch
    for (int64_t kt = 0; kt < tiles; ++kt) {
      const int64_t first = slabs.first(kt);
      if (slabs.causal && kt * slabs.BK > i) break;  // this key tile and the later ones are after query i
      sum += head[(row0 + i - first) * D + d];
      row0 += slabs.rows - first;
    }
    dq[e] = cuda::narrow<T>(sum * scale);
  }
}

}  // namespace mu::cuda_kernels
