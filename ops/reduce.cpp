// Reductions. sum is the primitive the gradients of every broadcasting op need;
// mean and var are composed from it.
#include <cmath>
#include <limits>

#include "autograd/node.h"
#include "ops/cpu/reduce_loop.h"
#include "ops/ops.h"
#include "ops/pointwise.h"

namespace mu {

using autograd::record;
using autograd::save;
using autograd::TensorList;

// Accumulator type: sums of float32 are carried in double, so that a long sum's error
// does not grow with its length.
template <class T> struct Acc { using type = T; };
template <> struct Acc<float> { using type = double; };
template <> struct Acc<bool> { using type = int64_t; };

namespace cpu {
// Sum over the plan's reduced dims into a new tensor of shape p.out_shape.
static Tensor sum_kernel(const Tensor& x, const ReducePlan& p) {
  DType out_dtype = x.dtype() == kBool ? kInt64 : x.dtype();
  Tensor out = empty(p.out_shape, out_dtype);
  MU_DISPATCH_ALL(x.dtype(), "sum", [&] {
    using A = typename Acc<scalar_t>::type;
    using O = std::conditional_t<std::is_same_v<scalar_t, bool>, int64_t, scalar_t>;
    O* po = out.data_ptr<O>();
    reduce_runs<scalar_t>(x, p, po, [](const scalar_t* v, int64_t n, int64_t st) {
      A acc = 0;
      if (st == 1)
        for (int64_t i = 0; i < n; ++i) acc += A(v[i]);
      else
        for (int64_t i = 0; i < n; ++i) acc += A(v[i * st]);
      return O(acc);
    });
  });
  return out;
}
}  // namespace cpu

Tensor sum(const Tensor& x, const Shape& dims, bool keepdim) {
  detail::require_cpu(x, "sum");
  cpu::ReducePlan p = cpu::plan_reduce(x, dims, keepdim, "sum");
  Tensor y = cpu::sum_kernel(x, p);
  return record("SumBackward", y, {x}, [keep = p.keep_shape, sx = x.shape()](const Tensor& g) -> TensorList {
    return {g.reshape(keep).expand(sx)};
  });
}

Tensor mean(const Tensor& x, const Shape& dims, bool keepdim) {
  MU_CHECK(x.is_floating_point(), "mean: needs a floating-point tensor, got ", dtype_name(x.dtype()));
  cpu::ReducePlan p = cpu::plan_reduce(x, dims, keepdim, "mean");
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

}  // namespace mu
