// Normalisation layers: LayerNorm over the trailing dims of each sample, BatchNorm1d over
// the batch (and time) for each channel.
//
//   auto ln = std::make_shared<nn::LayerNorm>(nn::LayerNormOptions({768}).eps(1e-5));
//   auto bn = std::make_shared<nn::BatchNorm1d>(nn::BatchNormOptions(64).momentum(0.1));
//   auto bt = std::make_shared<nn::BatchNorm1d>(nn::BatchNormOptions(64).channels_last(true));  // (B, T, 64)
#pragma once
#include <optional>

#include "nn/module.h"

namespace mu::nn {

struct LayerNormOptions {
  LayerNormOptions(Shape normalized_shape) : normalized_shape_(std::move(normalized_shape)) {}  // NOLINT: implicit
  LayerNormOptions& eps(double e) { eps_ = e; return *this; }
  LayerNormOptions& elementwise_affine(bool a) { elementwise_affine_ = a; return *this; }
  // With elementwise_affine, whether there is a bias as well as a weight (torch's
  // LayerNorm(bias=False), nanoGPT's bias=False models).
  LayerNormOptions& bias(bool b) { bias_ = b; return *this; }
  const Shape& normalized_shape() const { return normalized_shape_; }
  double eps() const { return eps_; }
  bool elementwise_affine() const { return elementwise_affine_; }
  bool bias() const { return bias_; }

 private:
  Shape normalized_shape_;
  double eps_ = 1e-5;
  bool elementwise_affine_ = true;
  bool bias_ = true;
};

// y = (x - mean) / sqrt(var + eps) * weight + bias, mean and (biased) var taken over the
// trailing dims named by normalized_shape, as torch.nn.LayerNorm (the fused layer_norm op).
class LayerNorm : public UnaryModule {
 public:
  explicit LayerNorm(const LayerNormOptions& options);
  Tensor forward(const Tensor& x) override;
  void reset_parameters();  // weight 1, bias 0
  std::string extra_repr() const override;
  const LayerNormOptions& options() const { return options_; }

  Tensor weight;  // normalized_shape; undefined without elementwise_affine
  Tensor bias;    // likewise, and undefined without options.bias()

 private:
  LayerNormOptions options_;
};

struct BatchNormOptions {
  BatchNormOptions(int64_t num_features) : num_features_(num_features) {}  // NOLINT: implicit
  BatchNormOptions& eps(double e) { eps_ = e; return *this; }
  // Weight of the newest batch in the running averages; nullopt gives the cumulative
  // average over all batches seen (torch's momentum=None).
  BatchNormOptions& momentum(std::optional<double> m) { momentum_ = m; return *this; }
  BatchNormOptions& affine(bool a) { affine_ = a; return *this; }
  // Without running statistics, batch statistics are used in eval mode too.
  BatchNormOptions& track_running_stats(bool t) { track_running_stats_ = t; return *this; }
  // Channels in the last dim: (N, C) or token-major (B, T, C) input, each channel's
  // statistics taken over B and T. Off (torch's layout): (N, C) or (N, C, L).
  BatchNormOptions& channels_last(bool c) { channels_last_ = c; return *this; }
  int64_t num_features() const { return num_features_; }
  double eps() const { return eps_; }
  std::optional<double> momentum() const { return momentum_; }
  bool affine() const { return affine_; }
  bool track_running_stats() const { return track_running_stats_; }
  bool channels_last() const { return channels_last_; }

 private:
  int64_t num_features_;
  double eps_ = 1e-5;
  std::optional<double> momentum_ = 0.1;
  bool affine_ = true;
  bool track_running_stats_ = true;
  bool channels_last_ = false;
};

// Batch normalisation of C channels, as torch.nn.BatchNorm1d: (N, C) or (N, C, L) input,
// or with channels_last, (N, C) or token-major (B, T, C) input with the statistics of
// each channel taken over B and T (torch.nn.BatchNorm1d on the (B, C, T) transpose). The
// layout is never guessed from the shape. Training normalises with the batch mean and
// biased variance and moves the running mean and unbiased variance towards them; eval
// normalises with the running statistics. One fused op (batch_norm) does the work.
class BatchNorm1d : public UnaryModule {
 public:
  explicit BatchNorm1d(const BatchNormOptions& options);
  explicit BatchNorm1d(int64_t num_features) : BatchNorm1d(BatchNormOptions(num_features)) {}
  Tensor forward(const Tensor& x) override;
  void reset_running_stats();  // mean 0, var 1, no batches seen
  void reset_parameters();     // running statistics reset, weight 1, bias 0
  std::string extra_repr() const override;
  const BatchNormOptions& options() const { return options_; }

  Tensor weight;  // (C); undefined without affine
  Tensor bias;
  Tensor running_mean;         // (C); undefined without track_running_stats
  Tensor running_var;          // (C)
  Tensor num_batches_tracked;  // int64 scalar, as in torch's state dicts

 private:
  BatchNormOptions options_;
};

}  // namespace mu::nn
