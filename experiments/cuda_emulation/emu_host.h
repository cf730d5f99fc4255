// The host side of the CUDA kernel files run as written, on host memory: EmuTensor stands
// for Tensor in the extracted text (extract.py renames it), with the few methods the
// host functions call; the runtime's stream, allocator and strided-operand packing are
// given host definitions. Workspace memory is filled with garbage, like fresh device
// memory.
#pragma once
#include "emu_alloc.h"
#include "emu_extra.h"
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>
#include "ops/cuda/dtypes.cuh"
#include "ops/cuda/strided.cuh"
#include "tensor/device.h"
#include "tensor/dtype.h"
#include "tensor/shape.h"

namespace mu::cuda {
// The byte fresh memory is filled with: garbage, not zeros (a harness may pick 0xff, NaN
// in every float dtype, where a small garbage value would go unnoticed).
inline unsigned char emu_garbage_byte = 0xA7;
inline cudaStream_t stream(int) { return nullptr; }
inline void* allocate(size_t nbytes, int) { return emu_device_alloc(nbytes, emu_garbage_byte); }
inline void deallocate(void* p, size_t, int) { std::free(p); }
}  // namespace mu::cuda

namespace mu {
template <class T> constexpr DType emu_dtype() {
  if constexpr (std::is_same_v<T, float>) return DType::Float32;
  else if constexpr (std::is_same_v<T, double>) return DType::Float64;
  else if constexpr (std::is_same_v<T, int64_t>) return DType::Int64;
  else if constexpr (std::is_same_v<T, bool>) return DType::Bool;
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) return DType::BFloat16;
  else if constexpr (std::is_same_v<T, __half>) return DType::Float16;
  else if constexpr (std::is_same_v<T, int8_t>) return DType::Int8;
  else if constexpr (std::is_same_v<T, int16_t>) return DType::Int16;
  else if constexpr (std::is_same_v<T, int32_t>) return DType::Int32;
  else return DType::UInt8;
}

// A view of host memory with a shape and strides (elements), on "cuda:0".
struct EmuTensor {
  void* p = nullptr;
  DType dt = DType::Float32;
  Shape sh, st;
  void* raw_data() const { return p; }
  bool defined() const { return p != nullptr; }  // EmuTensor{}: an undefined tensor
  DType dtype() const { return dt; }
  Device device() const { return Device::cuda(0); }
  int64_t dim() const { return int64_t(sh.size()); }
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t s : sh) n *= s;
    return n;
  }
  const Shape& shape() const { return sh; }
  int64_t size(int64_t d) const { return sh[size_t(d < 0 ? d + dim() : d)]; }
  int64_t stride(int64_t d) const { return st[size_t(d < 0 ? d + dim() : d)]; }
  const Shape& strides() const { return st; }
  bool is_contiguous() const {
    int64_t e = 1;
    for (int64_t d = dim() - 1; d >= 0; --d) {
      if (sh[size_t(d)] != 1 && st[size_t(d)] != e) return false;
      e *= sh[size_t(d)];
    }
    return true;
  }
  std::string describe() const { return "EmuTensor"; }
  // The harnesses hand the host functions dense tensors: a copy would be needed only
  // for a view, which no harness makes (the emulated device's tests cover views).
  const EmuTensor& contiguous() const {
    if (!is_contiguous()) {
      fprintf(stderr, "EmuTensor::contiguous: a view reached a harness that passes dense tensors only\n");
      std::abort();
    }
    return *this;
  }
};

// data viewed with `shape` and `strides` (row-major when left empty) from element `offset`.
template <class T>
EmuTensor emu_view(std::vector<T>& data, Shape shape, Shape strides = {}, int64_t offset = 0) {
  if (strides.empty()) {
    strides.assign(shape.size(), 1);
    for (int64_t d = int64_t(shape.size()) - 2; d >= 0; --d) strides[size_t(d)] = strides[size_t(d) + 1] * shape[size_t(d) + 1];
  }
  return EmuTensor{static_cast<void*>(data.data() + offset), emu_dtype<T>(), shape, strides};
}
}  // namespace mu

namespace mu::cuda {
inline cudaStream_t stream(const EmuTensor&) { return nullptr; }
}  // namespace mu::cuda

