// CUDA kernels of copies (declared in ops/kernels/copy.h). For now a copy on the device
// is one cudaMemcpy of a dense, same-dtype tensor; strided and converting copies need
// the CUDA map kernels.
#include "ops/kernels/copy.h"

namespace mu::cuda_kernels {

static void copy(const Tensor& dst, const Tensor& src) {
  MU_CHECK(dst.is_contiguous() && src.is_contiguous() && dst.dtype() == src.dtype() && dst.shape() == src.shape(),
           "copy on ", dst.device().str(), ": only dense same-dtype, same-shape copies have a CUDA kernel yet (",
           src.describe(), " -> ", dst.describe(), ")");
  cuda::memcpy(dst.raw_data(), dst.device(), src.raw_data(), src.device(),
               size_t(dst.numel()) * element_size(dst.dtype()));
}

MU_REGISTER_KERNEL(kernels::copy, DeviceType::CUDA, copy);

}  // namespace mu::cuda_kernels
