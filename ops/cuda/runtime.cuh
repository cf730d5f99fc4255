// What every CUDA kernel file includes: checked calls, the device's stream, cuBLAS and
// cuBLASLt handles, launch geometry, and scratch memory from the caching allocator. nvcc only.
#pragma once
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "tensor/cuda.h"
#include "tensor/error.h"
#include "tensor/tensor.h"

// Every CUDA runtime call goes through this: a failure is a mu::Error naming the call,
// the error's name and its description.
#define MU_CUDA_CHECK(call)                                                                        \
  do {                                                                                             \
    cudaError_t mu_err_ = (call);                                                                  \
    MU_CHECK(mu_err_ == cudaSuccess, #call, " failed: ", cudaGetErrorName(mu_err_), " (",          \
             cudaGetErrorString(mu_err_), ")");                                                    \
  } while (0)

// The same for cuBLAS calls.
#define MU_CUBLAS_CHECK(call)                                                                      \
  do {                                                                                             \
    cublasStatus_t mu_st_ = (call);                                                                \
    MU_CHECK(mu_st_ == CUBLAS_STATUS_SUCCESS, #call, " failed: ", cublasGetStatusName(mu_st_), " (", \
             cublasGetStatusString(mu_st_), ")");                                                  \
  } while (0)

// After a <<<...>>> launch: a bad configuration (too many threads, too much shared
// memory) shows here, named after the kernel; faults inside the kernel show at the next
// synchronising call, which is checked too.
#define MU_CUDA_CHECK_LAUNCH(kernel_name)                                                          \
  do {                                                                                             \
    cudaError_t mu_err_ = cudaGetLastError();                                                      \
    MU_CHECK(mu_err_ == cudaSuccess, kernel_name, ": CUDA kernel launch failed: ",                 \
             cudaGetErrorName(mu_err_), " (", cudaGetErrorString(mu_err_), ")");                   \
  } while (0)

namespace mu::cuda {

// The one stream of `device`, created on first use; also makes `device` current, so a
// launch that follows goes to it. Every kernel and every copy of the framework runs on it.
cudaStream_t stream(int device);
inline cudaStream_t stream(const Tensor& t) { return stream(t.device().index); }

// The device's cuBLAS handle, bound to stream(device), with a workspace from the
// caching allocator and the math mode of allow_tf32().
cublasHandle_t cublas(int device);

// The device's cuBLASLt handle, created on first use (cuBLASLt takes the stream and the
// workspace with each call), and the workspace to give it: the cuBLAS handle's, which
// both libraries may use since their calls are ordered on the one stream.
cublasLtHandle_t cublaslt(int device);
struct CublasWorkspace {
  void* data;
  size_t bytes;
};
CublasWorkspace cublas_workspace(int device);

// The most blocks a grid-stride loop is given: an H100's 132 SMs, 32 blocks each; more
// only queue. A build may set fewer: the emulated device's sets a few, so that every
// grid-stride loop of its tests takes several turns, as loops do on the GPU for tensors
// of more than a million elements or so.
#ifndef MU_CUDA_MAX_BLOCKS
#define MU_CUDA_MAX_BLOCKS (132 * 32)
#endif

// Blocks of `threads` covering n elements in a grid-stride loop: enough to fill every SM
// several times over, never more than the grid allows.
inline unsigned grid_for(int64_t n, int threads) {
  const int64_t blocks = (n + threads - 1) / threads;
  const int64_t cap = MU_CUDA_MAX_BLOCKS;
  return unsigned(blocks < 1 ? 1 : blocks < cap ? blocks : cap);
}

// Device scratch memory for a kernel's temporaries, from the caching allocator, returned
// on destruction. Kernels queued on the stream before the destructor runs still see it:
// the next user of the block is queued after them.
class Workspace {
 public:
  Workspace(size_t nbytes, int device) : n_(nbytes), device_(device), p_(allocate(nbytes, device)) {}
  ~Workspace() { deallocate(p_, n_, device_); }
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  template <class T>
  T* as() const { return static_cast<T*>(p_); }

 private:
  size_t n_;
  int device_;
  void* p_;
};

}  // namespace mu::cuda
