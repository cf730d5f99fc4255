// layer_norm and batch_norm: the checks, allocation and autograd record of each op,
// its forward and backward kernels (ops/kernels/norm.h) side by side.
#include "ops/normalization.h"

#include <algorithm>
#include <utility>

#include "ops/compute_dtype.h"
#include "autograd/autocast.h"
#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "ops/kernels/norm.h"
#include "ops/pointwise.h"
#include "tensor/option_checks.h"

namespace mu {

using autograd::record;
using autograd::save;
using autograd::TensorList;

// An optional parameter: undefined, or a tensor of `shape` with x's dtype and device.
static void check_param(const Tensor& p, const char* what, const Shape& shape, const Tensor& x, const char* op) {
  if (!p.defined()) return;
  MU_CHECK(p.shape() == shape, op, ": ", what, " must have shape ", shape_str(shape), ", got ",
           shape_str(p.shape()));
  MU_CHECK(p.dtype() == x.dtype(), op, ": ", what, " is ", dtype_name(p.dtype()), " but the input is ",
           dtype_name(x.dtype()), "; convert one with .to(dtype)");
  MU_CHECK(p.device() == x.device(), op, ": ", what, " is on ", p.device().str(), " but the input is on ",
           x.device().str());
}

// The dense tensor a kernel reads: detached from the graph, contiguous; undefined stays so.
static Tensor dense(const Tensor& t) { return t.defined() ? t.detach().contiguous() : Tensor(); }

// Needs a gradient: defined and requiring grad.
static bool wants_grad(const Tensor& t) { return t.defined() && t.requires_grad(); }

// ---------------------------------------------------------------- layer_norm

Tensor layer_norm(const Tensor& x_in, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias,
                  double eps) {
  const Tensor x = autograd::autocast::to_full(x_in);  // in float32 under autocast
  const char* op = "layer_norm";
  check_eps(op, eps);
  MU_CHECK(x.defined(), op, ": the input is an undefined tensor");
  MU_CHECK(x.is_floating_point(), op, ": needs a floating-point input, got ", dtype_name(x.dtype()));
  const int64_t k = int64_t(normalized_shape.size());
  MU_CHECK(k > 0, op, ": normalized_shape must name at least one dim");
  bool fits = x.dim() >= k;
  for (int64_t i = 0; fits && i < k; ++i) fits = x.size(x.dim() - k + i) == normalized_shape[size_t(i)];
  MU_CHECK(fits, op, ": expected an input whose trailing dims are ", shape_str(normalized_shape),
           " (normalized_shape), got shape ", shape_str(x.shape()));
  check_param(weight, "weight", normalized_shape, x, op);
  check_param(bias, "bias", normalized_shape, x, op);
  // The 16-bit floats (input, weight and bias alike, above) compute in float32 and round
  // once, on every device; the gradients come back in their dtype.
  if (!is_compute_dtype(x.dtype()))
    return layer_norm(in_compute_dtype(x), normalized_shape, in_compute_dtype(weight), in_compute_dtype(bias), eps)
        .to(x.dtype());

  // x as (rows, n): every row is one sample's normalized_shape block.
  const int64_t n = numel_of(normalized_shape);
  int64_t rows = 1;
  for (int64_t i = 0; i < x.dim() - k; ++i) rows *= x.size(i);
  const TensorOptions opts = TensorOptions(x.dtype()).device(x.device());
  Tensor xc = dense(x), wc = dense(weight), bc = dense(bias);
  Tensor y = empty(x.shape(), opts), mean = empty({rows}, opts), rstd = empty({rows}, opts);
  kernels::layer_norm_forward(x.device(), xc, wc, bc, y, mean, rstd, rows, n, eps);

  const bool need_x = x.requires_grad(), need_w = wants_grad(weight), need_b = wants_grad(bias);
  return record("LayerNormBackward", y, {x, weight, bias},
                [xs = save(xc), ws = wc.defined() ? save(wc) : autograd::SavedTensor(), ms = save(mean),
                 rs = save(rstd), ns = normalized_shape, rows, n, need_x, need_w,
                 need_b](const Tensor& g) -> TensorList {
    Tensor xv = xs.get(), wv = ws.defined() ? ws.get() : Tensor(), gc = g.contiguous();
    const TensorOptions o = TensorOptions(xv.dtype()).device(xv.device());
    Tensor dx = need_x ? empty(xv.shape(), o) : Tensor();
    Tensor dw = need_w ? empty(ns, o) : Tensor();
    Tensor db = need_b ? empty(ns, o) : Tensor();
    kernels::layer_norm_backward(xv.device(), gc, xv, ms.get(), rs.get(), wv, dx, dw, db, rows, n);
    return {dx, dw, db};
  });
}

// ---------------------------------------------------------------- batch_norm

Tensor batch_norm(const Tensor& x_in, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                  const Tensor& bias, bool training, double momentum, double eps, ChannelLayout layout) {
  const Tensor x = autograd::autocast::to_full(x_in);  // in float32 under autocast
  const char* op = "batch_norm";
  check_enum(op, "layout", layout, ChannelLayout::Last, "ChannelLayout", "First, Last");
  check_unit_interval(op, "momentum", momentum);
  check_eps(op, eps);
  const bool last = layout == ChannelLayout::Last;
  MU_CHECK(x.defined(), op, ": the input is an undefined tensor");
  MU_CHECK(x.is_floating_point(), op, ": needs a floating-point input, got ", dtype_name(x.dtype()));
  // Its running statistics are updated in place, in the input's dtype: a 16-bit input is
  // refused here, on every device, rather than computed in a wider copy whose statistics
  // would not be the module's.
  MU_CHECK(is_compute_dtype(x.dtype()), op, ": a ", dtype_name(x.dtype()),
           " input is not supported (float32 or float64); convert it with .to(kFloat32), or run under an autocast "
           "scope, which keeps norms in float32");
  MU_CHECK(x.dim() >= 2, op, ": expected an input of at least 2 dims, ", last ? "(N, ..., C)" : "(N, C, ...)",
           ", got shape ", shape_str(x.shape()));
  const int64_t cdim = last ? x.dim() - 1 : 1, c = x.size(cdim);
  MU_CHECK(running_mean.defined() == running_var.defined(), op,
           ": running_mean and running_var must be given together (one is undefined)");
  const bool tracked = running_mean.defined();
  MU_CHECK(training || tracked, op, ": running_mean and running_var are needed when training is false");
  // A parameter whose size is not the channel count most likely means the layout is the
  // other one: say which dim was read as channels.
  const std::pair<const Tensor*, const char*> params[] = {
      {&running_mean, "running_mean"}, {&running_var, "running_var"}, {&weight, "weight"}, {&bias, "bias"}};
  for (auto [p, what] : params) {
    if (!p->defined()) continue;
    MU_CHECK(p->dim() == 1 && p->size(0) == c, op, ": ", what, " has shape ", shape_str(p->shape()),
             " but the input of shape ", shape_str(x.shape()), " has ", c, " channels (dim ", cdim, ", as ",
             last ? "channels-last (N, ..., C)" : "(N, C, ...)", "; for ",
             last ? "(N, C, ...) input pass ChannelLayout::First" : "channels-last input pass ChannelLayout::Last",
             ")");
    check_param(*p, what, {c}, x, op);
  }
  // x as (outer, c, inner): channels-first (N, C, L...) is (N, C, L·...); channels-last
  // (N, ..., C) is (N·..., C, 1).
  const int64_t outer = last ? x.numel() / std::max<int64_t>(c, 1) : x.size(0);
  const int64_t inner = last ? 1 : x.numel() / std::max<int64_t>(x.size(0) * c, 1);
  MU_CHECK(!training || outer * inner > 1, op, ": expected more than 1 value per channel when training, got input of "
           "shape ", shape_str(x.shape()));

  const TensorOptions opts = TensorOptions(x.dtype()).device(x.device());
  Tensor xc = dense(x), wc = dense(weight), bc = dense(bias);
  // The running statistics are written in place; a non-contiguous one goes through a
  // dense copy that is copied back.
  Tensor rm = running_mean, rv = running_var;
  if (tracked && !rm.is_contiguous()) rm = running_mean.detach().contiguous();
  if (tracked && !rv.is_contiguous()) rv = running_var.detach().contiguous();
  Tensor y = empty(x.shape(), opts), mean = empty({c}, opts), invstd = empty({c}, opts);
  kernels::batch_norm_forward(x.device(), xc, wc, bc, rm, rv, y, mean, invstd, outer, c, inner, training,
                              momentum, eps);
  if (training && tracked) {
    NoGradGuard no_grad;  // state, not part of any graph
    const std::pair<Tensor, Tensor> written[] = {{running_mean, rm}, {running_var, rv}};
    for (auto [dst, src] : written) {
      if (dst.is_same(src))
        dst.bump_version();  // written by the kernel: a tensor saved from it is now stale
      else
        dst.copy_(src);
    }
  }

  const bool need_x = x.requires_grad(), need_w = wants_grad(weight), need_b = wants_grad(bias);
  return record("BatchNormBackward", y, {x, weight, bias},
                [xs = save(xc), ws = wc.defined() ? save(wc) : autograd::SavedTensor(), ms = save(mean),
                 is = save(invstd), outer, c, inner, training, need_x, need_w, need_b](const Tensor& g) -> TensorList {
    Tensor xv = xs.get(), wv = ws.defined() ? ws.get() : Tensor(), gc = g.contiguous();
    const TensorOptions o = TensorOptions(xv.dtype()).device(xv.device());
    Tensor dx = need_x ? empty(xv.shape(), o) : Tensor();
    Tensor dw = need_w ? empty({c}, o) : Tensor();
    Tensor db = need_b ? empty({c}, o) : Tensor();
    kernels::batch_norm_backward(xv.device(), gc, xv, ms.get(), is.get(), wv, dx, dw, db, outer, c, inner, training);
    return {dx, dw, db};
  });
}

}  // namespace mu
