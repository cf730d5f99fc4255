// Elementwise layers as modules, for Sequential: ReLU, GELU and Dropout.
#pragma once
#include <string>

#include "nn/module.h"
#include "tensor/random.h"

namespace mu::nn {

class ReLU : public UnaryModule {
 public:
  ReLU() : UnaryModule("ReLU") {}
  Tensor forward(const Tensor& x) override;
};

struct GELUOptions {
  // "none": x * Phi(x) with the exact normal CDF; "tanh": the tanh approximation.
  GELUOptions& approximate(std::string a) { approximate_ = std::move(a); return *this; }
  const std::string& approximate() const { return approximate_; }

 private:
  std::string approximate_ = "none";
};

class GELU : public UnaryModule {
 public:
  explicit GELU(const GELUOptions& options = {});
  explicit GELU(const std::string& approximate) : GELU(GELUOptions().approximate(approximate)) {}
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  const GELUOptions& options() const { return options_; }

 private:
  GELUOptions options_;
};

struct DropoutOptions {
  DropoutOptions(double p = 0.5) : p_(p) {}  // NOLINT: implicit, so Dropout(0.1) reads naturally
  DropoutOptions& p(double v) { p_ = v; return *this; }
  // The generator the masks are drawn from (null: the global one, seeded by manual_seed).
  // A data-prefetch thread or a second model can own its stream; the module does not
  // own the generator, which must outlive it.
  DropoutOptions& generator(Generator* g) { generator_ = g; return *this; }
  double p() const { return p_; }
  Generator* generator() const { return generator_; }

 private:
  double p_;
  Generator* generator_ = nullptr;
};

// Zeroes each element with probability p and scales the rest by 1/(1-p) in training mode;
// the identity in eval mode.
class Dropout : public UnaryModule {
 public:
  explicit Dropout(const DropoutOptions& options = {});
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;

 private:
  DropoutOptions options_;
};

}  // namespace mu::nn
