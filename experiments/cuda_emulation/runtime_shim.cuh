// Stands in for ops/cuda/runtime.cuh under the emulation (run.sh installs it as
// ops/cuda/runtime.cuh in front of the real one and appends the real grid_for): no
// streams (launches run at once, in order), launch checks that pass, and a Workspace in
// host memory (256-byte aligned, as device memory is) filled with garbage (all bytes
// 0xff: NaN as a float or double, -1 as an integer), so that a partial read before it is
// written shows.
#pragma once
#include <cuda_runtime.h>

#include "emu_alloc.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "tensor/error.h"
#include "tensor/tensor.h"

#define MU_CUDA_CHECK(call) ((void)0)
#define MU_CUDA_CHECK_LAUNCH(kernel_name) ((void)(kernel_name))

namespace mu::cuda {

inline cudaStream_t stream(int) { return nullptr; }
inline cudaStream_t stream(const Tensor&) { return nullptr; }

class Workspace {
 public:
  Workspace(size_t nbytes, int) : p_(emu_device_alloc(nbytes, 0xff)) {}
  ~Workspace() { std::free(p_); }
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  template <class T>
  T* as() const { return reinterpret_cast<T*>(p_); }

 private:
  void* p_;
};

}  // namespace mu::cuda
