#include "nn/norm.h"

#include "autograd/grad_mode.h"
#include "nn/init.h"
#include "ops/ops.h"

namespace mu::nn {

// ---------------------------------------------------------------- LayerNorm

LayerNorm::LayerNorm(const LayerNormOptions& options) : UnaryModule("LayerNorm"), options_(options) {
  MU_CHECK(!options.normalized_shape().empty(), "LayerNorm: normalized_shape must name at least one dim");
  for (int64_t s : options.normalized_shape())
    MU_CHECK(s > 0, "LayerNorm: normalized_shape must be positive, got ", shape_str(options.normalized_shape()));
  MU_CHECK(options.eps() >= 0, "LayerNorm: eps must be non-negative, got ", options.eps());
  if (options.elementwise_affine()) {
    weight = register_parameter("weight", empty(options.normalized_shape()));
    bias = register_parameter("bias", empty(options.normalized_shape()));
  }
  reset_parameters();
}

void LayerNorm::reset_parameters() {
  if (!weight.defined()) return;
  init::ones_(weight);
  init::zeros_(bias);
}

Tensor LayerNorm::forward(const Tensor& x) {
  const Shape& ns = options_.normalized_shape();
  const int64_t k = int64_t(ns.size());
  bool fits = x.defined() && x.dim() >= k;
  for (int64_t i = 0; fits && i < k; ++i) fits = x.size(x.dim() - k + i) == ns[size_t(i)];
  MU_CHECK(fits, "LayerNorm: expected input whose trailing dims are ", shape_str(ns), ", got ", x.describe());
  Shape dims;
  for (int64_t i = -k; i < 0; ++i) dims.push_back(i);
  Tensor centred = x - mean(x, dims, true);
  // Biased variance (divide by n), as torch normalises.
  Tensor variance = mean(centred * centred, dims, true);
  Tensor y = centred * rsqrt(variance + options_.eps());
  return weight.defined() ? y * weight + bias : y;
}

std::string LayerNorm::extra_repr() const {
  return detail::str(shape_str(options_.normalized_shape()), ", eps=", options_.eps(),
                     ", elementwise_affine=", options_.elementwise_affine() ? "true" : "false");
}

// ---------------------------------------------------------------- BatchNorm1d

BatchNorm1d::BatchNorm1d(const BatchNormOptions& options) : UnaryModule("BatchNorm1d"), options_(options) {
  const int64_t c = options.num_features();
  MU_CHECK(c > 0, "BatchNorm1d: num_features must be positive, got ", c);
  MU_CHECK(options.eps() >= 0, "BatchNorm1d: eps must be non-negative, got ", options.eps());
  if (options.momentum())
    MU_CHECK(*options.momentum() >= 0 && *options.momentum() <= 1, "BatchNorm1d: momentum must lie in [0, 1], got ",
             *options.momentum());
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
  MU_CHECK(x.defined() && (x.dim() == 2 || x.dim() == 3) && x.size(-1) == c, "BatchNorm1d: expected input (B, ", c,
           ") or (B, T, ", c, "), got ", x.describe());
  // Every dim but the channel one is a sample axis.
  const Shape dims = x.dim() == 2 ? Shape{0} : Shape{0, 1};
  const int64_t n = x.numel() / c;
  const bool use_batch_stats = is_training() || !running_mean.defined();

  Tensor y;
  if (use_batch_stats) {
    MU_CHECK(n > 1, "BatchNorm1d: expected more than 1 value per channel when training, got input ", x.describe());
    // Shapes (C): broadcasting lines them up with the last dim of x.
    Tensor batch_mean = mean(x, dims);
    Tensor centred = x - batch_mean;
    Tensor batch_var = mean(centred * centred, dims);  // biased: what the batch is normalised by
    y = centred * rsqrt(batch_var + options_.eps());
    if (is_training() && running_mean.defined()) {
      NoGradGuard no_grad;  // the running estimates are state, not part of the graph
      num_batches_tracked.add_(1.0);
      // momentum = nullopt: cumulative average, the k-th batch weighted 1/k.
      double m = options_.momentum() ? *options_.momentum() : 1.0 / num_batches_tracked.item();
      // The running variance is the unbiased estimate (n / (n - 1) times the biased one).
      Tensor unbiased = batch_var.detach() * (double(n) / double(n - 1));
      running_mean.mul_(1 - m).add_(batch_mean.detach(), m);
      running_var.mul_(1 - m).add_(unbiased, m);
    }
  } else {
    y = (x - running_mean) * rsqrt(running_var + options_.eps());
  }
  return weight.defined() ? y * weight + bias : y;
}

std::string BatchNorm1d::extra_repr() const {
  std::string momentum = options_.momentum() ? detail::str(*options_.momentum()) : "none";
  return detail::str(options_.num_features(), ", eps=", options_.eps(), ", momentum=", momentum,
                     ", affine=", options_.affine() ? "true" : "false",
                     ", track_running_stats=", options_.track_running_stats() ? "true" : "false");
}

}  // namespace mu::nn
