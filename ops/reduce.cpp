// Reductions. sum is the primitive the gradients of every broadcasting op need;
// mean and var are composed from it.
#include <cmath>
#include <limits>

#include "autograd/node.h"
#include "ops/compute_dtype.h"
#include "ops/kernels/reduce.h"
#include "ops/ops.h"
#include "ops/pointwise.h"

namespace mu {

using autograd::record;
using autograd::save;
using autograd::TensorList;

// sum; a 16-bit float x's sum is left in float32 when `round` is false (for mean, which
// divides before it rounds).
static Tensor sum_impl(const Tensor& x, const Shape& dims, bool keepdim, bool round) {
  // The narrow integers sum as int64, as in PyTorch (the result is int64).
  if (!is_compute_dtype(x.dtype()) && !is_floating(x.dtype())) return sum(in_compute_dtype(x), dims, keepdim);
  ReducePlan p = plan_reduce(x, dims, keepdim, "sum");
  // The 16-bit floats (autocast's bfloat16 activations) are summed in float32 by the
  // kernel, which reads them as they are, and the result rounded back once, as in
  // PyTorch; bool counts in int64.
  const bool narrow_float = is_16bit_float(x.dtype());
  const DType acc = narrow_float ? kFloat32 : x.dtype() == kBool ? kInt64 : x.dtype();
  Tensor y = empty(p.out_shape, TensorOptions(acc).device(x.device()));
  kernels::sum(x.device(), y, x, p);
  if (narrow_float && round) y = detail::cast(y, x.dtype());
  return record("SumBackward", y, {x}, [keep = p.keep_shape, sx = x.shape()](const Tensor& g) -> TensorList {
    return {g.reshape(keep).expand(sx)};
  });
}

Tensor sum(const Tensor& x, const Shape& dims, bool keepdim) { return sum_impl(x, dims, keepdim, true); }

Tensor mean(const Tensor& x, const Shape& dims, bool keepdim) {
  MU_CHECK(x.is_floating_point(), "mean: needs a floating-point tensor, got ", dtype_name(x.dtype()));
  ReducePlan p = plan_reduce(x, dims, keepdim, "mean");
  // A 16-bit float's mean is the float32 sum divided in float32, rounded once (a float16
  // sum of 1e5 ones is inf, a bfloat16 sum of 1000 threes 3008), as torch's.
  if (is_16bit_float(x.dtype())) return (sum_impl(x, dims, keepdim, false) / double(p.inner)).to(x.dtype());
  return sum(x, dims, keepdim) / double(p.inner);
}

Tensor sum_to(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  MU_CHECK(shape.size() <= x.shape().size(), "sum_to: cannot reduce shape ", shape_str(x.shape()), " to ",
           shape_str(shape));
  size_t lead = x.shape().size() - shape.size();
  Shape dims;
  for (size_t d = 0; d < x.shape().size(); ++d) {
    if (d < lead) {
      dims.push_back(int64_t(d));
    } else if (shape[d - lead] == 1 && x.shape()[d] != 1) {
      dims.push_back(int64_t(d));
    } else {
      MU_CHECK(shape[d - lead] == x.shape()[d], "sum_to: cannot reduce shape ", shape_str(x.shape()), " to ",
               shape_str(shape));
    }
  }
  if (dims.empty()) return x.reshape(shape);
  return sum(x, dims, true).reshape(shape);
}

Tensor Tensor::sum() const { return mu::sum(*this); }
Tensor Tensor::sum(const Shape& dims, bool keepdim) const { return mu::sum(*this, dims, keepdim); }
Tensor Tensor::mean() const { return mu::mean(*this); }
Tensor Tensor::mean(const Shape& dims, bool keepdim) const { return mu::mean(*this, dims, keepdim); }
Tensor Tensor::max() const { return mu::max(*this); }
Tensor Tensor::min() const { return mu::min(*this); }
ValuesIndices Tensor::max(int64_t dim, bool keepdim) const { return mu::max(*this, dim, keepdim); }
ValuesIndices Tensor::min(int64_t dim, bool keepdim) const { return mu::min(*this, dim, keepdim); }
Tensor Tensor::argmax() const { return mu::argmax(*this); }
Tensor Tensor::argmin() const { return mu::argmin(*this); }
Tensor Tensor::argmax(int64_t dim, bool keepdim) const { return mu::argmax(*this, dim, keepdim); }
Tensor Tensor::argmin(int64_t dim, bool keepdim) const { return mu::argmin(*this, dim, keepdim); }

}  // namespace mu

// ---------------------------------------------------------------- var, std

