// Shims beyond emu.h for the elementwise, indexing, entmax and optimiser kernels (see
// run.sh): the rest of the warp and block intrinsics those kernels call, the
// correctly-rounded arithmetic intrinsics as plain host arithmetic (the harness is built
// with -ffp-contract=off, so every operation rounds once, as the intrinsics do), and a
// launch that takes the <<<grid, block, smem, stream>>> configuration as written.
#pragma once
// The runtime header first, so that the launch check below replaces its own.
#include "ops/cuda/runtime.cuh"
#include "emu.h"
#include <atomic>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

// The name the last launch was checked under (the attention harness tells a path by it).
inline std::string emu_last_launch;
#undef MU_CUDA_CHECK_LAUNCH
#define MU_CUDA_CHECK_LAUNCH(name) (void)(emu_last_launch = (name))
// Nor does anything else here leave one behind: the last error is always none.
#define cudaGetLastError() cudaSuccess
// Copies and sets on the stream as emu_queue.h orders them (immediate unless deferred);
// errors are never raised.
#include <cstring>
#define cudaMemcpyAsync(dst, src, n, kind, s) emu_memcpy_async((dst), (src), (n), (kind), (s))
#define cudaMemsetAsync(p, v, n, s) emu_memset_async((p), (v), (n), (s))
#define cudaStreamSynchronize(s) emu_stream_synchronize(s)
#define cudaGetErrorName(e) "emulated"
#define cudaGetErrorString(e) "emulated"
// The device is an H100 (as far as the kernels ask): 227 KiB of shared memory per block
// when a kernel opts in (emu.h's kEmuSmemOptin and cudaFuncSetAttribute).
inline cudaError_t emu_device_attribute(int* value, cudaDeviceAttr attr) {
  if (attr != cudaDevAttrMaxSharedMemoryPerBlockOptin) {
    fprintf(stderr, "emu_extra.h: cudaDeviceGetAttribute(%d) is not emulated\n", int(attr));
    std::abort();
  }
  *value = kEmuSmemOptin;
  return cudaSuccess;
}
#define cudaDeviceGetAttribute(value, attr, device) emu_device_attribute((value), (attr))

// Block-wide "any": every thread's predicate ORed, handed to every thread. The three
// barriers keep one call's flag apart from the next call's (blocks run one at a time).
inline std::atomic<int> emu_or_flag{0};
inline int __syncthreads_or(int pred) {
  __syncthreads();
  if (pred) emu_or_flag.store(1);
  __syncthreads();
  const int r = emu_or_flag.load();
  __syncthreads();
  if (threadIdx.x == 0) emu_or_flag.store(0);
  return r;
}

// Lane `lane` - d's value (this lane's own below d), through emu.h's shuffle slots.
template <class V>
V __shfl_up_sync(unsigned, V v, unsigned d) {
  return emu_shuffle(v, [d](int l) { return l - int(d); });
}

// One IEEE rounding each (no contraction under -ffp-contract=off).
#define __dmul_rn(a, b) emu_dmul(a, b)
#define __dadd_rn(a, b) emu_dadd(a, b)
#define __ddiv_rn(a, b) emu_ddiv(a, b)
#define __dsqrt_rn(a) emu_dsqrt(a)
#define __fmul_rn(a, b) emu_fmul(a, b)
#define __fadd_rn(a, b) emu_fadd(a, b)
#define __fdiv_rn(a, b) emu_fdiv(a, b)
#define __fsqrt_rn(a) emu_fsqrt(a)
#define __fmaf_rn(a, b, c) emu_fmaf(a, b, c)
#define __fma_rn(a, b, c) emu_fma(a, b, c)
inline double emu_dmul(double a, double b) { return a * b; }
inline double emu_dadd(double a, double b) { return a + b; }
inline double emu_ddiv(double a, double b) { return a / b; }
inline double emu_dsqrt(double a) { return std::sqrt(a); }
inline float emu_fmul(float a, float b) { return a * b; }
inline float emu_fadd(float a, float b) { return a + b; }
inline float emu_fdiv(float a, float b) { return a / b; }
inline float emu_fsqrt(float a) { return std::sqrt(a); }
inline float emu_fmaf(float a, float b, float c) { return std::fma(a, b, c); }
inline double emu_fma(double a, double b, double c) { return std::fma(a, b, c); }

// kernel<<<grid, block, smem, stream>>>(args) as rewritten by extract.py.
// With emu_sequential set, the threads run one after another (see emu_launch_seq): for
// kernels without barriers or shuffles only (one that has them then crashes on ctx).
inline bool emu_sequential = false;
// Called before every launch when set (emu_nccl.h: no kernel on a stream NCCL is busy with).
inline void (*emu_before_launch)() = nullptr;
template <class F>
void emu_launch_seq(unsigned blocks, unsigned threads, F body);
// A launch dimension as written: a count or a dim3.
template <class D>
dim3 emu_dim(D d) {
  if constexpr (std::is_same_v<D, dim3>) return d;
  else return dim3(unsigned(d));
}
template <class G, class B, class S, class F>
void emu_launch_cfg(G grid, B block, S smem, cudaStream_t stream, F body) {
  if (emu_before_launch) emu_before_launch();
  if constexpr (!std::is_same_v<G, dim3> && !std::is_same_v<B, dim3>)
    if (emu_sequential) return emu_launch_seq(unsigned(grid), unsigned(block), body);
  emu_launch(emu_dim(grid), emu_dim(block), size_t(smem), stream, body);
}

// A kernel without barriers or shuffles run one thread after another (much faster than
// a fiber each; only for kernels whose threads never wait on one another).
template <class F>
void emu_launch_seq(unsigned blocks, unsigned threads, F body) {
  emu_next_kernel = nullptr;  // no shared memory here to check a grant against
  emu_check_config(dim3(blocks), dim3(threads));
  gridDim_ = {blocks, 1, 1};
  blockDim_ = {threads, 1, 1};
  const bool reverse = emu_reverse_order();  // emu.h: blocks and threads in descending order
  for (unsigned kb = 0; kb < blocks; ++kb)
    for (unsigned kt = 0; kt < threads; ++kt) {
      const unsigned b = reverse ? blocks - 1 - kb : kb, t = reverse ? threads - 1 - kt : kt;
      threadIdx_.x = t;
      blockIdx_.x = b;
      ctx = nullptr;
      body();
    }
}
