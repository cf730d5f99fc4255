// ReduceOp::Mean on CPU tensors (dist/mean.h).
#include "dist/mean.h"

#include "tensor/error.h"
#include "tensor/half.h"

namespace mu::dist::detail {

namespace {
// Below this many elements one thread is quicker than waking the team.
constexpr int64_t kParallelGrain = int64_t(1) << 16;

template <class T, class F>
void for_each(T* p, int64_t count, F f) {
#pragma omp parallel for if (count >= kParallelGrain)
  for (int64_t i = 0; i < count; ++i) p[i] = f(p[i]);
}
}  // namespace

void divide_in_place_cpu(const Tensor& t, int n) {
  MU_CHECK(t.device().is_cpu() && t.is_contiguous(), "divide_in_place_cpu: expected a contiguous CPU tensor, got ",
           t.describe());
  if (n == 1) return;  // x / 1 is x in every dtype
  const int64_t count = t.numel();
  switch (t.dtype()) {
    case DType::Float32: {
      const float d = float(n);
      for_each(t.data_ptr<float>(), count, [d](float x) { return x / d; });
      break;
    }
    case DType::Float64: {
      const double d = double(n);
      for_each(t.data_ptr<double>(), count, [d](double x) { return x / d; });
      break;
    }
    case DType::Int64: {
      const int64_t d = n;
      for_each(t.data_ptr<int64_t>(), count, [d](int64_t x) { return x / d; });
      break;
    }
    case DType::BFloat16: {
      const float d = float(n);
      for_each(t.data_ptr<bfloat16_t>(), count, [d](bfloat16_t x) { return bfloat16_t(float(x) / d); });
      break;
    }
    default:
      MU_FAIL("ReduceOp::Mean: dtype ", dtype_name(t.dtype()), " cannot be averaged (float32, float64, bfloat16, int64)");
  }
}

}  // namespace mu::dist::detail
