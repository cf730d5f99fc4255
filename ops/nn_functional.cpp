// Neural-network functions. softmax and log_softmax are fused, numerically stable
// kernels (the line's max is subtracted before exp) with fused gradients; dropout is
// composed from other ops, so autograd derives its gradient. (The losses are in
// ops/loss.cpp.)
#include <array>
#include <cmath>
#include <limits>

#include "autograd/autocast.h"
#include "autograd/node.h"
#include "ops/compute_dtype.h"
#include "ops/kernels/dropout.h"
#include "ops/kernels/softmax.h"
#include "ops/ops.h"
#include "ops/pointwise.h"
#include "tensor/random.h"

namespace mu {

using autograd::record;
using autograd::save;
using autograd::TensorList;



static Tensor softmax_impl(const Tensor& x_in, int64_t dim, bool log) {
  const Tensor x = autograd::autocast::to_full(x_in);  // in float32 under autocast
  const char* op = log ? "log_softmax" : "softmax";
  MU_CHECK(x.is_floating_point(), op, ": needs a floating-point tensor, got ", dtype_name(x.dtype()));
  // The 16-bit floats compute in float32 and round once, as torch (on every device, and
  // whatever the size: an empty tensor gets the same answer as any other).
  if (!is_compute_dtype(x.dtype())) return softmax_impl(in_compute_dtype(x), dim, log).to(x.dtype());
  int64_t d = wrap_dim(dim, x.dim(), op);
  auto [outer, n, inner] = line_geometry(x.shape(), d);
  Tensor xc = x.detach().contiguous(), y = empty_like(xc);
  kernels::softmax_forward(x.device(), xc, y, outer, n, inner, log);
  return record(log ? "LogSoftmaxBackward" : "SoftmaxBackward", y, {x},
                [ys = save(y), outer, n, inner, log](const Tensor& g) -> TensorList {
    Tensor gc = g.contiguous(), yv = ys.get(), dx = empty_like(yv);
    kernels::softmax_backward(yv.device(), gc, yv, dx, outer, n, inner, log);
    return {dx};
  });
}

Tensor softmax(const Tensor& x, int64_t dim) { return softmax_impl(x, dim, false); }
Tensor log_softmax(const Tensor& x, int64_t dim) { return softmax_impl(x, dim, true); }

// ---------------------------------------------------------------- dropout

Tensor dropout(const Tensor& x, double p, bool training, Generator* gen) {
  MU_CHECK(p >= 0 && p <= 1, "dropout: probability has to be between 0 and 1, got ", p);
  if (!training || p == 0) return x;
  MU_CHECK(x.is_floating_point(), "dropout: needs a floating-point tensor, got ", dtype_name(x.dtype()));
  // Everything dropped: x * 0, so the gradient is zero and a NaN stays NaN (as torch).
  if (p == 1) return x * 0.0;
  // Keep each element with probability 1 - p and scale the kept ones so the mean holds.
  // The mask is a pure function of one drawn seed and each element's position
  // (ops/kernels/dropout.h): the same on every device for the same generator state.
  const uint64_t seed = (gen ? *gen : default_generator()).next_u64();
  // The mask in the dtype x computes in (float32 for bfloat16 x, whose product is
  // rounded back to bfloat16 once).
  const DType md = compute_dtype(x.dtype());
  Tensor mask = empty(x.shape(), TensorOptions(md).device(x.device()));
  kernels::dropout_mask(x.device(), mask, seed, kernels::attention_dropout_threshold(p), 1 / (1 - p));
  Tensor y = x * mask;
  return y.dtype() == x.dtype() ? y : y.to(x.dtype());
}

Tensor Tensor::softmax(int64_t dim) const { return mu::softmax(*this, dim); }
Tensor Tensor::log_softmax(int64_t dim) const { return mu::log_softmax(*this, dim); }

}  // namespace mu
