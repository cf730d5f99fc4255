// Learning-rate schedules: the rate as a function of the iteration number, and
// apply_lr, which sets an optimizer's groups from a schedule each iteration.
//
//   auto sched = optim::warmup_cosine_lr(6e-4, 6e-5, 2000, 100000);   // nanoGPT
//   for (int64_t it = start; it < max_iters; ++it) {
//     optim::apply_lr(opt, sched, it);
//     ... forward, backward, clip, opt.step(), opt.zero_grad()
//   }
// Schedules are pure functions of `it`, so a resumed run only needs its iteration number.
#pragma once
#include <cstdint>
#include <functional>

#include "optim/optimizer.h"

namespace mu::optim {

class LRSchedule {
 public:
  // `fn` gives the rate at iteration it >= 0; `base_lr` (> 0) is the rate it is written for.
  LRSchedule(double base_lr, std::function<double(int64_t)> fn);
  // The rate the schedule is written for: a group created with a different lr follows the
  // same curve scaled by its own lr / base_lr.
  double base_lr() const { return base_lr_; }
  // The learning rate for iteration `it` (0-based: the iteration about to run).
  double operator()(int64_t it) const;

 private:
  double base_lr_;
  std::function<double(int64_t)> fn_;
};

// lr at every iteration.
LRSchedule constant_lr(double lr);
// lr · gamma^floor(it / step_size), as torch.optim.lr_scheduler.StepLR.
LRSchedule step_lr(double lr, int64_t step_size, double gamma = 0.1);
// nanoGPT's get_lr (train.py, 2023), exactly:
//   it < warmup_iters:   lr · it / warmup_iters            (so 0 at it = 0)
//   it > lr_decay_iters: min_lr
//   otherwise:           min_lr + 0.5·(1 + cos(π·r))·(lr − min_lr),
//                        r = (it − warmup_iters) / (lr_decay_iters − warmup_iters)
// Needs 0 <= warmup_iters < lr_decay_iters and 0 <= min_lr <= lr.
LRSchedule warmup_cosine_lr(double lr, double min_lr, int64_t warmup_iters, int64_t lr_decay_iters);

// Sets every group's lr for iteration `it`, keeping the groups' lr ratios:
// group.lr = schedule(it) · (group.initial_lr / schedule.base_lr()). A group created with
// the schedule's base lr gets schedule(it) exactly. Returns schedule(it).
double apply_lr(Optimizer& opt, const LRSchedule& schedule, int64_t it);

// A schedule driven by step() calls, as torch.optim.lr_scheduler's objects:
//
//   optim::LRScheduler sched(opt, optim::warmup_cosine_lr(6e-4, 6e-5, 2000, 100000));
//   for (...) { ... loss.backward(); opt.step(); sched.step(); }
//
// Construction sets the rate of iteration `start` (0 for a new run; a resumed run passes
// the iteration it resumes at); each step() moves to the next iteration and sets its rate
// (through apply_lr, so every group keeps its ratio to the schedule's base lr). The
// optimizer must outlive the scheduler.
class LRScheduler {
 public:
  LRScheduler(Optimizer& opt, LRSchedule schedule, int64_t start = 0);
  void step();
  // The iteration whose rate is set now (torch's last_epoch).
  int64_t iteration() const { return it_; }
  // The schedule's rate at iteration() (torch's get_last_lr() for a group at the base lr).
  double last_lr() const { return last_lr_; }
  const LRSchedule& schedule() const { return schedule_; }

 private:
  Optimizer& opt_;
  LRSchedule schedule_;
  int64_t it_;
  double last_lr_;
};

}  // namespace mu::optim
