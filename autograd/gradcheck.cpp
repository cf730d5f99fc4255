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

// A view of all of t's elements through t's own geometry on its storage: writes through it
// reach t without autograd's in-place guard (t is a leaf that requires grad).
static Tensor storage_view(const Tensor& t) {
  return make_view(t.storage(), t.shape(), t.strides(), t.storage_offset(), t.dtype());
}

namespace {

// One differentiated tensor: an input's float64 copy or a caller's parameter.
struct Checked {
  Tensor t;
  int input = -1, parameter = -1;
  Tensor grad;  // the analytic gradient, on the host (zeros when backward did not reach t)
};

// The worst comparison so far and the largest |analytic - numeric|.
struct Tally {
  GradcheckResult& res;
  double worst = -INFINITY;

  void add(double analytic, double numeric, const GradcheckOptions& opt, const Checked* c,
           const std::vector<int64_t>& idx, int direction) {
    const double err = std::fabs(analytic - numeric);
    double excess = err - (opt.atol + opt.rtol * std::fabs(numeric));
    if (std::isnan(analytic) != std::isnan(numeric)) excess = INFINITY;
    const bool first = res.max_abs_error_input < 0 && res.max_abs_error_parameter < 0 && res.max_abs_error_direction < 0;
    if (first || err > res.max_abs_error || (std::isnan(err) && !std::isnan(res.max_abs_error))) {
      res.max_abs_error = err;
      res.max_abs_error_input = c ? c->input : -1;
      res.max_abs_error_parameter = c ? c->parameter : -1;
      res.max_abs_error_index = idx;
      res.max_abs_error_direction = direction;
    }
    if (excess > worst) {
      worst = excess;
      res.input = c ? c->input : -1;
      res.parameter = c ? c->parameter : -1;
      res.index = idx;
      res.direction = direction;
      res.analytic = analytic;
      res.numeric = numeric;
    }
  }
};

std::string where(int input, int parameter, const std::vector<int64_t>& index, int direction) {
  if (direction >= 0) return detail::str("direction ", direction);
  return detail::str(input >= 0 ? "input " : "parameter ", input >= 0 ? input : parameter, " at index ",
                     shape_str(index));
}

}  // namespace

GradcheckResult gradcheck(const GradcheckFn& fn, const TensorList& inputs, const GradcheckOptions& opt) {
  return gradcheck(fn, inputs, {}, opt);
}

