#include "train/loop.h"

#include <cmath>
#include <filesystem>
#include <memory>

#include "autograd/grad_mode.h"
#include "dist/ddp.h"
#include "dist/zero.h"
#include "ops/ops.h"
#include "optim/clip.h"
#include "train/interrupt.h"
#include "train/metrics_log.h"
#include "train/progress.h"

namespace mu::train {

std::string checkpoint_path(const std::string& out_dir) {
  return (std::filesystem::path(out_dir) / "checkpoint.safetensors").string();
}

namespace {

void check_options(const LoopOptions& o, const LoopHooks& h) {
  const char* op = "run_training";
  MU_CHECK(o.max_steps >= 0, op, ": max_steps must be >= 0, got ", o.max_steps);
  MU_CHECK(o.grad_accum >= 1, op, ": grad_accum must be >= 1, got ", o.grad_accum);
  MU_CHECK(o.clip_norm >= 0 && std::isfinite(o.clip_norm), op, ": clip_norm must be a finite number >= 0, got ",
           o.clip_norm);
  MU_CHECK(o.eval_every >= 0 && o.checkpoint_every >= 0 && o.log_every >= 0, op,
           ": eval_every, checkpoint_every and log_every must be >= 0, got ", o.eval_every, ", ", o.checkpoint_every,
           ", ", o.log_every);
  MU_CHECK(o.units_per_step >= 0, op, ": units_per_step must be >= 0, got ", o.units_per_step);
  MU_CHECK(!o.resume || !o.out_dir.empty(), op, ": resume needs out_dir (where the checkpoint is)");
  MU_CHECK(h.micro_batch_loss != nullptr, op, ": hooks.micro_batch_loss is not set");
  MU_CHECK(o.zero == nullptr || o.ddp != nullptr, op, ": optimizer-state sharding (zero) needs data parallelism (ddp)");
}

// The mean of `v` over the ranks of a data-parallel run (v itself for one process).
double rank_mean(const LoopOptions& o, double v) {
  if (o.ddp == nullptr || o.ddp->group().size() == 1) return v;
  Tensor t = from_vector(std::vector<double>{v}, {1});
  o.ddp->group().all_reduce(t, dist::ReduceOp::Mean);
  return t.to_vector<double>()[0];
}

// Whether any rank was interrupted: all of them stop after the same step.
bool any_interrupted(const LoopOptions& o) {
  if (o.ddp == nullptr || o.ddp->group().size() == 1) return interrupted();
  Tensor t = from_vector(std::vector<int64_t>{interrupted() ? 1 : 0}, {1});
  o.ddp->group().all_reduce(t, dist::ReduceOp::Sum);
  return t.to_vector<int64_t>()[0] > 0;
}

// Runs the evaluation hook in eval mode without a graph; training mode is put back.
Metrics evaluate(nn::Module& model, const LoopHooks& hooks) {
  if (!hooks.evaluate) return {};
  model.eval();
  Metrics m;
  {
    NoGradGuard no_grad;
    m = hooks.evaluate();
  }
  model.train();
  return m;
}

std::string describe(const Metrics& m) {
  std::string s;
  for (const auto& [k, v] : m) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.4f", v);
    s += (s.empty() ? "" : ", ") + k + " " + buf;
  }
  return s;
}

}  // namespace

