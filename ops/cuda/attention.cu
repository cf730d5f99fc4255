// CUDA kernels of fused scaled dot-product attention (declared in ops/kernels/attention.h;
// the CPU twins are in ops/cpu/attention.cpp), flash-attention style: no T x T matrix is
// ever stored.
//
// Thread mapping, shared by every kernel here: a block of 128 threads seen as 16 x 8
// (ty = tid / 8, tx = tid % 8; the 8 threads of one ty are 8 consecutive lanes of a warp).
// A score tile of R x C entries (R rows, C columns) is held in registers: thread (ty, tx)
// owns rows ty + 16 a (a < R / 16) and columns tx + 8 b (b < C / 8). A per-row reduction
// is a shuffle across the 8 lanes of one ty. An R x D accumulator (output, dQ, dK, dV) is
// held the same way: rows ty + 16 a, columns d = tx + 8 c (c < DC, D <= 8 DC).
// Operand tiles (rows of q, k, v, dO) are staged in shared memory, widened to the math
// type W (float for float32 and bfloat16, double for float64), with an odd row stride so
// that the 8 threads reading 8 different rows at one d hit 8 different banks.
//
// The vector variant (V4: float32 tensors, D = 64, data on 16 bytes) loads its tiles from
// global memory 16 bytes at a time with no index division, and reads shared memory 16
// bytes at a time: row strides of D + 4 floats (rows 16 bytes apart modulo 128: 8 rows,
// 8 different bank groups), dot products over d four at a time, and accumulator columns
// d = 32 (c / 4) + 4 tx + c % 4, so that a thread's 4 consecutive columns are one vector.
// Its forward holds 64-query and 64-key tiles, 4 x 8 scores per thread: 12 vector loads
// feed 128 multiply-adds, where the scalar variant spends one load per two. Its backward
// keeps 64 rows and walks 32 at a time (64 and 64 measured slower: 2 blocks per SM).
//
// Forward: one block per (b·h, tile of BQ queries). It walks the key tiles (BK keys, up
// to the diagonal when causal), computes the scaled scores, keeps per query a running max
// m and sum l of exp(s - m) (rescaling l and the output by exp(m_old - m_new) when the
// max rises), applies the dropout mask, and adds P·V into the output. It writes out / l
// and lse = m + log l.
//
// Backward: a first kernel computes Di = dO_i · O_i and widens lse, one warp per row. Then
// dK and dV come from one block per (b·h, key tile) walking the query tiles; it recomputes
// P = exp(S - L) and dS = P ∘ (dP - Di) (dropout: Pd ∘ dP - P Di) and, holding dS and K,
// also its key tile's share of dQ = dS K, written to a scratch slab of its own; a last
// kernel sums each query's shares in key-tile order. That is 5 tile products per (key
// tile, query tile) pair. Where the slabs would not fit kDqSlabsCap (or with
// MUMOE_ATTENTION_DQ=separate) dQ comes instead from one block per (b·h, query tile)
// walking the key tiles, which recomputes S and dP (7 products in all). Every gradient
// element is summed by one thread in a fixed order: deterministic, no atomics.
//
// The entry points offer each call first to cuDNN (attention_cudnn.cu: bfloat16 without
// dropout), then, at D = 64, to the tensor-core kernels (attention_flash.cu, bfloat16 and
// float32; the forward from 64 queries on), then to the cuBLAS path (attention_gemm.cu,
// long sequences), and run the rest here.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "ops/cuda/attention_common.cuh"
#include "ops/cuda/attention_flash.cuh"
#include "ops/cuda/attention_gemm.cuh"
#include "ops/cuda/dtypes.cuh"
#include "ops/cuda/runtime.cuh"
#include "ops/kernels/attention.h"