namespace mu {

Tensor var(const Tensor& x, const Shape& dims, int64_t correction, bool keepdim) {
  MU_CHECK(x.is_floating_point(), "var: needs a floating-point tensor, got ", dtype_name(x.dtype()));
  MU_CHECK(correction >= 0, "var: correction must be non-negative, got ", correction);
  ReducePlan p = plan_reduce(x, dims, keepdim, "var");
  // 16-bit floats in float32 throughout, rounded once (their squares and sums overflow
  // float16, and each rounding to 8 bits would cost bfloat16 its digits), as torch's.
  if (is_16bit_float(x.dtype())) return var(x.to(kFloat32), dims, correction, keepdim).to(x.dtype());
  Tensor d = x - mean(x, dims, true);
  // As torch: divide by max(0, n - correction), so too few elements give inf or NaN.
  double denom = double(std::max<int64_t>(0, p.inner - correction));
  return sum(d * d, dims, keepdim) / denom;
}

Tensor std(const Tensor& x, const Shape& dims, int64_t correction, bool keepdim) {
  return sqrt(var(x, dims, correction, keepdim));
}

// ---------------------------------------------------------------- amax, amin, max, min


// A reduction with no identity element needs at least one element per output.
static void require_nonempty(const Tensor& x, const ReducePlan& p, const char* op) {
  MU_CHECK(p.inner > 0 || p.outer == 0, op, ": cannot reduce over zero elements (input shape ", shape_str(x.shape()),
           "): the operation has no identity");
}

// Orderings (amax, amin, max, min, argmax, argmin) compare in a compute dtype: the 16-bit
// floats widen to float32 and the narrow integers to int64, both exactly (order, ties and
// NaNs kept), so the extremum and its index are the narrow values' own; bool is refused.
static Tensor widened_for_order(const Tensor& x, const char* op) {
  MU_CHECK(x.dtype() != kBool, op, ": expected a number dtype, got bool (convert with .to(kInt64))");
  return in_compute_dtype(x);
}

// amax/amin over dims, and max()/min() over everything. The gradient is shared evenly
// among the elements equal to the result (the NaNs, when the result is NaN).
static Tensor amax_amin(const Tensor& x_in, const Shape& dims, bool keepdim, bool take_max, const char* op) {
  const Tensor x = widened_for_order(x_in, op);
  if (x.dtype() != x_in.dtype()) return amax_amin(x, dims, keepdim, take_max, op).to(x_in.dtype());  // exact
  ReducePlan p = plan_reduce(x, dims, keepdim, op);
  require_nonempty(x, p, op);
  Tensor y = empty(p.out_shape, TensorOptions(x.dtype()).device(x.device()));
  kernels::extremum(x.device(), y, x, p, take_max);
  return record(take_max ? "AmaxBackward" : "AminBackward", y, {x},
                [xs = save(x), ys = save(y), keep = p.keep_shape, dims](const Tensor& g) -> TensorList {
    Tensor xv = xs.get();
    Tensor yk = ys.get().reshape(keep);
    Tensor hit = detail::map(fn::EqualOrBothNaN{}, {xv, yk});
    // Every kept slot has at least one hit (its own extremum), so the count is never 0.
    return {g.reshape(keep) * hit / sum(hit, dims, true)};
  });
}

Tensor amax(const Tensor& x, const Shape& dims, bool keepdim) { return amax_amin(x, dims, keepdim, true, "amax"); }
Tensor amin(const Tensor& x, const Shape& dims, bool keepdim) { return amax_amin(x, dims, keepdim, false, "amin"); }
Tensor max(const Tensor& x) { return amax_amin(x, {}, false, true, "max"); }
Tensor min(const Tensor& x) { return amax_amin(x, {}, false, false, "min"); }

// Index of the first extremum along one dim.
static Tensor arg_extremum(const Tensor& x_in, int64_t dim, bool keepdim, bool take_max, const char* op) {
  // Logits under autocast (bfloat16) take argmax directly.
  const Tensor x = widened_for_order(x_in, op);
  ReducePlan p = plan_reduce(x, {dim}, keepdim, op);
  require_nonempty(x, p, op);
  Tensor y = empty(p.out_shape, TensorOptions(kInt64).device(x.device()));
  kernels::arg_extremum(x.device(), y, x, p, take_max);
  return y;
}

Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) { return arg_extremum(x, dim, keepdim, true, "argmax"); }
Tensor argmin(const Tensor& x, int64_t dim, bool keepdim) { return arg_extremum(x, dim, keepdim, false, "argmin"); }
Tensor argmax(const Tensor& x) { return arg_extremum(x.reshape({-1}), 0, false, true, "argmax"); }
Tensor argmin(const Tensor& x) { return arg_extremum(x.reshape({-1}), 0, false, false, "argmin"); }

// Values are gathered at the indices, so their gradient flows to exactly that element.
static ValuesIndices max_min(const Tensor& x, int64_t dim, bool keepdim, bool take_max) {
  const char* op = take_max ? "max" : "min";
  Shape out_shape = plan_reduce(x, {dim}, keepdim, op).out_shape;
  // A 0-dim tensor is reduced as one of shape [1], so gather has a dim to work along.
  Tensor xv = x.dim() == 0 ? x.reshape({1}) : x;
  int64_t d = wrap_dim(dim, xv.dim(), op);
  Tensor idx = arg_extremum(xv, d, true, take_max, op);
  const Tensor xw = widened_for_order(xv, op);  // gather takes compute dtypes; narrowing back is exact
  // The positions come from arg_extremum's kernel, in range: no host copy to check them.
  Tensor values = xw.dtype() == xv.dtype() ? detail::gather_in_range(xv, d, idx)
                                           : detail::gather_in_range(xw, d, idx).to(xv.dtype());
  return {values.reshape(out_shape), idx.reshape(out_shape)};
}

ValuesIndices max(const Tensor& x, int64_t dim, bool keepdim) { return max_min(x, dim, keepdim, true); }
ValuesIndices min(const Tensor& x, int64_t dim, bool keepdim) { return max_min(x, dim, keepdim, false); }

}  // namespace mu
