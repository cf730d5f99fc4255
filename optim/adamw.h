// AdamW (Loshchilov & Hutter): Adam with decoupled weight decay, computed exactly as
// torch.optim.AdamW of PyTorch 1.13 (foreach off), per element:
//   g ← −g                                 (maximize only)
//   t ← t + 1
//   p ← p · (1 − lr·wd)
//   m ← β1·m + (1 − β1)·g
//   v ← β2·v + ((1 − β2)·g)·g
//   v̂ ← max(v̂, v)                          (amsgrad only; else v̂ = v)
//   p ← p + ((−lr/(1 − β1^t))·m) / (sqrt(v̂)/sqrt(1 − β2^t) + eps)
// Scalars are formed in double, then rounded to the parameter's dtype; the element
// arithmetic runs in that dtype, in the order above, and the two "+ (..)·g" of the
// moments are fused multiply-adds where the CPU has FMA, as in torch's AVX2/AVX-512
// kernels. On such a CPU the results equal torch's bit for bit (tests/test_optim_parity).
// Per-parameter state: step (int64), exp_avg (m), exp_avg_sq (v), and max_exp_avg_sq (v̂)
// with amsgrad.
#pragma once
#include "optim/optimizer.h"

namespace mu::optim {

// Defaults as torch.optim.AdamW; group options are named "beta1", "beta2", "eps",
// "amsgrad" and "maximize" (1 or 0). amsgrad keeps one more buffer per parameter, so it
// is chosen for the whole optimizer here; a group may not change it.
class AdamWOptions {
 public:
  explicit AdamWOptions(double lr = 1e-3) : lr_(lr) {}
  AdamWOptions& lr(double v) { lr_ = v; return *this; }
  AdamWOptions& betas(double b1, double b2) { beta1_ = b1; beta2_ = b2; return *this; }
  AdamWOptions& eps(double v) { eps_ = v; return *this; }
  AdamWOptions& weight_decay(double v) { weight_decay_ = v; return *this; }
  AdamWOptions& amsgrad(bool v) { amsgrad_ = v; return *this; }
  AdamWOptions& maximize(bool v) { maximize_ = v; return *this; }
  double lr() const { return lr_; }
  double beta1() const { return beta1_; }
  double beta2() const { return beta2_; }
  double eps() const { return eps_; }
  double weight_decay() const { return weight_decay_; }
  bool amsgrad() const { return amsgrad_; }
  bool maximize() const { return maximize_; }

 private:
  double lr_;
  double beta1_ = 0.9, beta2_ = 0.999;
  double eps_ = 1e-8;
  double weight_decay_ = 1e-2;
  bool amsgrad_ = false;
  bool maximize_ = false;
};

class AdamW : public Optimizer {
 public:
  AdamW(std::vector<ParamGroup> groups, const AdamWOptions& opts = AdamWOptions());
  AdamW(const std::vector<Tensor>& params, const AdamWOptions& opts = AdamWOptions());

 protected:
  void update(const ParamGroup& group, const std::vector<ParamUpdate>& items) override;
  void check_group(const ParamGroup& group) const override;

 private:
  bool amsgrad_;
};

}  // namespace mu::optim
