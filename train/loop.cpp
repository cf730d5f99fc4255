#include "train/loop.h"

#include <cmath>
#include <filesystem>
#include <memory>

#include "autograd/grad_mode.h"
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
  const bool saving = !o.out_dir.empty();
  const std::string ckpt = saving ? checkpoint_path(o.out_dir) : std::string();
  if (saving) std::filesystem::create_directories(o.out_dir);
  if (o.resume) {
    MU_CHECK(std::filesystem::exists(ckpt), "run_training: resume asked for, but there is no checkpoint at ", ckpt);
    r.start_step = optim::load_checkpoint(ckpt, model, opt, &hooks.extras);
    MU_CHECK(r.start_step <= o.max_steps, "run_training: the checkpoint ", ckpt, " has ", r.start_step,
             " steps done, more than max_steps = ", o.max_steps);
  }
  std::unique_ptr<MetricsLog> log;
  if (saving) log = std::make_unique<MetricsLog>((std::filesystem::path(o.out_dir) / "metrics.jsonl").string(),
                                                 o.resume ? r.start_step : -1);
  auto save = [&](int64_t steps_done) {
    if (saving) optim::save_checkpoint(ckpt, model, opt, steps_done, hooks.extras);
  };

  InterruptGuard guard;
  Progress progress(r.start_step, o.max_steps, o.unit, o.progress_every, o.progress ? -1 : 0);
  model.train();
  r.steps_done = r.start_step;
  for (int64_t step = r.start_step; step < o.max_steps; ++step) {
    const double lr = optim::apply_lr(opt, schedule, step);
    opt.zero_grad();
    double loss_sum = 0;
    for (int64_t micro = 0; micro < o.grad_accum; ++micro) {
      Tensor loss = hooks.micro_batch_loss(step, micro);
      MU_CHECK(loss.defined() && loss.numel() == 1, "run_training: micro_batch_loss must return a one-element loss, got ",
               loss.describe());
      loss_sum += loss.item();
      // Mean over micro-batches: each contributes 1 / grad_accum of the gradient.
      (o.grad_accum == 1 ? loss : loss * (1.0 / double(o.grad_accum))).backward();
    }
    const double loss = loss_sum / double(o.grad_accum);
    const double norm = o.clip_norm > 0 ? optim::clip_grad_norm(model.parameters(), o.clip_norm)
                                        : optim::grad_norm(model.parameters());
    opt.step();
    r.steps_done = step + 1;
    r.last_loss = loss;
    r.losses.push_back(loss);
    if (o.progress) progress.update(r.steps_done, loss, o.units_per_step);
    if (log && o.log_every > 0 && (r.steps_done % o.log_every == 0 || r.steps_done == o.max_steps))
      log->write("train", r.steps_done, {{"loss", loss}, {"lr", lr}, {"grad_norm", norm}});
    if (hooks.after_step) hooks.after_step(step, loss);

    const bool last = r.steps_done == o.max_steps;
    if ((o.eval_every > 0 && r.steps_done % o.eval_every == 0) || last) {
      r.last_eval = evaluate(model, hooks);
      if (!r.last_eval.empty()) {
        if (log) log->write("eval", r.steps_done, r.last_eval);
        if (o.progress) progress.message("step " + std::to_string(r.steps_done) + ": " + describe(r.last_eval));
      }
    }
    if ((o.checkpoint_every > 0 && r.steps_done % o.checkpoint_every == 0) || last) save(r.steps_done);
    if (interrupted() && !last) {
      save(r.steps_done);
      r.interrupted = true;
      // Said even without progress output: the user pressed Ctrl-C and wants to know what became of the run.
      progress.message("interrupted after step " + std::to_string(r.steps_done) +
                         (saving ? "; checkpoint saved to " + ckpt + " (continue with --resume)" : ""));
      break;
    }
  }
  // A resumed run that had already finished runs no step: evaluate anyway, so the caller
  // still learns where the model stands.
  if (r.losses.empty() && !r.interrupted) r.last_eval = evaluate(model, hooks);
  if (o.progress) progress.finish();
  return r;
}

}  // namespace mu::train
