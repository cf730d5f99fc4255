#include "nn/norm.h"

#include "autograd/activation_checkpoint.h"
#include "autograd/grad_mode.h"
#include "nn/init.h"
#include "ops/ops.h"
#include "tensor/option_checks.h"

namespace mu::nn {

// ---------------------------------------------------------------- LayerNorm

LayerNorm::LayerNorm(const LayerNormOptions& options) : UnaryModule("LayerNorm"), options_(options) {
  MU_CHECK(!options.normalized_shape().empty(), "LayerNorm: normalized_shape must name at least one dim");
  for (int64_t s : options.normalized_shape())
    MU_CHECK(s > 0, "LayerNorm: normalized_shape must be positive, got ", shape_str(options.normalized_shape()));
  check_eps("LayerNorm", options.eps());
  if (options.elementwise_affine()) {
    weight = register_parameter("weight", empty(options.normalized_shape()));
    if (options.bias()) bias = register_parameter("bias", empty(options.normalized_shape()));
  }
  reset_parameters();
}

void LayerNorm::reset_parameters() {
  if (weight.defined()) init::ones_(weight);
  if (bias.defined()) init::zeros_(bias);
}

Tensor LayerNorm::forward(const Tensor& x) {
  const Shape& ns = options_.normalized_shape();
  const int64_t k = int64_t(ns.size());
  bool fits = x.defined() && x.dim() >= k;
  for (int64_t i = 0; fits && i < k; ++i) fits = x.size(x.dim() - k + i) == ns[size_t(i)];
  MU_CHECK(fits, "LayerNorm: expected input whose trailing dims are ", shape_str(ns), ", got ", x.describe());
  return layer_norm(x, ns, weight, bias, options_.eps());
}

std::string LayerNorm::extra_repr() const {
  return detail::str(shape_str(options_.normalized_shape()), ", eps=", options_.eps(),
                     ", elementwise_affine=", options_.elementwise_affine() ? "true" : "false",
                     options_.elementwise_affine() && !options_.bias() ? ", bias=false" : "");
}

// ---------------------------------------------------------------- BatchNorm1d

BatchNorm1d::BatchNorm1d(const BatchNormOptions& options) : UnaryModule("BatchNorm1d"), options_(options) {
  const int64_t c = options.num_features();
  MU_CHECK(c > 0, "BatchNorm1d: num_features must be positive, got ", c);
  check_eps("BatchNorm1d", options.eps());
  if (options.momentum()) check_unit_interval("BatchNorm1d", "momentum", *options.momentum());
  if (options.affine()) {
    weight = register_parameter("weight", empty({c}));
    bias = register_parameter("bias", empty({c}));
  }
  if (options.track_running_stats()) {
    running_mean = register_buffer("running_mean", zeros({c}));
    running_var = register_buffer("running_var", ones({c}));
    num_batches_tracked = register_buffer("num_batches_tracked", zeros({}, kInt64));
  }
  reset_parameters();
}

void BatchNorm1d::reset_running_stats() {
  if (!running_mean.defined()) return;
  NoGradGuard no_grad;
  running_mean.zero_();
  running_var.fill_(1.0);
  num_batches_tracked.zero_();
}

void BatchNorm1d::reset_parameters() {
  reset_running_stats();
  if (!weight.defined()) return;
  init::ones_(weight);
  init::zeros_(bias);
}

Tensor BatchNorm1d::forward(const Tensor& x) {
  const int64_t c = options_.num_features();
  const bool last = options_.channels_last();
  // The layouts this module takes, for the errors (built only for one).
  auto expected = [&] {
    return last ? detail::str("(N, ", c, ") or (B, T, ", c, ") (channels_last)")
                : detail::str("(N, ", c, ") or (N, ", c, ", L)");
  };
  const char* hint = last ? "; for (N, C, L) input leave BatchNormOptions::channels_last off"
                          : "; for token-major (B, T, C) input set BatchNormOptions::channels_last(true)";
  MU_CHECK(x.defined() && (x.dim() == 2 || x.dim() == 3), "BatchNorm1d: expected input ", expected(), ", got ",
           x.defined() ? x.describe() : std::string("an undefined tensor"));
  const int64_t cdim = last ? x.dim() - 1 : 1;
  MU_CHECK(x.size(cdim) == c, "BatchNorm1d: expected input ", expected(), ", got ", x.describe(),
           " whose dim ", cdim, " is not ", c, hint);
  const bool tracked = running_mean.defined();
  // Without running statistics the batch statistics normalise in eval mode too (as torch).
  const bool batch_stats = is_training() || !tracked;
  // A checkpointed region run again in the backward pass (autograd/activation_checkpoint.h)
  // counts its batch once: the second run normalises by the batch statistics and updates
  // nothing.
  const bool update = is_training() && tracked && !autograd::recomputing();
  // momentum = nullopt: cumulative average, the k-th batch weighted 1/k.
  double factor = 0;
  if (update) factor = options_.momentum() ? *options_.momentum() : 1.0 / (num_batches_tracked.item() + 1);
  const bool skip_stats = is_training() && tracked && !update;
  Tensor y = batch_norm(x, skip_stats ? Tensor() : running_mean, skip_stats ? Tensor() : running_var, weight, bias,
                        batch_stats, factor, options_.eps(),
                        last ? ChannelLayout::Last : ChannelLayout::First);
  if (update) {
    NoGradGuard no_grad;
    num_batches_tracked.add_(1.0);  // after the op, so a refused input counts no batch
  }
  return y;
}

std::string BatchNorm1d::extra_repr() const {
  std::string momentum = options_.momentum() ? detail::str(*options_.momentum()) : "none";
  return detail::str(options_.num_features(), ", eps=", options_.eps(), ", momentum=", momentum,
                     ", affine=", options_.affine() ? "true" : "false",
                     ", track_running_stats=", options_.track_running_stats() ? "true" : "false",
                     options_.channels_last() ? ", channels_last=true" : "");
}

}  // namespace mu::nn
