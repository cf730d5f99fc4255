#include "tensor/allocator.h"

#include <sys/mman.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <new>
#include <vector>

#include "tensor/checked.h"
#include "tensor/error.h"

namespace mu::cpu_allocator {
namespace {

struct Cache {
  std::mutex mu;
  std::multimap<size_t, void*> free_blocks;  // rounded size -> block
  MemoryStats st;
  bool enabled;
  Cache() {
#ifdef MUMOE_NO_CACHING
    enabled = false;
#else
    const char* env = std::getenv("MUMOE_NO_CACHING");
    enabled = !(env && env[0] == '1');
#endif
  }
  ~Cache() {
    for (auto& [sz, p] : free_blocks) std::free(p);
  }
};

Cache& cache() {
  static Cache* c = new Cache();  // never destroyed: tensors may outlive static destructors
  return *c;
}

// Rounds a request up so that blocks of nearby sizes are interchangeable: multiples of
// 512 bytes below 1 MiB, of 1/8 of the power of two above.
size_t round_size(size_t n) {
  // Past the cap the doubling below would wrap to zero and never end.
  MU_CHECK(n <= size_t(kMaxAllocationBytes), "cannot allocate ", n, " bytes: more than any machine can address (",
           kMaxAllocationBytes, ")");
  if (n == 0) return 64;
  if (n < (1u << 20)) return (n + 511) / 512 * 512;
  size_t p = 1;
  while (p < n) p <<= 1;
  size_t step = p / 8;
  return (n + step - 1) / step * step;
}

// Blocks of 2 MiB and more start on a 2 MiB boundary and ask the kernel for transparent
// huge pages over their whole 2 MiB stretches (madvise: the policy of most distributions
// grants them only on request). Streaming kernels then cross a page boundary every 2 MiB
// instead of every 4 KiB, and in a virtual machine each TLB miss walks two page tables.
constexpr size_t kHugePage = size_t(2) << 20;

void* system_alloc(size_t sz) {
  void* p = nullptr;
  if (sz < kHugePage) return std::aligned_alloc(64, sz);
  if (posix_memalign(&p, kHugePage, sz) != 0) return nullptr;
  // Advice only: where the kernel has no huge pages the block is used as it is.
  madvise(p, sz / kHugePage * kHugePage, MADV_HUGEPAGE);
  return p;
}

}  // namespace

void* allocate(size_t nbytes) {
  Cache& c = cache();
  size_t sz = round_size(nbytes);
  {
    std::lock_guard<std::mutex> g(c.mu);
    if (c.enabled) {
      auto it = c.free_blocks.find(sz);
      if (it != c.free_blocks.end()) {
        void* p = it->second;
        c.free_blocks.erase(it);
        c.st.cached_bytes -= int64_t(sz);
        c.st.allocated_bytes += int64_t(sz);
        if (c.st.allocated_bytes > c.st.peak_bytes) c.st.peak_bytes = c.st.allocated_bytes;
        return p;
      }
    }
  }
  void* p = system_alloc(sz);
  if (!p && c.enabled) {  // out of memory: give the cache back and try once more
    empty_cache();
    p = system_alloc(sz);
  }
  MU_CHECK(p != nullptr, "out of host memory: could not allocate ", nbytes, " bytes");
  std::lock_guard<std::mutex> g(c.mu);
  c.st.allocated_bytes += int64_t(sz);
  if (c.st.allocated_bytes > c.st.peak_bytes) c.st.peak_bytes = c.st.allocated_bytes;
  return p;
}

void deallocate(void* ptr, size_t nbytes) {
  if (!ptr) return;
  Cache& c = cache();
  size_t sz = round_size(nbytes);
  std::lock_guard<std::mutex> g(c.mu);
  c.st.allocated_bytes -= int64_t(sz);
  if (c.enabled) {
    c.free_blocks.emplace(sz, ptr);
    c.st.cached_bytes += int64_t(sz);
  } else {
    std::free(ptr);
  }
}

MemoryStats stats() {
  std::lock_guard<std::mutex> g(cache().mu);
  return cache().st;
}

void reset_peak() {
  std::lock_guard<std::mutex> g(cache().mu);
  cache().st.peak_bytes = cache().st.allocated_bytes;
}

void empty_cache() {
  Cache& c = cache();
  std::lock_guard<std::mutex> g(c.mu);
  for (auto& [sz, p] : c.free_blocks) std::free(p);
  c.free_blocks.clear();
  c.st.cached_bytes = 0;
}

bool caching_enabled() { return cache().enabled; }

}  // namespace mu::cpu_allocator
