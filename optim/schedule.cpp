// Learning-rate schedules (see schedule.h for the formulas).
#include "optim/schedule.h"

#include <cmath>
#include <numbers>

namespace mu::optim {

LRSchedule::LRSchedule(double base_lr, std::function<double(int64_t)> fn) : base_lr_(base_lr), fn_(std::move(fn)) {
  // The base divides group lrs in apply_lr, so it must be positive (negated test refuses NaN).
  MU_CHECK(base_lr > 0.0 && std::isfinite(base_lr), "LRSchedule: base learning rate must be a finite number > 0, got ",
           base_lr);
  MU_CHECK(fn_ != nullptr, "LRSchedule: no schedule function given");
}

double LRSchedule::operator()(int64_t it) const {
  MU_CHECK(it >= 0, "LRSchedule: iteration must be >= 0, got ", it);
  return fn_(it);
}

LRSchedule constant_lr(double lr) {
  return LRSchedule(lr, [lr](int64_t) { return lr; });
}

LRSchedule step_lr(double lr, int64_t step_size, double gamma) {
  MU_CHECK(step_size > 0, "step_lr: step_size must be > 0, got ", step_size);
  MU_CHECK(gamma >= 0.0 && std::isfinite(gamma), "step_lr: gamma must be a finite number >= 0, got ", gamma);
  // torch's closed form: base_lr * gamma ** (epoch // step_size).
  return LRSchedule(lr, [=](int64_t it) { return lr * std::pow(gamma, double(it / step_size)); });
}

LRSchedule warmup_cosine_lr(double lr, double min_lr, int64_t warmup_iters, int64_t lr_decay_iters) {
  MU_CHECK(warmup_iters >= 0, "warmup_cosine_lr: warmup_iters must be >= 0, got ", warmup_iters);
  // Equal values would make nanoGPT's decay ratio 0/0 at it == warmup_iters.
  MU_CHECK(lr_decay_iters > warmup_iters, "warmup_cosine_lr: lr_decay_iters (", lr_decay_iters,
           ") must be greater than warmup_iters (", warmup_iters, ")");
  MU_CHECK(min_lr >= 0.0 && min_lr <= lr, "warmup_cosine_lr: min_lr must be in [0, lr] = [0, ", lr, "], got ", min_lr);
  return LRSchedule(lr, [=](int64_t it) {
    // The same operations, in the same order, as nanoGPT's Python, so rates agree bit for bit.
    if (it < warmup_iters) return lr * double(it) / double(warmup_iters);
    if (it > lr_decay_iters) return min_lr;
    const double decay_ratio = double(it - warmup_iters) / double(lr_decay_iters - warmup_iters);
    const double coeff = 0.5 * (1.0 + std::cos(std::numbers::pi * decay_ratio));
    return min_lr + coeff * (lr - min_lr);
  });
}

double apply_lr(Optimizer& opt, const LRSchedule& schedule, int64_t it) {
  const double lr = schedule(it);
  for (ParamGroup& g : opt.param_groups()) {
    // Ratio first: it is exactly 1 for a group created with the schedule's base lr.
    g.lr = lr * (g.initial_lr / schedule.base_lr());
  }
  return lr;
}

LRScheduler::LRScheduler(Optimizer& opt, LRSchedule schedule, int64_t start)
    : opt_(opt), schedule_(std::move(schedule)), it_(start) {
  MU_CHECK(start >= 0, "LRScheduler: start iteration must be >= 0, got ", start);
  last_lr_ = apply_lr(opt_, schedule_, it_);
}

void LRScheduler::step() { last_lr_ = apply_lr(opt_, schedule_, ++it_); }

}  // namespace mu::optim
