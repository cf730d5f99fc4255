// A block of memory on one device, shared by every tensor that views it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>

#include "tensor/device.h"

namespace mu {

struct Storage {
  void* data = nullptr;
  size_t nbytes = 0;
  Device device;
  // Bumped by every in-place write through any view; autograd compares it with the
  // value recorded when a tensor was saved for backward.
  uint64_t version = 0;

  Storage(size_t nbytes, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
};

namespace cuda {
// Device plumbing. Built without CUDA (or with no GPU present) these throw a mu::Error
// that says why; device_count() then returns 0.
int device_count();
bool is_available();
void* allocate(size_t nbytes, int device);
void deallocate(void* ptr, int device);
// Copies nbytes between any two of host/device memory.
void memcpy(void* dst, Device dst_dev, const void* src, Device src_dev, size_t nbytes);
}  // namespace cuda

}  // namespace mu
