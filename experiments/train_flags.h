// The command-line flags train_gpt2 and train_mixer share (CLI11): the run's directory and
// resume, optimisation (AdamW with nanoGPT's decay split, warm-up + cosine, clipping,
// accumulation), the evaluation and checkpoint cadence, the seed, and the MLP kind of
// the model's blocks, the device, the precision and activation checkpointing. Each
// program adds its own model and data flags.
#pragma once
#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "mumoe.h"
#include "tensor/allocator.h"
#include "tensor/cuda.h"
#include "train/loop.h"

namespace mu::experiments {

struct TrainFlags {
  std::string out_dir;  // checkpoint.safetensors, metrics.jsonl
  bool resume = false;
  int64_t max_steps = 1000;
  int64_t batch_size = 32;
  int64_t grad_accum = 1;
  double lr = 1e-3, min_lr = 1e-4;
  int64_t warmup = 100;
  double weight_decay = 0.1, beta1 = 0.9, beta2 = 0.95;
  double clip = 1.0;
  int64_t eval_every = 100, checkpoint_every = 500;
  uint64_t seed = 0;
  std::string mlp = "dense";  // dense | cp | tr
  int64_t experts = 64;
  bool no_progress = false;
  std::string device = "cpu";  // cpu | cuda | cuda:N
  std::string dtype = "fp32";  // fp32 | bf16 (autocast: bfloat16 products, float32 weights)
  int zero = 0;                // 1: AdamW state sharded across the ranks of mpirun (ZeRO-1)
  bool recompute = false;      // activation checkpointing of every block
};

// Registers the shared flags on `app`, each with its documentation for --help; the
// defaults are the program's (set them in `f` before calling).
// `mlp_kinds`: the values --mlp takes in this program.
inline void add_train_flags(CLI::App& app, TrainFlags& f,
                            const std::vector<std::string>& mlp_kinds = {"dense", "cp", "tr"}) {
  app.add_option("--out-dir", f.out_dir, "Directory for checkpoint.safetensors and metrics.jsonl (created)")
      ->required();
  app.add_flag("--resume", f.resume, "Continue bit-identically from <out-dir>/checkpoint.safetensors");
  app.add_option("--max-steps", f.max_steps, "Optimizer steps in the whole run")->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--batch-size", f.batch_size, "Samples per micro-batch")->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--grad-accum", f.grad_accum, "Micro-batches accumulated per optimizer step")->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--lr", f.lr, "Peak learning rate (after warm-up)")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--min-lr", f.min_lr, "Learning rate at the end of the cosine decay")->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--warmup", f.warmup, "Linear warm-up steps")->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--weight-decay", f.weight_decay, "AdamW decay of weight matrices and embeddings (not of biases and "
                 "norm gains)")->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--beta1", f.beta1, "AdamW beta1")->capture_default_str()->check(CLI::Range(0.0, 1.0));
  app.add_option("--beta2", f.beta2, "AdamW beta2")->capture_default_str()->check(CLI::Range(0.0, 1.0));
  app.add_option("--clip", f.clip, "Clip the global gradient norm to this (0: off)")->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--eval-every", f.eval_every, "Evaluate every k steps (0: only at the end)")->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--checkpoint-every", f.checkpoint_every, "Save a checkpoint every k steps (0: only at the end and "
                 "on Ctrl-C)")->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--seed", f.seed, "Seed of initialisation, dropout and data order")->capture_default_str();
  std::string kinds;
  for (const std::string& k : mlp_kinds) kinds += (kinds.empty() ? "" : ", ") + k;
  app.add_option("--mlp", f.mlp, "MLP of every block: " + kinds + " (cp: CPμMoE, tr: TRμMoE)")->capture_default_str()
      ->check(CLI::IsMember(mlp_kinds));
  app.add_option("--experts", f.experts, "Experts of the μMoE MLPs")->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_flag("--no-progress", f.no_progress, "No progress output on stderr");
  app.add_option("--device", f.device, "Where the model trains: cpu, cuda or cuda:N")->capture_default_str();
  app.add_option("--zero", f.zero, "Under mpirun: 1 keeps each rank's shard of the AdamW moments only (ZeRO stage 1; "
                 "the same steps, less memory); 0: every rank holds all of them")->capture_default_str()
      ->check(CLI::Range(0, 1));
  app.add_option("--dtype", f.dtype, "fp32, or bf16: matmuls, einsum and attention in bfloat16 with float32 sums "
                 "(autocast), weights, norms and losses in float32")->capture_default_str()
      ->check(CLI::IsMember({"fp32", "bf16"}));
  app.add_flag("--recompute", f.recompute, "Recompute each block's activations in the backward pass instead of keeping "
               "them (activation checkpointing: less memory, one more forward of the blocks per step, the same steps)");
}

// The device --device names; an unknown name or a CUDA device this machine lacks is an
// error saying so.
inline Device parse_device(const std::string& s) {
  if (s == "cpu") return Device::cpu();
  int index = 0;
  if (s == "cuda") {
    index = 0;
  } else if (s.rfind("cuda:", 0) == 0 && s.size() > 5 && s.find_first_not_of("0123456789", 5) == std::string::npos &&
             s.size() < 9) {
    index = std::stoi(s.substr(5));
  } else {
    MU_FAIL("--device: \"", s, "\" is not a device (cpu, cuda or cuda:N)");
  }
  const int n = cuda::device_count();
  MU_CHECK(index < n, "--device ", s, ": this machine has ", n, " CUDA device", n == 1 ? "" : "s",
           cuda::is_available() ? "" : " (no GPU found, or a build without CUDA)");
  return Device::cuda(index);
}

// The most bytes the run's tensors held at once on `dev` (the allocator's count of live
// tensors, its cache excluded), as one line: what --recompute and --batch-size trade.
inline void print_peak_memory(Device dev) {
  const MemoryStats s = dev.is_cpu() ? cpu_allocator::stats() : cuda::memory_stats(dev.index);
  std::printf("peak tensor memory %.1f MiB on %s\n", double(s.peak_bytes) / (1 << 20), dev.str().c_str());
}

// The loop options the flags describe; units_per_step and unit are the program's.
inline train::LoopOptions loop_options(const TrainFlags& f) {
  train::LoopOptions o;
  o.max_steps = f.max_steps;
  o.grad_accum = f.grad_accum;
  o.clip_norm = f.clip;
  o.eval_every = f.eval_every;
  o.checkpoint_every = f.checkpoint_every;
  o.out_dir = f.out_dir;
  o.resume = f.resume;
  o.progress = !f.no_progress;
  return o;
}

}  // namespace mu::experiments
