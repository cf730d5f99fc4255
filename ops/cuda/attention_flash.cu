// The bfloat16 attention backward on the tensor cores without the score matrix in
// memory (ops/cuda/attention.cu asks attention_backward_flash first). The cuBLAS path
// (attention_gemm.cu) writes S, P and dP for every head, ~2.8 GB per GPT-2 layer at
// B 8, H 12, T 1024; this kernel keeps each 64 x 64 tile of them in shared memory.
//
// One block per (64-key tile j, head bh), four warps. K_j and V_j stay in shared memory;
// dK_j and dV_j accumulate in the warps' WMMA fragments (float32) while the block walks
// the 64-query tiles i that see tile j (from the diagonal on when causal):
//   S  = Q_i K_jᵀ                      warp w: query rows 16w..16w+15
//   P  = exp(scale S - lse_i), masked; Pd = P ∘ M/(1-p)     (bfloat16, for dV)
//   dP = dO_i V_jᵀ                     warp w: the same rows
//   dS = scale · (Pd ∘ dP - P · Di)     (bfloat16; Di = rowsum(dO ∘ O), precomputed)
//   dQ_i += dS K_j                     warp w's rows, added into a float32 dQ in global
//                                      memory (other key tiles add theirs: atomics)
//   dV_j += Pdᵀ dO_i,  dK_j += dSᵀ Q_i   warp w: key rows 16w..16w+15
// then dK_j, dV_j are rounded to bfloat16 and dQ is rounded once after all blocks. dK and
// dV are summed in a fixed order; dQ's float32 sums take the key tiles in whatever order
// the hardware runs the atomics, so its last bits (and, rarely, a bfloat16 rounding of
// it) may differ between two runs of the same call. MUMOE_ATTENTION=tiled gives a
// backward that sums every gradient in a fixed order (ops/cuda/attention.cu). The
// probabilities and the dropout mask are the other paths', entry for entry (the row
// formulas of attention_gemm.cu, ops/cuda/attention_common.cuh).
#include <mma.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "ops/cuda/attention_common.cuh"
#include "ops/cuda/attention_flash.cuh"
#include "ops/cuda/dtypes.cuh"
#include "ops/cuda/runtime.cuh"
#include "ops/kernels/copy.h"

namespace mu::cuda_kernels {

namespace {

using namespace nvcuda;
using cuda::bf16;

constexpr int kTile = 64;      // queries and keys per tile
constexpr int kD = 64;         // head dim this kernel is built for
constexpr int kWarps = 4;      // 16 rows of each tile per warp
constexpr int kThreads = 32 * kWarps;
constexpr int kLdH = kD + 8;   // bfloat16 row pitch in shared memory (WMMA: a multiple of 8)
constexpr int kLdF = kTile + 4;  // float row pitch (a multiple of 4)

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major>;
using FragAT = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::col_major>;
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major>;
using FragBT = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

using Geo = AttentionGeo;  // ops/cuda/attention_common.cuh

// The shared memory of one block, in bytes: Q_i, dO_i, K_j, V_j, Pd, dS (bfloat16
// tiles), S/P and dP (float tiles), lse_i and Di (64 floats each).
constexpr size_t kSmem = size_t(6) * kTile * kLdH * sizeof(bf16) + size_t(2) * kTile * kLdF * sizeof(float) +
                         size_t(2) * kTile * sizeof(float);

// rows [r0, r0 + 64) of a (T x 64) bfloat16 matrix into a shared tile; rows past T are zeros.
__device__ __forceinline__ void load_tile(bf16* dst, const bf16* src, int64_t r0, int64_t T) {
  constexpr int kVecs = kD / 8;  // 16-byte vectors per row
  for (int idx = threadIdx.x; idx < kTile * kVecs; idx += kThreads) {
    const int r = idx / kVecs, c = idx % kVecs;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (r0 + r < T) v = reinterpret_cast<const uint4*>(src + (r0 + r) * kD)[c];
    *reinterpret_cast<uint4*>(dst + r * kLdH + c * 8) = v;
  }
}

// C (16 x 64, four fragments) += A (16 x 64 at a, pitch lda) times B, where B's 16 x 16
// block (k, n) is at b + 16k * ldb + 16n (row-major) or b + 16n * ldb + 16k (column-major),
// A's block (0, k) at a + 16k (row-major) or a + 16k * lda (column-major); the layouts
// are those of the fragment types FA and FB.
template <class FA, class FB>
__device__ __forceinline__ void row_times_acc(FragC (&c)[4], const bf16* a, int lda, bool a_col, const bf16* b,
                                              int ldb, bool b_col) {
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    FA fa;
    wmma::load_matrix_sync(fa, a_col ? a + k * 16 * lda : a + k * 16, lda);
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      FB fb;
      wmma::load_matrix_sync(fb, b_col ? b + n * 16 * ldb + k * 16 : b + k * 16 * ldb + n * 16, ldb);
      wmma::mma_sync(c[n], fa, fb, c[n]);
    }
  }
}

