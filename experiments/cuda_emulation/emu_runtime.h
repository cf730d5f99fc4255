// A stand-in CUDA runtime and cuBLAS and cuBLASLt handle API for ops/cuda/runtime.cu under
// the host emulation: one device whose memory is host memory under a byte budget (cudaMalloc fails
// with cudaErrorMemoryAllocation past it, as the driver does when the device is full, and
// the error is left for cudaGetLastError), one stream whose work runs as emu_queue.h
// orders it (at once, or deferred to the next synchronisation), events that mark it.
// Included before the file; the calls are renamed.
#pragma once
#include <cublasLt.h>  // declared before the macros below rename its calls
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include "emu_alloc.h"
#include "emu_devices.h"
#include "emu_queue.h"
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>

inline size_t emu_device_budget = size_t(4) << 30;  // bytes cudaMalloc may hand out (harnesses set their own)
inline size_t emu_device_used = 0;
inline std::map<void*, size_t> emu_device_blocks;  // live cudaMalloc blocks
inline int emu_malloc_calls = 0, emu_free_calls = 0;
inline cudaError_t emu_last_error = cudaSuccess;

inline cudaError_t emu_cudaMalloc(void** p, size_t n) {
  ++emu_malloc_calls;
  if (emu_device_used + n > emu_device_budget) return emu_last_error = cudaErrorMemoryAllocation;
  // Not zeros: malloc's large blocks are fresh zero pages, on which a kernel that reads
  // what nobody wrote (a workspace it forgot to clear) would pass. All-ones bytes are NaN
  // in every floating dtype and -1 in the integers.
  *p = emu_device_alloc(n, 0xFF);
  emu_device_blocks[*p] = n;
  emu_device_used += n;
  return cudaSuccess;
}
inline cudaError_t emu_cudaFree(void* p) {
  emu_flush();  // cudaFree waits for the device's work, which may still use the block
  auto it = emu_device_blocks.find(p);
  if (it == emu_device_blocks.end()) return cudaErrorInvalidValue;  // not a live block
  ++emu_free_calls;
  emu_device_used -= it->second;
  emu_device_blocks.erase(it);
  std::free(p);
  return cudaSuccess;
}
inline cudaError_t emu_cudaGetLastError() {
  const cudaError_t e = emu_last_error;
  emu_last_error = cudaSuccess;
  return e;
}
inline cudaError_t emu_cudaMemGetInfo(size_t* free_b, size_t* total_b) {
  *free_b = emu_device_budget - emu_device_used, *total_b = emu_device_budget;
  return cudaSuccess;
}
inline cudaError_t emu_cudaGetDeviceCount(int* n) { return *n = emu_device_count(), cudaSuccess; }
inline cudaError_t emu_cudaSetDevice(int d) { return d >= 0 && d < emu_device_count() ? cudaSuccess : cudaErrorInvalidDevice; }
inline cudaError_t emu_cudaGetDeviceProperties(cudaDeviceProp* p, int d) {
  std::memset(p, 0, sizeof *p);
  std::strcpy(p->name, "emulated");
  p->major = 9, p->minor = 0;
  emu_device_uuid(p->uuid.bytes, d);
  return cudaSuccess;
}
// The framework's stream of each device: the emulated device's stream (emu_queue.h).
inline cudaError_t emu_cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) {
  *s = &emu_device_stream;
  return cudaSuccess;
}
inline cudaError_t emu_cudaStreamSynchronize(cudaStream_t s) { return emu_stream_synchronize(s); }
inline cudaError_t emu_cudaEventCreate(cudaEvent_t* e) { return *e = new CUevent_st, cudaSuccess; }
inline cudaError_t emu_cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) { return emu_cudaEventCreate(e); }
inline cudaError_t emu_cudaEventRecord(cudaEvent_t e, cudaStream_t s) { return emu_event_record(e, s), cudaSuccess; }
inline cudaError_t emu_cudaEventSynchronize(cudaEvent_t e) { return emu_event_synchronize(e), cudaSuccess; }
inline cudaError_t emu_cudaEventElapsedTime(float* ms, cudaEvent_t, cudaEvent_t) { return *ms = 0, cudaSuccess; }
inline cudaError_t emu_cudaEventDestroy(cudaEvent_t e) { return delete e, cudaSuccess; }
inline cudaError_t emu_cudaMallocHost(void** p, size_t n) {
  *p = std::malloc(n ? n : 1);
  std::memset(*p, 0xFF, n);  // as cudaMalloc's
  emu_pinned_add(*p, n);
  return cudaSuccess;
}
inline cudaError_t emu_cudaMemcpyAsync(void* d, const void* s, size_t n, cudaMemcpyKind kind, cudaStream_t st) {
  return emu_memcpy_async(d, s, n, kind, st);
}
inline cudaError_t emu_cudaMemcpyPeerAsync(void* d, int, const void* s, int, size_t n, cudaStream_t st) {
  return emu_memcpy_async(d, s, n, cudaMemcpyDeviceToDevice, st);
}
inline const char* emu_cudaGetErrorName(cudaError_t e) {
  return e == cudaErrorMemoryAllocation ? "cudaErrorMemoryAllocation" : e == cudaSuccess ? "cudaSuccess" : "cudaError";
}
inline cublasStatus_t emu_cublas_ok(...) { return CUBLAS_STATUS_SUCCESS; }
inline const char* emu_cublas_name(cublasStatus_t) { return "a cuBLAS status"; }

#define cudaMalloc emu_cudaMalloc
#define cudaFree emu_cudaFree
#define cudaGetLastError emu_cudaGetLastError
#define cudaMemGetInfo emu_cudaMemGetInfo
#define cudaGetDeviceCount emu_cudaGetDeviceCount
#define cudaSetDevice emu_cudaSetDevice
#define cudaGetDeviceProperties emu_cudaGetDeviceProperties
#define cudaStreamCreateWithFlags emu_cudaStreamCreateWithFlags
#define cudaStreamSynchronize emu_cudaStreamSynchronize
#define cudaEventCreate emu_cudaEventCreate
#define cudaEventCreateWithFlags emu_cudaEventCreateWithFlags
#define cudaEventRecord emu_cudaEventRecord
#define cudaEventSynchronize emu_cudaEventSynchronize
#define cudaEventElapsedTime emu_cudaEventElapsedTime
#define cudaEventDestroy emu_cudaEventDestroy
#define cudaMallocHost emu_cudaMallocHost
#define cudaMemcpyAsync emu_cudaMemcpyAsync
#define cudaMemsetAsync(p, v, n, s) emu_memset_async((p), (v), (n), (s))  // MUMOE_CUDA_POISON's fill
#define cudaMemcpyPeerAsync emu_cudaMemcpyPeerAsync
#define cudaGetErrorName emu_cudaGetErrorName
#define cudaGetErrorString emu_cudaGetErrorName
#define cublasCreate emu_cublas_ok
#define cublasSetStream emu_cublas_ok
#define cublasSetWorkspace emu_cublas_ok
#define cublasSetMathMode emu_cublas_ok
#define cublasLtCreate emu_cublas_ok
#define cublasGetStatusName emu_cublas_name
#define cublasGetStatusString emu_cublas_name
