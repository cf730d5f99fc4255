// CPU kernel of the dropout mask (declared in ops/kernels/dropout.h): every element's
// bits come from its position alone, so the threads may split the range any way. The
// hash runs on eight counters at once (ops/cpu/dropout_lanes.h).
#include "ops/cpu/dropout_lanes.h"
#include "ops/cpu/loops.h"
#include "ops/cpu/simd.h"
#include "ops/kernels/dropout.h"

namespace mu::cpu {

template <class T>
static void fill_mask(T* m, int64_t n, uint64_t key, uint64_t threshold, T kept) {
  constexpr int64_t kBlock = 4096;  // elements a thread takes at a time (a multiple of 8)
  const auto keep = typename DropoutLanes<T>::type{} + kept;
  parallel_for_if((n + kBlock - 1) / kBlock, n > kParallelGrain && !omp_in_parallel(), [&](int64_t b) {
    const int64_t end = std::min(n, (b + 1) * kBlock);
    int64_t i = b * kBlock;
    for (; i + 8 <= end; i += 8)
      store(m + i, dropout_select8<T>(dropout_kept8<T>(key, uint64_t(i), 1, threshold), keep));
    for (; i < end; ++i) m[i] = kernels::attention_dropout_bits(key, uint64_t(i)) >= threshold ? kept : T(0);
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
