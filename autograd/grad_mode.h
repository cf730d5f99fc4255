// Whether ops record the graph. Off inside NoGradGuard (optimizer updates, evaluation)
// and during a backward pass, so gradient formulas never record graphs of their own.
#pragma once

namespace mu::autograd {

bool is_grad_enabled();
void set_grad_enabled(bool enabled);

class NoGradGuard {
 public:
  NoGradGuard() : prev_(is_grad_enabled()) { set_grad_enabled(false); }
  ~NoGradGuard() { set_grad_enabled(prev_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

// The opposite: grad mode on for a scope, e.g. inside a backward pass (as torch.enable_grad).
class EnableGradGuard {
 public:
  EnableGradGuard() : prev_(is_grad_enabled()) { set_grad_enabled(true); }
  ~EnableGradGuard() { set_grad_enabled(prev_); }
  EnableGradGuard(const EnableGradGuard&) = delete;
  EnableGradGuard& operator=(const EnableGradGuard&) = delete;

 private:
  bool prev_;
};

}  // namespace mu::autograd

namespace mu {
using autograd::EnableGradGuard;
using autograd::NoGradGuard;
}
