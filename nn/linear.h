// Linear: y = x · Wᵀ + b over the last dim of x, with torch's weight layout (out, in).
//
//   auto fc = std::make_shared<nn::Linear>(768, 1000);
//   auto head = std::make_shared<nn::Linear>(nn::LinearOptions(768, 50257).bias(false));
#pragma once
#include "nn/module.h"

namespace mu::nn {

struct LinearOptions {
  LinearOptions(int64_t in_features, int64_t out_features) : in_features_(in_features), out_features_(out_features) {}
  LinearOptions& bias(bool b) { bias_ = b; return *this; }
  int64_t in_features() const { return in_features_; }
  int64_t out_features() const { return out_features_; }
  bool bias() const { return bias_; }

 private:
  int64_t in_features_, out_features_;
  bool bias_ = true;
};

class Linear : public UnaryModule {
 public:
  explicit Linear(const LinearOptions& options);
  Linear(int64_t in_features, int64_t out_features, bool bias = true)
      : Linear(LinearOptions(in_features, out_features).bias(bias)) {}

  // x (..., in_features) -> (..., out_features).
  Tensor forward(const Tensor& x) override;
  // Torch's default: W and b from U(-1/sqrt(in), 1/sqrt(in)).
  void reset_parameters();
  std::string extra_repr() const override;
  const LinearOptions& options() const { return options_; }

  Tensor weight;  // (out_features, in_features)
  Tensor bias;    // (out_features), undefined when built without bias

 private:
  LinearOptions options_;
};

}  // namespace mu::nn
