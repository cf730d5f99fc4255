// Loss functions. cross_entropy with class-index targets is fused: one kernel per line
// of logits forward (ops/kernels/loss.h) saving only the line's log-sum-exp, one kernel
// backward computing the gradient from it. Probability targets, nll_loss, mse_loss and
// binary_cross_entropy_with_logits are composed from differentiable ops, so autograd
// derives their gradients (and each follows PyTorch's own composition of it).
#include "ops/loss.h"

#include <cmath>

#include "autograd/autocast.h"
#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "ops/kernels/loss.h"
#include "ops/loss_common.h"
#include "ops/ops.h"
#include "tensor/option_checks.h"

namespace mu {

using autograd::record;
using autograd::save;
using autograd::TensorList;

namespace loss_detail {

// "at position 3" for (N) targets, "at position [1, 0, 2]" for (N, d1, ...), nothing
// for a single () target.
std::string position(const Shape& shape, int64_t flat) {
  if (shape.empty()) return "";
  if (shape.size() == 1) return detail::str(" (at position ", flat, ")");
  std::vector<int64_t> idx(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    idx[d] = flat % shape[d];
    flat /= shape[d];
  }
  return " (at position " + shape_str(idx) + ")";
}

void check_weight(const char* op, DType dtype, Device device, const Tensor& weight, int64_t classes) {
  if (!weight.defined()) return;
  MU_CHECK(weight.dim() == 1 && weight.numel() == classes, op, ": weight must hold one value per class, shape [",
           classes, "], got shape ", shape_str(weight.shape()));
  MU_CHECK(weight.dtype() == dtype, op, ": weight is ", dtype_name(weight.dtype()), " but the input is ",
           dtype_name(dtype), "; convert it with .to(", dtype_name(dtype), ")");
  MU_CHECK(weight.device() == device, op, ": weight on ", weight.device().str(), ", input on ", device.str());
}

void read_class_targets(const char* op, const Tensor& target, const Tensor& weight, int64_t ignore_index,
                        ClassTargets& ct) {
  if (weight.defined()) ct.w = weight.to_vector<double>();
  ct.t = target.to_vector<int64_t>();
  for (size_t i = 0; i < ct.t.size(); ++i) {
    int64_t v = ct.t[i];
    if (v == ignore_index) continue;
    MU_CHECK(v >= 0 && v < ct.classes, op, ": target ", v, " is out of bounds for ", ct.classes, " classes",
             position(ct.loss_shape, int64_t(i)));
    ct.weight_sum += ct.w.empty() ? 1.0 : ct.w[size_t(v)];
  }
}

// Checks input against an int64 class-index target and reads the targets: each must lie
// in [0, C) or equal ignore_index. The mu::Error names the value and its position.
ClassTargets check_class_targets(const char* op, const Tensor& input, const Tensor& target, const Tensor& weight,
                                 int64_t ignore_index) {
  MU_CHECK(input.dim() >= 1, op, ": input must be (C), (N, C) or (N, C, d1, ...), got shape ",
           shape_str(input.shape()));
  MU_CHECK(input.is_floating_point(), op, ": input must be floating point, got ", dtype_name(input.dtype()));
  MU_CHECK(target.dtype() == kInt64, op, ": target must hold int64 class indices, got ", dtype_name(target.dtype()),
           " (convert it with .to(kInt64)", input.shape() == target.shape() ? "; or, for class probabilities, use cross_entropy" : "", ")");
  MU_CHECK(target.device() == input.device(), op, ": target on ", target.device().str(), ", input on ",
           input.device().str());
  ClassTargets ct;
  const Shape& s = input.shape();
  ct.classes = input.dim() == 1 ? s[0] : s[1];
  if (input.dim() > 1) {
    ct.outer = s[0];
    ct.loss_shape.push_back(s[0]);
    for (size_t d = 2; d < s.size(); ++d) {
      ct.inner *= s[d];
      ct.loss_shape.push_back(s[d]);
    }
  }
  MU_CHECK(target.shape() == ct.loss_shape, op, ": target of shape ", shape_str(target.shape()),
           " does not match input of shape ", shape_str(s), " (expected ", shape_str(ct.loss_shape), ")");
  check_weight(op, input.dtype(), input.device(), weight, ct.classes);
  read_class_targets(op, target, weight, ignore_index, ct);
  return ct;
}

void refuse_weight_grad(const char* op, const Tensor& weight) {
  MU_CHECK(!(weight.defined() && weight.requires_grad() && autograd::is_grad_enabled()), op,
           ": weight requires grad, but its gradient is not implemented (as in PyTorch); pass weight.detach()");
}

void check_reduction(const char* op, Reduction r) {
  check_enum(op, "reduction", r, Reduction::Sum, "Reduction", "None, Mean, Sum");
}

Tensor reduce(const Tensor& per, Reduction r, double mean_denominator) {
  switch (r) {
    case Reduction::None: return per;
    case Reduction::Sum: return per.sum();
    case Reduction::Mean: break;
  }
  // 0 / 0 = NaN when nothing counts (every target ignored, an empty batch), as in PyTorch.
  return per.sum() / mean_denominator;
}

}  // namespace loss_detail

namespace {

using namespace loss_detail;

// The weight reshaped to broadcast along the class dim `cdim` of an input of rank `rank`.
Tensor along_class_dim(const Tensor& weight, int64_t cdim, int64_t rank) {
  Shape s(size_t(rank), 1);
  s[size_t(cdim)] = weight.numel();
  return weight.reshape(s);
}

// ---------------------------------------------------------------- cross_entropy

// Class-index targets: the fused kernels.
Tensor cross_entropy_indices(const Tensor& logits, const Tensor& target, const CrossEntropyOptions& o) {
  const char* op = "cross_entropy";
  refuse_weight_grad(op, o.weight());
  ClassTargets ct = check_class_targets(op, logits, target, o.weight(), o.ignore_index());
  kernels::CrossEntropyLines L{ct.outer, ct.classes, ct.inner, o.ignore_index(), o.label_smoothing()};
  Tensor x = logits.detach().contiguous(), t = target.contiguous();
  // bfloat16 logits are computed in float32: the per-line losses are float32, and the
  // kernels read the class weights in float32 too (a bfloat16 weight, beside bfloat16
  // logits outside autocast, is widened here).
  const DType loss_dtype = compute_dtype(x.dtype());
  Tensor w = o.weight().defined() ? o.weight().detach().to(loss_dtype).contiguous() : Tensor();
  TensorOptions opts = TensorOptions(loss_dtype).device(x.device());
  Tensor per = empty({ct.outer * ct.inner}, opts), lse = empty({ct.outer * ct.inner}, opts.dtype(kFloat64));
  kernels::cross_entropy_forward(x.device(), x, t, w, per, lse, L);
  Tensor out = reduce(per.reshape(ct.loss_shape), o.reduction(), ct.weight_sum);
  // d(out)/d(loss of line l): 1 for None (the upstream value is per line) and Sum,
  // 1 / sum of weights for Mean.
  double scale = o.reduction() == Reduction::Mean ? 1.0 / ct.weight_sum : 1.0;
  return record("CrossEntropyBackward", out, {logits},
                [xs = save(x), ts = save(t), ws = save(w), ls = save(lse), L, scale](const Tensor& g) -> TensorList {
    Tensor xv = xs.get();
    // The gradient goes over the logits when they are this node's alone (no handle, view
    // or saved copy elsewhere: the forward's logits were a temporary) and the node runs
    // for the last time: GPT-2's (tokens, 50257) logits and their gradient are then never
    // both held. Both kernels, CPU and CUDA, read each logit before writing its gradient,
    // in the same thread, and read no other logit after that (ops/kernels/loss.h).
    const bool reuse = autograd::last_use() && xv.storage().use_count() == 1 && xv.impl_ptr().use_count() == 2;
    Tensor dx = reuse ? xv : empty_like(xv);
    kernels::cross_entropy_backward(xv.device(), g.contiguous(), scale, xv, ts.get(), ws.get(), ls.get(), dx, L);
    return {dx};
  });
}

// Probability targets, composed as PyTorch 1.13 composes them: -sum_c w_c q_c
// log_softmax(x)_c with q = (1 - s) p + s / C, the mean taken over the positions. A
// fused kernel would save one (N, C) temporary; these targets are rare enough (distillation,
// mixup) that autograd's derivation, which includes the gradient for the target, wins.
Tensor cross_entropy_probabilities(const Tensor& logits, const Tensor& target, const CrossEntropyOptions& o) {
  const char* op = "cross_entropy";
  MU_CHECK(logits.dim() >= 1, op, ": input must be (C), (N, C) or (N, C, d1, ...), got shape ",
           shape_str(logits.shape()));
  MU_CHECK(logits.is_floating_point(), op, ": input must be floating point, got ", dtype_name(logits.dtype()));
  MU_CHECK(target.is_floating_point(), op, ": a target of the input's shape ", shape_str(target.shape()),
           " holds class probabilities and must be floating point, got ", dtype_name(target.dtype()),
           " (class indices have the input's shape without the class dim)");
  MU_CHECK(o.ignore_index() < 0, op, ": ignore_index (", o.ignore_index(),
           ") is not supported with class-probability targets, as in PyTorch");
  int64_t cdim = logits.dim() == 1 ? 0 : 1, classes = logits.shape()[size_t(cdim)];
  check_weight(op, logits.dtype(), logits.device(), o.weight(), classes);
  double s = o.label_smoothing();
  Tensor q = s > 0 ? target * (1 - s) + s / double(classes) : target;
  Tensor prod = log_softmax(logits, cdim) * q;
  if (o.weight().defined()) prod = prod * along_class_dim(o.weight(), cdim, logits.dim());
  Tensor per = -prod.sum({cdim});
  int64_t positions = classes == 0 ? 0 : logits.numel() / classes;
  return reduce(per, o.reduction(), double(positions));
}

}  // namespace

using namespace loss_detail;

Tensor cross_entropy(const Tensor& logits_in, const Tensor& target_in, const CrossEntropyOptions& options) {
  // In float32 under autocast (a probability target too). With class indices and no
  // class weights the fused kernels read bfloat16 logits as they are, compute in float32
  // and round the gradient once into bfloat16: the same numbers as a float32 copy of the
  // logits would give, without that copy (and its gradient's) of a (tokens x
  // vocabulary) matrix.
  const bool direct = autograd::is_autocast_enabled() && logits_in.defined() && logits_in.dtype() == kBFloat16 &&
                      target_in.defined() && !is_floating(target_in.dtype()) && !options.weight().defined();
  const Tensor full_logits = direct ? logits_in : autograd::autocast::to_full(logits_in);
  // float16 logits are widened exactly to float32 (the kernels read bfloat16 as it is, not
  // float16); the loss is float32, as for bfloat16, and the gradient comes back rounded
  // once to float16 through the recorded cast.
  const Tensor logits =
      full_logits.defined() && full_logits.dtype() == kFloat16 ? full_logits.to(kFloat32) : full_logits;
  const Tensor target = autograd::autocast::to_full(target_in);
  check_reduction("cross_entropy", options.reduction());
  double s = options.label_smoothing();
  MU_CHECK(s >= 0 && s <= 1, "cross_entropy: label_smoothing must be between 0.0 and 1.0, got ", s);
  // As PyTorch: a target of the logits' own shape holds probabilities, any other indices.
  if (target.shape() == logits.shape()) return cross_entropy_probabilities(logits, target, options);
  return cross_entropy_indices(logits, target, options);
}

Tensor cross_entropy(const Tensor& logits, const Tensor& target, Reduction reduction, int64_t ignore_index) {
  return cross_entropy(logits, target, CrossEntropyOptions().reduction(reduction).ignore_index(ignore_index));
}

// ---------------------------------------------------------------- nll_loss

// -w[t] log_probs[t] picked by gather along the class dim; ignored targets pick class 0
// and are then masked (not multiplied by 0: a -inf there would make 0 * -inf = NaN).
Tensor nll_loss(const Tensor& log_probs_in, const Tensor& target, const Tensor& weight, Reduction reduction,
                int64_t ignore_index) {
  const Tensor log_probs = autograd::autocast::to_full(log_probs_in);  // in float32 under autocast
  const char* op = "nll_loss";
  check_reduction(op, reduction);
  refuse_weight_grad(op, weight);
  ClassTargets ct = check_class_targets(op, log_probs, target, weight, ignore_index);
  int64_t cdim = log_probs.dim() == 1 ? 0 : 1;
  std::vector<int64_t> safe(ct.t.size());
  std::vector<double> wt(ct.t.size());
  std::vector<bool> keep(ct.t.size());
  for (size_t i = 0; i < ct.t.size(); ++i) {
    bool ignored = ct.t[i] == ignore_index;
    safe[i] = ignored ? 0 : ct.t[i];
    wt[i] = ignored ? 0.0 : ct.w.empty() ? 1.0 : ct.w[size_t(ct.t[i])];
    keep[i] = !ignored;
  }
  // The index has the input's rank with the class dim of size 1.
  Shape ishape = log_probs.shape();
  ishape[size_t(cdim)] = 1;
  Device dev = log_probs.device();
  Tensor picked = gather(log_probs, cdim, from_vector(safe, ishape).to(dev)).reshape(ct.loss_shape);
  Tensor wts = from_vector(wt, ct.loss_shape, TensorOptions(log_probs.dtype())).to(dev);
  Tensor mask = from_vector(keep, ct.loss_shape).to(dev);
  Tensor per = where(mask, -(picked * wts), 0.0);
  return reduce(per, reduction, ct.weight_sum);
}

// ---------------------------------------------------------------- mse_loss

Tensor mse_loss(const Tensor& a_in, const Tensor& b_in, Reduction reduction) {
  const Tensor a = autograd::autocast::to_full(a_in), b = autograd::autocast::to_full(b_in);  // float32 under autocast
  check_reduction("mse_loss", reduction);
  MU_CHECK(a.shape() == b.shape(), "mse_loss: input of shape ", shape_str(a.shape()), " and target of shape ",
           shape_str(b.shape()), " differ (reshape one of them; broadcasting here is almost always a bug)");
  MU_CHECK(a.is_floating_point(), "mse_loss: input must be floating point, got ", dtype_name(a.dtype()));
  Tensor d = a - b;
  return reduce(d * d, reduction, double(a.numel()));
}

// ---------------------------------------------------------------- binary_cross_entropy_with_logits

// PyTorch's form term by term: with m = max(-x, 0), log(exp(-m) + exp(-x - m)) + m is
// log(1 + exp(-x)) without overflow, and its gradient at x = 0 comes out right (-1/2):
// clamp passes the gradient at its bound, where log(1 + exp(-|x|)) + max(-x, 0) written
// with abs would give 0 + (-1) there.
Tensor binary_cross_entropy_with_logits(const Tensor& logits_in, const Tensor& target_in, const Tensor& weight,
                                        const Tensor& pos_weight, Reduction reduction) {
  // In float32 under autocast.
  const Tensor logits = autograd::autocast::to_full(logits_in), target = autograd::autocast::to_full(target_in);
  const char* op = "binary_cross_entropy_with_logits";
  check_reduction(op, reduction);
  MU_CHECK(target.shape() == logits.shape(), op, ": target of shape ", shape_str(target.shape()),
           " must have the shape of the input, ", shape_str(logits.shape()));
  MU_CHECK(logits.is_floating_point(), op, ": input must be floating point, got ", dtype_name(logits.dtype()));
  for (const auto& [name, t] : {std::pair{"weight", weight}, std::pair{"pos_weight", pos_weight}}) {
    if (!t.defined()) continue;
    Shape s = broadcast_shapes(logits.shape(), t.shape(), op);
    MU_CHECK(s == logits.shape(), op, ": ", name, " of shape ", shape_str(t.shape()),
             " does not broadcast to the input's shape ", shape_str(logits.shape()));
  }
  const Tensor& x = logits;
  Tensor m = clamp_min(-x, 0.0);
  Tensor softplus = log(exp(-m) + exp(-x - m)) + m;  // log(1 + exp(-x))
  Tensor loss = pos_weight.defined() ? (1.0 - target) * x + ((pos_weight - 1.0) * target + 1.0) * softplus
                                     : (1.0 - target) * x + softplus;
  if (weight.defined()) loss = loss * weight;
  return reduce(loss, reduction, double(logits.numel()));
}

}  // namespace mu
