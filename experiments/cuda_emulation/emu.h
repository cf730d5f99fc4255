// Host emulation of the few CUDA features the attention kernels of ops/cuda/attention.cu
// use, so that their index arithmetic, masking and synchronisation can be checked on a
// machine without a GPU: one std::thread per CUDA thread, blocks run one after another,
// __syncthreads a barrier of the block, __shfl_xor_sync an exchange through a per-warp
// buffer between two warp barriers. Shared memory starts as garbage (not zeros), so a
// tile entry read before it is written shows. Not a CUDA model: no races are detected.
#pragma once
#include <cuda_runtime.h>
#include <barrier>
#include <thread>
#include <vector>
#include <memory>
#undef __launch_bounds__
#define __launch_bounds__(x)
struct Dim { unsigned x = 0, y = 0, z = 0; };
inline thread_local Dim threadIdx_, blockIdx_;
inline Dim gridDim_, blockDim_;
#define threadIdx threadIdx_
#define blockIdx blockIdx_
#define gridDim gridDim_
#define blockDim blockDim_
struct BlockCtx {
  std::barrier<>* bar;
  std::barrier<>* warp[32];
  double shfl[1024];
  unsigned char* smem;
};
inline thread_local BlockCtx* ctx;  // the block the calling thread belongs to
inline void __syncthreads() { ctx->bar->arrive_and_wait(); }
template <class V>
V __shfl_xor_sync(unsigned, V v, int w) {
  int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  V* slots = reinterpret_cast<V*>(ctx->shfl) + warp * 32;
  slots[lane] = v;
  ctx->warp[warp]->arrive_and_wait();
  V r = slots[lane ^ w];
  ctx->warp[warp]->arrive_and_wait();
  return r;
}
// Runs body() as `blocks` blocks of `threads` threads with `smem` bytes of shared memory.
template <class F>
void emu_launch(unsigned blocks, unsigned threads, size_t smem, F body) {
  gridDim_.x = blocks;
  blockDim_.x = threads;
  for (unsigned b = 0; b < blocks; ++b) {
    std::vector<double> mem(smem / 8 + 16, 12345.678);  // garbage, not zeros
    std::barrier<> bar(threads);
    std::vector<std::unique_ptr<std::barrier<>>> wb;
    BlockCtx c;
    c.bar = &bar;
    for (unsigned w = 0; w < (threads + 31) / 32; ++w) {
      wb.push_back(std::make_unique<std::barrier<>>(32));
      c.warp[w] = wb.back().get();
    }
    c.smem = reinterpret_cast<unsigned char*>(mem.data());
    std::vector<std::thread> ts;
    for (unsigned t = 0; t < threads; ++t)
      ts.emplace_back([&, t] {
        threadIdx_.x = t;
        blockIdx_.x = b;
        ctx = &c;
        body();
      });
    for (auto& t : ts) t.join();
  }
}