namespace mu::cuda_kernels {

#ifdef MUMOE_CUDNN
// ops/cuda/attention_cudnn.cu: forward and backward through cuDNN when it supports the call
// (true), else false and nothing done.
bool attention_forward_cudnn(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                             const kernels::AttentionParams& params);
bool attention_backward_cudnn(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                              const Tensor& grad_out, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                              const kernels::AttentionParams& params);
#endif

namespace {

using cuda::narrow;
using cuda::wide_t;
using cuda::widen;

constexpr int kThreads = 128;  // 16 x 8, see the header
constexpr int kMaxD = 128;     // head dims beyond it are refused (accumulators are registers)

// ---------------------------------------------------------------- the dropout mask

// attention_dropout_bits (ops/kernels/attention.h) is host and device code: CPU and CUDA
// draw the same mask (through attention_keep_factor, ops/cuda/attention_common.cuh).

// The log-sum-exps' type: float32 for bfloat16 inputs (ops/kernels/attention.h), T else.
template <class T>
using lse_t = std::conditional_t<std::is_same_v<T, cuda::bf16>, float, T>;

// What every kernel needs to know about a call.
template <class W>
struct Geo {
  int64_t BH, Tq, Tk;
  int64_t k_head, v_head;  // elements from one head of k (of v) to the next: Tk D, or a cache's stride (forward)
  int D, ld;          // head dim; row stride of the shared-memory operand tiles (odd)
  W scale;
  bool causal, dropout;
  uint64_t key, threshold;  // attention_dropout_key(seed); bits below threshold are dropped
  W keep;                   // 1 / (1 - p) for a kept element (0 for p = 1)
};

__device__ __forceinline__ float log_w(float x) { return logf(x); }
__device__ __forceinline__ double log_w(double x) { return log(x); }

// The dropout factor of query i, key j of head bh: 0 when dropped, keep when kept.
template <class W>
__device__ __forceinline__ W dropout_factor(const Geo<W>& g, int64_t bh, int64_t i, int64_t j) {
  return attention_keep_factor(g.key, g.threshold, g.keep, bh, g.Tq, g.Tk, i, j);
}

// ---------------------------------------------------------------- tile helpers

// dst[r * ld + d] = factor * src[(row0 + r) * D + d] for r < valid, zeros for valid <= r <
// rows (whole rows read contiguously by consecutive threads: coalesced).
template <class T, class W>
__device__ void load_rows(W* dst, const T* src, int64_t row0, int valid, int rows, const Geo<W>& g, W factor) {
  const int n = rows * g.D;
  for (int e = threadIdx.x; e < n; e += kThreads) {
    const int r = e / g.D, d = e - r * g.D;
    dst[r * g.ld + d] = r < valid ? W(widen(src[(row0 + r) * g.D + d])) * factor : W(0);
  }
}

// load_rows for the vector variant (float, D = 64, ld = 68, src 16-byte aligned): one
// 16-byte load and store per 4 elements, no division (16 vectors per row).
__device__ __forceinline__ void load_rows_v4(float* dst, const float* src, int64_t row0, int valid, int rows,
                                             float factor) {
  const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int e = threadIdx.x; e < rows * 16; e += kThreads) {
    const int r = e >> 4, d = (e & 15) * 4;
    float4 x = zero;
    if (r < valid) {
      x = *reinterpret_cast<const float4*>(src + (row0 + r) * 64 + d);
      x.x *= factor;
      x.y *= factor;
      x.z *= factor;
      x.w *= factor;
    }
    *reinterpret_cast<float4*>(dst + r * 68 + d) = x;
  }
}

// The tile load of the variant V4 names.
template <bool V4, class T, class W>
__device__ __forceinline__ void load_tile(W* dst, const T* src, int64_t row0, int valid, int rows, const Geo<W>& g,
                                          W factor) {
  if constexpr (V4) load_rows_v4(dst, src, row0, valid, rows, factor);
  else load_rows(dst, src, row0, valid, rows, g, factor);
}

// acc[a][b] = X_row(ty + 16a) · Y_row(tx + 8b) over D, X and Y tiles with row stride ld.
template <class W, int RA, int RB>
__device__ __forceinline__ void tile_dot(const W* X, const W* Y, int D, int ld, W (&acc)[RA][RB]) {
  const int ty = threadIdx.x / 8, tx = threadIdx.x % 8;
#pragma unroll
  for (int a = 0; a < RA; ++a)
#pragma unroll
    for (int b = 0; b < RB; ++b) acc[a][b] = 0;
  for (int d = 0; d < D; ++d) {
    W x[RA], y[RB];
#pragma unroll
    for (int a = 0; a < RA; ++a) x[a] = X[(ty + 16 * a) * ld + d];
#pragma unroll
    for (int b = 0; b < RB; ++b) y[b] = Y[(tx + 8 * b) * ld + d];
#pragma unroll
    for (int a = 0; a < RA; ++a)
#pragma unroll
      for (int b = 0; b < RB; ++b) acc[a][b] += x[a] * y[b];
  }
}

// The accumulator column c of thread tx: tx + 8c, or in the vector variant 32 (c / 4) +
// 4 tx + c % 4 (D = 64, DC = 8).
template <bool V4>
__device__ __forceinline__ int acc_col(int c) {
  const int tx = threadIdx.x % 8;
  return V4 ? 32 * (c / 4) + 4 * tx + c % 4 : tx + 8 * c;
}

// tile_dot with 16-byte loads: D a multiple of 4, ld a multiple of 4, X and Y 16-byte aligned.
template <int RA, int RB>
__device__ __forceinline__ void tile_dot_v4(const float* X, const float* Y, int D, int ld, float (&acc)[RA][RB]) {
  const int ty = threadIdx.x / 8, tx = threadIdx.x % 8;
#pragma unroll
  for (int a = 0; a < RA; ++a)
#pragma unroll
    for (int b = 0; b < RB; ++b) acc[a][b] = 0;
  for (int d = 0; d < D; d += 4) {
    float4 x[RA], y[RB];
#pragma unroll
    for (int a = 0; a < RA; ++a) x[a] = *reinterpret_cast<const float4*>(X + (ty + 16 * a) * ld + d);
#pragma unroll
    for (int b = 0; b < RB; ++b) y[b] = *reinterpret_cast<const float4*>(Y + (tx + 8 * b) * ld + d);
#pragma unroll
    for (int a = 0; a < RA; ++a)
#pragma unroll
      for (int b = 0; b < RB; ++b)
        acc[a][b] += x[a].x * y[b].x + x[a].y * y[b].y + x[a].z * y[b].z + x[a].w * y[b].w;
  }
}

// tile_acc with 16-byte loads, D = 64 (DC = 8, columns acc_col<true>): P rows are read
// four entries at a time, so n is rounded up to 4; the entries past n up to the tile's
// width must be zeros (every kernel here writes its P and dS tiles whole, unseen entries
// 0, and zero-fills the padding rows of Z).
template <int RA>
__device__ __forceinline__ void tile_acc_v4(const float* P, int ldp, int n, const float* Z, int ldz,
                                            float (&acc)[RA][8]) {
  const int ty = threadIdx.x / 8, tx = threadIdx.x % 8;
  for (int j = 0; j < n; j += 4) {
    float4 p[RA];
#pragma unroll
    for (int a = 0; a < RA; ++a) p[a] = *reinterpret_cast<const float4*>(P + (ty + 16 * a) * ldp + j);
#pragma unroll
    for (int jj = 0; jj < 4; ++jj) {
      const float4 z0 = *reinterpret_cast<const float4*>(Z + (j + jj) * ldz + 4 * tx);
      const float4 z1 = *reinterpret_cast<const float4*>(Z + (j + jj) * ldz + 32 + 4 * tx);
#pragma unroll
      for (int a = 0; a < RA; ++a) {
        const float pa = jj == 0 ? p[a].x : jj == 1 ? p[a].y : jj == 2 ? p[a].z : p[a].w;
        acc[a][0] += pa * z0.x;
        acc[a][1] += pa * z0.y;
        acc[a][2] += pa * z0.z;
        acc[a][3] += pa * z0.w;
        acc[a][4] += pa * z1.x;
        acc[a][5] += pa * z1.y;
        acc[a][6] += pa * z1.z;
        acc[a][7] += pa * z1.w;
      }
    }
  }
}

// acc[a][c] += sum_{j < n} P[ty + 16a][j] · Z[j][tx + 8c], for columns tx + 8c < D; P has
// row stride ldp (held transposed with PT: P[i][j] at j * ldp + i), Z row stride ldz.
template <class W, int RA, int DC, bool PT = false>
__device__ __forceinline__ void tile_acc(const W* P, int ldp, int n, const W* Z, int ldz, int D, W (&acc)[RA][DC]) {
  const int ty = threadIdx.x / 8, tx = threadIdx.x % 8;
  for (int j = 0; j < n; ++j) {
    W p[RA];
#pragma unroll
    for (int a = 0; a < RA; ++a) p[a] = PT ? P[j * ldp + ty + 16 * a] : P[(ty + 16 * a) * ldp + j];
#pragma unroll
    for (int c = 0; c < DC; ++c) {
      const int d = tx + 8 * c;
      if (d < D) {
        const W z = Z[j * ldz + d];
#pragma unroll
        for (int a = 0; a < RA; ++a) acc[a][c] += p[a] * z;
      }
    }
  }
}

// The two products of every kernel, in the variant V4 names.
template <bool V4, class W, int RA, int RB>
__device__ __forceinline__ void dot_tiles(const W* X, const W* Y, int D, int ld, W (&acc)[RA][RB]) {
  if constexpr (V4) tile_dot_v4(X, Y, D, ld, acc);
  else tile_dot(X, Y, D, ld, acc);
}
template <bool V4, class W, int RA, int DC>
__device__ __forceinline__ void acc_tiles(const W* P, int ldp, int n, const W* Z, int ldz, int D,
                                          W (&acc)[RA][DC]) {
  if constexpr (V4) tile_acc_v4(P, ldp, (n + 3) / 4 * 4, Z, ldz, acc);
  else tile_acc(P, ldp, n, Z, ldz, D, acc);
}

// The fused dQ of the dK/dV blocks: acc[a][c] += sum_{j < n} dS[i][j] · K[j][d] with dS
// held transposed (Pt[j * ldp + i], as the dK/dV blocks keep it). The vector variant
// (D = 64, 32 query rows) gives thread (r, cx) = (tid / 16, tid % 16) rows 4r .. 4r + 3 and
// columns 4cx .. 4cx + 3, so that both operands are read 16 bytes at a time (one vector
// of dSᵀ, four queries, and one of K, four dims, feed 16 multiply-adds); the scalar one
// is tile_acc on the transposed tile (rows ty + 16a, columns tx + 8c).
template <int RQ>
__device__ __forceinline__ void dq_acc_v4(const float* Pt, int ldp, int n, const float* Z, int ldz,
                                          float (&acc)[4][4]) {
  static_assert(RQ == 2, "the vector variant's dK/dV blocks walk 32 queries");
  const int r = threadIdx.x / 16, cx = threadIdx.x % 16;
  for (int j = 0; j < n; ++j) {
    const float4 p = *reinterpret_cast<const float4*>(Pt + j * ldp + 4 * r);
    const float4 z = *reinterpret_cast<const float4*>(Z + j * ldz + 4 * cx);
    const float pe[4] = {p.x, p.y, p.z, p.w}, ze[4] = {z.x, z.y, z.z, z.w};
#pragma unroll
    for (int e = 0; e < 4; ++e)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[e][c] += pe[e] * ze[c];
  }
}

// ---------------------------------------------------------------- forward

// One block per (bh, query tile); tiles in reverse order, so that the long causal tiles
// start first. Shared memory: Q (BQ rows, scaled), K and V (BK rows each), P (BQ x BK).
template <class T, class W, int BQ, int BK, int DC, bool V4>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, T* __restrict__ out,
                   lse_t<T>* __restrict__ lse, Geo<W> g) {
  constexpr int RA = BQ / 16, RB = BK / 8, LDP = V4 ? BK + 4 : BK + 1;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  W* Qs = reinterpret_cast<W*>(smem_raw);
  W* Ks = Qs + BQ * g.ld;
  W* Vs = Ks + BK * g.ld;
  W* Ps = Vs + BK * g.ld;
  const int ty = threadIdx.x / 8, tx = threadIdx.x % 8;
  const W inf = W(INFINITY);  // a builtin, usable on the device

  const int64_t nq = (g.Tq + BQ - 1) / BQ;
  const int64_t bh = int64_t(blockIdx.x) % g.BH, q0 = (nq - 1 - int64_t(blockIdx.x) / g.BH) * BQ;
  const int qv = int(g.Tq - q0 < BQ ? g.Tq - q0 : BQ);
  const T* kh = k + bh * g.k_head;
  const T* vh = v + bh * g.v_head;
  load_tile<V4>(Qs, q + bh * g.Tq * g.D, q0, qv, BQ, g, g.scale);

  W m[RA], l[RA], o[RA][DC];
#pragma unroll
  for (int a = 0; a < RA; ++a) {
    m[a] = -inf;
    l[a] = 0;
#pragma unroll
    for (int c = 0; c < DC; ++c) o[a][c] = 0;
  }

  // Causal: keys past the tile's last query are masked for every query in it.
  const int64_t kend = g.causal ? (q0 + qv < g.Tk ? q0 + qv : g.Tk) : g.Tk;
  for (int64_t k0 = 0; k0 < kend; k0 += BK) {
    const int kv = int(kend - k0 < BK ? kend - k0 : BK);
    __syncthreads();  // the previous tile's K, V and P are no longer read
    load_tile<V4>(Ks, kh, k0, kv, BK, g, W(1));
    load_tile<V4>(Vs, vh, k0, kv, BK, g, W(1));
    __syncthreads();

    W s[RA][RB];
    dot_tiles<V4>(Qs, Ks, g.D, g.ld, s);
#pragma unroll
    for (int a = 0; a < RA; ++a) {
      const int64_t i = q0 + ty + 16 * a;
      // Padding keys, and keys after query i when causal, are -inf: they add exp(-inf) = 0.
#pragma unroll
      for (int b = 0; b < RB; ++b) {
        const int j = tx + 8 * b;
        if (j >= kv || (g.causal && k0 + j > i)) s[a][b] = -inf;
      }
      const W alpha = online_softmax_step<8>(s[a], m[a], l[a]);  // s[a] becomes exp(s - shift)
#pragma unroll
      for (int c = 0; c < DC; ++c) o[a][c] *= alpha;
      // The denominator counts every key; the output only the kept ones.
#pragma unroll
      for (int b = 0; b < RB; ++b) {
        const int j = tx + 8 * b;
        W p = s[a][b];
        if (g.dropout && j < kv) p *= dropout_factor(g, bh, i, k0 + j);
        Ps[(ty + 16 * a) * LDP + j] = p;
      }
    }
    __syncthreads();  // P complete
    acc_tiles<V4>(Ps, LDP, kv, Vs, g.ld, g.D, o);
  }

  T* oh = out + bh * g.Tq * g.D;
#pragma unroll
  for (int a = 0; a < RA; ++a) {
    const int r = ty + 16 * a;
    if (r >= qv) continue;
    // l == 0 only without keys (Tk == 0): the output is 0 (an empty sum), lse is -inf.
    const W inv = l[a] > 0 ? W(1) / l[a] : W(0);
#pragma unroll
    for (int c = 0; c < DC; ++c) {
      const int d = acc_col<V4>(c);
      if (d < g.D) oh[(q0 + r) * g.D + d] = narrow<T>(o[a][c] * inv);
    }
    if (tx == 0) lse[bh * g.Tq + q0 + r] = lse_t<T>(l[a] > 0 ? m[a] + log_w(l[a]) : -inf);
  }
}

