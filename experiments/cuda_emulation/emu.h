// Host emulation of the few CUDA features the kernels of ops/cuda/ use, so that their
// index arithmetic, masking and synchronisation can be checked on a machine without a
// GPU: each CUDA thread a fiber (its own stack, switched by _setjmp/_longjmp) on the calling thread,
// blocks run one after another, __syncthreads a barrier of the block's fibers, the warp
// shuffles (__shfl_xor_sync, __shfl_down_sync, __shfl_sync) an exchange through per-warp
// slots and one warp barrier. A fiber runs until it waits at a barrier or ends; a
// scheduler resumes, in thread order, every fiber whose barrier has opened (switching
// fibers costs far less than waking an OS thread, and no system call).
// Grids and blocks are dim3 (threads numbered x fastest, warps cut from that linear
// order, as on the GPU). Shared memory, dynamic (ctx->smem) or static (emu_shared, which
// run.sh substitutes for `__shared__ T name[N]`), starts as garbage (not zeros), so an
// entry read before it is written shows. Not a CUDA model: no races are detected, but
// with MUMOE_EMULATED_ORDER=reverse blocks run last to first and, between barriers, a
// block's threads from the highest to the lowest, so that a kernel that needs some
// order the GPU does not promise (a thread reading what a lower one wrote with no barrier
// between, a block reading another block's output) shows as wrong data in one of the two
// orders. A barrier or shuffle that some thread of its block or warp never reaches (it returned, or
// waits at another) stops the program with a message naming the block and the count, and so
// does a launch a GPU would refuse: past the block and grid limits, a kernel's
// __launch_bounds__, or the shared memory its kernel may have (see emu_func_set_attribute).
// checks_emulated.cpp makes each of these faults on purpose and requires the stop.
#pragma once
#include <cuda_runtime.h>
#include "emu_queue.h"
#include <setjmp.h>
#include <ucontext.h>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>
// Under AddressSanitizer, every switch between the scheduler's stack and a fiber's is
// announced (its fiber annotations), so that it knows which stack is live: otherwise it
// takes a fiber's frames for overflows of the thread's stack, or gives up on them.
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#define EMU_FIBER_SWITCH(save, bottom, size) __sanitizer_start_switch_fiber((save), (bottom), (size))
#define EMU_FIBER_ARRIVED(saved, bottom_from, size_from) __sanitizer_finish_switch_fiber((saved), (bottom_from), (size_from))
#else
#define EMU_FIBER_SWITCH(save, bottom, size) ((void)0)
#define EMU_FIBER_ARRIVED(saved, bottom_from, size_from) ((void)0)
#endif
#undef __launch_bounds__
#define __launch_bounds__(...)
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

// A barrier of `expected` fibers: the last to arrive opens it (a new generation) and goes
// on; the others return to the scheduler until it has opened.
struct EmuBarrier {
  unsigned expected = 0, arrived = 0;
  uint64_t generation = 0;
  void arrive_and_wait();
};

struct BlockCtx {
  EmuBarrier* bar;
  EmuBarrier* warp[32];
  double shfl[2][1024];  // two rounds of slots, used alternately (see emu_shuffle)
  unsigned char* smem;
  // Static __shared__ arrays of this block, by the address of their key (one per
  // declaration and template instance), allocated by the first thread to reach one.
  std::mutex shared_mu;
  std::map<const void*, std::unique_ptr<double[]>> shared;  // 128 bytes more than asked, for the alignment
  size_t shared_bytes = 0;  // their sizes summed: the kernel's static shared memory
};
// The running fiber's view, set by the scheduler whenever it resumes one.
inline thread_local BlockCtx* ctx;  // the block the calling thread belongs to
inline thread_local unsigned linear_tid;  // x + y * blockDim.x + z * blockDim.x * blockDim.y
inline thread_local unsigned shfl_round;  // shuffles this thread has made in the block

