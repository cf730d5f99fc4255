// Whether ops record the graph. Off inside NoGradGuard (optimizer updates, evaluation)
// and during a backward pass, so gradient formulas never record graphs of their own.
#pragma once

namespace mu::autograd {

bool is_grad_enabled();
void set_grad_enabled(bool enabled);

// Grad mode set for a scope, the previous one put back at its end.
class GradModeGuard {
 public:
  explicit GradModeGuard(bool enabled) : prev_(is_grad_enabled()) { set_grad_enabled(enabled); }
  ~GradModeGuard() { set_grad_enabled(prev_); }
  GradModeGuard(const GradModeGuard&) = delete;
  GradModeGuard& operator=(const GradModeGuard&) = delete;

 private:
  bool prev_;
};

// Off for a scope (as torch.no_grad).
struct NoGradGuard : GradModeGuard {
  NoGradGuard() : GradModeGuard(false) {}
};

// On for a scope, e.g. a checkpointed region recomputed inside a backward pass (as
// torch.enable_grad).
struct EnableGradGuard : GradModeGuard {
  EnableGradGuard() : GradModeGuard(true) {}
};

}  // namespace mu::autograd

namespace mu {
using autograd::EnableGradGuard;
using autograd::NoGradGuard;
}
