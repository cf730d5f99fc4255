// Neural-network functions. softmax and log_softmax are fused, numerically stable
// kernels (the line's max is subtracted before exp) with fused gradients;
// cross_entropy and dropout are composed from other ops, so autograd derives theirs.
#include <array>
#include <cmath>
#include <limits>

#include "autograd/node.h"
#include "ops/kernels/softmax.h"
#include "ops/ops.h"
#include "ops/pointwise.h"
#include "tensor/random.h"

namespace mu {

using autograd::record;
using autograd::save;
using autograd::TensorList;



static Tensor softmax_impl(const Tensor& x, int64_t dim, bool log) {
  const char* op = log ? "log_softmax" : "softmax";
  MU_CHECK(x.is_floating_point(), op, ": needs a floating-point tensor, got ", dtype_name(x.dtype()));
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

// ---------------------------------------------------------------- cross_entropy

Tensor cross_entropy(const Tensor& logits, const Tensor& target, Reduction reduction, int64_t ignore_index) {
  const char* op = "cross_entropy";
  MU_CHECK(logits.dim() == 1 || logits.dim() == 2, op, ": logits must be (N, C) or (C), got shape ",
           shape_str(logits.shape()));
  MU_CHECK(target.dtype() == kInt64, op, ": target must hold int64 class indices, got ", dtype_name(target.dtype()),
           " (convert it with .to(kInt64))");
  bool batched = logits.dim() == 2;
  int64_t n = batched ? logits.shape()[0] : 1, c = logits.shape()[size_t(logits.dim() - 1)];
  MU_CHECK(batched ? target.shape() == Shape{n} : target.dim() == 0, op, ": target of shape ",
           shape_str(target.shape()), " does not match logits of shape ", shape_str(logits.shape()), " (expected ",
           batched ? shape_str({n}) : std::string("[]"), ")");
  // Ignored targets pick class 0 (any valid one) and are then weighted by 0.
  std::vector<int64_t> t = target.to_vector<int64_t>(), safe(static_cast<size_t>(n));
  std::vector<double> keep(static_cast<size_t>(n));
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) {
    int64_t v = t[size_t(i)];
    bool ignored = v == ignore_index;
    MU_CHECK(ignored || (v >= 0 && v < c), op, ": target ", v, " is out of bounds for ", c, " classes",
             batched ? detail::str(" (at position ", i, ")") : std::string());
    safe[size_t(i)] = ignored ? 0 : v;
    keep[size_t(i)] = ignored ? 0.0 : 1.0;
    count += ignored ? 0 : 1;
  }
  Tensor lp = log_softmax(batched ? logits : logits.unsqueeze(0), 1);
  Tensor picked = gather(lp, 1, from_vector(safe, {n, 1})).reshape({n});
  Tensor loss = -picked * from_vector(keep, {n}, logits.dtype());
  if (reduction == Reduction::None) return batched ? loss : loss.reshape({});
  if (reduction == Reduction::Sum) return loss.sum();
  // As torch: the mean over the targets kept. When every target is ignored the value is
  // NaN (0 / 0) but the gradient is 0, not 0 / 0: a NaN constant added to a zero-weighted sum.
  if (count == 0) return loss.sum() * 0.0 + full({}, NAN, TensorOptions(loss.dtype()).device(loss.device()));
  return loss.sum() / double(count);
}

// ---------------------------------------------------------------- dropout

Tensor dropout(const Tensor& x, double p, bool training) {
  MU_CHECK(p >= 0 && p <= 1, "dropout: probability has to be between 0 and 1, got ", p);
  if (!training || p == 0) return x;
  MU_CHECK(x.is_floating_point(), "dropout: needs a floating-point tensor, got ", dtype_name(x.dtype()));
  // Everything dropped: x * 0, so the gradient is zero and a NaN stays NaN (as torch).
  if (p == 1) return x * 0.0;
  // Keep each element with probability 1 - p and scale the kept ones so the mean holds.
  double q = 1 - p, scale = 1 / q;
  Tensor u = rand(x.shape(), TensorOptions(x.dtype()).device(x.device()));
  Tensor mask = detail::map(fn::DropoutMask{{}, q, scale}, {u});
  return x * mask;
}

}  // namespace mu
