// Stochastic gradient descent with momentum, dampening, Nesterov momentum and (coupled,
// L2) weight decay, computed exactly as torch.optim.SGD of PyTorch 1.13 (foreach off):
//   d ← g + wd·p                                  (when wd ≠ 0)
//   b ← d at the first update, else μ·b + (1 − dampening)·d    (when μ ≠ 0)
//   d ← d + μ·b (Nesterov) or d ← b               (when μ ≠ 0)
//   p ← p + (−lr)·d
// Scalars are rounded to the parameter's dtype; element arithmetic runs in that dtype,
// every "x + a·y" being one fused multiply-add where the CPU has FMA, as in torch's
// AVX2/AVX-512 add kernel; on such a CPU the results equal torch's bit for bit.
// Per-parameter state: momentum_buffer (only when momentum ≠ 0).
#pragma once
#include "optim/optimizer.h"

namespace mu::optim {

// Defaults as torch.optim.SGD (which has no default lr). Group options are named
// "momentum", "dampening" and "nesterov" (0 or 1).
class SGDOptions {
 public:
  explicit SGDOptions(double lr) : lr_(lr) {}
  SGDOptions& lr(double v) { lr_ = v; return *this; }
  SGDOptions& momentum(double v) { momentum_ = v; return *this; }
  SGDOptions& dampening(double v) { dampening_ = v; return *this; }
  SGDOptions& weight_decay(double v) { weight_decay_ = v; return *this; }
  SGDOptions& nesterov(bool v) { nesterov_ = v; return *this; }
  double lr() const { return lr_; }
  double momentum() const { return momentum_; }
  double dampening() const { return dampening_; }
  double weight_decay() const { return weight_decay_; }
  bool nesterov() const { return nesterov_; }

 private:
  double lr_;
  double momentum_ = 0.0;
  double dampening_ = 0.0;
  double weight_decay_ = 0.0;
  bool nesterov_ = false;
};

class SGD : public Optimizer {
 public:
  SGD(std::vector<ParamGroup> groups, const SGDOptions& opts);
  SGD(const std::vector<Tensor>& params, const SGDOptions& opts);

 protected:
  void update(const ParamGroup& group, const std::vector<ParamUpdate>& items) override;
  void check_group(const ParamGroup& group) const override;
};

}  // namespace mu::optim
