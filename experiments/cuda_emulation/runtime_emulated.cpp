// ops/cuda/runtime.cu (the device plumbing, compiled here as host C++) over the stand-in
// runtime of emu_runtime.h: one device whose memory is host memory under a byte budget.
// Checks the caching allocator's size classes (against the rule written out here), reuse
// of a freed block by a request of the same class, the books (allocated, peak, cached),
// out of memory with cached blocks (released, the allocation retried once and served),
// out of memory with everything live (an error naming the bytes asked and held), and
// host <-> device copies through the two pinned staging buffers in 16 MiB chunks; and,
// deferred, the queue's own rules (held work, stale pinned reads, two streams' order).
#include "emu_runtime.h"
#include "ops/cuda/runtime.cu"

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

using namespace mu;

static int failures = 0;
static void check(bool ok, const std::string& what) {
  std::printf("%s: %s\n", what.c_str(), ok ? "ok" : "FAIL");
  failures += !ok;
}

// With MUMOE_EMULATED_DEFERRED=1 (run.sh runs this harness both ways): the queue of
// emu_queue.h holds the device's work until the host synchronises, so that the emulated
// device's `cuda` tests (device_tests.sh, deferred mode) would see a missing wait.
static void check_deferred() {
  const size_t n = 3 * 1024 * 1024 + 5;
  int* dev = static_cast<int*>(cuda::allocate(sizeof(int), 0));
  *dev = 1;
  emu_defer([dev] { *dev = 2; });  // a kernel writing 2
  check(*dev == 1, "deferred: a queued write has not run before a synchronisation");
  cuda::synchronize(0);
  check(*dev == 2, "deferred: it has after cudaStreamSynchronize");

  // A result read through the runtime's copy: it waits for the work before it.
  emu_defer([dev] { *dev = 3; });
  int got = 0;
  cuda::memcpy(&got, Device::cpu(), dev, Device::cuda(0), sizeof(int));
  check(got == 3, "deferred: a device-to-host copy sees the work queued before it");

  // What a missing wait looks like: a pinned buffer read before the copy into it has run.
  void* pinned = nullptr;
  cudaMallocHost(&pinned, sizeof(int));
  *static_cast<int*>(pinned) = -1;
  emu_defer([dev] { *dev = 4; });
  cudaMemcpyAsync(pinned, dev, sizeof(int), cudaMemcpyDeviceToHost, nullptr);
  check(*static_cast<int*>(pinned) == -1, "deferred: a pinned buffer read without a wait is stale");
  cudaEvent_t e;
  cudaEventCreate(&e);
  cudaEventRecord(e, nullptr);
  cudaEventSynchronize(e);
  check(*static_cast<int*>(pinned) == 4, "deferred: and current after the event's wait");

  // A pageable source is staged at the call: changing it afterwards changes nothing.
  std::vector<unsigned char> src(n, 7);
  unsigned char* big = static_cast<unsigned char*>(cuda::allocate(n, 0));
  cudaMemcpyAsync(big, src.data(), n, cudaMemcpyHostToDevice, nullptr);
  std::fill(src.begin(), src.end(), 9);
  cuda::synchronize(0);
  check(std::all_of(big, big + n, [](unsigned char c) { return c == 7; }),
        "deferred: a pageable source is taken at the call");
  // cudaFree waits for the device's work (which might still use the block).
  void* raw = nullptr;
  cudaMalloc(&raw, 64);
  emu_defer([dev] { *dev = 5; });
  cudaFree(raw);
  check(*dev == 5 && emu_device_stream.ops.empty(), "deferred: cudaFree runs the queued work first");
  cuda::deallocate(big, n, 0);
  cuda::deallocate(dev, sizeof(int), 0);

  // Two streams (the NCCL side's has its own): one's synchronisation runs the other's
  // work only up to the event it waits for; without a wait, none of it.
  cudaStream_t other = emu_stream_create();
  int a = 0, b = 0;
  emu_defer([&a] { a = 1; });
  cudaEvent_t mark;
  cudaEventCreate(&mark);
  cudaEventRecord(mark, nullptr);
  emu_defer([&a] { a = 2; });  // after the mark
  emu_stream_wait_event(other, mark);
  cudaEventDestroy(mark);  // allowed with work on it pending
  emu_defer_on(other, [&a, &b] { b = a; });
  check(a == 0 && b == 0, "deferred: two streams' work queued");
  emu_stream_synchronize(other);
  check(a == 1 && b == 1, "deferred: a stream's synchronisation runs another's work up to the event it waits for");
  emu_defer_on(other, [&b] { b = 5; });
  cuda::synchronize(0);
  check(a == 2 && b == 1, "deferred: the device stream's synchronisation leaves another stream's work queued");
  emu_synchronize();
  check(b == 5, "deferred: the device's synchronisation runs every stream");

  // host_to_device queues its copy and returns: the source may change at once, the
  // destination is written when the device gets there. Two small copies in a row use the
  // two staging buffers and wait for nothing; a third reuses the first's buffer, so it
  // waits for that copy (and the work before it), not for the second.
  int* d3 = static_cast<int*>(cuda::allocate(3 * sizeof(int), 0));
  d3[0] = d3[1] = d3[2] = 0;
  cuda::synchronize(0);
  int x = 0;
  emu_defer([d3] { d3[2] = -1; });  // work queued before the copies
  for (int i = 0; i < 2; ++i) {
    x = 10 + i;
    cuda::memcpy(d3 + i, Device::cuda(0), &x, Device::cpu(), sizeof(int));
  }
  x = 99;  // the source reused at once
  check(d3[0] == 0 && d3[1] == 0 && d3[2] == 0, "deferred: two copies to the device queued, nothing waited for");
  x = 12;
  cuda::memcpy(d3 + 2, Device::cuda(0), &x, Device::cpu(), sizeof(int));
  x = 99;
  check(d3[0] == 10 && d3[1] == 0 && d3[2] == -1, "deferred: a third copy waited for the first's buffer only");
  cuda::synchronize(0);
  check(d3[0] == 10 && d3[1] == 11 && d3[2] == 12, "deferred: each copy carried its source as it was at the call");
  // A copy back to the host after a queued copy to the device sees it.
  x = 7;
  cuda::memcpy(d3, Device::cuda(0), &x, Device::cpu(), sizeof(int));
  int back = 0;
  cuda::memcpy(&back, Device::cpu(), d3, Device::cuda(0), sizeof(int));
  check(back == 7, "deferred: a copy to the host sees a queued copy to the device");
  cuda::deallocate(d3, 3 * sizeof(int), 0);
}

