// Device memory as the emulation hands it out (emu_host.h's allocate, emu_runtime.h's
// cudaMalloc, runtime_shim.cuh's Workspace): host memory aligned to 256 bytes, as
// cudaMalloc's blocks are (kernels may rely on it: WMMA operands want 32 bytes), its first
// n bytes set to `fill`, never zeros (a kernel reading what nobody wrote must show it).
// Freed with std::free.
#pragma once
#include <cstddef>
#include <cstdlib>
#include <cstring>

inline void* emu_device_alloc(size_t n, unsigned char fill) {
  void* p = std::aligned_alloc(256, n ? (n + 255) / 256 * 256 : 256);
  std::memset(p, fill, n);
  return p;
}
