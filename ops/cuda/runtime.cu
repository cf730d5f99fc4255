// CUDA device plumbing: device discovery, memory and copies. Every runtime call is
// checked and turned into a mu::Error that names the call and the CUDA error string.
#include <cuda_runtime.h>

#include <cstring>

#include "tensor/storage.h"

namespace mu::cuda {

#define MU_CUDA_CHECK(call)                                                            \
  do {                                                                                 \
    cudaError_t err_ = (call);                                                         \
    MU_CHECK(err_ == cudaSuccess, #call, " failed: ", cudaGetErrorString(err_), " (", \
             int(err_), ")");                                                          \
  } while (0)

int device_count() {
  int n = 0;
  // No driver or no GPU: cudaGetDeviceCount reports an error; that means zero devices.
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error so later calls are not poisoned
    return 0;
  }
  return n;
}

bool is_available() { return device_count() > 0; }

static void require_device(int device) {
  int n = device_count();
  MU_CHECK(n > 0, "CUDA tensor requested but no CUDA device is available on this machine "
                  "(cudaGetDeviceCount found none)");
  MU_CHECK(device >= 0 && device < n, "CUDA device index ", device, " out of range: ", n,
           " device", n == 1 ? "" : "s", " present");
}

void* allocate(size_t nbytes, int device) {
  require_device(device);
  MU_CUDA_CHECK(cudaSetDevice(device));
  void* p = nullptr;
  MU_CUDA_CHECK(cudaMalloc(&p, nbytes == 0 ? 1 : nbytes));
  return p;
}

void deallocate(void* ptr, int device) {
  if (!ptr) return;
  cudaSetDevice(device);
  cudaFree(ptr);
}

void memcpy(void* dst, Device dd, const void* src, Device sd, size_t n) {
  if (dd.is_cpu() && sd.is_cpu()) {
    std::memcpy(dst, src, n);
    return;
  }
  cudaMemcpyKind kind = dd.is_cpu()   ? cudaMemcpyDeviceToHost
                        : sd.is_cpu() ? cudaMemcpyHostToDevice
                                      : cudaMemcpyDeviceToDevice;
  MU_CUDA_CHECK(cudaMemcpy(dst, src, n, kind));
}

}  // namespace mu::cuda