// ---------------------------------------------------------------- backward

// P (after the dropout mask: pd) and dS of query i, key j from the scaled score s and
// dP = dO_i · V_j, or zeros when key j is not seen by query i. Both backward kernels use
// it, so they agree on every entry.
template <class W>
__device__ __forceinline__ void grad_entry(const Geo<W>& g, int64_t bh, int64_t i, int64_t j, bool seen, W s, W dp,
                                           W L, W Di, W& pd, W& ds) {
  if (!seen) {
    pd = 0;
    ds = 0;
    return;
  }
  const W p = attention_exp(s - L);
  if (g.dropout) {
    // dS = P ∘ (dP ∘ M / (1 - p) - Di) = Pd ∘ dP - P Di, with Pd = P ∘ M / (1 - p).
    pd = p * dropout_factor(g, bh, i, j);
    ds = pd * dp - p * Di;
  } else {
    pd = p;
    ds = p * (dp - Di);
  }
}

// dK and dV of one key tile: one block per (bh, key tile of BK keys), walking the query
// tiles (from the one holding the tile's first key when causal). Key tiles in ascending
// order, so that the long causal tiles start first: the first key tile sees every query,
// the last only the last queries (started last, the long tiles left a tail of a few busy
// SMs: a list schedule of GPT-2's 1536 blocks on 264 to 396 resident ones ends 12-18 %
// later shortest-first than longest-first). The tile is transposed:
// rows are keys, columns queries. Shared memory: K, V (BK rows), Q (scaled) and dO (BQ
// rows), Pdᵀ and dSᵀ (BK x BQ), L and Di of the query tile. dK = scale dSᵀ Q is summed
// against the scaled Q directly.
template <class T, class W, int BK, int BQ, int DC, bool V4, bool FUSED>
__global__ void __launch_bounds__(kThreads)
    dkdv_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, const T* __restrict__ dout,
                const W* __restrict__ lw, const W* __restrict__ di, T* __restrict__ dk, T* __restrict__ dv,
                W* __restrict__ dq_part, DqSlabs slabs, Geo<W> g) {
  constexpr int RA = BK / 16, RB = BQ / 8, LDT = V4 ? BQ + 4 : BQ + 1;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  W* Ks = reinterpret_cast<W*>(smem_raw);
  W* Vs = Ks + BK * g.ld;
  W* Qs = Vs + BK * g.ld;
  W* dOs = Qs + BQ * g.ld;
  W* Pt = dOs + BQ * g.ld;
  W* dSt = Pt + BK * LDT;
  W* Ls = dSt + BK * LDT;
  W* Dis = Ls + BQ;
  const int ty = threadIdx.x / 8, tx = threadIdx.x % 8;

  const int64_t bh = int64_t(blockIdx.x) % g.BH, k0 = int64_t(blockIdx.x) / g.BH * BK;
  const int kv = int(g.Tk - k0 < BK ? g.Tk - k0 : BK);
  load_tile<V4>(Ks, k + bh * g.Tk * g.D, k0, kv, BK, g, W(1));
  load_tile<V4>(Vs, v + bh * g.Tk * g.D, k0, kv, BK, g, W(1));

  W dka[RA][DC], dva[RA][DC];
#pragma unroll
  for (int a = 0; a < RA; ++a)
#pragma unroll
    for (int c = 0; c < DC; ++c) dka[a][c] = dva[a][c] = 0;

  // The fused dQ's slab of this key tile holds query rows [first, Tq): query row i at
  // scratch row part_row + i.
  const int64_t part_row = FUSED ? bh * slabs.per_head() + slabs.before(k0 / BK) - slabs.first(k0 / BK) : 0;

  // Causal: queries before k0 see none of these keys.
  for (int64_t q0 = g.causal ? k0 / BQ * BQ : 0; q0 < g.Tq; q0 += BQ) {
    const int qv = int(g.Tq - q0 < BQ ? g.Tq - q0 : BQ);
    __syncthreads();  // the previous query tile is no longer read
    load_tile<V4>(Qs, q + bh * g.Tq * g.D, q0, qv, BQ, g, g.scale);
    load_tile<V4>(dOs, dout + bh * g.Tq * g.D, q0, qv, BQ, g, W(1));
    for (int i = threadIdx.x; i < BQ; i += kThreads) {
      Ls[i] = i < qv ? lw[bh * g.Tq + q0 + i] : W(0);
      Dis[i] = i < qv ? di[bh * g.Tq + q0 + i] : W(0);
    }
    __syncthreads();

    W st[RA][RB], dpt[RA][RB];
    dot_tiles<V4>(Ks, Qs, g.D, g.ld, st);   // scaled scores, keys down
    dot_tiles<V4>(Vs, dOs, g.D, g.ld, dpt); // dPᵀ = V dOᵀ
#pragma unroll
    for (int a = 0; a < RA; ++a) {
      const int j = ty + 16 * a;
#pragma unroll
      for (int b = 0; b < RB; ++b) {
        const int i = tx + 8 * b;
        const bool seen = j < kv && i < qv && (!g.causal || k0 + j <= q0 + i);
        W pd, ds;
        grad_entry(g, bh, q0 + i, k0 + j, seen, st[a][b], dpt[a][b], Ls[i], Dis[i], pd, ds);
        Pt[j * LDT + i] = pd;
        dSt[j * LDT + i] = ds;
      }
    }
    __syncthreads();  // Pdᵀ and dSᵀ complete
    acc_tiles<V4>(Pt, LDT, qv, dOs, g.ld, g.D, dva);  // dV += Pdᵀ dO
    acc_tiles<V4>(dSt, LDT, qv, Qs, g.ld, g.D, dka);  // dK += dSᵀ (scale Q)
    if constexpr (FUSED) {
      // This key tile's share of dQ for the query tile, dS K (K unscaled, the scale comes
      // in dq_sum_kernel), to the tile's rows of its scratch slab.
      W* part = dq_part + (part_row + q0) * g.D;
      if constexpr (V4) {
        float acc[4][4] = {};
        dq_acc_v4<BQ / 16>(dSt, LDT, kv, Ks, g.ld, acc);
        const int r = threadIdx.x / 16, cx = threadIdx.x % 16;
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (4 * r + e < qv)
            *reinterpret_cast<float4*>(part + (4 * r + e) * 64 + 4 * cx) =
                make_float4(acc[e][0], acc[e][1], acc[e][2], acc[e][3]);
      } else {
        W acc[BQ / 16][DC] = {};
        tile_acc<W, BQ / 16, DC, true>(dSt, LDT, kv, Ks, g.ld, g.D, acc);
#pragma unroll
        for (int a = 0; a < BQ / 16; ++a) {
          const int i = ty + 16 * a;
          if (i >= qv) continue;
#pragma unroll
          for (int c = 0; c < DC; ++c)
            if (tx + 8 * c < g.D) part[i * g.D + tx + 8 * c] = acc[a][c];
        }
      }
    }
  }

  T* dkh = dk + bh * g.Tk * g.D;
  T* dvh = dv + bh * g.Tk * g.D;
#pragma unroll
  for (int a = 0; a < RA; ++a) {
    const int j = ty + 16 * a;
    if (j >= kv) continue;
#pragma unroll
    for (int c = 0; c < DC; ++c) {
      const int d = acc_col<V4>(c);
      if (d < g.D) {
        dkh[(k0 + j) * g.D + d] = narrow<T>(dka[a][c]);
        dvh[(k0 + j) * g.D + d] = narrow<T>(dva[a][c]);
      }
    }
  }
}

