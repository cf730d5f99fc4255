// Reductions across the threads of a warp or a block, and the launch schemes of the
// line-wise kernels (softmax, cross_entropy, layer_norm): a dense tensor seen as (outer,
// n, inner), every line of n elements along the middle axis owned by one group of
// threads that reduce over it together. nvcc only.
//
//   inner == 1, n <= 1024: one warp per line (4 lines per block of 128 threads); lane r
//                          takes elements r, r + 32, ...
//   inner == 1, n  > 1024: one block of 256 threads per line; thread r takes r, r + 256, ...
//                          (1024 threads when a few lines are long: sampling's one row of
//                          a 50257-word vocabulary runs on one SM, and its passes wait on
//                          memory, each thread holding one load in flight at a time)
//   inner  > 1:            a bx x by block (bx * by = 256) owns bx neighbouring lines of
//                          one outer index: threadIdx.x picks the line (so a warp reads bx
//                          consecutive addresses), threadIdx.y in [0, by) the elements
//                          y, y + by, ... of it, and the by partial results of a line are
//                          combined through shared memory.
// Every scheme walks its lines (or tiles of lines) in a grid-stride loop. Reductions are
// in a fixed order for a given launch, which depends only on the sizes: the results are
// the same on every run.
#pragma once
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "ops/cuda/runtime.cuh"

namespace mu::cuda {

constexpr unsigned kFullMask = 0xffffffffu;
// Shared memory a group's reduction needs: 256 partial values of up to 8 bytes.
constexpr int kScratchBytes = 256 * 8;
// Blocks a grid-stride loop is given at most (runtime.cuh).
constexpr int64_t kMaxBlocks = MU_CUDA_MAX_BLOCKS;

// exp and log of float in float and of double in double, as the CPU's std::exp and
// std::log overloads compute them.
__device__ __forceinline__ float dev_exp(float v) { return expf(v); }
__device__ __forceinline__ double dev_exp(double v) { return exp(v); }
__device__ __forceinline__ float dev_log(float v) { return logf(v); }
__device__ __forceinline__ double dev_log(double v) { return log(v); }

template <class T>
__device__ __forceinline__ T dev_inf() {
  return T(INFINITY);
}

// Combiners. MaxOf keeps a when b is not greater: a NaN never wins, as in the CPU's
// `v > m ? v : m`, and the running values never hold NaN (they start at -inf).
struct SumOf {
  template <class A>
  __device__ A operator()(A a, A b) const { return a + b; }
};
struct MaxOf {
  template <class A>
  __device__ A operator()(A a, A b) const { return b > a ? b : a; }
};

// Reduces v over the 32 lanes of a warp (xor butterfly), then hands every lane lane 0's
// result: a combiner that is not exactly commutative (MaxOf on +0 and -0) still leaves
// one value in the whole warp.
template <class A, class Op>
__device__ __forceinline__ A warp_reduce(A v, Op op) {
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(kFullMask, v, o));
  return __shfl_sync(kFullMask, v, 0);
}

// The lanes of a warp sharing one line.
struct WarpGroup {
  int rank;
  static constexpr int size = 32;
  template <class A, class Op>
  __device__ A reduce(A v, Op op, A) const { return warp_reduce(v, op); }
};

// The threads of a 1-d block (a multiple of 32) sharing one line. Every thread must call
// reduce, and every thread gets the result.
struct BlockGroup {
  int rank, size;
  void* scratch;  // kScratchBytes of shared memory
  template <class A, class Op>
  __device__ A reduce(A v, Op op, A identity) const {
    A* s = static_cast<A*>(scratch);
    const int lane = rank & 31, warp = rank >> 5, warps = size >> 5;
    v = warp_reduce(v, op);
    __syncthreads();  // the previous reduction's readers are done with s
    if (lane == 0) s[warp] = v;
    __syncthreads();
    // Every warp combines the warps' results in the same order, so all agree.
    return warp_reduce(lane < warps ? s[lane] : identity, op);
  }
};

