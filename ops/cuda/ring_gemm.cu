// CUDA kernel of the fused ring-contraction GEMM (declared in ops/kernels/ring_gemm.h; the
// CPU twin is ops/cpu/ring_gemm.cpp): out = A · w with A[m, s P + p] = (c[m] · h[m])[p, s].
//
// The GEMM is ops/cuda/tile_gemm.cuh's (one block per 64 x 64 output tile; SIMT for
// float32 / float64, WMMA tensor cores for bfloat16) with A reached through RingEntries,
// which forms each entry of A as the tile loads it: R multiply-adds on c's row p and h's
// column s of row m. A itself is never written. Every output tile recomputes the entries
// of its rows of A, so the cost over the plain GEMM is R multiply-adds per entry of A per
// column tile, R / 64 of the GEMM's own work per entry on the SIMT path; what it saves is
// the (M, S P) product written by one kernel and read back by the next.
#include <cuda_runtime.h>
#include <mma.h>

#include <climits>
#include <cstdint>

#include "ops/cuda/dtypes.cuh"
#include "ops/cuda/runtime.cuh"
#include "ops/cuda/tile_gemm.cuh"
#include "ops/kernels/ring_gemm.h"

namespace mu::cuda_kernels {
namespace {

using cuda::bf16;
using namespace tile_gemm;

// A[m, k] = Σ_r c[m, p, r] h[m, r, s] for k = s P + p, summed in T's wide type (float
// for bfloat16) and stored as a T. c (M, P, R) and h (M, R, S) dense. The tile loaders
// call it with the same k for several rows, so the division is shared between them.
template <class T>
struct RingEntries {
  const T* c;
  const T* h;
  int P, R;
  int64_t S;

  __device__ __forceinline__ T operator()(int64_t m, int64_t k) const {
    const int kk = int(k), s = kk / P, p = kk - s * P;  // K = S P < 2^31 (checked on the host)
    const T* cr = c + (m * P + p) * R;
    const T* hr = h + m * R * S + s;
    cuda::wide_t<T> v = 0;
    for (int r = 0; r < R; ++r) v = fma(cuda::widen(cr[r]), cuda::widen(hr[r * S]), v);
    return cuda::narrow<T>(v);
  }
};

template <class T>
__global__ void __launch_bounds__(kSimtThreads)
    ring_gemm_simt(T* out, RingEntries<T> a, const T* w, int64_t M, int64_t K, int64_t N) {
  __shared__ SimtStage<T> st;
  const int64_t row0 = int64_t(blockIdx.x) * kTile, col0 = int64_t(blockIdx.y) * kTile;
  T acc[kMicro][kMicro];
  simt_tile_product(acc, st, a, w, M, K, N, row0, col0);
#pragma unroll
  for (int i = 0; i < kMicro; ++i)
#pragma unroll
    for (int j = 0; j < kMicro; ++j) {
      const int64_t r = row0 + simt_row(i), c = col0 + simt_col(j);
      if (r < M && c < N) out[r * N + c] = acc[i][j];
    }
}

__global__ void __launch_bounds__(kWThreads)
    ring_gemm_wmma(bf16* out, RingEntries<bf16> a, const bf16* w, int64_t M, int64_t K, int64_t N) {
  __shared__ WmmaStage st;
  __shared__ WmmaOut staged;
  const int64_t row0 = int64_t(blockIdx.x) * kTile, col0 = int64_t(blockIdx.y) * kTile;
  AccFrag acc[kFragsPerWarp][kFragsPerWarp];
  wmma_tile_product(acc, st, a, w, M, K, N, row0, col0);
  // Through shared memory, so that each thread rounds (and the block writes rows of) the tile.
  wmma_store_tile(acc, staged);
  for (int e = threadIdx.x; e < kTile * kTile; e += kWThreads) {
    const int r = e / kTile, c = e % kTile;
    if (row0 + r < M && col0 + c < N) out[(row0 + r) * N + col0 + c] = __float2bfloat16_rn(staged.c[r][c]);
  }
}

template <class T>
void launch(const Tensor& out, const Tensor& c, const Tensor& h, const Tensor& w) {
  const int64_t M = out.size(0), N = out.size(1), P = c.size(1), R = c.size(2), S = h.size(2), K = S * P;
  MU_CHECK(K <= INT_MAX && R <= INT_MAX, "ring_gemm: inner sizes S P = ", K, " and R = ", R,
           " must each be below 2^31 on CUDA");
  const dim3 grid = tile_grid(M, N, "ring_gemm");
  const RingEntries<T> a{static_cast<const T*>(c.raw_data()), static_cast<const T*>(h.raw_data()), int(P), int(R), S};
  T* o = static_cast<T*>(out.raw_data());
  const T* wp = static_cast<const T*>(w.raw_data());
  cudaStream_t st = cuda::stream(out);
  if constexpr (std::is_same_v<T, bf16>) {
    ring_gemm_wmma<<<grid, kWThreads, 0, st>>>(o, a, wp, M, K, N);
    MU_CUDA_CHECK_LAUNCH("ring_gemm (bfloat16, tensor cores)");
  } else {
    ring_gemm_simt<T><<<grid, kSimtThreads, 0, st>>>(o, a, wp, M, K, N);
    MU_CUDA_CHECK_LAUNCH("ring_gemm");
  }
}

void ring_gemm(const Tensor& out, const Tensor& c, const Tensor& h, const Tensor& w) {
  if (out.numel() == 0) return;  // no grid of 0 blocks
  cuda::dispatch_float_bf16(out.dtype(), "ring_gemm", [&](auto tag) {
    using T = decltype(tag);
    launch<T>(out, c, h, w);
  });
}

}  // namespace

MU_REGISTER_KERNEL(kernels::ring_gemm, DeviceType::CUDA, ring_gemm);

}  // namespace mu::cuda_kernels