// dQ of one query tile: one block per (bh, query tile of BQ queries), walking the key
// tiles (up to the diagonal when causal). Shared memory: Q (scaled) and dO (BQ rows), K
// and V (BK rows), dS (BQ x BK). dQ = scale dS K: K is unscaled, the scale comes last.
template <class T, class W, int BQ, int BK, int DC, bool V4>
__global__ void __launch_bounds__(kThreads)
    dq_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, const T* __restrict__ dout,
              const W* __restrict__ lw, const W* __restrict__ di, T* __restrict__ dq, Geo<W> g) {
  constexpr int RA = BQ / 16, RB = BK / 8, LDS = V4 ? BK + 4 : BK + 1;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  W* Qs = reinterpret_cast<W*>(smem_raw);
  W* dOs = Qs + BQ * g.ld;
  W* Ks = dOs + BQ * g.ld;
  W* Vs = Ks + BK * g.ld;
  W* dS = Vs + BK * g.ld;
  const int ty = threadIdx.x / 8, tx = threadIdx.x % 8;

  const int64_t nq = (g.Tq + BQ - 1) / BQ;
  const int64_t bh = int64_t(blockIdx.x) % g.BH, q0 = (nq - 1 - int64_t(blockIdx.x) / g.BH) * BQ;
  const int qv = int(g.Tq - q0 < BQ ? g.Tq - q0 : BQ);
  load_tile<V4>(Qs, q + bh * g.Tq * g.D, q0, qv, BQ, g, g.scale);
  load_tile<V4>(dOs, dout + bh * g.Tq * g.D, q0, qv, BQ, g, W(1));
  // Each thread's rows' L and Di, in registers (padding rows: never seen, values unused).
  W L[RA], Di[RA], dqa[RA][DC];
#pragma unroll
  for (int a = 0; a < RA; ++a) {
    const int i = ty + 16 * a;
    L[a] = i < qv ? lw[bh * g.Tq + q0 + i] : W(0);
    Di[a] = i < qv ? di[bh * g.Tq + q0 + i] : W(0);
#pragma unroll
    for (int c = 0; c < DC; ++c) dqa[a][c] = 0;
  }

  const int64_t kend = g.causal ? (q0 + qv < g.Tk ? q0 + qv : g.Tk) : g.Tk;
  for (int64_t k0 = 0; k0 < kend; k0 += BK) {
    const int kv = int(kend - k0 < BK ? kend - k0 : BK);
    __syncthreads();  // the previous key tile and dS are no longer read
    load_tile<V4>(Ks, k + bh * g.Tk * g.D, k0, kv, BK, g, W(1));
    load_tile<V4>(Vs, v + bh * g.Tk * g.D, k0, kv, BK, g, W(1));
    __syncthreads();

    W s[RA][RB], dp[RA][RB];
    dot_tiles<V4>(Qs, Ks, g.D, g.ld, s);
    dot_tiles<V4>(dOs, Vs, g.D, g.ld, dp);
#pragma unroll
    for (int a = 0; a < RA; ++a) {
      const int i = ty + 16 * a;
#pragma unroll
      for (int b = 0; b < RB; ++b) {
        const int j = tx + 8 * b;
        const bool seen = j < kv && i < qv && (!g.causal || k0 + j <= q0 + i);
        W pd, ds;
        grad_entry(g, bh, q0 + i, k0 + j, seen, s[a][b], dp[a][b], L[a], Di[a], pd, ds);
        dS[i * LDS + j] = ds;
      }
    }
    __syncthreads();  // dS complete
    acc_tiles<V4>(dS, LDS, kv, Ks, g.ld, g.D, dqa);
  }

  T* dqh = dq + bh * g.Tq * g.D;
#pragma unroll
  for (int a = 0; a < RA; ++a) {
    const int i = ty + 16 * a;
    if (i >= qv) continue;
#pragma unroll
    for (int c = 0; c < DC; ++c) {
      const int d = acc_col<V4>(c);
      if (d < g.D) dqh[(q0 + i) * g.D + d] = narrow<T>(dqa[a][c] * g.scale);
    }
  }
}

