// The CUDA device as the rest of the framework sees it: discovery, device memory (a
// caching allocator per device), copies, the one stream per device every kernel runs on,
// and the TF32 switch. Built without CUDA (tensor/cuda_none.cpp) or on a machine with no
// GPU, device_count() is 0 and every request for device memory is a mu::Error saying why.
//
// Compiled by g++ (C++20) and nvcc (C++17): keep it C++17.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "tensor/allocator.h"
#include "tensor/device.h"

namespace mu::cuda {

int device_count();
bool is_available();

// Device memory from the caching allocator: a freed block is kept, by size class, for
// the next request of that class (kernels all run on the device's one stream, in order,
// so a block freed while a kernel that used it is still queued is safe to hand out
// again; NCCL's stream, the one other, hands its tensors back only after making the
// device's stream wait for it, dist/nccl.cu). When cudaMalloc fails, every cached block of the device is released and the
// allocation retried once; a second failure is a mu::Error naming the bytes requested
// and the bytes held. Zero bytes still give a valid (unique) pointer.
void* allocate(size_t nbytes, int device);
void deallocate(void* ptr, size_t nbytes, int device);
// allocated_bytes: held by live tensors now; peak_bytes: the most ever held at once;
// cached_bytes: freed by tensors and kept for re-use. Sizes are the rounded block sizes.
MemoryStats memory_stats(int device = 0);
void reset_peak_memory(int device = 0);
// Waits for the device's queued work, then returns every cached block to the driver.
void empty_cache(int device = 0);

// Copies nbytes between any two of host and device memory. From or to the host, the
// bytes go through a pinned staging buffer (page-locked, so the copy engine reads it
// directly). To the device, the call returns once the bytes are in the staging buffer
// and the copy is queued on the stream (the host memory may be reused at once; kernels
// queued after it see the bytes); at most two such copies are in flight, a third waits
// for the oldest. To the host, it returns when the copy is done (after the work queued
// before it). Device to device is queued on the stream.
void memcpy(void* dst, Device dst_dev, const void* src, Device src_dev, size_t nbytes);

// Copies between the host and the device since the program started, each direction
// counted per call of memcpy. Each copy to the host waits for the device's queued work (a
// synchronisation: the GPU idles while the host catches up), and a copy to the device
// may wait for an earlier one, so a count that grows every step shows where a loop
// stalls the GPU, as torch.cuda.set_sync_debug_mode would.
struct HostTransfers {
  int64_t to_device = 0;
  int64_t to_host = 0;
};
HostTransfers host_transfers(int device = 0);

// Blocks until every kernel queued on the device's stream has finished (timing, and
// before reading device memory outside the framework).
void synchronize(int device = 0);

// TF32 tensor-core math for float32 matmuls (10-bit mantissa inputs, fp32 accumulation):
// faster, but not float32's precision, so off unless the user asks, as in PyTorch.
void set_allow_tf32(bool allow);
bool allow_tf32();

// Timing marks on the device's stream (the kernel profiler, ops/profile.h): event_record
// queues a timestamp behind the work already queued and returns its handle;
// event_elapsed_ms waits for both marks and gives the milliseconds between them;
// event_destroy releases a handle.
void* event_record(int device);
float event_elapsed_ms(void* start, void* end);
void event_destroy(void* event);

// The device's name and compute capability, e.g. "NVIDIA H100 80GB HBM3 (sm_90)".
std::string device_name(int device = 0);

}  // namespace mu::cuda
