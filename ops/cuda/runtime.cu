// CUDA device plumbing (declared in tensor/cuda.h and ops/cuda/runtime.cuh): device
// discovery, the caching allocator, pinned staging buffers for host transfers, the one
// stream and cuBLAS handle per device. Every CUDA and cuBLAS call is checked.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "ops/cuda/runtime.cuh"
#include "tensor/checked.h"

namespace mu::cuda {

// Devices past this index are refused (more than any one machine here holds).
constexpr int kMaxDevices = 16;

int device_count() {
  static const int n = [] {
    int count = 0;
    // No driver or no GPU: cudaGetDeviceCount reports an error; that means zero devices.
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
      cudaGetLastError();  // clear the error so that later calls are not poisoned by it
      return 0;
    }
    return std::min(count, kMaxDevices);
  }();
  return n;
}

bool is_available() { return device_count() > 0; }

static void require_device(int device) {
  const int n = device_count();
  MU_CHECK(n > 0, "CUDA tensor requested but no CUDA device is available on this machine "
                  "(cudaGetDeviceCount found none)");
  MU_CHECK(device >= 0 && device < n, "CUDA device index ", device, " out of range: ", n, " device",
           n == 1 ? "" : "s", " present");
}

void* event_record(int device) {
  cudaEvent_t e = nullptr;
  MU_CUDA_CHECK(cudaEventCreate(&e));
  MU_CUDA_CHECK(cudaEventRecord(e, stream(device)));
  return e;
}

float event_elapsed_ms(void* start, void* end) {
  MU_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(end)));
  float ms = 0;
  MU_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start), static_cast<cudaEvent_t>(end)));
  return ms;
}

void event_destroy(void* event) {
  if (event != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(event));  // nothing to do about a failure here
}

std::string device_name(int device) {
  require_device(device);
  cudaDeviceProp prop{};
  MU_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  return detail::str(prop.name, " (sm_", prop.major, prop.minor, ")");
}

// ---------------------------------------------------------------- streams

namespace {
struct PerDevice {
  std::once_flag stream_once, cublas_once, cublaslt_once;
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  cublasLtHandle_t cublaslt = nullptr;
  CublasWorkspace workspace{nullptr, 0};
  bool cublas_tf32 = false;  // the math mode the handle was last set to
};
PerDevice& per_device(int device) {
  static PerDevice* all = new PerDevice[kMaxDevices];  // never destroyed: tensors outlive statics
  return all[device];
}
bool g_allow_tf32 = false;
}  // namespace

cudaStream_t stream(int device) {
  require_device(device);
  MU_CUDA_CHECK(cudaSetDevice(device));
  PerDevice& d = per_device(device);
  // A stream of its own rather than the legacy default stream, which synchronises with
  // every other stream of the process (a library a user links may launch on those).
  std::call_once(d.stream_once, [&] { MU_CUDA_CHECK(cudaStreamCreateWithFlags(&d.stream, cudaStreamNonBlocking)); });
  return d.stream;
}

void synchronize(int device) { MU_CUDA_CHECK(cudaStreamSynchronize(stream(device))); }

void set_allow_tf32(bool allow) { g_allow_tf32 = allow; }
bool allow_tf32() { return g_allow_tf32; }

// cuBLAS's math mode. Always with reduced-precision reductions refused: by default cuBLAS
// may add a split-K product's partial sums in the output's dtype, so that a bfloat16
// product of few rows and a long depth (a decoding step's) was rounded to 8 bits several
// times, not once as its float32 sums promise (4 x 2100 by 2100 x 257: 0.2 off on values
// near 46, twice bfloat16's rounding; test_autocast on an H200).
static cublasMath_t math_mode(bool tf32) {
  return cublasMath_t((tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH) |
                      CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION);
}