// One CUDA thread: a fiber kept for the whole program (one per thread index of a block),
// what it waits for, and its own copies of the globals above. A fiber is started once,
// from its ucontext (the only switch that costs a system call: setcontext restores the
// signal mask); from then on every switch is _setjmp/_longjmp between its stack and the
// scheduler's, and a fiber that finished a block's body loops to run the next block's.
struct EmuFiber {
  jmp_buf jb;  // where it resumes
  ucontext_t uc;  // how it starts
  bool started = false;
  Dim tid;
  unsigned linear = 0, shfl_round = 0;
  const EmuBarrier* wait_on = nullptr;  // null: runnable
  uint64_t wait_generation = 0;
  bool done = false;
  void* asan_fake_stack = nullptr;  // AddressSanitizer's, kept while the fiber is switched out
};
inline jmp_buf emu_scheduler;  // where a fiber returns when it waits or ends
// The scheduler's stack (as a fiber learns it on arriving) and AddressSanitizer's state of
// it while a fiber runs: for the annotations of EMU_FIBER_SWITCH (no-ops without ASan).
inline const void* emu_scheduler_stack = nullptr;
inline size_t emu_scheduler_stack_size = 0;
inline void* emu_scheduler_fake_stack = nullptr;
inline EmuFiber* emu_running = nullptr;
inline void (*emu_body_call)(void*) = nullptr;  // the launch's body, type-erased
inline void* emu_body_arg = nullptr;
// Back to the scheduler; returns when the scheduler resumes this fiber.
inline void emu_yield(EmuFiber* f) {
  if (_setjmp(f->jb) == 0) {
    EMU_FIBER_SWITCH(&f->asan_fake_stack, emu_scheduler_stack, emu_scheduler_stack_size);
    _longjmp(emu_scheduler, 1);
  }
  EMU_FIBER_ARRIVED(f->asan_fake_stack, &emu_scheduler_stack, &emu_scheduler_stack_size);
}
[[noreturn]] inline void emu_fiber_entry() {
  EMU_FIBER_ARRIVED(nullptr, &emu_scheduler_stack, &emu_scheduler_stack_size);  // a fresh fiber
  for (;;) {
    emu_body_call(emu_body_arg);
    emu_running->done = true;
    emu_yield(emu_running);  // resumed only for a later block: run its body
  }
}
// From the scheduler: runs f until it waits or finishes.
inline void emu_resume(EmuFiber& f) {
  if (_setjmp(emu_scheduler) == 0) {
    EMU_FIBER_SWITCH(&emu_scheduler_fake_stack, f.uc.uc_stack.ss_sp, f.uc.uc_stack.ss_size);
    if (!f.started) {
      f.started = true;
      setcontext(&f.uc);
    }
    _longjmp(f.jb, 1);
  }
  EMU_FIBER_ARRIVED(emu_scheduler_fake_stack, nullptr, nullptr);
}

inline void EmuBarrier::arrive_and_wait() {
  const uint64_t g = generation;
  if (++arrived == expected) {
    arrived = 0;
    ++generation;
    return;
  }
  EmuFiber* f = emu_running;
  f->wait_on = this;
  f->wait_generation = g;
  f->shfl_round = shfl_round;
  emu_yield(f);
}

inline void __syncthreads() { ctx->bar->arrive_and_wait(); }
// The warp's lanes meet (the mask is taken to be the whole warp, the only use here).
inline void __syncwarp(unsigned = 0xffffffffu) { ctx->warp[linear_tid / 32]->arrive_and_wait(); }

// Fibers switch only at barriers, so a read-modify-write is already indivisible.
inline float atomicAdd(float* p, float v) {
  const float old = *p;
  *p = old + v;
  return old;
}
inline unsigned atomicAdd(unsigned* p, unsigned v) {
  const unsigned old = *p;
  *p = old + v;
  return old;
}

// The high 32 bits of a 32 x 32-bit product (ops/cuda/strided.cuh's magic-number divisions).
inline unsigned __umulhi(unsigned a, unsigned b) { return unsigned((uint64_t(a) * b) >> 32); }

// A float's bits as an unsigned and back.
inline unsigned __float_as_uint(float x) {
  unsigned u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}
