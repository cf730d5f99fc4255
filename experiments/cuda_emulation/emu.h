// Host emulation of the few CUDA features the kernels of ops/cuda/ use, so that their
// index arithmetic, masking and synchronisation can be checked on a machine without a
// GPU: one std::thread per CUDA thread, blocks run one after another, __syncthreads a
// barrier of the block, the warp shuffles (__shfl_xor_sync, __shfl_down_sync,
// __shfl_sync) an exchange through per-warp slots and one warp barrier.
// Grids and blocks are dim3 (threads numbered x fastest, warps cut from that linear
// order, as on the GPU). Shared memory, dynamic (ctx->smem) or static (emu_shared, which
// run.sh substitutes for `__shared__ T name[N]`), starts as garbage (not zeros), so an
// entry read before it is written shows. Not a CUDA model: no races are detected, and a
// shuffle or barrier that not every thread of its warp or block reaches hangs (run.sh
// runs the programs under a timeout).
#pragma once
#include <cuda_runtime.h>
#include <algorithm>
#include <barrier>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>
#undef __launch_bounds__
#define __launch_bounds__(x)
struct Dim { unsigned x = 0, y = 0, z = 0; };
inline thread_local Dim threadIdx_, blockIdx_;
inline Dim gridDim_, blockDim_;
#define threadIdx threadIdx_
#define blockIdx blockIdx_
#define gridDim gridDim_
#define blockDim blockDim_
#ifndef warpSize
#define warpSize 32
#endif
struct BlockCtx {
  std::barrier<>* bar;
  std::barrier<>* warp[32];
  double shfl[2][1024];  // two rounds of slots, used alternately (see emu_shuffle)
  unsigned char* smem;
  // Static __shared__ arrays of this block, by the address of their key (one per
  // declaration and template instance), allocated by the first thread to reach one.
  std::mutex shared_mu;
  std::map<const void*, std::unique_ptr<double[]>> shared;
};
inline thread_local BlockCtx* ctx;  // the block the calling thread belongs to
inline thread_local unsigned linear_tid;  // x + y * blockDim.x + z * blockDim.x * blockDim.y
inline thread_local unsigned shfl_round;  // shuffles this thread has made in the launch
inline void __syncthreads() { ctx->bar->arrive_and_wait(); }
// The high 32 bits of a 32 x 32-bit product (ops/cuda/strided.cuh's magic-number divisions).
inline unsigned __umulhi(unsigned a, unsigned b) { return unsigned((uint64_t(a) * b) >> 32); }

// The block's instance of a static __shared__ array of type A (an array type), filled
// with garbage on first use. Every thread of the block gets the same storage.
template <class A>
A& emu_shared(const void* key) {
  std::lock_guard<std::mutex> lock(ctx->shared_mu);
  auto& slot = ctx->shared[key];
  if (!slot) {
    const size_t words = (sizeof(A) + 7) / 8;
    slot.reset(new double[words]);
    for (size_t i = 0; i < words; ++i) slot[i] = 12345.678;  // garbage, not zeros
  }
  return *reinterpret_cast<A*>(slot.get());
}

// Every lane of the warp publishes v, then reads the value of lane src(lane) (its own
// when src is out of the warp, as __shfl_down_sync leaves the top lanes). Rounds
// alternate between two sets of slots, so one barrier per shuffle is enough: a lane can
// write round k + 2's values (into round k's slots) only after the barrier of round
// k + 1, which every lane reaches after reading round k's.
template <class V, class Src>
V emu_shuffle(V v, Src src) {
  static_assert(sizeof(V) <= sizeof(double), "one slot per lane");
  const int lane = int(linear_tid % 32), warp = int(linear_tid / 32);
  // Each lane's slot is a double wide: a V of any size <= 8 sits at its start.
  double* base = ctx->shfl[shfl_round++ & 1] + warp * 32;
  auto slot = [&](int l) -> V& { return *reinterpret_cast<V*>(base + l); };
  slot(lane) = v;
  ctx->warp[warp]->arrive_and_wait();
  const int s = src(lane);
  return (s >= 0 && s < 32) ? slot(s) : v;
}
template <class V>
V __shfl_xor_sync(unsigned, V v, int w) { return emu_shuffle(v, [w](int l) { return l ^ w; }); }
template <class V>
V __shfl_down_sync(unsigned, V v, unsigned d) { return emu_shuffle(v, [d](int l) { return l + int(d); }); }
template <class V>
V __shfl_sync(unsigned, V v, int src) { return emu_shuffle(v, [src](int) { return src & 31; }); }

// Runs body() as a grid of `grid` blocks of `block` threads with `smem` bytes of dynamic
// shared memory; blocks one after another, the threads of a block at once. One team of
// std::threads serves every block of the launch (creating a thread costs more than most
// blocks' work): between two blocks the team meets at a barrier of its own, and the last
// thread to arrive refills shared memory with garbage and forgets the static arrays. That
// barrier is not the block's: a thread that returns early while the others wait in a
// __syncthreads still leaves them waiting, and the hang shows, as on the GPU.
template <class F>
void emu_launch(dim3 grid, dim3 block, size_t smem, F body) {
  gridDim_ = {grid.x, grid.y, grid.z};
  blockDim_ = {block.x, block.y, block.z};
  const unsigned threads = block.x * block.y * block.z;
  if (threads == 0 || threads > 1024 || grid.x == 0 || grid.y == 0 || grid.z == 0) {
    fprintf(stderr, "emu_launch: invalid configuration grid (%u, %u, %u) block (%u, %u, %u)\n", grid.x, grid.y,
            grid.z, block.x, block.y, block.z);
    std::abort();
  }
  std::vector<double> mem(smem / 8 + 16);
  BlockCtx c;
  auto fresh_block = [&]() noexcept {
    std::fill(mem.begin(), mem.end(), 12345.678);  // garbage, not zeros
    c.shared.clear();
  };
  fresh_block();
  std::barrier<> bar(threads);
  std::barrier<decltype(fresh_block)> team(threads, fresh_block);
  std::vector<std::unique_ptr<std::barrier<>>> wb;
  c.bar = &bar;
  for (unsigned w = 0; w < (threads + 31) / 32; ++w) {
    // A last partial warp synchronises only its own lanes.
    const unsigned lanes = threads - w * 32 < 32 ? threads - w * 32 : 32;
    wb.push_back(std::make_unique<std::barrier<>>(lanes));
    c.warp[w] = wb.back().get();
  }
  c.smem = reinterpret_cast<unsigned char*>(mem.data());
  std::vector<std::thread> ts;
  for (unsigned t = 0; t < threads; ++t)
    ts.emplace_back([&, t] {
      threadIdx_ = {t % block.x, t / block.x % block.y, t / (block.x * block.y)};
      linear_tid = t;
      ctx = &c;
      for (unsigned bz = 0; bz < grid.z; ++bz)
        for (unsigned by = 0; by < grid.y; ++by)
          for (unsigned bx = 0; bx < grid.x; ++bx) {
            blockIdx_ = {bx, by, bz};
            shfl_round = 0;
            body();
            team.arrive_and_wait();  // every thread done with this block; then a fresh one
          }
    });
  for (auto& t : ts) t.join();
}
// The form run.sh writes for `k<<<grid, block, smem, stream>>>(args)`.
template <class F>
void emu_launch(dim3 grid, dim3 block, size_t smem, cudaStream_t, F body) {
  emu_launch(grid, block, smem, body);
}
template <class F>
void emu_launch(dim3 grid, dim3 block, F body) {
  emu_launch(grid, block, 0, body);
}
