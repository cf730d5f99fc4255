// CUDA kernel of the fused Hadamard of GEMMs (declared in ops/kernels/hadamard_gemm.h;
// the CPU twin is ops/cpu/hadamard_gemm.cpp): out = scale ∗ Π_k (a_k · b_k).
//
// Mapping: one thread block per output tile (blockIdx.x: tile row, blockIdx.y: tile
// column). For each factor k in turn the block runs a tiled GEMM over K_k, staging
// a_k and b_k tiles in shared memory (zero-padded past the matrix edges, so sizes need
// not be multiples of the tile; each thread reads the next stage into registers while the
// current one is multiplied), and keeps the factor's tile of sums in registers; the
// tile is then multiplied into the running product, also in registers. Only the final
// product, times scale, is written: no (M, R) intermediate ever reaches global memory.
//
// - float32 / float64: 64 x 64 tiles, 256 threads, each thread a 4 x 4 micro-tile at rows
//   ty + 16 i and columns tx + 16 j (strided, so a warp reads consecutive shared-memory
//   columns of b without bank conflicts), fused multiply-adds in T. float32 sums are
//   carried in float32, as cuBLAS's float32 GEMM carries them: a double accumulator
//   would run at 1/64 of the rate on an H100 and defeat the point of the kernel.
// - bfloat16: 64 x 64 tiles, 4 warps each owning a 32 x 32 quarter as 2 x 2 WMMA
//   16x16x16 tensor-core fragments with float32 accumulators. The product of factors is
//   taken element by element on the accumulator fragments (two fragments of one type map
//   their elements to the same matrix positions); the epilogue stages the product through
//   shared memory so each thread can apply scale and round to bfloat16 once.
//
// At most kMaxFactors products per launch; more are folded in by further launches that
// take the partial product as their scale (in place: every element of scale is read only
// by the thread that then writes the same element of out).
#include <cuda_runtime.h>
#include <mma.h>

#include <cstdint>

#include "ops/cuda/dtypes.cuh"
#include "ops/cuda/runtime.cuh"
#include "ops/kernels/hadamard_gemm.h"

