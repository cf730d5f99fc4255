// One thread block's 64 x 64 tile of a matrix product A · B, accumulated in registers: the
// main loop shared by the fused GEMM kernels (ops/cuda/hadamard_gemm.cu, which multiplies
// several such tiles together, and ops/cuda/ring_gemm.cu, whose A is computed as it is
// read). A is reached only through a loader `a(row, k)` (called for row < M and k < K
// only), so a kernel decides what A is: a dense matrix, or entries formed on the fly.
// B is dense row-major (K, R). Both read their stages through StageFetch.
//
// - float32 / float64 (simt_tile_product): 256 threads, each a 4 x 4 micro-tile at rows
//   ty + 16 i and columns tx + 16 j (strided, so a warp reads consecutive shared-memory
//   columns of b without bank conflicts), fused multiply-adds in T.
// - bfloat16 (wmma_tile_product): 128 threads, 4 warps each owning a 32 x 32 quarter as
//   2 x 2 WMMA 16x16x16 tensor-core fragments with float32 accumulators.
//
// The shared-memory stages are the caller's (__shared__ arrays declared in its kernel, of
// the types below), so that a kernel can reuse them between products. Every routine ends
// with a barrier: the stages may be overwritten as soon as it returns.
#pragma once
#include <cuda_runtime.h>
#include <mma.h>

#include <cstdint>

#include "ops/cuda/dtypes.cuh"

namespace mu::cuda_kernels::tile_gemm {

using cuda::bf16;

constexpr int kTile = 64;  // output rows and columns per block

// One thread's share of a shared-memory stage, fetched from global memory into registers
// (so that the next stage is in flight while the current one is multiplied). The a tile
// (64 rows x Depth) and the b tile (Depth x 64) each hold 64 Depth elements, kLoads per
// thread: element e = tid + Threads l is, in a's, row e / Depth = a_r + l a_step, column
// a_c (fixed per thread); in b's, row b_r + l b_step, column b_c. So consecutive threads
// read consecutive k of one row of a and consecutive columns of one row of b. Zeros past
// M, K and R, so that sizes need not be multiples of the tile.
template <class T, int Threads, int Depth>
struct StageFetch {
  static_assert(Threads % Depth == 0 && Threads % kTile == 0, "a thread keeps one tile column across its loads");
  static constexpr int kLoads = kTile * Depth / Threads, a_step = Threads / Depth, b_step = Threads / kTile;
  int a_r, a_c, b_r, b_c;
  T ra[kLoads], rb[kLoads];

  __device__ explicit StageFetch(int tid) : a_r(tid / Depth), a_c(tid % Depth), b_r(tid / kTile), b_c(tid % kTile) {}