// ---------------------------------------------------------------- host side

// Tile sizes: float math holds 64 query rows per forward block; double, twice the bytes
// per value, 32 (so that shared memory stays well under the 227 KB of an H100).
template <class W> constexpr int kForwardBQ = std::is_same_v<W, double> ? 32 : 64;
constexpr int kBK = 32;  // keys per tile, everywhere
constexpr int kBQ = 32;  // queries per tile in the backward kernels

// MUMOE_ATTENTION_DQ=separate: the tiled backward's dQ from its own blocks even where the
// fused one fits (benchmarks and tests of both).
bool dq_separate_forced() {
  const char* choice = std::getenv("MUMOE_ATTENTION_DQ");
  return choice != nullptr && std::strcmp(choice, "separate") == 0;
}

template <class W>
Geo<W> make_geo(const Tensor& q, const Tensor& k, const kernels::AttentionParams& p) {
  Geo<W> g;
  g.BH = q.size(0) * q.size(1);
  g.Tq = q.size(2);
  g.Tk = k.size(2);
  g.D = int(q.size(3));
  g.k_head = g.v_head = g.Tk * g.D;  // dense; the forward may read views (forward_typed)
  g.ld = g.D | 1;  // odd: rows fall on different banks
  g.scale = W(p.scale);
  g.causal = p.causal;
  g.dropout = p.dropout_p > 0;
  g.key = kernels::attention_dropout_key(p.seed);
  g.threshold = kernels::attention_dropout_threshold(p.dropout_p);
  g.keep = p.dropout_p < 1 ? W(1 / (1 - p.dropout_p)) : W(0);
  return g;
}

