// CUDA kernel of the fused Hadamard of GEMMs (declared in ops/kernels/hadamard_gemm.h;
// the CPU twin is ops/cpu/hadamard_gemm.cpp): out = scale ∗ Π_k (a_k · b_k).
//
// Mapping: one thread block per output tile (blockIdx.x: tile row, blockIdx.y: tile
// column). For each factor k in turn the block runs the tiled GEMM of ops/cuda/tile_gemm.cuh
// over K_k and keeps the factor's tile of sums in registers; the tile is then multiplied
// into the running product, also in registers. Only the final product, times scale, is
// written: no (M, R) intermediate ever reaches global memory.
//
// - float32 / float64: the SIMT tile product, fused multiply-adds in T. float32 sums are
//   carried in float32, as cuBLAS's float32 GEMM carries them: a double accumulator
//   would run at 1/64 of the rate on an H100 and defeat the point of the kernel.
// - bfloat16: the WMMA tile product (float32 accumulator fragments). The product of
//   factors is taken element by element on the accumulator fragments; the epilogue stages
//   the product through shared memory so each thread can apply scale and round to
//   bfloat16 once.
//
// At most kMaxFactors products per launch; more are folded in by further launches that
// take the partial product as their scale (in place: every element of scale is read only
// by the thread that then writes the same element of out).
#include <cuda_runtime.h>
#include <mma.h>

#include <cstdint>

#include "ops/cuda/dtypes.cuh"
#include "ops/cuda/runtime.cuh"
#include "ops/cuda/tile_gemm.cuh"
#include "ops/kernels/hadamard_gemm.h"

namespace mu::cuda_kernels {
namespace {

using cuda::bf16;
using namespace tile_gemm;

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

template <class T>
__global__ void __launch_bounds__(kSimtThreads)
    hadamard_gemm_simt(T* out, Factors<T> f, const T* scale, int64_t M, int64_t R) {
  __shared__ SimtStage<T> st;
  const int64_t row0 = int64_t(blockIdx.x) * kTile, col0 = int64_t(blockIdx.y) * kTile;
  T prod[kMicro][kMicro];
  for (int fi = 0; fi < f.n; ++fi) {
    const T* A = f.a[fi];
    const int64_t K = f.k[fi];
    T acc[kMicro][kMicro];
    simt_tile_product(acc, st, [A, K](int64_t r, int64_t k) { return A[r * K + k]; }, f.b[fi], M, K, R, row0, col0);
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
      const int64_t r = row0 + simt_row(i), c = col0 + simt_col(j);
      if (r < M && c < R) {
        const int64_t idx = r * R + c;
        // Read scale before writing out: the two may be the same buffer.
        out[idx] = scale ? prod[i][j] * scale[idx] : prod[i][j];
      }
    }
}

// ---------------------------------------------------------------- bfloat16 (tensor cores)

__global__ void __launch_bounds__(kWThreads)
    hadamard_gemm_wmma(bf16* out, Factors<bf16> f, const bf16* scale, int64_t M, int64_t R) {
  __shared__ WmmaStage st;
  __shared__ WmmaOut staged;
  const int tid = threadIdx.x;
  const int64_t row0 = int64_t(blockIdx.x) * kTile, col0 = int64_t(blockIdx.y) * kTile;
  AccFrag prod[kFragsPerWarp][kFragsPerWarp];
  for (int fi = 0; fi < f.n; ++fi) {
    const bf16* A = f.a[fi];
    const int64_t K = f.k[fi];
    AccFrag acc[kFragsPerWarp][kFragsPerWarp];
    wmma_tile_product(acc, st, [A, K](int64_t r, int64_t k) { return A[r * K + k]; }, f.b[fi], M, K, R, row0, col0);
    // Multiply into the running product, element by element in the fragments' own layout
    // (two fragments of one type map their elements to the same matrix positions).
#pragma unroll
    for (int i = 0; i < kFragsPerWarp; ++i)
#pragma unroll
      for (int j = 0; j < kFragsPerWarp; ++j)
#pragma unroll
        for (int t = 0; t < acc[i][j].num_elements; ++t)
          prod[i][j].x[t] = fi == 0 ? acc[i][j].x[t] : prod[i][j].x[t] * acc[i][j].x[t];
  }

  // Stage the float32 product, then each thread scales and rounds elements of it.
  wmma_store_tile(prod, staged);
  for (int e = tid; e < kTile * kTile; e += kWThreads) {
    const int r = e / kTile, c = e % kTile;
    const int64_t gr = row0 + r, gc = col0 + c;
    if (gr < M && gc < R) {
      const int64_t idx = gr * R + gc;
      float v = staged.c[r][c];
      if (scale) v *= __bfloat162float(scale[idx]);  // read before the write: may alias out
      out[idx] = __float2bfloat16_rn(v);
    }
  }
}

// ---------------------------------------------------------------- host side

template <class T>
void launch(const Tensor& out, const std::vector<Tensor>& a, const std::vector<Tensor>& b, const Tensor& scale) {
  const int64_t M = out.size(0), R = out.size(1);
  const dim3 grid = tile_grid(M, R, "hadamard_gemm");
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
