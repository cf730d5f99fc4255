// A block of memory on one device, shared by every tensor that views it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>

#include "tensor/cuda.h"
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

}  // namespace mu