// Refuses head dims the register accumulators cannot hold and grids past CUDA's limit.
void check_sizes(const Tensor& q, const Tensor& k, int64_t blocks, const char* op) {
  MU_CHECK(q.size(3) <= kMaxD, op, " on CUDA: head dim D = ", q.size(3), " is not supported (at most ", kMaxD,
           "); q ", shape_str(q.shape()), ", k ", shape_str(k.shape()));
  MU_CHECK(blocks <= int64_t(INT32_MAX), op, " on CUDA: ", blocks, " blocks exceed the grid limit (q ",
           shape_str(q.shape()), ", k ", shape_str(k.shape()), ")");
}

// Launches `kernel` with `smem` bytes of dynamic shared memory, opting in past the 48 KB
// default (up to the device's per-block maximum, else a mu::Error naming the sizes).
template <class Kernel, class... Args>
void launch(Kernel kernel, int64_t blocks, size_t smem, const Tensor& q, const char* name, Args... args) {
  const int dev = q.device().index;
  cudaStream_t stream = cuda::stream(dev);  // also makes dev current
  if (smem > 48 * 1024) {
    int limit = 0;
    MU_CUDA_CHECK(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    MU_CHECK(smem <= size_t(limit), name, " on CUDA: needs ", smem, " bytes of shared memory per block, the device has ",
             limit, " (q ", shape_str(q.shape()), ")");
    MU_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  }
  kernel<<<unsigned(blocks), kThreads, smem, stream>>>(args...);
  MU_CUDA_CHECK_LAUNCH(name);
}

// Calls body(std::integral_constant<int, DC>) with the accumulator column count for D.
template <class Body>
void dispatch_dc(int D, Body&& body) {
  if (D <= 64) body(std::integral_constant<int, 8>{});
  else body(std::integral_constant<int, 16>{});
}

// The vector variant (V4) runs float32 tensors (float math, read without conversion) with
// D = 64 whose data start on 16 bytes (a contiguous view at an odd offset does not);
// forward_typed and backward_typed choose it.
template <class T, bool V4>
void forward_launch(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                    const kernels::AttentionParams& p) {
  using W = wide_t<T>;
  Geo<W> g = make_geo<W>(q, k, p);
  // k and v dense, or views with dense rows (a key-value cache: attention_rows_view).
  g.k_head = kernels::attention_head_stride(k);
  g.v_head = kernels::attention_head_stride(v);
  if (V4) g.ld = g.D + 4;  // 16-byte rows (see the top of the file)
  constexpr int BQ = V4 ? 64 : kForwardBQ<W>, BK = V4 ? 64 : kBK, LDP = V4 ? BK + 4 : BK + 1;
  if (g.BH == 0 || g.Tq == 0) return;  // no query rows: nothing to write
  const int64_t blocks = g.BH * ((g.Tq + BQ - 1) / BQ);
  check_sizes(q, k, blocks, "attention_forward");
  // Q, K, V tiles and the P tile.
  const size_t smem = (size_t(BQ + 2 * BK) * g.ld + size_t(BQ) * LDP) * sizeof(W);
  auto go = [&](auto dc) {
    launch(forward_kernel<T, W, BQ, BK, decltype(dc)::value, V4>, blocks, smem, q, "attention_forward",
           static_cast<const T*>(q.raw_data()), static_cast<const T*>(k.raw_data()),
           static_cast<const T*>(v.raw_data()), static_cast<T*>(out.raw_data()), static_cast<lse_t<T>*>(lse.raw_data()), g);
  };
  if constexpr (V4) go(std::integral_constant<int, 8>{});
  else dispatch_dc(g.D, go);
}

template <class T>
void forward_typed(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                   const kernels::AttentionParams& p) {
  if constexpr (std::is_same_v<T, float>) {
    // The vector variant reads 16-byte rows: every head of k and v (a cache's views
    // included) must start on 16 bytes too.
    const bool heads16 = kernels::attention_head_stride(k) % 4 == 0 && kernels::attention_head_stride(v) % 4 == 0;
    if (q.size(3) == 64 && heads16 && attention_aligned16({&q, &k, &v}))
      return forward_launch<T, true>(q, k, v, out, lse, p);
  }
  forward_launch<T, false>(q, k, v, out, lse, p);
}

template <class T, bool V4>
void backward_launch(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                     const Tensor& grad_out, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                     const kernels::AttentionParams& p) {
  using W = wide_t<T>;
  Geo<W> g = make_geo<W>(q, k, p);
  if (V4) g.ld = g.D + 4;  // 16-byte rows (see the top of the file)
  // dK, dV blocks hold BK keys and walk BQ queries at a time; dQ blocks the reverse (the
  // vector variant: 64 rows owned, 32 walked; the scalar one 32 and 32).
  constexpr int BK = V4 ? 64 : kBK, BQ = V4 ? 32 : kBQ;  // dkdv_kernel's
  constexpr int QQ = V4 ? 64 : kBQ, QK = V4 ? 32 : kBK;  // dq_kernel's
  constexpr int PAD = V4 ? 4 : 1;
  if (g.BH == 0 || g.D == 0) return;  // every gradient is empty
  cudaStream_t stream = cuda::stream(q);
  if (g.Tk == 0 || g.Tq == 0) {
    // No key reaches dQ, no query reaches dK and dV: zeros (the empty ones are no-ops).
    MU_CUDA_CHECK(cudaMemsetAsync(dq.raw_data(), 0, size_t(dq.numel()) * sizeof(T), stream));
    MU_CUDA_CHECK(cudaMemsetAsync(dk.raw_data(), 0, size_t(dk.numel()) * sizeof(T), stream));
    MU_CUDA_CHECK(cudaMemsetAsync(dv.raw_data(), 0, size_t(dv.numel()) * sizeof(T), stream));
    return;
  }
  const int64_t qblocks = g.BH * ((g.Tq + QQ - 1) / QQ), kblocks = g.BH * ((g.Tk + BK - 1) / BK);
  check_sizes(q, k, qblocks > kblocks ? qblocks : kblocks, "attention_backward");

  // Di and the widened lse, one value per query row.
  const int64_t rows = g.BH * g.Tq;
  cuda::Workspace ws(size_t(2 * rows) * sizeof(W), q.device().index);
  W* di = ws.as<W>();
  W* lw = di + rows;
  attention_row_terms_kernel<T, W, lse_t<T>><<<cuda::grid_for(rows, 8), 256, 0, stream>>>(
      static_cast<const T*>(grad_out.raw_data()), static_cast<const T*>(out.raw_data()),
      static_cast<const lse_t<T>*>(lse.raw_data()), di, lw, rows, g.D);
  MU_CUDA_CHECK_LAUNCH("attention_backward (row terms)");

  const T* qd = static_cast<const T*>(q.raw_data());
  const T* kd = static_cast<const T*>(k.raw_data());
  const T* vd = static_cast<const T*>(v.raw_data());
  const T* gd = static_cast<const T*>(grad_out.raw_data());
  // K, V, Q, dO tiles, the two transposed score tiles, L and Di.
  const size_t smem_kv = (size_t(BK + BK + BQ + BQ) * g.ld + 2 * size_t(BK) * (BQ + PAD) + 2 * BQ) * sizeof(W);
  // Q, dO, K, V tiles and the dS tile.
  const size_t smem_q = (size_t(QQ + QQ + QK + QK) * g.ld + size_t(QQ) * (QK + PAD)) * sizeof(W);
  // dQ fused into the dK/dV blocks (each writes its key tile's share to a scratch slab, a
  // last kernel sums them: 5 tile products per pair of tiles instead of 7) when the
  // scratch fits under kDqSlabsCap, else the dq blocks recompute S and dP on their own.
  const DqSlabs slabs{g.Tq, g.Tk, BK, BQ, g.causal, g.Tq};
  const size_t part_bytes = size_t(g.BH) * size_t(slabs.per_head()) * size_t(g.D) * sizeof(W);
  const bool fused = part_bytes <= kDqSlabsCap && !dq_separate_forced();
  cuda::Workspace part(fused ? part_bytes : 0, q.device().index);
  auto go = [&](auto dc) {
    constexpr int DC = decltype(dc)::value;
    auto dkdv = [&](auto fuse) {
      launch(dkdv_kernel<T, W, BK, BQ, DC, V4, decltype(fuse)::value>, kblocks, smem_kv, q,
             "attention_backward (dk, dv)", qd, kd, vd, gd, static_cast<const W*>(lw), static_cast<const W*>(di),
             static_cast<T*>(dk.raw_data()), static_cast<T*>(dv.raw_data()), part.as<W>(), slabs, g);
    };
    if (fused) {
      dkdv(std::true_type{});
      const int64_t n = g.BH * g.Tq * g.D;
      dq_sum_kernel<T, W><<<cuda::grid_for(n, 256), 256, 0, stream>>>(part.as<W>(), static_cast<T*>(dq.raw_data()),
                                                                       slabs, g.BH, g.D, g.scale);
      MU_CUDA_CHECK_LAUNCH("attention_backward (dq sum)");
      return;
    }
    dkdv(std::false_type{});
    launch(dq_kernel<T, W, QQ, QK, DC, V4>, qblocks, smem_q, q, "attention_backward (dq)", qd, kd, vd, gd,
           static_cast<const W*>(lw), static_cast<const W*>(di), static_cast<T*>(dq.raw_data()), g);
  };
  if constexpr (V4) go(std::integral_constant<int, 8>{});
  else dispatch_dc(g.D, go);
}

template <class T>
void backward_typed(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                    const Tensor& grad_out, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                    const kernels::AttentionParams& p) {
  if constexpr (std::is_same_v<T, float>)
    if (q.size(3) == 64 && attention_aligned16({&q, &k, &v, &grad_out}))
      return backward_launch<T, true>(q, k, v, out, lse, grad_out, dq, dk, dv, p);
  backward_launch<T, false>(q, k, v, out, lse, grad_out, dq, dk, dv, p);
}

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                       const kernels::AttentionParams& p) {
  // k and v may be views of a key-value cache (ops/kernels/attention.h). A decoding step
  // goes to the tiled kernels, which read them in place, as they would take its dense
  // copies: no copy of the whole cache per step. The other paths read dense tensors.
  if (!k.is_contiguous() || !v.is_contiguous()) {
    const bool tiled = attention_decoding_step(q.size(2), k.size(2)) &&
                       (attention_path_unset() || attention_path_forced("tiled")) &&
                       kernels::attention_rows_view(k) && kernels::attention_rows_view(v);
    if (!tiled) return attention_forward(q, k.contiguous(), v.contiguous(), out, lse, p);
    return cuda::dispatch_float_bf16(q.dtype(), "attention_forward",
                                     [&](auto tag) { forward_typed<decltype(tag)>(q, k, v, out, lse, p); });
  }
#ifdef MUMOE_CUDNN
  if (attention_forward_cudnn(q, k, v, out, lse, p)) return;  // cuDNN took it (bfloat16 without dropout)
#endif
  if (attention_forward_flash(q, k, v, out, lse, p)) return;  // bfloat16 and float32, D = 64, 64 queries or more
  if (attention_gemm_wanted(q, k, false)) return attention_forward_gemm(q, k, v, out, lse, p);
  cuda::dispatch_float_bf16(q.dtype(), "attention_forward",
                            [&](auto tag) { forward_typed<decltype(tag)>(q, k, v, out, lse, p); });
}

void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                        const Tensor& grad_out, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                        const kernels::AttentionParams& p) {
#ifdef MUMOE_CUDNN
  if (attention_backward_cudnn(q, k, v, out, lse, grad_out, dq, dk, dv, p)) return;  // bfloat16 without dropout
#endif
  if (attention_backward_flash(q, k, v, out, lse, grad_out, dq, dk, dv, p)) return;  // bfloat16 and float32, D = 64
  if (attention_gemm_wanted(q, k, true)) return attention_backward_gemm(q, k, v, out, lse, grad_out, dq, dk, dv, p);
  cuda::dispatch_float_bf16(q.dtype(), "attention_backward", [&](auto tag) {
    backward_typed<decltype(tag)>(q, k, v, out, lse, grad_out, dq, dk, dv, p);
  });
}

}  // namespace

MU_REGISTER_KERNEL(kernels::attention_forward, DeviceType::CUDA, attention_forward);
MU_REGISTER_KERNEL(kernels::attention_backward, DeviceType::CUDA, attention_backward);

}  // namespace mu::cuda_kernels
