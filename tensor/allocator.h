// Host memory for tensors: a caching allocator so that a training step re-uses the
// blocks of the previous one instead of going back to malloc (and the kernel's page
// faults) every step. Blocks are 64-byte aligned for SIMD loads; those of 2 MiB and more
// start on a 2 MiB boundary, with transparent huge pages requested (allocator.cpp).
#pragma once
#include <cstddef>
#include <cstdint>

namespace mu {

struct MemoryStats {
  int64_t allocated_bytes = 0;  // held by live tensors now
  int64_t peak_bytes = 0;       // most ever held by live tensors at once
  int64_t cached_bytes = 0;     // freed by tensors, kept for re-use
};

namespace cpu_allocator {
void* allocate(size_t nbytes);
void deallocate(void* ptr, size_t nbytes);
MemoryStats stats();
void reset_peak();
// Returns all cached blocks to the system.
void empty_cache();
// Caching is on by default; MUMOE_NO_CACHING=1 in the environment (or a sanitizer
// build) turns it off so that use-after-free is caught.
bool caching_enabled();
}  // namespace cpu_allocator

}  // namespace mu
