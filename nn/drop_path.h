// DropPath (stochastic depth, Huang et al. 2016): in training mode each sample of the
// batch (dim 0) keeps its whole residual branch with probability 1 - p, scaled by
// 1/(1 - p) so the expectation is unchanged, or loses it (zero); the identity in eval mode.
//
//   auto dp = std::make_shared<nn::DropPath>(nn::DropPathOptions(0.1).generator(&gen));
//   x = x + dp->forward(branch(x));
#pragma once
#include <string>

#include "nn/module.h"
#include "tensor/random.h"

namespace mu::nn {

struct DropPathOptions {
  DropPathOptions(double p = 0.0) : p_(p) {}  // NOLINT: implicit, so DropPath(0.1) reads naturally
  DropPathOptions& p(double v) { p_ = v; return *this; }
  // The generator the per-sample draws come from (null: the global one). Not owned: it
  // must outlive the module.
  DropPathOptions& generator(Generator* g) { generator_ = g; return *this; }
  double p() const { return p_; }
  Generator* generator() const { return generator_; }
  // Refuses a p outside [0, 1] (NaN included).
  void validate() const;

 private:
  double p_;
  Generator* generator_ = nullptr;
};

class DropPath : public UnaryModule {
 public:
  explicit DropPath(const DropPathOptions& options = {});
  // x (B, ...): sample b scaled by m_b, m_b = 1/(1-p) with probability 1-p, else 0.
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  const DropPathOptions& options() const { return options_; }

 private:
  DropPathOptions options_;
};

}  // namespace mu::nn