// The by threads of one column (threadIdx.x) of a bx x by block sharing one line. Every
// thread of the block must call reduce; each gets its column's result.
struct ColumnGroup {
  int rank, size;  // threadIdx.y, blockDim.y
  void* scratch;   // kScratchBytes of shared memory
  template <class A, class Op>
  __device__ A reduce(A v, Op op, A) const {
    A* s = static_cast<A*>(scratch);
    const int bx = int(blockDim.x), x = int(threadIdx.x);
    __syncthreads();  // the previous reduction's readers are done with s
    s[rank * bx + x] = v;
    __syncthreads();
    // Every thread of the column adds the column's partials in row order: one result.
    A r = s[x];
    for (int k = 1; k < size; ++k) r = op(r, s[k * bx + x]);
    return r;
  }
};

// body(group, off, st, line, active) for each line: off is the element offset of the
// line's first element, st the stride between its elements, line = o * inner + i its
// number. active is false for the padding threads of the last tile of the column scheme:
// they must still join every reduction, but touch no element of line (which is past the
// end).
template <class Body>
__global__ void lines_warp_kernel(int64_t lines, Body body) {
  const int per_block = int(blockDim.x) >> 5;
  const WarpGroup g{int(threadIdx.x) & 31};
  // The loop condition is the same for the 32 lanes of a warp (one line per warp).
  for (int64_t l = int64_t(blockIdx.x) * per_block + (threadIdx.x >> 5); l < lines; l += int64_t(gridDim.x) * per_block)
    body(g, l * body.n, int64_t(1), l, true);
}

template <class Body>
__global__ void lines_block_kernel(int64_t lines, Body body) {
  __shared__ alignas(8) unsigned char scratch[kScratchBytes];
  const BlockGroup g{int(threadIdx.x), int(blockDim.x), scratch};
  for (int64_t l = blockIdx.x; l < lines; l += gridDim.x) body(g, l * body.n, int64_t(1), l, true);
}

template <class Body>
__global__ void lines_column_kernel(int64_t outer, int64_t inner, Body body) {
  __shared__ alignas(8) unsigned char scratch[kScratchBytes];
  const ColumnGroup g{int(threadIdx.y), int(blockDim.y), scratch};
  const int64_t tiles_per_outer = (inner + blockDim.x - 1) / blockDim.x, tiles = outer * tiles_per_outer;
  // The tile index is the same for the whole block, so every thread runs the same
  // number of iterations and reaches the same reductions.
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t o = t / tiles_per_outer, i = (t % tiles_per_outer) * blockDim.x + threadIdx.x;
    const bool active = i < inner;
    const int64_t ii = active ? i : 0;  // a padding thread's offsets stay inside the tensor
    body(g, o * body.n * inner + ii, inner, o * inner + ii, active);
  }
}

// Below kFewLines lines of at least kLongLine elements, a contiguous line gets a block of
// 1024 threads (the GPU has 132 SMs: fewer lines leave most of them idle).
constexpr int64_t kFewLines = 64, kLongLine = 8192;

// Runs body over the outer * inner lines of n elements (body.n == n) on the stream,
// choosing the scheme described at the top. Nothing is launched without lines.
template <class Body>
void launch_lines(int64_t outer, int64_t n, int64_t inner, cudaStream_t stream, const char* name, const Body& body) {
  const int64_t lines = outer * inner;
  if (lines == 0) return;
  if (inner == 1 && n <= 1024) {
    const int threads = 128, per_block = threads / 32;
    const int64_t blocks = (lines + per_block - 1) / per_block;
    lines_warp_kernel<<<unsigned(blocks < kMaxBlocks ? blocks : kMaxBlocks), threads, 0, stream>>>(lines, body);
  } else if (inner == 1) {
    const int threads = lines < kFewLines && n >= kLongLine ? 1024 : 256;
    lines_block_kernel<<<unsigned(lines < kMaxBlocks ? lines : kMaxBlocks), threads, 0, stream>>>(lines, body);
  } else {
    // bx: the smallest power of two >= inner, at most 32 (a warp's worth of lines).
    int bx = 2;
    while (bx < 32 && bx < inner) bx *= 2;
    const dim3 block(unsigned(bx), unsigned(256 / bx));
    const int64_t tiles = outer * ((inner + bx - 1) / bx);
    lines_column_kernel<<<unsigned(tiles < kMaxBlocks ? tiles : kMaxBlocks), block, 0, stream>>>(outer, inner, body);
  }
  MU_CUDA_CHECK_LAUNCH(name);
}

}  // namespace mu::cuda