inline float __uint_as_float(unsigned u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

// The block's instance of a static __shared__ array of type A (an array type), filled
// with garbage on first use. Every thread of the block gets the same storage.
template <class A>
A& emu_shared(const void* key) {
  std::lock_guard<std::mutex> lock(ctx->shared_mu);
  auto& slot = ctx->shared[key];
  const size_t words = (sizeof(A) + 7) / 8;
  if (!slot) {
    ctx->shared_bytes += sizeof(A);
    slot.reset(new double[words + 16]);
    for (size_t i = 0; i < words + 16; ++i) slot[i] = 12345.678;  // garbage, not zeros
  }
  // 128-byte aligned, the most a declaration asks for (__align__(32) for WMMA tiles).
  return *reinterpret_cast<A*>((reinterpret_cast<uintptr_t>(slot.get()) + 127) & ~uintptr_t(127));
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

// MUMOE_EMULATED_ORDER=reverse: blocks and threads in descending order (see the top).
inline bool emu_reverse_order() {
  static const bool on = [] {
    const char* v = std::getenv("MUMOE_EMULATED_ORDER");
    if (v == nullptr || v[0] == '\0' || std::strcmp(v, "forward") == 0) return false;
    if (std::strcmp(v, "reverse") == 0) return true;
    fprintf(stderr, "emu.h: MUMOE_EMULATED_ORDER=%s is neither forward nor reverse\n", v);
    std::abort();
  }();
  return on;
}

// First in the body of a kernel declared __launch_bounds__(max_threads) (the scripts here
// put it there): a GPU refuses to launch it with more threads per block.
inline void emu_launch_bounds(unsigned max_threads) {
  const unsigned t = blockDim_.x * blockDim_.y * blockDim_.z;
  if (t > max_threads) {
    fflush(stdout);
    fprintf(stderr, "emu_launch: a block of %u threads for a kernel declared __launch_bounds__(%u)\n", t, max_threads);
    std::abort();
  }
}

// Shared memory per block, as an H100 has it: 48 KiB (static and dynamic together) unless
// the kernel opts in with cudaFuncSetAttribute(kernel,
// cudaFuncAttributeMaxDynamicSharedMemorySize, n), which grants up to 227 KiB with its
// static arrays. The grants by kernel, known by its name as written at the launch and at
// cudaFuncSetAttribute (a launch names its kernel through emu_next_kernel, set by the
// rewritten launch just before it; a name, since a template kernel whose arguments the
// launch deduces has no address to take), so that a launch asking for more than its
// kernel was granted stops the program as it fails on the GPU.
inline constexpr size_t kEmuSmemDefault = 48 * 1024;
inline constexpr int kEmuSmemOptin = 232448;
inline std::map<std::string, size_t> emu_smem_grants;
inline const char* emu_next_kernel = nullptr;
inline cudaError_t emu_func_set_attribute(const char* kernel, cudaFuncAttribute attr, int value) {
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) {
    fprintf(stderr, "emu.h: cudaFuncSetAttribute(%d) is not emulated\n", int(attr));
    std::abort();
  }
  if (value < 0 || value > kEmuSmemOptin) return cudaErrorInvalidValue;
  emu_smem_grants[kernel] = size_t(value);
  return cudaSuccess;
}
#define cudaFuncSetAttribute(fn, attr, v) ((void)(fn), emu_func_set_attribute(#fn, (attr), int(v)))
// The dynamic shared memory `kernel` may launch with (0 when the launch names none: the
// hand-written harness launches, checked against the default).
inline size_t emu_smem_grant(const char* kernel) {
  auto it = kernel ? emu_smem_grants.find(kernel) : emu_smem_grants.end();
  return it == emu_smem_grants.end() ? 0 : it->second;
}

// Stops the program on a launch configuration a GPU refuses (the limits of every GPU
// since compute capability 3.0).
inline void emu_check_config(dim3 grid, dim3 block) {
  const uint64_t threads = uint64_t(block.x) * block.y * block.z;  // no wrap before the check
  if (threads == 0 || threads > 1024 || block.x > 1024 || block.y > 1024 || block.z > 64 || grid.x == 0 ||
      grid.x > 2147483647u || grid.y == 0 || grid.y > 65535 || grid.z == 0 || grid.z > 65535) {
    fflush(stdout);
    fprintf(stderr,
            "emu_launch: invalid configuration grid (%u, %u, %u) block (%u, %u, %u): blocks of 1 to 1024 threads "
            "(z at most 64), a grid of at most (2^31 - 1, 65535, 65535)\n",
            grid.x, grid.y, grid.z, block.x, block.y, block.z);
    std::abort();
  }
}

// Fiber stacks, kept from launch to launch (mostly untouched: memory is committed as used).
inline constexpr size_t kEmuStack = 256 * 1024;
inline std::vector<std::unique_ptr<char[]>> emu_stacks;
inline std::vector<std::unique_ptr<EmuFiber>> emu_fibers;  // by thread index, started on first use

// Runs body() as a grid of `grid` blocks of `block` threads with `smem` bytes of dynamic
// shared memory; blocks one after another, each block's threads as fibers. Every block
// starts with shared memory refilled with garbage and no static arrays.
// `grant`: the dynamic shared memory the kernel was granted when launched (0: none).
template <class F>
void emu_launch_now(dim3 grid, dim3 block, size_t smem, size_t grant, F body) {
  gridDim_ = {grid.x, grid.y, grid.z};
  blockDim_ = {block.x, block.y, block.z};
  emu_check_config(grid, block);
  const unsigned threads = block.x * block.y * block.z;
  if (smem > (grant > 0 ? grant : kEmuSmemDefault)) {
    fflush(stdout);
    fprintf(stderr, "emu_launch: %zu bytes of dynamic shared memory asked, the kernel may have %zu (%s)\n", smem,
            grant > 0 ? grant : kEmuSmemDefault,
            grant > 0 ? "granted by cudaFuncSetAttribute" : "the default: more needs cudaFuncSetAttribute");
    std::abort();
  }
  if (emu_running) {
    fprintf(stderr, "emu_launch: a launch from inside a kernel\n");
    std::abort();
  }
  // new char[] leaves the bytes uninitialised: pages are committed only as a stack grows.
  while (emu_stacks.size() < threads) {
    emu_stacks.push_back(std::unique_ptr<char[]>(new char[kEmuStack]));
    auto f = std::make_unique<EmuFiber>();
    getcontext(&f->uc);
    f->uc.uc_stack.ss_sp = emu_stacks.back().get();
    f->uc.uc_stack.ss_size = kEmuStack;
    f->uc.uc_link = nullptr;  // the entry never returns
    makecontext(&f->uc, emu_fiber_entry, 0);
    emu_fibers.push_back(std::move(f));
  }
  emu_body_call = [](void* b) { (*static_cast<F*>(b))(); };
  emu_body_arg = &body;
  // 128-byte aligned, the most any kernel declares (`extern __shared__ __align__(128)`),
  // with at least 256 bytes past its end that must still hold the garbage after each
  // block: a kernel writing past the shared memory its launch asked for stops there.
  std::vector<double> mem(smem / 8 + 64);
  double* const mem_start = reinterpret_cast<double*>((reinterpret_cast<uintptr_t>(mem.data()) + 127) & ~uintptr_t(127));
  const std::vector<double> garbage(mem.size(), 12345.678);
  const size_t tail = size_t(mem_start - mem.data()) * 8 + smem;  // the first byte past the block's shared memory
  BlockCtx c;
  EmuBarrier bar{threads};
  std::vector<EmuBarrier> warps((threads + 31) / 32);
  c.bar = &bar;
  for (unsigned w = 0; w < warps.size(); ++w) {
    // A last partial warp synchronises only its own lanes.
    warps[w].expected = threads - w * 32 < 32 ? threads - w * 32 : 32;
    c.warp[w] = &warps[w];
  }
  c.smem = reinterpret_cast<unsigned char*>(mem_start);
  EmuFiber* const* const fibers = reinterpret_cast<EmuFiber* const*>(emu_fibers.data());  // the first `threads`
  const bool reverse = emu_reverse_order();
  // The k-th of n in the order of this run.
  auto nth = [reverse](unsigned k, unsigned n) { return reverse ? n - 1 - k : k; };
  for (unsigned kz = 0; kz < grid.z; ++kz)
    for (unsigned ky = 0; ky < grid.y; ++ky)
      for (unsigned kx = 0; kx < grid.x; ++kx) {
        const unsigned bx = nth(kx, grid.x), by = nth(ky, grid.y), bz = nth(kz, grid.z);
        std::copy(garbage.begin(), garbage.end(), mem.begin());  // garbage, not zeros
        c.shared.clear();
        c.shared_bytes = 0;
        for (unsigned t = 0; t < threads; ++t) {
          EmuFiber& f = *fibers[t];
          f.tid = {t % block.x, t / block.x % block.y, t / (block.x * block.y)};
          f.linear = t;
          f.shfl_round = 0;
          f.wait_on = nullptr;
          f.wait_generation = 0;
          f.done = false;
        }
        blockIdx_ = {bx, by, bz};
        ctx = &c;
        unsigned live = threads;
        while (live > 0) {
          bool ran = false;
          for (unsigned k = 0; k < threads; ++k) {
            EmuFiber& f = *fibers[nth(k, threads)];
            if (f.done || (f.wait_on && f.wait_on->generation == f.wait_generation)) continue;
            f.wait_on = nullptr;
            threadIdx_ = f.tid;
            linear_tid = f.linear;
            shfl_round = f.shfl_round;
            emu_running = &f;
            emu_resume(f);
            emu_running = nullptr;
            ran = true;
            live -= f.done ? 1 : 0;
          }
          if (!ran) {
            fflush(stdout);  // what the harness printed so far, before the reason
            fprintf(stderr,
                    "emu_launch: block (%u, %u, %u) of %u threads is stuck: %u threads wait at a barrier or shuffle "
                    "that the other %u (returned, or waiting at another) never reach\n",
                    bx, by, bz, threads, live, threads - live);
            std::abort();
          }
        }
        if (std::memcmp(reinterpret_cast<const char*>(mem.data()) + tail, reinterpret_cast<const char*>(garbage.data()) + tail,
                        mem.size() * 8 - tail) != 0) {
          fflush(stdout);
          fprintf(stderr, "emu_launch: block (%u, %u, %u) wrote past the %zu bytes of dynamic shared memory of its launch\n",
                  bx, by, bz, smem);
          std::abort();
        }
        // Static arrays count against the same budget: with the default, static and dynamic
        // together at most 48 KiB; with a grant, the grant and the static ones within 227 KiB.
        const size_t budget = grant > 0 ? size_t(kEmuSmemOptin) - std::min(grant, size_t(kEmuSmemOptin)) : kEmuSmemDefault - smem;
        if (c.shared_bytes > budget) {
          fflush(stdout);
          fprintf(stderr,
                  "emu_launch: %zu bytes of static shared memory with %zu dynamic (granted %zu) exceed a block's "
                  "shared memory (48 KiB by default, 227 KiB opted in)\n",
                  c.shared_bytes, smem, grant);
          std::abort();
        }
      }
  emu_body_call = nullptr;
  emu_body_arg = nullptr;
}
// A launch on `stream`: run now, or queued on it (emu_queue.h).
template <class F>
void emu_launch(dim3 grid, dim3 block, size_t smem, cudaStream_t stream, F body) {
  // The kernel's grant as it stands at the launch (a later cudaFuncSetAttribute does not
  // change a launch already made).
  const size_t grant = emu_smem_grant(emu_next_kernel);
  emu_next_kernel = nullptr;
  emu_defer_on(stream, [grid, block, smem, grant, body]() mutable { emu_launch_now(grid, block, smem, grant, body); });
}
// On the device's stream (stream 0).
template <class F>
void emu_launch(dim3 grid, dim3 block, size_t smem, F body) {
  emu_launch(grid, block, smem, nullptr, body);
}
template <class F>
void emu_launch(dim3 grid, dim3 block, F body) {
  emu_launch(grid, block, 0, body);
}