cublasHandle_t cublas(int device) {
  cudaStream_t s = stream(device);
  PerDevice& d = per_device(device);
  std::call_once(d.cublas_once, [&] {
    MU_CUBLAS_CHECK(cublasCreate(&d.cublas));
    MU_CUBLAS_CHECK(cublasSetStream(d.cublas, s));
    // The handle's workspace from the caching allocator, so that cuBLAS never allocates
    // behind the allocator's back (32 MiB: what cuBLAS asks for on Hopper).
    constexpr size_t kWorkspace = size_t(32) << 20;
    d.workspace = {allocate(kWorkspace, device), kWorkspace};
    MU_CUBLAS_CHECK(cublasSetWorkspace(d.cublas, d.workspace.data, kWorkspace));
    MU_CUBLAS_CHECK(cublasSetMathMode(d.cublas, math_mode(false)));
  });
  if (d.cublas_tf32 != g_allow_tf32) {
    MU_CUBLAS_CHECK(cublasSetMathMode(d.cublas, math_mode(g_allow_tf32)));
    d.cublas_tf32 = g_allow_tf32;
  }
  return d.cublas;
}

CublasWorkspace cublas_workspace(int device) {
  cublas(device);  // allocates it with the handle
  return per_device(device).workspace;
}

cublasLtHandle_t cublaslt(int device) {
  require_device(device);
  PerDevice& d = per_device(device);
  std::call_once(d.cublaslt_once, [&] { MU_CUBLAS_CHECK(cublasLtCreate(&d.cublaslt)); });
  return d.cublaslt;
}

// ---------------------------------------------------------------- the caching allocator

namespace {

struct DeviceCache {
  std::mutex mu;
  std::multimap<size_t, void*> free_blocks;  // rounded size -> block
  MemoryStats st;
};

DeviceCache& device_cache(int device) {
  static DeviceCache* all = new DeviceCache[kMaxDevices];  // never destroyed, as above
  return all[device];
}

// Caching is on unless MUMOE_NO_CACHING=1 (then every free goes back to the driver, so
// that compute-sanitizer sees use-after-free).
bool caching_enabled() {
  static const bool on = [] {
    const char* env = std::getenv("MUMOE_NO_CACHING");
    return !(env && env[0] == '1');
  }();
  return on;
}

// MUMOE_CUDA_POISON=1: every block handed out is first filled with all-ones bytes (NaN in
// every float dtype, -1 in the integers), as the emulated device fills its blocks, so that
// a kernel reading memory nothing wrote gives NaN instead of whatever the block held last.
bool poison_enabled() {
  static const bool on = [] {
    const char* env = std::getenv("MUMOE_CUDA_POISON");
    return env && env[0] == '1';
  }();
  return on;
}

void* handed_out(void* p, size_t sz, int device) {
  if (poison_enabled()) MU_CUDA_CHECK(cudaMemsetAsync(p, 0xff, sz, stream(device)));
  return p;
}

// Size classes: multiples of 512 bytes below 1 MiB, of 2 MiB below 64 MiB, and of 1/8 of
// the next power of two above; nearby sizes share a class, so the blocks of one training
// step serve the next.
size_t round_size(size_t n) {
  MU_CHECK(n <= size_t(kMaxAllocationBytes), "cannot allocate ", n, " bytes on a CUDA device: more than any "
           "device can address (", kMaxAllocationBytes, ")");
  if (n == 0) return 512;
  if (n < (size_t(1) << 20)) return (n + 511) / 512 * 512;
  if (n < (size_t(64) << 20)) return (n + (size_t(2) << 20) - 1) / (size_t(2) << 20) * (size_t(2) << 20);
  size_t p = 1;
  while (p < n) p <<= 1;
  const size_t step = p / 8;
  return (n + step - 1) / step * step;
}

void note_allocated(MemoryStats& st, size_t sz) {
  st.allocated_bytes += int64_t(sz);
  st.peak_bytes = std::max(st.peak_bytes, st.allocated_bytes);
}

// Returns every cached block of the device to the driver. The caller holds c.mu.
void release_cached(DeviceCache& c, int device) {
  if (c.free_blocks.empty()) return;
  // Kernels queued on the stream may still use a cached block (freed by a tensor, not yet
  // reached by the stream): wait for them before the memory goes back.
  MU_CUDA_CHECK(cudaStreamSynchronize(stream(device)));
  // Forgotten even if a free fails: the error is raised after the books are right.
  cudaError_t first = cudaSuccess;
  for (auto& [sz, p] : c.free_blocks) {
    const cudaError_t e = cudaFree(p);
    if (first == cudaSuccess) first = e;
  }
  c.free_blocks.clear();
  c.st.cached_bytes = 0;
  MU_CUDA_CHECK(first);
}

}  // namespace

