// The CUDA device plumbing of a build made without nvcc: there are no devices, and every
// request for device memory is refused with an error that says how to get a CUDA build.
#include <cstring>

#include "tensor/cuda.h"
#include "tensor/error.h"

namespace mu::cuda {

static const char* kNoCuda =
    "mumoe was built without CUDA support (nvcc was not found when CMake configured the "
    "build); reconfigure with the CUDA toolkit on PATH to use Device::cuda()";

int device_count() { return 0; }
bool is_available() { return false; }
void* allocate(size_t, int) { MU_FAIL(kNoCuda); }
void deallocate(void*, size_t, int) {}
MemoryStats memory_stats(int) { MU_FAIL(kNoCuda); }
void reset_peak_memory(int) { MU_FAIL(kNoCuda); }
void empty_cache(int) { MU_FAIL(kNoCuda); }
void memcpy(void* dst, Device dd, const void* src, Device sd, size_t n) {
  MU_CHECK(dd.is_cpu() && sd.is_cpu(), kNoCuda);
  std::memcpy(dst, src, n);
}
HostTransfers host_transfers(int) { MU_FAIL(kNoCuda); }
void synchronize(int) { MU_FAIL(kNoCuda); }
static bool tf32 = false;
void set_allow_tf32(bool allow) { tf32 = allow; }
bool allow_tf32() { return tf32; }
std::string device_name(int) { MU_FAIL(kNoCuda); }
void* event_record(int) { MU_FAIL(kNoCuda); }
float event_elapsed_ms(void*, void*) { MU_FAIL(kNoCuda); }
void event_destroy(void*) {}

}  // namespace mu::cuda