namespace mu::cuda_kernels {
namespace {

using cuda::bf16;

constexpr int kMaxFactors = 8;

// The factors of one launch, passed by value in the kernel's parameter space.
template <class T>
struct Factors {
  const T* a[kMaxFactors];  // (M, k[i]) row-major
  const T* b[kMaxFactors];  // (k[i], R) row-major
  int64_t k[kMaxFactors];
  int n;
};

// ---------------------------------------------------------------- float32 / float64

constexpr int kTile = 64;      // output rows and columns per block
constexpr int kTileK = 16;     // depth of one shared-memory stage
constexpr int kSimtThreads = 256;
constexpr int kMicro = 4;      // each thread: kMicro x kMicro outputs
constexpr int kLanes = kTile / kMicro;  // 16 threads across a tile's rows (and columns)
// Elements of each tile (a's and b's are the same size) one thread moves per stage.
constexpr int kSimtLoads = kTile * kTileK / kSimtThreads;  // 4
static_assert(kSimtThreads % kTileK == 0 && kSimtThreads % kTile == 0,
              "a thread keeps one tile column across its loads (fetch's indexing)");

template <class T>
__global__ void __launch_bounds__(kSimtThreads)
    hadamard_gemm_simt(T* out, Factors<T> f, const T* scale, int64_t M, int64_t R) {
  // a's tile transposed ([depth][row]) so the inner loop reads a column of it as a row;
  // +1 column so the transposing stores of one warp fall in different banks.
  __shared__ T As[kTileK][kTile + 1];
  __shared__ T Bs[kTileK][kTile];
  const int tid = threadIdx.x, tx = tid % kLanes, ty = tid / kLanes;
  const int64_t row0 = int64_t(blockIdx.x) * kTile, col0 = int64_t(blockIdx.y) * kTile;
  // This thread's place in the tile loads (see fetch).
  constexpr int a_step = kSimtThreads / kTileK, b_step = kSimtThreads / kTile;
  const int a_r = tid / kTileK, a_c = tid % kTileK, b_r = tid / kTile, b_c = tid % kTile;

  T prod[kMicro][kMicro];
  for (int fi = 0; fi < f.n; ++fi) {
    const T* A = f.a[fi];
    const T* B = f.b[fi];
    const int64_t K = f.k[fi];
    T acc[kMicro][kMicro];
#pragma unroll
    for (int i = 0; i < kMicro; ++i)
#pragma unroll
      for (int j = 0; j < kMicro; ++j) acc[i][j] = T(0);

    // Each thread's share of the next stage's tiles, fetched from global memory into
    // registers while the current stage is being multiplied (software pipelining).
    T ra[kSimtLoads], rb[kSimtLoads];
    // Element e = tid + kSimtThreads l of a tile: in a's, row e / kTileK = a_r + l a_step,
    // column a_c (fixed per thread); in b's, row b_r + l b_step, column b_c. So consecutive
    // threads read consecutive k of one row of a, consecutive columns of one row of b.
    auto fetch = [&](int64_t k0) {
      const bool a_in = k0 + a_c < K;
      const T* pa = A + (row0 + a_r) * K + k0 + a_c;
#pragma unroll
      for (int l = 0; l < kSimtLoads; ++l)
        ra[l] = a_in && row0 + a_r + l * a_step < M ? pa[int64_t(l * a_step) * K] : T(0);
      const bool b_in = col0 + b_c < R;
      const T* pb = B + (k0 + b_r) * R + col0 + b_c;
#pragma unroll
      for (int l = 0; l < kSimtLoads; ++l)
        rb[l] = b_in && k0 + b_r + l * b_step < K ? pb[int64_t(l * b_step) * R] : T(0);
    };
    if (K > 0) fetch(0);
    for (int64_t k0 = 0; k0 < K; k0 += kTileK) {
      // The fetched stage into shared memory, at the positions fetch read them from.
#pragma unroll
      for (int l = 0; l < kSimtLoads; ++l) {
        As[a_c][a_r + l * a_step] = ra[l];
        Bs[b_r + l * b_step][b_c] = rb[l];
      }
      __syncthreads();
      if (k0 + kTileK < K) fetch(k0 + kTileK);  // in flight during the multiply below
#pragma unroll
      for (int kk = 0; kk < kTileK; ++kk) {
        T av[kMicro], bv[kMicro];
#pragma unroll
        for (int i = 0; i < kMicro; ++i) av[i] = As[kk][ty + kLanes * i];
#pragma unroll
        for (int j = 0; j < kMicro; ++j) bv[j] = Bs[kk][tx + kLanes * j];
#pragma unroll
        for (int i = 0; i < kMicro; ++i)
#pragma unroll
          for (int j = 0; j < kMicro; ++j) acc[i][j] = fma(av[i], bv[j], acc[i][j]);
      }
      __syncthreads();  // the tiles are overwritten by the next stage (or the next factor)
    }
    // The epilogue of this factor's GEMM: multiply into the running product.
#pragma unroll
    for (int i = 0; i < kMicro; ++i)
#pragma unroll
      for (int j = 0; j < kMicro; ++j) prod[i][j] = fi == 0 ? acc[i][j] : prod[i][j] * acc[i][j];
  }

#pragma unroll
  for (int i = 0; i < kMicro; ++i)
#pragma unroll
    for (int j = 0; j < kMicro; ++j) {
      const int64_t r = row0 + ty + kLanes * i, c = col0 + tx + kLanes * j;
      if (r < M && c < R) {
        const int64_t idx = r * R + c;
        // Read scale before writing out: the two may be the same buffer.
        out[idx] = scale ? prod[i][j] * scale[idx] : prod[i][j];
      }
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

// Elements of each tile (a's and b's are the same size) one thread moves per stage.
constexpr int kWLoads = kTile * kWTileK / kWThreads;  // 16
static_assert(kWThreads % kWTileK == 0 && kWThreads % kTile == 0,
              "a thread keeps one tile column across its loads (fetch's indexing)");

using AccFrag = wmma::fragment<wmma::accumulator, kFrag, kFrag, kFrag, float>;

__global__ void __launch_bounds__(kWThreads)
    hadamard_gemm_wmma(bf16* out, Factors<bf16> f, const bf16* scale, int64_t M, int64_t R) {
  __shared__ __align__(32) bf16 As[kTile][kLdA];
  __shared__ __align__(32) bf16 Bs[kWTileK][kLdB];
  __shared__ __align__(32) float Cs[kTile][kLdC];
  const int tid = threadIdx.x, warp = tid / 32, wm = warp / 2, wn = warp % 2;
  const int64_t row0 = int64_t(blockIdx.x) * kTile, col0 = int64_t(blockIdx.y) * kTile;
  // This thread's place in the tile loads (see fetch).
  constexpr int a_step = kWThreads / kWTileK, b_step = kWThreads / kTile;
  const int a_r = tid / kWTileK, a_c = tid % kWTileK, b_r = tid / kTile, b_c = tid % kTile;
  const bf16 zero = __float2bfloat16_rn(0.0f);

  AccFrag prod[kFragsPerWarp][kFragsPerWarp];
  for (int fi = 0; fi < f.n; ++fi) {
    const bf16* A = f.a[fi];
    const bf16* B = f.b[fi];
    const int64_t K = f.k[fi];
    AccFrag acc[kFragsPerWarp][kFragsPerWarp];
#pragma unroll
    for (int i = 0; i < kFragsPerWarp; ++i)
#pragma unroll
      for (int j = 0; j < kFragsPerWarp; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

    // Each thread's share of the next stage's tiles, fetched from global memory into
    // registers while the current stage is being multiplied (software pipelining).
    bf16 ra[kWLoads], rb[kWLoads];
    // Element e = tid + kWThreads l of a tile: in a's, row e / kWTileK = a_r + l a_step,
    // column a_c (fixed per thread); in b's, row b_r + l b_step, column b_c. Zeros past
    // M, K and R.
    auto fetch = [&](int64_t k0) {
      const bool a_in = k0 + a_c < K;
      const bf16* pa = A + (row0 + a_r) * K + k0 + a_c;
#pragma unroll
      for (int l = 0; l < kWLoads; ++l)
        ra[l] = a_in && row0 + a_r + l * a_step < M ? pa[int64_t(l * a_step) * K] : zero;
      const bool b_in = col0 + b_c < R;
      const bf16* pb = B + (k0 + b_r) * R + col0 + b_c;
#pragma unroll
      for (int l = 0; l < kWLoads; ++l)
        rb[l] = b_in && k0 + b_r + l * b_step < K ? pb[int64_t(l * b_step) * R] : zero;
    };
    if (K > 0) fetch(0);
    for (int64_t k0 = 0; k0 < K; k0 += kWTileK) {
      // The fetched stage into shared memory, at the positions fetch read them from.
#pragma unroll
      for (int l = 0; l < kWLoads; ++l) {
        As[a_r + l * a_step][a_c] = ra[l];
        Bs[b_r + l * b_step][b_c] = rb[l];
      }
      __syncthreads();
      if (k0 + kWTileK < K) fetch(k0 + kWTileK);  // in flight during the multiply below
#pragma unroll
      for (int kk = 0; kk < kWTileK; kk += kFrag) {
        wmma::fragment<wmma::matrix_a, kFrag, kFrag, kFrag, bf16, wmma::row_major> fa[kFragsPerWarp];
        wmma::fragment<wmma::matrix_b, kFrag, kFrag, kFrag, bf16, wmma::row_major> fb[kFragsPerWarp];
#pragma unroll
        for (int i = 0; i < kFragsPerWarp; ++i)
          wmma::load_matrix_sync(fa[i], &As[wm * kWarpTile + i * kFrag][kk], kLdA);
#pragma unroll
        for (int j = 0; j < kFragsPerWarp; ++j)
          wmma::load_matrix_sync(fb[j], &Bs[kk][wn * kWarpTile + j * kFrag], kLdB);
#pragma unroll
        for (int i = 0; i < kFragsPerWarp; ++i)
#pragma unroll
          for (int j = 0; j < kFragsPerWarp; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
      }
      __syncthreads();  // the tiles are overwritten by the next stage (or the next factor)
    }
    // Multiply into the running product, element by element in the fragments' own layout.
#pragma unroll
    for (int i = 0; i < kFragsPerWarp; ++i)
#pragma unroll
      for (int j = 0; j < kFragsPerWarp; ++j)
#pragma unroll
        for (int t = 0; t < acc[i][j].num_elements; ++t)
          prod[i][j].x[t] = fi == 0 ? acc[i][j].x[t] : prod[i][j].x[t] * acc[i][j].x[t];
  }

  // Stage the float32 product in shared memory, then each thread scales and rounds
  // elements of it (fragments do not say which thread holds which element).
#pragma unroll
  for (int i = 0; i < kFragsPerWarp; ++i)
#pragma unroll
    for (int j = 0; j < kFragsPerWarp; ++j)
      wmma::store_matrix_sync(&Cs[wm * kWarpTile + i * kFrag][wn * kWarpTile + j * kFrag], prod[i][j], kLdC,
                              wmma::mem_row_major);
  __syncthreads();
  for (int e = tid; e < kTile * kTile; e += kWThreads) {
    const int r = e / kTile, c = e % kTile;
    const int64_t gr = row0 + r, gc = col0 + c;
    if (gr < M && gc < R) {
      const int64_t idx = gr * R + gc;
      float v = Cs[r][c];
      if (scale) v *= __bfloat162float(scale[idx]);  // read before the write: may alias out
      out[idx] = __float2bfloat16_rn(v);
    }
  }
}

// ---------------------------------------------------------------- host side

template <class T>
void launch(const Tensor& out, const std::vector<Tensor>& a, const std::vector<Tensor>& b, const Tensor& scale) {
  const int64_t M = out.size(0), R = out.size(1);
  const int64_t row_tiles = (M + kTile - 1) / kTile, col_tiles = (R + kTile - 1) / kTile;
  // Rows on grid x (up to 2^31 - 1 tiles), columns on grid y (up to 65535 tiles).
  MU_CHECK(row_tiles <= 2147483647LL && col_tiles <= 65535, "hadamard_gemm: output (", M, ", ", R,
           ") needs a grid of ", row_tiles, " x ", col_tiles, " tiles of ", kTile, "; at most 2147483647 x 65535");
  const dim3 grid(static_cast<unsigned>(row_tiles), static_cast<unsigned>(col_tiles), 1u);
  T* o = static_cast<T*>(out.raw_data());
  const T* s = scale.defined() ? static_cast<const T*>(scale.raw_data()) : nullptr;
  cudaStream_t st = cuda::stream(out);
  // kMaxFactors products per launch; a later launch takes the partial product as scale.
  for (size_t first = 0; first < a.size(); first += kMaxFactors) {
    Factors<T> f{};
    f.n = 0;
    for (size_t k = first; k < a.size() && f.n < kMaxFactors; ++k, ++f.n) {
      f.a[f.n] = static_cast<const T*>(a[k].raw_data());
      f.b[f.n] = static_cast<const T*>(b[k].raw_data());
      f.k[f.n] = a[k].size(1);
    }
    const T* sc = first == 0 ? s : o;
    if constexpr (std::is_same_v<T, bf16>) {
      hadamard_gemm_wmma<<<grid, kWThreads, 0, st>>>(o, f, sc, M, R);
      MU_CUDA_CHECK_LAUNCH("hadamard_gemm (bfloat16, tensor cores)");
    } else {
      hadamard_gemm_simt<T><<<grid, kSimtThreads, 0, st>>>(o, f, sc, M, R);
      MU_CUDA_CHECK_LAUNCH("hadamard_gemm");
    }
  }
}

void hadamard_gemm(const Tensor& out, const std::vector<Tensor>& a, const std::vector<Tensor>& b,
                   const Tensor& scale) {
  if (out.numel() == 0) return;  // no grid of 0 blocks
  cuda::dispatch_float_bf16(out.dtype(), "hadamard_gemm", [&](auto tag) {
    using T = decltype(tag);
    launch<T>(out, a, b, scale);
  });
}

}  // namespace

MU_REGISTER_KERNEL(kernels::hadamard_gemm, DeviceType::CUDA, hadamard_gemm);

}  // namespace mu::cuda_kernels