void* allocate(size_t nbytes, int device) {
  require_device(device);
  DeviceCache& c = device_cache(device);
  const size_t sz = round_size(nbytes);
  std::lock_guard<std::mutex> g(c.mu);
  if (caching_enabled()) {
    auto it = c.free_blocks.find(sz);
    if (it != c.free_blocks.end()) {
      void* p = it->second;
      c.free_blocks.erase(it);
      c.st.cached_bytes -= int64_t(sz);
      note_allocated(c.st, sz);
      return handed_out(p, sz, device);
    }
  }
  MU_CUDA_CHECK(cudaSetDevice(device));
  void* p = nullptr;
  cudaError_t err = cudaMalloc(&p, sz);
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // an allocation failure is not sticky; clear it before the retry
    release_cached(c, device);
    err = cudaMalloc(&p, sz);
  }
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    MU_FAIL("CUDA out of memory on cuda:", device, ": tried to allocate ", nbytes, " bytes (", sz,
            " rounded); live tensors hold ", c.st.allocated_bytes, " bytes, the cache held ", c.st.cached_bytes,
            " and was released; the device has ", free_b, " of ", total_b, " bytes free");
  }
  MU_CHECK(err == cudaSuccess, "cudaMalloc(", sz, " bytes) on cuda:", device, " failed: ", cudaGetErrorName(err),
           " (", cudaGetErrorString(err), ")");
  note_allocated(c.st, sz);
  return handed_out(p, sz, device);
}

void deallocate(void* ptr, size_t nbytes, int device) {
  if (!ptr) return;
  DeviceCache& c = device_cache(device);
  const size_t sz = round_size(nbytes);
  std::lock_guard<std::mutex> g(c.mu);
  c.st.allocated_bytes -= int64_t(sz);
  if (caching_enabled()) {
    c.free_blocks.emplace(sz, ptr);
    c.st.cached_bytes += int64_t(sz);
  } else {
    // No throwing here (a destructor calls this): wait for the stream, then free, and
    // say so on stderr if the driver refuses (a fault in an earlier kernel, usually).
    cudaError_t e = cudaSetDevice(device);
    if (e == cudaSuccess) e = cudaStreamSynchronize(per_device(device).stream);
    if (e == cudaSuccess) e = cudaFree(ptr);
    if (e != cudaSuccess)
      std::fprintf(stderr, "mumoe: freeing %zu bytes on cuda:%d failed: %s (%s)\n", sz, device, cudaGetErrorName(e),
                   cudaGetErrorString(e));
  }
}

MemoryStats memory_stats(int device) {
  require_device(device);
  DeviceCache& c = device_cache(device);
  std::lock_guard<std::mutex> g(c.mu);
  return c.st;
}

void reset_peak_memory(int device) {
  require_device(device);
  DeviceCache& c = device_cache(device);
  std::lock_guard<std::mutex> g(c.mu);
  c.st.peak_bytes = c.st.allocated_bytes;
}

void empty_cache(int device) {
  require_device(device);
  DeviceCache& c = device_cache(device);
  std::lock_guard<std::mutex> g(c.mu);
  release_cached(c, device);
}

// ---------------------------------------------------------------- host transfers