LoopResult run_training(nn::Module& model, optim::Optimizer& opt, const optim::LRSchedule& schedule,
                        const LoopOptions& o, LoopHooks& hooks) {
  check_options(o, hooks);
  LoopResult r;
  // Rank 0 of a data-parallel run (or the one process) prints, logs and saves.
  const bool main_rank = o.ddp == nullptr || o.ddp->group().rank() == 0;
  const bool saving = !o.out_dir.empty();
  const std::string ckpt = saving ? checkpoint_path(o.out_dir) : std::string();
  if (saving && main_rank) std::filesystem::create_directories(o.out_dir);
  if (o.resume) {
    // Every rank reads the checkpoint (whatever the number of ranks that wrote it: it
    // holds the whole model and the whole optimizer state).
    MU_CHECK(std::filesystem::exists(ckpt), "run_training: resume asked for, but there is no checkpoint at ", ckpt);
    r.start_step = optim::load_checkpoint(ckpt, model, opt, &hooks.extras);
    if (o.zero != nullptr) o.zero->release_state();
    MU_CHECK(r.start_step <= o.max_steps, "run_training: the checkpoint ", ckpt, " has ", r.start_step,
             " steps done, more than max_steps = ", o.max_steps);
  }
  std::unique_ptr<MetricsLog> log;
  if (saving && main_rank)
    log = std::make_unique<MetricsLog>((std::filesystem::path(o.out_dir) / "metrics.jsonl").string(),
                                       o.resume ? r.start_step : -1);
  auto save = [&](int64_t steps_done) {
    if (!saving) return;
    if (o.zero != nullptr) o.zero->gather_state();  // collective: every rank takes part
    if (main_rank) optim::save_checkpoint(ckpt, model, opt, steps_done, hooks.extras);
    if (o.zero != nullptr) o.zero->release_state();
  };

  InterruptGuard guard;
  const bool show = o.progress && main_rank;
  Progress progress(r.start_step, o.max_steps, o.unit, o.progress_every, show ? -1 : 0);
  model.train();
  r.steps_done = r.start_step;
  for (int64_t step = r.start_step; step < o.max_steps; ++step) {
    const double lr = optim::apply_lr(opt, schedule, step);
    opt.zero_grad();
    double loss_sum = 0;
    for (int64_t micro = 0; micro < o.grad_accum; ++micro) {
      if (o.ddp != nullptr) o.ddp->set_sync(micro == o.grad_accum - 1);  // one average per step
      Tensor loss = hooks.micro_batch_loss(step, micro);
      MU_CHECK(loss.defined() && loss.numel() == 1, "run_training: micro_batch_loss must return a one-element loss, got ",
               loss.describe());
      loss_sum += loss.item();
      // Mean over micro-batches: each contributes 1 / grad_accum of the gradient.
      (o.grad_accum == 1 ? loss : loss * (1.0 / double(o.grad_accum))).backward();
    }
    const double loss = rank_mean(o, loss_sum / double(o.grad_accum));
    // The gradients are the same on every rank by now, and so are their norm and the step.
    const double norm = o.clip_norm > 0 ? optim::clip_grad_norm(model.parameters(), o.clip_norm)
                                        : optim::grad_norm(model.parameters());
    if (o.zero != nullptr)
      o.zero->step();
    else
      opt.step();
    r.steps_done = step + 1;
    r.last_loss = loss;
    r.losses.push_back(loss);
    if (show) progress.update(r.steps_done, loss, o.units_per_step);
    if (log && o.log_every > 0 && (r.steps_done % o.log_every == 0 || r.steps_done == o.max_steps))
      log->write("train", r.steps_done, {{"loss", loss}, {"lr", lr}, {"grad_norm", norm}});
    if (hooks.after_step) hooks.after_step(step, loss);

    const bool last = r.steps_done == o.max_steps;
    if ((o.eval_every > 0 && r.steps_done % o.eval_every == 0) || last) {
      r.last_eval = evaluate(model, hooks);
      if (!r.last_eval.empty()) {
        if (log) log->write("eval", r.steps_done, r.last_eval);
        if (show) progress.message("step " + std::to_string(r.steps_done) + ": " + describe(r.last_eval));
      }
    }
    if ((o.checkpoint_every > 0 && r.steps_done % o.checkpoint_every == 0) || last) save(r.steps_done);
    if (any_interrupted(o) && !last) {
      save(r.steps_done);
      r.interrupted = true;
      // Said even without progress output: the user pressed Ctrl-C and wants to know what became of the run.
      if (main_rank)
        progress.message("interrupted after step " + std::to_string(r.steps_done) +
                         (saving ? "; checkpoint saved to " + ckpt + " (continue with --resume)" : ""));
      break;
    }
  }
  // A resumed run that had already finished runs no step: evaluate anyway, so the caller
  // still learns where the model stands.
  if (r.losses.empty() && !r.interrupted) r.last_eval = evaluate(model, hooks);
  if (show) progress.finish();
  return r;
}

}  // namespace mu::train
