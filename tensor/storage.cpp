#include "tensor/storage.h"

#include "tensor/allocator.h"

namespace mu {

Storage::Storage(size_t n, Device dev) : nbytes(n), device(dev) {
  if (dev.is_cpu())
    data = cpu_allocator::allocate(n);
  else
    data = cuda::allocate(n, dev.index);
}

Storage::~Storage() {
  if (device.is_cpu())
    cpu_allocator::deallocate(data, nbytes);
  else
    cuda::deallocate(data, nbytes, device.index);
}

}  // namespace mu