namespace {

// Host <-> device copies go through page-locked staging buffers in chunks: the copy
// engine reads pinned memory directly (pageable memory it would first copy into a
// driver buffer of its own), and two buffers let the host fill one chunk while the
// previous one is in flight.
constexpr size_t kChunk = size_t(16) << 20;

struct Staging {
  std::mutex mu;
  void* buf[2] = {nullptr, nullptr};
  cudaEvent_t done[2] = {nullptr, nullptr};  // the last copy out of / into buf[k] finished
  int next = 0;  // the buffer host_to_device fills first: the one its last chunk did not use
};

Staging& staging(int device) {
  static Staging* all = new Staging[kMaxDevices];  // never destroyed, as above
  return all[device];
}

// The buffers and events, made on first use; the caller holds s.mu.
void ensure_staging(Staging& s) {
  for (int k = 0; k < 2; ++k) {
    if (!s.buf[k]) MU_CUDA_CHECK(cudaMallocHost(&s.buf[k], kChunk));
    if (!s.done[k]) MU_CUDA_CHECK(cudaEventCreateWithFlags(&s.done[k], cudaEventDisableTiming));
  }
}

// The device's staging buffers, held for one transfer, and the stream it runs on.
struct HeldStaging {
  cudaStream_t stream;
  Staging& s;
  std::lock_guard<std::mutex> hold;
  explicit HeldStaging(int device) : stream(cuda::stream(device)), s(staging(device)), hold(s.mu) {
    ensure_staging(s);
  }
};

// host_transfers' counts, per device.
struct TransferCounters {
  std::atomic<int64_t> to_device{0}, to_host{0};
};
TransferCounters& transfer_counters(int device) {
  static TransferCounters* all = new TransferCounters[kMaxDevices];  // never destroyed, as above
  return all[device];
}

void host_to_device(void* dst, const void* src, size_t n, int device) {
  transfer_counters(device).to_device.fetch_add(1, std::memory_order_relaxed);
  HeldStaging h(device);
  Staging& s = h.s;
  cudaStream_t st = h.stream;
  const char* from = static_cast<const char*>(src);
  char* to = static_cast<char*>(dst);
  // The copy is queued, not waited for: the source has been copied into the staging
  // buffers when this returns (the caller may reuse it), the device reads the destination
  // in stream order, and whoever next fills a buffer first waits for its event. Each call
  // starts in the buffer the last one did not end in, so that two small copies in a row
  // (a batch's inputs and targets) neither wait for the device's queue to drain.
  int k = s.next;
  for (size_t off = 0; off < n; off += kChunk, k ^= 1) {
    const size_t len = std::min(kChunk, n - off);
    MU_CUDA_CHECK(cudaEventSynchronize(s.done[k]));  // the buffer's previous chunk has left
    std::memcpy(s.buf[k], from + off, len);
    MU_CUDA_CHECK(cudaMemcpyAsync(to + off, s.buf[k], len, cudaMemcpyHostToDevice, st));
    MU_CUDA_CHECK(cudaEventRecord(s.done[k], st));
  }
  s.next = k;
}

void device_to_host(void* dst, const void* src, size_t n, int device) {
  transfer_counters(device).to_host.fetch_add(1, std::memory_order_relaxed);
  HeldStaging h(device);
  Staging& s = h.s;
  cudaStream_t st = h.stream;
  const char* from = static_cast<const char*>(src);
  char* to = static_cast<char*>(dst);
  // Queue chunk k + 1 before copying chunk k out of its buffer, so that the two overlap.
  // A host_to_device copy still queued out of a buffer is ahead of these in the stream:
  // the device finishes reading it before it writes there.
  const size_t chunks = (n + kChunk - 1) / kChunk;
  auto queue = [&](size_t c) {
    const size_t off = c * kChunk, len = std::min(kChunk, n - off);
    MU_CUDA_CHECK(cudaMemcpyAsync(s.buf[c & 1], from + off, len, cudaMemcpyDeviceToHost, st));
    MU_CUDA_CHECK(cudaEventRecord(s.done[c & 1], st));
  };
  if (chunks > 0) queue(0);
  for (size_t c = 0; c < chunks; ++c) {
    if (c + 1 < chunks) queue(c + 1);
    MU_CUDA_CHECK(cudaEventSynchronize(s.done[c & 1]));
    const size_t off = c * kChunk, len = std::min(kChunk, n - off);
    std::memcpy(to + off, s.buf[c & 1], len);
  }
}

}  // namespace

HostTransfers host_transfers(int device) {
  require_device(device);
  const TransferCounters& c = transfer_counters(device);
  return {c.to_device.load(std::memory_order_relaxed), c.to_host.load(std::memory_order_relaxed)};
}

void memcpy(void* dst, Device dd, const void* src, Device sd, size_t n) {
  if (n == 0) return;
  if (dd.is_cpu() && sd.is_cpu()) {
    std::memcpy(dst, src, n);
  } else if (sd.is_cpu()) {
    host_to_device(dst, src, n, dd.index);
  } else if (dd.is_cpu()) {
    device_to_host(dst, src, n, sd.index);
  } else if (dd.index == sd.index) {
    MU_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, stream(dd.index)));
  } else {
    // Between two devices: the source's queued writes must land first, and the copy
    // must land before the destination's stream reads it.
    synchronize(sd.index);
    MU_CUDA_CHECK(cudaMemcpyPeerAsync(dst, dd.index, src, sd.index, n, stream(dd.index)));
    synchronize(dd.index);
  }
}

}  // namespace mu::cuda
