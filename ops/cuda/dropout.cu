// CUDA kernel of the dropout mask (declared in ops/kernels/dropout.h; the CPU twin is
// ops/cpu/dropout.cpp): one thread per element in a grid-stride loop, each hashing its
// own position, so the mask equals the CPU's bit for bit.
#include "ops/cuda/dtypes.cuh"
#include "ops/cuda/runtime.cuh"
#include "ops/kernels/dropout.h"

namespace mu::cuda_kernels {

using namespace mu::cuda;

template <class T>
__global__ void dropout_mask_kernel(T* m, int64_t n, uint64_t key, uint64_t threshold, float scale_f, double scale_d) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const bool kept = kernels::attention_dropout_bits(key, uint64_t(i)) >= threshold;
    // The kept value is scale rounded once to T, as the CPU's scalar_t(scale).
    if constexpr (std::is_same_v<T, double>) m[i] = kept ? scale_d : 0.0;
    else m[i] = narrow<T>(kept ? scale_f : 0.0f);
  }
}

static void dropout_mask(const Tensor& mask, uint64_t seed, uint64_t threshold, double scale) {
  const int64_t n = mask.numel();
  if (n == 0) return;
  constexpr int threads = 256;
  dispatch_float_bf16(mask.dtype(), "dropout", [&](auto tag) {
    using T = decltype(tag);
    dropout_mask_kernel<T><<<grid_for(n, threads), threads, 0, stream(mask)>>>(
        static_cast<T*>(mask.raw_data()), n, kernels::attention_dropout_key(seed), threshold, float(scale), scale);
    MU_CUDA_CHECK_LAUNCH("dropout");
  });
}

MU_REGISTER_KERNEL(kernels::dropout_mask, DeviceType::CUDA, dropout_mask);

}  // namespace mu::cuda_kernels
