// The CUDA device plumbing of a build made without nvcc: every request for device
// memory is refused with an error that says how to get a CUDA build.
#include <cstring>

#include "tensor/storage.h"

namespace mu::cuda {

static const char* kNoCuda =
    "mumoe was built without CUDA support (nvcc was not found when CMake configured the "
    "build); reconfigure with the CUDA toolkit on PATH to use Device::cuda()";

int device_count() { return 0; }
bool is_available() { return false; }
void* allocate(size_t, int) { MU_FAIL(kNoCuda); }
void deallocate(void*, int) {}
void memcpy(void* dst, Device dd, const void* src, Device sd, size_t n) {
  MU_CHECK(dd.is_cpu() && sd.is_cpu(), kNoCuda);
  std::memcpy(dst, src, n);
}

}  // namespace mu::cuda