// Rows r0..r0+15 of a float tile (pitch kLdF) from the four fragments of a 16 x 64 strip.
__device__ __forceinline__ void store_strip(float* tile, int r0, const FragC (&c)[4]) {
#pragma unroll
  for (int n = 0; n < 4; ++n) wmma::store_matrix_sync(tile + r0 * kLdF + n * 16, c[n], kLdF, wmma::mem_row_major);
}

// The same into a zeroed C.
template <class FA, class FB>
__device__ __forceinline__ void row_times(FragC (&c)[4], const bf16* a, int lda, bool a_col, const bf16* b, int ldb,
                                          bool b_col) {
#pragma unroll
  for (int n = 0; n < 4; ++n) wmma::fill_fragment(c[n], 0.f);
  row_times_acc<FA, FB>(c, a, lda, a_col, b, ldb, b_col);
}

__global__ void __launch_bounds__(kThreads)
    flash_backward_kernel(const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
                          const bf16* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ di,
                          float* __restrict__ dq_acc, bf16* __restrict__ dk, bf16* __restrict__ dv, Geo g) {
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* sQ = reinterpret_cast<bf16*>(smem);
  bf16* sdO = sQ + kTile * kLdH;
  bf16* sK = sdO + kTile * kLdH;
  bf16* sV = sK + kTile * kLdH;
  bf16* sPd = sV + kTile * kLdH;  // Pd, [query][key]
  bf16* sdS = sPd + kTile * kLdH;  // dS, [query][key]
  float* sS = reinterpret_cast<float*>(sdS + kTile * kLdH);  // S, then P, [query][key]
  float* sdP = sS + kTile * kLdF;  // dP, then dQ's partial, [query][key or d]
  float* sL = sdP + kTile * kLdF;
  float* sDi = sL + kTile;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t bh = blockIdx.y, j0 = int64_t(blockIdx.x) * kTile;
  const bf16* qh = q + bh * g.Tq * kD;
  const bf16* dOh = dout + bh * g.Tq * kD;
  const float* lh = lse + bh * g.Tq;
  const float* dih = di + bh * g.Tq;
  float* dqh = dq_acc + bh * g.Tq * kD;

  load_tile(sK, k + bh * g.Tk * kD, j0, g.Tk);
  load_tile(sV, v + bh * g.Tk * kD, j0, g.Tk);

  FragC dKf[4], dVf[4];
#pragma unroll
  for (int n = 0; n < 4; ++n) {
    wmma::fill_fragment(dKf[n], 0.f);
    wmma::fill_fragment(dVf[n], 0.f);
  }

  // Causal: query tiles wholly before key tile j see none of its keys.
  const int64_t i_first = g.causal ? j0 : 0;
  for (int64_t i0 = i_first; i0 < g.Tq; i0 += kTile) {
    __syncthreads();  // the previous tile's readers are done with sQ, sdO, sPd, sdS
    load_tile(sQ, qh, i0, g.Tq);
    load_tile(sdO, dOh, i0, g.Tq);
    for (int r = threadIdx.x; r < kTile; r += kThreads) {
      sL[r] = i0 + r < g.Tq ? lh[i0 + r] : 0.f;
      sDi[r] = i0 + r < g.Tq ? dih[i0 + r] : 0.f;
    }
    __syncthreads();

    const int r0 = warp * 16;  // this warp's query rows within the tile
    FragC acc[4];
    // S = Q_i K_jᵀ: Kᵀ read column-major from K's rows.
    row_times<FragA, FragBT>(acc, sQ + r0 * kLdH, kLdH, false, sK, kLdH, true);
    store_strip(sS, r0, acc);
    // dP = dO_i V_jᵀ.
    row_times<FragA, FragBT>(acc, sdO + r0 * kLdH, kLdH, false, sV, kLdH, true);
    store_strip(sdP, r0, acc);
    __syncwarp();

    // The warp's 16 rows x 64 keys: P, Pd and dS, elementwise (each lane every 32nd entry).
    for (int e = lane; e < 16 * kTile; e += 32) {
      const int r = r0 + e / kTile, c = e % kTile;
      const int64_t i = i0 + r, j = j0 + c;
      const bool seen = i < g.Tq && j < g.Tk && (!g.causal || j <= i);
      float p = 0.f, pd = 0.f, ds = 0.f;
      if (seen) {
        p = expf(g.scale * sS[r * kLdF + c] - sL[r]);
        pd = g.dropout ? p * attention_keep_factor(g.key, g.threshold, g.keep, bh, g.Tq, g.Tk, i, j) : p;
        ds = g.scale * (pd * sdP[r * kLdF + c] - p * sDi[r]);
      }
      sPd[r * kLdH + c] = __float2bfloat16_rn(pd);
      sdS[r * kLdH + c] = __float2bfloat16_rn(ds);
    }
    __syncwarp();

    // dQ_i (the warp's rows) += dS K_j: K read row-major (keys x d).
    row_times<FragA, FragB>(acc, sdS + r0 * kLdH, kLdH, false, sK, kLdH, false);
    store_strip(sdP, r0, acc);
    __syncwarp();
    for (int e = lane; e < 16 * kD; e += 32) {
      const int r = r0 + e / kD, c = e % kD;
      if (i0 + r < g.Tq) atomicAdd(dqh + (i0 + r) * kD + c, sdP[r * kLdF + c]);
    }
    __syncthreads();  // every warp's Pd and dS rows are in place

    // dV_j (the warp's key rows) += Pdᵀ dO_i and dK_j += dSᵀ Q_i: Pdᵀ and dSᵀ read
    // column-major from their [query][key] tiles, starting at key column 16w.
    const int k0 = warp * 16;
    row_times_acc<FragAT, FragB>(dVf, sPd + k0, kLdH, true, sdO, kLdH, false);
    row_times_acc<FragAT, FragB>(dKf, sdS + k0, kLdH, true, sQ, kLdH, false);
  }

  // dK_j, dV_j: through shared memory (sS, sdP are free now) into bfloat16 rows.
  __syncthreads();
  const int k0 = warp * 16;
  store_strip(sS, k0, dKf);
  store_strip(sdP, k0, dVf);
  __syncwarp();
  bf16* dkh = dk + bh * g.Tk * kD;
  bf16* dvh = dv + bh * g.Tk * kD;
  for (int e = lane; e < 16 * kD; e += 32) {
    const int r = k0 + e / kD, c = e % kD;
    if (j0 + r < g.Tk) {
      dkh[(j0 + r) * kD + c] = __float2bfloat16_rn(sS[r * kLdF + c]);
      dvh[(j0 + r) * kD + c] = __float2bfloat16_rn(sdP[r * kLdF + c]);
    }
  }
}

}  // namespace

