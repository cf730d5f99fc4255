#include "autograd/gradcheck.h"

#include <cmath>

#include "autograd/grad_mode.h"
#include "ops/ops.h"
#include "tensor/random.h"

namespace mu::autograd {

// A float64 copy of t with t's strides (so a transposed input stays transposed), on t's
// device.
static Tensor float64_like_layout(const Tensor& t) {
  NoGradGuard g;
  // Allocate a buffer as large as t's storage span and copy through the same geometry.
  int64_t span = 1;
  for (int64_t d = 0; d < t.dim(); ++d) span += (t.shape()[size_t(d)] - 1) * t.strides()[size_t(d)];
  bool dense_strides = true;
  for (int64_t s : t.strides()) dense_strides = dense_strides && s >= 0;
  if (t.numel() == 0 || !dense_strides) return t.to(kFloat64).contiguous().clone();
  Tensor buf = zeros({span}, TensorOptions(kFloat64).device(t.device()));
  Tensor v = make_view(buf.storage(), t.shape(), t.strides(), 0, kFloat64);
  v.copy_(t);
  return v;
}

// The element of t at idx as a 0-dim view of t's storage. Reading it with item() and
// writing it with copy_ works on any device, where Tensor::set needs host memory: the
// perturbations below go through it so that inputs on a GPU are checked where they are.
static Tensor element_view(const Tensor& t, const std::vector<int64_t>& idx) {
  int64_t off = t.storage_offset();
  for (size_t d = 0; d < idx.size(); ++d) off += idx[d] * t.strides()[d];
  return make_view(t.storage(), {}, {}, off, t.dtype());
}

GradcheckResult gradcheck(const GradcheckFn& fn, const TensorList& inputs, const GradcheckOptions& opt) {
  GradcheckResult res;
  const size_t n_in = inputs.size();
  std::vector<bool> check(n_in);
  for (size_t i = 0; i < n_in; ++i) {
    bool fl = inputs[i].defined() && inputs[i].is_floating_point();
    check[i] = opt.check_inputs.empty() ? fl : (i < opt.check_inputs.size() && opt.check_inputs[i] && fl);
  }

  // float64 leaves: differentiated inputs require grad, others stay as given (int indices).
  TensorList x(n_in);
  for (size_t i = 0; i < n_in; ++i) {
    if (!inputs[i].defined()) continue;
    x[i] = inputs[i].is_floating_point() ? float64_like_layout(inputs[i]) : inputs[i].detach();
    if (check[i]) x[i].requires_grad_(true);
  }

  Tensor y = fn(x);
  MU_CHECK(y.defined() && y.dtype() == kFloat64, "gradcheck: the function must return a float64 tensor, got ",
           y.describe());
  // The projection vector v, fixed by the seed so failures reproduce; drawn from a
  // generator of its own, so the global stream (and any thread drawing from it) is untouched.
  Generator projection(opt.seed);
  // Drawn on the host (the same numbers on every device), then moved to y's device.
  Tensor v = randn(y.shape(), kFloat64, &projection).to(y.device());

  // Analytic: one backward pass of v.
  bool any = false;
  for (size_t i = 0; i < n_in; ++i) any = any || check[i];
  MU_CHECK(any, "gradcheck: no floating-point input to differentiate");
  MU_CHECK(y.requires_grad(), "gradcheck: the output does not depend on any differentiated input (", y.describe(), ")");
  y.backward(v);

  // Numeric: central differences of <f(x), v>, one input element at a time.
  NoGradGuard no_grad;
  auto project = [&]() {
    Tensor out = fn(x);
    return (out * v).sum().item();
  };
  double worst = -INFINITY;
  for (size_t i = 0; i < n_in; ++i) {
    if (!check[i]) continue;
    // The analytic gradient, read on the host (one copy, not one per element).
    Tensor g = x[i].grad();
    g = g.defined() ? g.cpu() : zeros(x[i].shape(), kFloat64);
    const Tensor& xi = x[i];
    int64_t numel = xi.numel();
    std::vector<int64_t> idx(size_t(xi.dim()), 0);
    for (int64_t flat = 0; flat < numel; ++flat) {
      // multi-index of element `flat` in row-major order
      int64_t r = flat;
      for (int64_t d = xi.dim() - 1; d >= 0; --d) {
        idx[size_t(d)] = r % xi.shape()[size_t(d)];
        r /= xi.shape()[size_t(d)];
      }
      // Write through a view that shares only the storage, so autograd's in-place guard
      // (xi requires grad) does not object. Each value is made on the host and copied in.
      Tensor elem = element_view(xi, idx);
      auto write = [&](double value) { elem.copy_(full({}, value, TensorOptions(kFloat64).device(elem.device()))); };
      double orig = elem.item();
      write(orig + opt.eps);
      double fp = project();
      write(orig - opt.eps);
      double fm = project();
      write(orig);
      double numeric = (fp - fm) / (2 * opt.eps);
      double analytic = g.at(idx);
      double err = std::fabs(analytic - numeric);
      double excess = err - (opt.atol + opt.rtol * std::fabs(numeric));
      if (std::isnan(analytic) != std::isnan(numeric)) excess = INFINITY;
      if (res.max_abs_error_input < 0 || err > res.max_abs_error || (std::isnan(err) && !std::isnan(res.max_abs_error))) {
        res.max_abs_error = err;
        res.max_abs_error_input = int(i);
        res.max_abs_error_index = idx;
      }
      if (excess > worst) {
        worst = excess;
        res.input = int(i);
        res.index = idx;
        res.analytic = analytic;
        res.numeric = numeric;
      }
    }
  }
  res.ok = worst <= 0;
  res.excess = worst;
  const bool same = res.max_abs_error_input == res.input && res.max_abs_error_index == res.index;
  res.message = detail::str(
      res.ok ? "gradcheck passed" : "gradcheck failed", ": worst element (furthest beyond atol + rtol |numeric|) is input ",
      res.input, " at index ", shape_str(res.index), ": analytic ", res.analytic, " vs numeric ", res.numeric,
      " (|diff| ", std::fabs(res.analytic - res.numeric), ", tolerance ", opt.atol + opt.rtol * std::fabs(res.numeric),
      " from atol ", opt.atol, ", rtol ", opt.rtol, "); largest |diff| ", res.max_abs_error,
      same ? " (the same element)"
           : detail::str(" at input ", res.max_abs_error_input, " index ", shape_str(res.max_abs_error_index)));
  return res;
}

}  // namespace mu::autograd
