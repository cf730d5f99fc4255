// Data-parallel scaling, measured and projected.
//
// Measured (run under mpirun -np 1 and -np 2): a gpt2-mini training step (4 layers, width
// 256, context 128, vocabulary 50257; AdamW) on a global batch of --batch windows, each of
// the N ranks taking batch / N of them, gradients averaged by DistributedDataParallel.
// Rank 0 prints one JSON line: the median step time and tokens per second of the whole job.
//
// Projected (no MPI needed): the bytes one step all-reduces for GPT-2 124M with dense MLPs
// and with CPμMoE / TRμMoE MLPs at N = 256 (the paper's Table 3 models), and the time a
// ring all-reduce of them takes on G GPUs at a bus bandwidth of B GB/s,
// 2 (G - 1) / G · bytes / B, beside the compute time of the step at a stated rate.
//
//   mpirun -np 2 bench_ddp [--batch 16] [--reps 10] [--warmup 3]
//   bench_ddp --project 1 [--gpus 8] [--bus-gbps 100] [--tflops 400] [--tokens 491520]
#include <omp.h>

#include <cstdio>
#include <string>

#include "dist/ddp.h"
#include "dist/sampler.h"
#include "experiments/bench/timing.h"
#include "models/gpt2.h"
#include "mumoe.h"

using namespace mu;

namespace {

// Parameters that receive gradients, and the bytes DDP all-reduces per step for them
// (float32 gradients plus one count per parameter tensor).
struct Counts {
  int64_t params = 0, tensors = 0;
  int64_t bytes() const { return 4 * (params + tensors); }
};

Counts counts_of(const models::GPT2Config& c) {
  manual_seed(0);
  models::GPT2 model(c);
  Counts n;
  for (const Tensor& p : model.parameters()) {
    n.params += p.numel();
    n.tensors += 1;
  }
  return n;
}

void project(int gpus, double bus_gbps, double tflops, double tokens) {
  std::printf("GPT-2 124M (12 layers, width 768, context 1024), gradients all-reduced per step; ring all-reduce on %d "
              "GPUs at %.0f GB/s bus bandwidth; compute at %.0f TFLOP/s for %.0f tokens per step (6 x params x tokens)\n",
              gpus, bus_gbps, tflops, tokens);
  std::printf("| MLP | params | MB all-reduced | all-reduce ms | compute ms | all-reduce / compute |\n|---|---|---|---|---|---|\n");
  for (const char* kind : {"dense", "cp", "tr"}) {
    models::GPT2Config c = models::GPT2Config::gpt2_124m();
    if (std::string(kind) == "cp") c.mlp = models::mlp::cp_mumoe(256);
    if (std::string(kind) == "tr") c.mlp = models::mlp::tr_mumoe(256);
    const Counts n = counts_of(c);
    const double ring_s = 2.0 * (gpus - 1) / gpus * double(n.bytes()) / (bus_gbps * 1e9);
    const double compute_s = 6.0 * double(n.params) * tokens / (tflops * 1e12) / gpus;
    std::printf("| %s | %.1fM | %.1f | %.2f | %.1f | %.3f |\n", kind, double(n.params) / 1e6, double(n.bytes()) / 1e6,
                ring_s * 1e3, compute_s * 1e3, ring_s / compute_s);
  }
  // A dense or sparse MoE of 256 copies of each MLP (Table 4's 14.5B): every expert's
  // gradient is all-reduced, and a sparse MoE's compute stays about the dense model's.
  const models::GPT2Config c = models::GPT2Config::gpt2_124m();
  const int64_t d = c.n_embd, mlp = 2 * d * 4 * d + 4 * d + d, dense_params = counts_of(c).params;
  const int64_t moe_params = dense_params - c.n_layer * mlp + c.n_layer * 256 * mlp;
  const double ring_s = 2.0 * (gpus - 1) / gpus * 4.0 * double(moe_params) / (bus_gbps * 1e9);
  const double compute_s = 6.0 * double(dense_params) * tokens / (tflops * 1e12) / gpus;
  std::printf("| MoE, 256 experts (Table 4) | %.1fB | %.0f | %.0f | %.1f | %.1f |\n", double(moe_params) / 1e9,
              4.0 * double(moe_params) / 1e6, ring_s * 1e3, compute_s * 1e3, ring_s / compute_s);
  std::printf("(compute counts 6 x params x tokens, attention's products aside; a sparse MoE's compute is taken as "
              "the dense model's)\n");
}

}  // namespace

int main(int argc, char** argv) {
  bench::Options opt("bench_ddp", 10, 3,
                     {{"batch", "16"}, {"project", "0"}, {"gpus", "8"}, {"bus-gbps", "100"}, {"tflops", "400"},
                      {"tokens", "491520"}});
  opt.parse(argc, argv);
  if (opt.str("project") == "1") {
    project(std::stoi(opt.str("gpus")), std::stod(opt.str("bus-gbps")), std::stod(opt.str("tflops")),
            std::stod(opt.str("tokens")));
    return 0;
  }
  dist::ProcessGroup& pg = dist::ProcessGroup::world();
  const int64_t B = std::stoll(opt.str("batch"));
  const dist::Shard shard = dist::batch_shard(B, pg.rank(), pg.size());
  models::GPT2Config c = models::GPT2Config::gpt2_mini();
  manual_seed(0);
  models::GPT2 model(c);
  dist::DistributedDataParallel ddp(model, pg);
  optim::AdamW adamw(model.parameters(), optim::AdamWOptions(6e-4).weight_decay(0.1));
  const int64_t T = c.block_size;
  Tensor idx = randint(0, c.vocab_size, {B, T}), tgt = randint(0, c.vocab_size, {B, T});
  Tensor x = idx.narrow(0, shard.begin, shard.count).contiguous(), y = tgt.narrow(0, shard.begin, shard.count).contiguous();
  auto step = [&] {
    adamw.zero_grad();
    model.forward(x, y).loss.backward();  // the gradients are averaged as backward runs
    adamw.step();
  };
  const bench::Timing t = bench::time_it(step, opt.reps, opt.warmup);
  // The job's step is its slowest rank's.
  Tensor ms = from_vector(std::vector<double>{t.median_ms}, {1});
  const std::vector<double> all = pg.all_gather(ms).to_vector<double>();
  double slowest = 0;
  for (double v : all) slowest = std::max(slowest, v);
  if (pg.rank() == 0)
    std::printf("{\"workload\": \"gpt2-mini-ddp\", \"ranks\": %d, \"threads_per_rank\": %d, \"global_batch\": %lld, "
                "\"median_ms\": %.3f, \"tokens_per_s\": %.0f, \"bytes_per_step\": %lld, \"buckets\": %lld}\n",
                pg.size(), omp_get_max_threads(), (long long)B, slowest, double(B * T) / (slowest * 1e-3),
                (long long)ddp.bytes_per_sync(), (long long)ddp.bucket_count());
  return 0;
}