bool attention_backward_flash(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                              const Tensor& grad_out, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                              const kernels::AttentionParams& params) {
  if (q.dtype() != DType::BFloat16 || lse.dtype() != DType::Float32 || q.size(3) != kD) return false;
  const int64_t BH = q.size(0) * q.size(1), Tq = q.size(2), Tk = k.size(2);
  if (BH == 0 || Tq == 0 || Tk == 0 || BH > 65535) return false;  // grid.y holds the heads
  if (!attention_aligned16({&q, &k, &v, &out, &grad_out, &dk, &dv})) return false;  // rows move as 16-byte vectors
  // MUMOE_ATTENTION=tiled or =gemm sends every call to that path (benchmarks, tests of each).
  if (attention_path_forced("tiled") || attention_path_forced("gemm")) return false;

  const int dev = q.device().index;
  cudaStream_t stream = cuda::stream(dev);
  // Di (float32) and dQ's float32 accumulator.
  cuda::Workspace ws(size_t(BH * Tq) * sizeof(float), dev);
  Tensor dq_acc = zeros(q.shape(), TensorOptions(kFloat32).device(q.device()));
  const int64_t rows = BH * Tq;
  attention_row_terms_kernel<bf16, float, float><<<cuda::grid_for(rows, 8), 256, 0, stream>>>(
      static_cast<const bf16*>(grad_out.raw_data()), static_cast<const bf16*>(out.raw_data()), nullptr,
      ws.as<float>(), nullptr, rows, int(kD));
  MU_CUDA_CHECK_LAUNCH("attention_backward (flash: row dots)");

  const Geo g = attention_geo(Tq, Tk, params);

  int limit = 0;
  MU_CUDA_CHECK(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  if (kSmem > size_t(limit)) return false;
  MU_CUDA_CHECK(cudaFuncSetAttribute(flash_backward_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmem)));
  const dim3 grid(unsigned((Tk + kTile - 1) / kTile), unsigned(BH));
  flash_backward_kernel<<<grid, kThreads, kSmem, stream>>>(
      static_cast<const bf16*>(q.raw_data()), static_cast<const bf16*>(k.raw_data()),
      static_cast<const bf16*>(v.raw_data()), static_cast<const bf16*>(grad_out.raw_data()),
      static_cast<const float*>(lse.raw_data()), ws.as<float>(), static_cast<float*>(dq_acc.raw_data()),
      static_cast<bf16*>(dk.raw_data()), static_cast<bf16*>(dv.raw_data()), g);
  MU_CUDA_CHECK_LAUNCH("attention_backward (flash)");
  kernels::copy(q.device(), dq, dq_acc);  // dQ rounded once to bfloat16
  return true;
}

}  // namespace mu::cuda_kernels
