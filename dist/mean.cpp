// ReduceOp::Mean on CPU tensors (dist/mean.h), through the library's own division.
#include "dist/mean.h"

#include "autograd/grad_mode.h"
#include "ops/ops.h"
#include "tensor/error.h"

namespace mu::dist::detail {

void divide_in_place_cpu(const Tensor& t, int n) {
  MU_CHECK(t.device().is_cpu() && t.is_contiguous(), "divide_in_place_cpu: expected a contiguous CPU tensor, got ",
           t.describe());
  const DType dt = t.dtype();
  MU_CHECK(dt == kFloat32 || dt == kFloat64 || dt == kBFloat16 || dt == kInt64, "ReduceOp::Mean: dtype ",
           dtype_name(dt), " cannot be averaged (float32, float64, bfloat16, int64)");
  if (n == 1) return;  // x / 1 is x in every dtype
  NoGradGuard no_grad;
  // The divisor as a 0-dim tensor of t's dtype, so the quotient keeps it (bfloat16 divides
  // its float value and rounds once); int64 truncates toward zero, as C++ does.
  const Tensor d = full({}, double(n), TensorOptions(dt));
  Tensor q = dt == kInt64 ? div(t, d, "trunc") : div(t, d);
  Tensor(t).copy_(q);
}

}  // namespace mu::dist::detail