GradcheckResult gradcheck(const GradcheckFn& fn, const TensorList& inputs, const std::vector<Tensor>& parameters,
                          const GradcheckOptions& opt) {
  GradcheckResult res;
  MU_CHECK(opt.directions >= 0, "gradcheck: directions must be 0 (element by element) or more, got ", opt.directions);
  const size_t n_in = inputs.size();
  std::vector<bool> check(n_in);
  for (size_t i = 0; i < n_in; ++i) {
    bool fl = inputs[i].defined() && inputs[i].is_floating_point();
    check[i] = opt.check_inputs.empty() ? fl : (i < opt.check_inputs.size() && opt.check_inputs[i] && fl);
  }
  for (size_t j = 0; j < parameters.size(); ++j) {
    const Tensor& p = parameters[j];
    MU_CHECK(p.defined(), "gradcheck: parameter ", j, " is undefined");
    MU_CHECK(p.dtype() == kFloat64 && p.is_leaf() && p.requires_grad(), "gradcheck: parameter ", j,
             " must be a float64 leaf that requires grad (module.to(kFloat64)), got ", p.describe(),
             p.is_leaf() ? "" : " (not a leaf)", p.requires_grad() ? "" : " (does not require grad)");
  }

  // float64 leaves: differentiated inputs require grad, others stay as given (int indices).
  TensorList x(n_in);
  for (size_t i = 0; i < n_in; ++i) {
    if (!inputs[i].defined()) continue;
    x[i] = inputs[i].is_floating_point() ? float64_like_layout(inputs[i]) : inputs[i].detach();
    if (check[i]) x[i].requires_grad_(true);
  }
  std::vector<Checked> checked;
  for (size_t i = 0; i < n_in; ++i)
    if (check[i]) checked.push_back({x[i], int(i), -1, {}});
  for (size_t j = 0; j < parameters.size(); ++j) checked.push_back({parameters[j], -1, int(j), {}});
  MU_CHECK(!checked.empty(), "gradcheck: no floating-point input or parameter to differentiate");

  // The parameters' values and gradients as the caller left them, put back however the
  // check ends (fn may throw with a parameter moved); the backward below starts from none.
  std::vector<Tensor> caller_values, caller_grads;
  for (const Tensor& p : parameters) {
    caller_values.push_back(p.detach().clone());
    caller_grads.push_back(p.grad());
    p.zero_grad();
  }
  struct Restore {
    const std::vector<Tensor>& params;
    const std::vector<Tensor>& values;
    const std::vector<Tensor>& grads;
    bool done = false;
    void run() {
      done = true;
      for (size_t j = 0; j < params.size(); ++j) {
        storage_view(params[j]).copy_(values[j]);
        params[j].zero_grad();
        if (grads[j].defined()) params[j].set_grad(grads[j]);
      }
    }
    // Unwinding from fn's error: that error is the one to report; a copy that fails too
    // (the device itself failing) must not end the program instead.
    ~Restore() {
      if (done) return;
      try {
        run();
      } catch (...) {
      }
    }
  } restore{parameters, caller_values, caller_grads};

  Tensor y = fn(x);
  MU_CHECK(y.defined() && y.dtype() == kFloat64, "gradcheck: the function must return a float64 tensor, got ",
           y.describe());
  // The projection vector v, fixed by the seed so failures reproduce; drawn from a
  // generator of its own, so the global stream (and any thread drawing from it) is untouched.
  Generator projection(opt.seed);
  // Drawn on the host (the same numbers on every device), then moved to y's device.
  Tensor v = randn(y.shape(), kFloat64, &projection).to(y.device());

  // Analytic: one backward pass of v.
  MU_CHECK(y.requires_grad(), "gradcheck: the output does not depend on any differentiated input or parameter (",
           y.describe(), ")");
  y.backward(v);
  for (Checked& c : checked) {
    // Read on the host once, not once per element.
    const Tensor g = c.t.grad();
    c.grad = g.defined() ? g.cpu() : zeros(c.t.shape(), kFloat64);
  }

  NoGradGuard no_grad;
  auto project = [&]() {
    Tensor out = fn(x);
    return (out * v).sum().item();
  };
  Tally tally{res};
  if (opt.directions == 0) {
    // Central differences of <f(x), v>, one element at a time.
    for (const Checked& c : checked) {
      const Tensor& xi = c.t;
      std::vector<int64_t> idx(size_t(xi.dim()), 0);
      for (int64_t flat = 0; flat < xi.numel(); ++flat) {
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
        tally.add(c.grad.at(idx), (fp - fm) / (2 * opt.eps), opt, &c, idx, -1);
      }
    }
  } else {
    // Central differences of <f(x), v> along random directions u over everything checked.
    std::vector<Tensor> views, saved;
    for (const Checked& c : checked) views.push_back(storage_view(c.t)), saved.push_back(c.t.detach().clone());
    Generator directions(opt.seed + 1);
    for (int k = 0; k < opt.directions; ++k) {
      std::vector<Tensor> u;
      double analytic = 0;
      for (const Checked& c : checked) {
        u.push_back(randn(c.t.shape(), kFloat64, &directions));  // on the host: the same on every device
        analytic += (c.grad * u.back()).sum().item();
      }
      auto move_to = [&](double step) {
        for (size_t m = 0; m < views.size(); ++m) views[m].copy_(saved[m] + u[m].to(saved[m].device()) * step);
      };
      move_to(opt.eps);
      const double fp = project();
      move_to(-opt.eps);
      const double fm = project();
      for (size_t m = 0; m < views.size(); ++m) views[m].copy_(saved[m]);  // exactly as before
      tally.add(analytic, (fp - fm) / (2 * opt.eps), opt, nullptr, {}, k);
    }
  }

  restore.run();  // here a failure is reported
  res.ok = tally.worst <= 0;
  res.excess = tally.worst;
  const bool same = res.max_abs_error_input == res.input && res.max_abs_error_parameter == res.parameter &&
                    res.max_abs_error_index == res.index && res.max_abs_error_direction == res.direction;
  res.message = detail::str(
      res.ok ? "gradcheck passed" : "gradcheck failed", ": worst ", res.direction >= 0 ? "direction" : "element",
      " (furthest beyond atol + rtol |numeric|) is ", where(res.input, res.parameter, res.index, res.direction),
      ": analytic ", res.analytic, " vs numeric ", res.numeric, " (|diff| ", std::fabs(res.analytic - res.numeric),
      ", tolerance ", opt.atol + opt.rtol * std::fabs(res.numeric), " from atol ", opt.atol, ", rtol ", opt.rtol,
      "); largest |diff| ", res.max_abs_error,
      same ? " (the same " + std::string(res.direction >= 0 ? "direction)" : "element)")
           : " at " + where(res.max_abs_error_input, res.max_abs_error_parameter, res.max_abs_error_index,
                            res.max_abs_error_direction));
  return res;
}

}  // namespace mu::autograd
