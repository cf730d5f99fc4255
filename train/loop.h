// One training loop for every model: AdamW (or any optimizer) under a learning-rate
// schedule, gradient accumulation, clipping, evaluation every k steps, a progress bar, a
// JSON-lines metrics log, atomic checkpoints every k steps and on Ctrl-C, and resume.
//
//   train::LoopOptions o;
//   o.max_steps = 2000; o.grad_accum = 4; o.eval_every = 200; o.checkpoint_every = 500;
//   o.out_dir = "runs/gpt2"; o.resume = flags.resume; o.units_per_step = 4 * B * T; o.unit = "tok";
//   train::LoopHooks h;
//   h.micro_batch_loss = [&](int64_t step, int64_t micro) { auto [x, y] = batch(); return model->loss(x, y); };
//   h.evaluate = [&] { return std::vector<std::pair<std::string, double>>{{"val_loss", val_loss()}}; };
//   h.extras.generators["data"] = &data_generator;     // restored on resume
//   train::LoopResult r = train::run_training(*model, opt, schedule, o, h);
//
// Steps are numbered from 0; the checkpoint saved after step s records s + 1 steps done,
// and a resumed run starts there. Resuming is bit-identical to never stopping on the CPU
// when everything random in a step draws from generators the checkpoint holds: the
// global one (dropout, initialisation) always, the data pipeline's through
// hooks.extras.generators. Evaluation must not draw from those (give it its own
// generator, seeded the same each time), or the training stream would depend on when
// evaluations ran.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "nn/module.h"
#include "optim/checkpoint.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"

namespace mu::dist {
class DistributedDataParallel;
class ZeroOptimizer;
}  // namespace mu::dist

namespace mu::train {

using Metrics = std::vector<std::pair<std::string, double>>;

struct LoopOptions {
  int64_t max_steps = 1000;      // optimizer steps in the whole run (a resumed run included)
  int64_t grad_accum = 1;        // micro-batches per optimizer step
  double clip_norm = 1.0;        // global gradient-norm clip; 0 turns it off
  int64_t eval_every = 0;        // 0: evaluate only at the end
  int64_t checkpoint_every = 0;  // 0: save only at the end and on Ctrl-C
  int64_t log_every = 1;         // training lines in the metrics log
  std::string out_dir;           // checkpoint.safetensors and metrics.jsonl go here; empty: neither
  bool resume = false;           // continue from out_dir/checkpoint.safetensors (which must exist)
  int64_t units_per_step = 0;    // tokens or images per optimizer step, for throughput
  std::string unit = "samples";
  int progress_every = 10;       // plain progress lines when stderr is not a terminal
  bool progress = true;          // draw progress on stderr at all
  // Data parallelism (dist/ddp.h), not owned; null: one process. Every rank runs the loop:
  // gradients are averaged once per step (the earlier micro-batches accumulate locally),
  // the logged loss is the mean over ranks, a Ctrl-C on any rank stops all at the same
  // step, and only rank 0 prints, logs and writes checkpoints. `zero` (dist/zero.h), when
  // set, steps instead of the optimizer and gathers its sharded state for checkpoints.
  dist::DistributedDataParallel* ddp = nullptr;
  dist::ZeroOptimizer* zero = nullptr;
};

struct LoopHooks {
  // The loss (a mean over the micro-batch) of micro-batch `micro` in [0, grad_accum) of
  // step `step`, with its graph: the loop scales it by 1 / grad_accum and runs backward.
  std::function<Tensor(int64_t step, int64_t micro)> micro_batch_loss;
  // Evaluation metrics, e.g. {{"val_loss", 3.2}}; run with the model in eval mode and no
  // graph. Optional.
  std::function<Metrics()> evaluate;
  // Called after each optimizer step with the step and its loss (e.g. to print samples).
  std::function<void(int64_t step, double loss)> after_step;
  // Generators and values of the caller's that a checkpoint keeps (see optim/checkpoint.h).
  optim::CheckpointExtras extras;
};

struct LoopResult {
  int64_t start_step = 0;    // the first step this call ran (> 0 after a resume)
  int64_t steps_done = 0;    // steps completed in total, the resumed ones included
  bool interrupted = false;  // stopped by Ctrl-C / SIGTERM, after saving a checkpoint
  double last_loss = 0;      // loss of the last step run
  Metrics last_eval;         // the last evaluation's metrics
  std::vector<double> losses;  // loss of every step this call ran
};

LoopResult run_training(nn::Module& model, optim::Optimizer& opt, const optim::LRSchedule& schedule,
                        const LoopOptions& options, LoopHooks& hooks);

// out_dir/checkpoint.safetensors
std::string checkpoint_path(const std::string& out_dir);

}  // namespace mu::train
