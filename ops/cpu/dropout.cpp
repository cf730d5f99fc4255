// CPU kernel of the dropout mask (declared in ops/kernels/dropout.h): every element's
// bits come from its position alone, so the threads may split the range any way.
#include "ops/cpu/loops.h"
#include "ops/kernels/dropout.h"

namespace mu::cpu {

template <class T>
static void fill_mask(T* m, int64_t n, uint64_t key, uint64_t threshold, T kept) {
  parallel_for_if(n, n > kParallelGrain && !omp_in_parallel(), [&](int64_t i) {
    m[i] = kernels::attention_dropout_bits(key, uint64_t(i)) >= threshold ? kept : T(0);
  });
}

static void dropout_mask(const Tensor& mask, uint64_t seed, uint64_t threshold, double scale) {
  const uint64_t key = kernels::attention_dropout_key(seed);
  MU_DISPATCH_FLOAT(mask.dtype(), "dropout", [&] {
    fill_mask<scalar_t>(mask.data_ptr<scalar_t>(), mask.numel(), key, threshold, scalar_t(scale));
  });
}

MU_REGISTER_KERNEL(kernels::dropout_mask, DeviceType::CPU, dropout_mask);

}  // namespace mu::cpu