  // The stage of depth k0 .. k0 + Depth: a through its loader, b row-major (K, R).
  template <class ALoad>
  __device__ __forceinline__ void operator()(const ALoad& a, const T* B, int64_t M, int64_t K, int64_t R,
                                             int64_t row0, int64_t col0, int64_t k0, T zero) {
    const bool a_in = k0 + a_c < K;
#pragma unroll
    for (int l = 0; l < kLoads; ++l) {
      const int64_t r = row0 + a_r + l * a_step;
      ra[l] = a_in && r < M ? a(r, k0 + a_c) : zero;
    }
    const bool b_in = col0 + b_c < R;
    const T* pb = B + (k0 + b_r) * R + col0 + b_c;
#pragma unroll
    for (int l = 0; l < kLoads; ++l) rb[l] = b_in && k0 + b_r + l * b_step < K ? pb[int64_t(l * b_step) * R] : zero;
  }
};

// ---------------------------------------------------------------- float32 / float64

constexpr int kTileK = 16;     // depth of one shared-memory stage
constexpr int kSimtThreads = 256;
constexpr int kMicro = 4;      // each thread: kMicro x kMicro outputs
constexpr int kLanes = kTile / kMicro;  // 16 threads across a tile's rows (and columns)

// The stages: a's tile transposed ([depth][row]) so the inner loop reads a column of it
// as a row; +1 column so the transposing stores of one warp fall in different banks.
template <class T>
struct SimtStage {
  T a[kTileK][kTile + 1];
  T b[kTileK][kTile];
};

// The thread's outputs of this block's tile: acc[i][j] for row row0 + simt_row(i),
// column col0 + simt_col(j).
__device__ __forceinline__ int simt_row(int i) { return int(threadIdx.x) / kLanes + kLanes * i; }
__device__ __forceinline__ int simt_col(int j) { return int(threadIdx.x) % kLanes + kLanes * j; }

// acc = A[row0 : row0 + 64, :] · B[:, col0 : col0 + 64] (this thread's micro-tile of it).
template <class T, class ALoad>
__device__ __forceinline__ void simt_tile_product(T (&acc)[kMicro][kMicro], SimtStage<T>& st, const ALoad& a,
                                                  const T* B, int64_t M, int64_t K, int64_t R, int64_t row0,
                                                  int64_t col0) {
  const int tid = threadIdx.x, tx = tid % kLanes, ty = tid / kLanes;
#pragma unroll
  for (int i = 0; i < kMicro; ++i)
#pragma unroll
    for (int j = 0; j < kMicro; ++j) acc[i][j] = T(0);

  StageFetch<T, kSimtThreads, kTileK> f(tid);
  if (K > 0) f(a, B, M, K, R, row0, col0, 0, T(0));
  for (int64_t k0 = 0; k0 < K; k0 += kTileK) {
    // The fetched stage into shared memory, at the positions it was read from.
#pragma unroll
    for (int l = 0; l < f.kLoads; ++l) {
      st.a[f.a_c][f.a_r + l * f.a_step] = f.ra[l];
      st.b[f.b_r + l * f.b_step][f.b_c] = f.rb[l];
    }
    __syncthreads();
    if (k0 + kTileK < K) f(a, B, M, K, R, row0, col0, k0 + kTileK, T(0));  // in flight during the multiply below
#pragma unroll
    for (int kk = 0; kk < kTileK; ++kk) {
      T av[kMicro], bv[kMicro];
#pragma unroll
      for (int i = 0; i < kMicro; ++i) av[i] = st.a[kk][ty + kLanes * i];
#pragma unroll
      for (int j = 0; j < kMicro; ++j) bv[j] = st.b[kk][tx + kLanes * j];
#pragma unroll
      for (int i = 0; i < kMicro; ++i)
#pragma unroll
        for (int j = 0; j < kMicro; ++j) acc[i][j] = fma(av[i], bv[j], acc[i][j]);
    }
    __syncthreads();  // the stages are overwritten by the next one (or the next product)
  }
}

// ---------------------------------------------------------------- bfloat16 (tensor cores)

namespace wmma = nvcuda::wmma;

constexpr int kWTileK = 32;           // depth of one shared-memory stage
constexpr int kWThreads = 128;        // 4 warps, 2 x 2 over the tile
constexpr int kWarpTile = 32;         // each warp: 32 x 32 outputs
constexpr int kFrag = 16;             // WMMA m = n = k = 16
constexpr int kFragsPerWarp = kWarpTile / kFrag;  // 2 x 2 fragments
// Shared-memory leading dimensions, padded against bank conflicts while keeping WMMA's
// rules: a multiple of 8 bfloat16 (4 float) elements, and every fragment's first element
// 32-byte aligned (16 rows of each array are a multiple of 32 bytes).
constexpr int kLdA = kWTileK + 8;  // 40
constexpr int kLdB = kTile + 8;    // 72
constexpr int kLdC = kTile + 4;    // 68

using AccFrag = wmma::fragment<wmma::accumulator, kFrag, kFrag, kFrag, float>;

struct WmmaStage {
  __align__(32) bf16 a[kTile][kLdA];
  __align__(32) bf16 b[kWTileK][kLdB];
};

// The float32 tile a kernel's epilogue stages its fragments through (fragments do not
// say which thread holds which element).
struct WmmaOut {
  __align__(32) float c[kTile][kLdC];
};

// acc = A[row0 : row0 + 64, :] · B[:, col0 : col0 + 64] (this warp's fragments of it:
// warp w holds rows 32 (w / 2) + 16 i, columns 32 (w % 2) + 16 j of the tile).
template <class ALoad>
__device__ __forceinline__ void wmma_tile_product(AccFrag (&acc)[kFragsPerWarp][kFragsPerWarp], WmmaStage& st,
                                                  const ALoad& a, const bf16* B, int64_t M, int64_t K, int64_t R,
                                                  int64_t row0, int64_t col0) {
  const int tid = threadIdx.x, warp = tid / 32, wm = warp / 2, wn = warp % 2;
  const bf16 zero = __float2bfloat16_rn(0.0f);
#pragma unroll
  for (int i = 0; i < kFragsPerWarp; ++i)
#pragma unroll
    for (int j = 0; j < kFragsPerWarp; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

  StageFetch<bf16, kWThreads, kWTileK> f(tid);
  if (K > 0) f(a, B, M, K, R, row0, col0, 0, zero);
  for (int64_t k0 = 0; k0 < K; k0 += kWTileK) {
    // The fetched stage into shared memory, at the positions it was read from.
#pragma unroll
    for (int l = 0; l < f.kLoads; ++l) {
      st.a[f.a_r + l * f.a_step][f.a_c] = f.ra[l];
      st.b[f.b_r + l * f.b_step][f.b_c] = f.rb[l];
    }
    __syncthreads();
    if (k0 + kWTileK < K) f(a, B, M, K, R, row0, col0, k0 + kWTileK, zero);  // in flight during the multiply below
#pragma unroll
    for (int kk = 0; kk < kWTileK; kk += kFrag) {
      wmma::fragment<wmma::matrix_a, kFrag, kFrag, kFrag, bf16, wmma::row_major> fa[kFragsPerWarp];
      wmma::fragment<wmma::matrix_b, kFrag, kFrag, kFrag, bf16, wmma::row_major> fb[kFragsPerWarp];
#pragma unroll
      for (int i = 0; i < kFragsPerWarp; ++i) wmma::load_matrix_sync(fa[i], &st.a[wm * kWarpTile + i * kFrag][kk], kLdA);
#pragma unroll
      for (int j = 0; j < kFragsPerWarp; ++j) wmma::load_matrix_sync(fb[j], &st.b[kk][wn * kWarpTile + j * kFrag], kLdB);
#pragma unroll
      for (int i = 0; i < kFragsPerWarp; ++i)
#pragma unroll
        for (int j = 0; j < kFragsPerWarp; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
    }
    __syncthreads();  // the stages are overwritten by the next one (or the next product)
  }
}

// The warp's fragments into the float32 tile (positions as wmma_tile_product's), then a
// barrier, so that any thread may read any element of out.c afterwards.
__device__ __forceinline__ void wmma_store_tile(const AccFrag (&acc)[kFragsPerWarp][kFragsPerWarp], WmmaOut& out) {
  const int warp = int(threadIdx.x) / 32, wm = warp / 2, wn = warp % 2;
#pragma unroll
  for (int i = 0; i < kFragsPerWarp; ++i)
#pragma unroll
    for (int j = 0; j < kFragsPerWarp; ++j)
      wmma::store_matrix_sync(&out.c[wm * kWarpTile + i * kFrag][wn * kWarpTile + j * kFrag], acc[i][j], kLdC,
                              wmma::mem_row_major);
  __syncthreads();
}

// The grid of 64 x 64 tiles over an (M, R) output: rows on grid x (up to 2^31 - 1 tiles),
// columns on grid y (up to 65535). `op` names the caller in the error.
inline dim3 tile_grid(int64_t M, int64_t R, const char* op) {
  const int64_t row_tiles = (M + kTile - 1) / kTile, col_tiles = (R + kTile - 1) / kTile;
  MU_CHECK(row_tiles <= 2147483647LL && col_tiles <= 65535, op, ": output (", M, ", ", R, ") needs a grid of ",
           row_tiles, " x ", col_tiles, " tiles of ", kTile, "; at most 2147483647 x 65535");
  return dim3(static_cast<unsigned>(row_tiles), static_cast<unsigned>(col_tiles), 1u);
}

}  // namespace mu::cuda_kernels::tile_gemm
