// A bitonic sort run by one thread block over one array in shared or global memory, and
// a deterministic block sum. Used by the line kernels of ops/cuda/index.cu (sort_indices)
// and ops/cuda/entmax.cu. nvcc only.
#pragma once
#include <cstdint>

#include "ops/cuda/runtime.cuh"

namespace mu::cuda {

// The smallest power of two >= n (1 for n <= 1).
inline int64_t next_pow2(int64_t n) {
  int64_t p = 1;
  while (p < n) p <<= 1;
  return p;
}

// The grid of a block-per-line kernel whose blocks each hold a global work array of
// `bytes_per_block`: two blocks per SM of an H100 (132 SMs), fewer where the arrays would
// take more than 256 MiB, at least one; never more than `lines` (nor the build's
// MU_CUDA_MAX_BLOCKS).
inline unsigned work_grid(int64_t lines, int64_t bytes_per_block) {
  int64_t g = 264 < MU_CUDA_MAX_BLOCKS ? 264 : MU_CUDA_MAX_BLOCKS;
  const int64_t fit = (int64_t(1) << 28) / (bytes_per_block > 0 ? bytes_per_block : 1);
  if (fit < g) g = fit;
  if (lines < g) g = lines;
  return unsigned(g < 1 ? 1 : g);
}

// Sorts a[0, P) (P a power of two) by the strict order `less`, cooperatively by every
// thread of the block; every thread must call it. Each thread handles the pairs
// i = threadIdx.x, threadIdx.x + blockDim.x, ... of every stage, and a __syncthreads
// separates the stages. Bitonic networks are not stable, so `less` must be a total order
// (ties broken by position) wherever a stable result is wanted. Ends with the block
// synchronised.
template <class V, class Less>
__device__ void block_bitonic_sort(V* a, int64_t P, Less less) {
  __syncthreads();  // the array was written by other threads
  for (int64_t k = 2; k <= P; k <<= 1) {
    for (int64_t j = k >> 1; j > 0; j >>= 1) {
      for (int64_t i = threadIdx.x; i < P; i += blockDim.x) {
        const int64_t ixj = i ^ j;
        if (ixj > i) {
          // Within blocks of size k, ascending where bit k of i is clear, descending
          // where set: merging those pairs of runs gives ascending runs of size 2k.
          const bool up = (i & k) == 0;
          const V x = a[i], y = a[ixj];
          if (up ? less(y, x) : less(x, y)) {
            a[i] = y;
            a[ixj] = x;
          }
        }
      }
      __syncthreads();
    }
  }
}

// The sum of every thread's v over the block, in a fixed tree order (warp shuffles, then
// the warps' partials in a second warp), returned to every thread. `scratch` holds 32
// values of T in shared memory; blockDim.x is a multiple of 32. Every thread must call it.
template <class T>
__device__ T block_sum(T v, T* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : T(0);
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

}  // namespace mu::cuda
