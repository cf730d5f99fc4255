// Neural-network functions. softmax and log_softmax are fused, numerically stable
// kernels (the line's max is subtracted before exp) with fused gradients;
// cross_entropy and dropout are composed from other ops, so autograd derives theirs.
#include <array>
#include <cmath>
#include <limits>

#include "autograd/node.h"
#include "ops/cpu/lines.h"
#include "ops/ops.h"
#include "ops/pointwise.h"
#include "tensor/random.h"

namespace mu {

using autograd::record;
using autograd::save;
using autograd::TensorList;


namespace cpu {
// y = softmax(x) (or log_softmax when `log`) along each line. A NaN anywhere in a
// line, or a line of only -inf, makes the whole line NaN, as in PyTorch.
template <class T>
static void softmax_lines(const T* x, T* y, int64_t outer, int64_t n, int64_t inner, bool log) {
  using A = acc_t<T>;
  for_each_line(outer, n, inner, [=](int64_t off, int64_t st) {
    const T* xl = x + off;
    T* yl = y + off;
    T m = -std::numeric_limits<T>::infinity();
    for (int64_t j = 0; j < n; ++j) m = xl[j * st] > m ? xl[j * st] : m;
    // A NaN never compares greater, so m is the max of the numbers; NaN still reaches
    // the sum through exp(NaN - m).
    A s = 0;
    if (log) {
      for (int64_t j = 0; j < n; ++j) s += A(std::exp(xl[j * st] - m));
      T ls = T(std::log(s));
      for (int64_t j = 0; j < n; ++j) yl[j * st] = xl[j * st] - m - ls;
    } else {
      // exp once: keep it in y, then scale by the sum.
      for (int64_t j = 0; j < n; ++j) {
        yl[j * st] = std::exp(xl[j * st] - m);
        s += A(yl[j * st]);
      }
      A inv = A(1) / s;
      for (int64_t j = 0; j < n; ++j) yl[j * st] = T(A(yl[j * st]) * inv);
    }
  });
}

// Gradients along each line: softmax dx = y (g - sum(g y)); log_softmax dx = g - exp(y) sum(g).
template <class T>
static void softmax_backward_lines(const T* g, const T* y, T* dx, int64_t outer, int64_t n, int64_t inner, bool log) {
  using A = acc_t<T>;
  for_each_line(outer, n, inner, [=](int64_t off, int64_t st) {
    const T *gl = g + off, *yl = y + off;
    T* dl = dx + off;
    A s = 0;
    if (log) {
      for (int64_t j = 0; j < n; ++j) s += A(gl[j * st]);
      for (int64_t j = 0; j < n; ++j) dl[j * st] = T(A(gl[j * st]) - std::exp(A(yl[j * st])) * s);
    } else {
      for (int64_t j = 0; j < n; ++j) s += A(gl[j * st]) * A(yl[j * st]);
      for (int64_t j = 0; j < n; ++j) dl[j * st] = T(A(yl[j * st]) * (A(gl[j * st]) - s));
    }
  });
}
}  // namespace cpu

static Tensor softmax_impl(const Tensor& x, int64_t dim, bool log) {
  const char* op = log ? "log_softmax" : "softmax";
  detail::require_cpu(x, op);
  MU_CHECK(x.is_floating_point(), op, ": needs a floating-point tensor, got ", dtype_name(x.dtype()));
  int64_t d = wrap_dim(dim, x.dim(), op);
  auto [outer, n, inner] = cpu::line_geometry(x.shape(), d);
  Tensor xc = x.detach().contiguous(), y = empty(x.shape(), x.dtype());
  MU_DISPATCH_FLOAT(x.dtype(), op, [&] {
    cpu::softmax_lines(xc.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), outer, n, inner, log);
  });
  return record(log ? "LogSoftmaxBackward" : "SoftmaxBackward", y, {x},
                [ys = save(y), outer, n, inner, log](const Tensor& g) -> TensorList {
    Tensor gc = g.contiguous(), yv = ys.get(), dx = empty(yv.shape(), yv.dtype());
    MU_DISPATCH_FLOAT(yv.dtype(), "softmax_backward", [&] {
      cpu::softmax_backward_lines(gc.data_ptr<scalar_t>(), yv.data_ptr<scalar_t>(), dx.data_ptr<scalar_t>(), outer,
                                  n, inner, log);
    });
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
  // As torch: the mean over the targets kept; NaN when every target is ignored.
  return loss.sum() / double(count);
}

// ---------------------------------------------------------------- dropout

Tensor dropout(const Tensor& x, double p, bool training) {
  MU_CHECK(p >= 0 && p <= 1, "dropout: probability has to be between 0 and 1, got ", p);
  if (!training || p == 0) return x;
  detail::require_cpu(x, "dropout");
  MU_CHECK(x.is_floating_point(), "dropout: needs a floating-point tensor, got ", dtype_name(x.dtype()));
  // Everything dropped: x * 0, so the gradient is zero and a NaN stays NaN (as torch).
  if (p == 1) return x * 0.0;
  // Keep each element with probability 1 - p and scale the kept ones so the mean holds.
  double q = 1 - p, scale = 1 / q;
  Tensor u = rand(x.shape(), x.dtype());
  Tensor mask = detail::map_float(u, "dropout", [q, scale](auto v) {
    using T = decltype(v);
    return v < T(q) ? T(scale) : T(0);
  });
  return x * mask;
}

}  // namespace mu