int main() {
  const size_t KiB = 1024, MiB = KiB * KiB;
  // Size classes: 512-byte steps below 1 MiB, 2 MiB steps below 64 MiB, eighths of the
  // next power of two above.
  const std::pair<size_t, size_t> classes[] = {{0, 512},           {1, 512},           {513, 1024},
                                               {MiB - 1, MiB},     {MiB, 2 * MiB},     {3 * MiB + 1, 4 * MiB},
                                               {64 * MiB, 64 * MiB}, {65 * MiB, 80 * MiB}, {100 * MiB, 112 * MiB}};
  bool ok = true;
  for (auto [n, want] : classes) ok = ok && cuda::round_size(n) == want;
  check(ok, "size classes");

  emu_device_budget = 10 * MiB;
  void* p1 = cuda::allocate(1000, 0);
  cuda::deallocate(p1, 1000, 0);
  void* p2 = cuda::allocate(900, 0);  // the same 1024-byte class: the cached block
  MemoryStats st = cuda::memory_stats(0);
  check(p2 == p1 && emu_malloc_calls == 1 && st.allocated_bytes == 1024 && st.cached_bytes == 0 &&
            st.peak_bytes == 1024,
        "a freed block serves the next request of its class");

  // 6 MiB cached + 8 MiB asked > 10 MiB: the first cudaMalloc fails, the cache is
  // released, the retry succeeds.
  void* a = cuda::allocate(6 * MiB, 0);
  cuda::deallocate(a, 6 * MiB, 0);
  const int frees_before = emu_free_calls;
  void* b = cuda::allocate(8 * MiB, 0);
  st = cuda::memory_stats(0);
  check(b != nullptr && emu_free_calls == frees_before + 1 && st.cached_bytes == 0 &&
            st.allocated_bytes == int64_t(8 * MiB + 1024) && emu_device_used == 8 * MiB + 1024 &&
            st.peak_bytes == int64_t(8 * MiB + 1024),
        "out of memory: the cache released and the allocation retried");

  // Everything live: 8 MiB + 1 KiB held, 4 MiB more does not fit.
  std::string msg;
  try {
    cuda::allocate(4 * MiB, 0);
  } catch (const Error& e) {
    msg = e.what();
  }
  check(msg.find("CUDA out of memory on cuda:0: tried to allocate 4194304 bytes") != std::string::npos &&
            msg.find("live tensors hold 8389632 bytes") != std::string::npos &&
            msg.find("the device has 2096128 of 10485760 bytes free") != std::string::npos,
        "out of memory with nothing to release: " + msg);

  cuda::reset_peak_memory(0);
  cuda::deallocate(b, 8 * MiB, 0);
  st = cuda::memory_stats(0);
  check(st.peak_bytes == int64_t(8 * MiB + 1024) && st.allocated_bytes == 1024 && st.cached_bytes == int64_t(8 * MiB),
        "peak kept after the free; the block cached");
  cuda::empty_cache(0);
  check(cuda::memory_stats(0).cached_bytes == 0 && emu_device_used == 1024, "empty_cache returns the cache");

  // 40 MiB + 123 bytes each way: three chunks, both staging buffers, a short last chunk.
  emu_device_budget = 256 * MiB;
  const size_t n = 40 * MiB + 123;
  std::vector<unsigned char> src(n), back(n, 0);
  for (size_t i = 0; i < n; ++i) src[i] = (unsigned char)(i * 2654435761u >> 13);
  void* dev = cuda::allocate(n, 0);
  cuda::memcpy(dev, Device::cuda(0), src.data(), Device::cpu(), n);
  cuda::synchronize(0);  // the copy to the device is queued (deferred: not yet run)
  const bool dev_ok = std::memcmp(dev, src.data(), n) == 0;
  cuda::memcpy(back.data(), Device::cpu(), dev, Device::cuda(0), n);
  check(dev_ok && back == src, "host -> device -> host through the staging chunks");
  cuda::deallocate(dev, n, 0);
  cuda::deallocate(p2, 900, 0);
  if (emu_deferred()) check_deferred();

  std::printf("%s\n", failures ? "FAIL" : "PASS");
  return failures ? 1 : 0;
}
