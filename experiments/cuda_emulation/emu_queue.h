// The emulated device's stream: where its work waits until the host must see it.
//
// By default every stream-ordered operation (a kernel launch, an asynchronous copy or
// set, a cuBLAS, cub or cuDNN call) runs when it is issued: a device infinitely fast.
// With MUMOE_EMULATED_DEFERRED=1 they are queued instead and run only when CUDA
// guarantees the host sees their effects: a stream, event or device synchronisation, a
// copy to pageable host memory, cudaFree, a host read that polls an event, an NCCL call.
// That is the other legal extreme, a device infinitely slow, and it makes a missing
// synchronisation show: a host that reads a result, or reuses a pinned buffer, before the
// work that writes or reads it has run now sees stale data. Arguments are taken when the
// operation is issued (a kernel's by value, as a launch copies them; a copy's pageable
// source is staged at once, as the driver stages it), memory is read when it runs.
//
// One queue: the framework keeps one stream per device, and the emulated device runs
// its streams in issue order.
#pragma once
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <utility>
#include <vector>

#include <cuda_runtime.h>

inline bool emu_deferred() {
  static const bool on = [] {
    const char* v = std::getenv("MUMOE_EMULATED_DEFERRED");
    return v != nullptr && v[0] == '1';
  }();
  return on;
}

inline std::deque<std::function<void()>> emu_queue;
inline bool emu_in_device = false;  // a queued operation is running: what it issues runs at once
inline std::recursive_mutex emu_queue_mutex;

// Runs op now (immediate mode, or from inside a running operation) or queues it.
inline void emu_defer(std::function<void()> op) {
  std::lock_guard<std::recursive_mutex> g(emu_queue_mutex);
  if (!emu_deferred() || emu_in_device) {
    op();
    return;
  }
  emu_queue.push_back(std::move(op));
}

// Runs the oldest `most` queued operations (all by default): the device catching up.
inline void emu_flush(size_t most = size_t(-1)) {
  std::lock_guard<std::recursive_mutex> g(emu_queue_mutex);
  if (emu_in_device) return;
  struct InDevice {
    InDevice() { emu_in_device = true; }
    ~InDevice() { emu_in_device = false; }
  } in_device;
  for (size_t k = 0; k < most && !emu_queue.empty(); ++k) {
    std::function<void()> op = std::move(emu_queue.front());
    emu_queue.pop_front();
    op();
  }
}

// An event's or stream's query: one more operation run, then whether all have.
inline bool emu_progress() {
  emu_flush(1);
  std::lock_guard<std::recursive_mutex> g(emu_queue_mutex);
  return emu_queue.empty();
}

// A kernel body with its arguments taken now, by value (what a launch does).
template <class K, class... A>
auto emu_bind(K kernel, A... args) {
  return [kernel, tup = std::make_tuple(args...)]() mutable { std::apply(kernel, tup); };
}

// Page-locked host blocks (cudaMallocHost): copies to and from them are truly
// asynchronous; any other host memory is pageable.
inline std::map<const char*, size_t> emu_pinned_blocks;
inline void emu_pinned_add(const void* p, size_t n) {
  std::lock_guard<std::recursive_mutex> g(emu_queue_mutex);
  emu_pinned_blocks[static_cast<const char*>(p)] = n;
}
inline bool emu_is_pinned(const void* p) {
  std::lock_guard<std::recursive_mutex> g(emu_queue_mutex);
  const char* c = static_cast<const char*>(p);
  auto it = emu_pinned_blocks.upper_bound(c);
  if (it == emu_pinned_blocks.begin()) return false;
  --it;
  return c < it->first + it->second;
}

// cudaMemcpyAsync as CUDA orders it. Host to device from pageable memory: the source is
// staged now, the write queued. Device to pageable host (or host to host): synchronous,
// the device catches up first. Device to device, or to and from pinned memory: queued.
inline cudaError_t emu_memcpy_async(void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
  if (n == 0) return cudaSuccess;
  const bool to_host = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyHostToHost;
  const bool from_host = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyHostToHost;
  if ((to_host && !emu_is_pinned(dst)) || kind == cudaMemcpyHostToHost || kind == cudaMemcpyDefault) {
    emu_flush();
    std::memcpy(dst, src, n);
    return cudaSuccess;
  }
  if (from_host && !emu_is_pinned(src)) {
    auto staged = std::make_shared<std::vector<char>>(static_cast<const char*>(src), static_cast<const char*>(src) + n);
    emu_defer([dst, staged] { std::memcpy(dst, staged->data(), staged->size()); });
    return cudaSuccess;
  }
  emu_defer([dst, src, n] { std::memcpy(dst, src, n); });
  return cudaSuccess;
}

inline cudaError_t emu_memset_async(void* p, int v, size_t n) {
  emu_defer([p, v, n] { std::memset(p, v, n); });
  return cudaSuccess;
}

inline cudaError_t emu_synchronize() {
  emu_flush();
  return cudaSuccess;
}
