// The mixer-fmnist and mixer-fmnist-cpmumoe workloads of ../shared/reference/torch_reference.py:
// an MLP-Mixer on 28×28×1 images (patch 4, width 128, 4 blocks, token MLP 64, channel MLP
// 512, 10 classes), batch 128 of uniform images with random labels, AdamW (lr 1e-3, weight
// decay 1e-4); one step = zero grads, forward, cross-entropy, backward, optimizer step.
// mixer-fmnist-cpmumoe replaces each channel MLP with the reference's GPT-style μMoE block
// (N = 64, CP rank int(0.75·128) = 96, LayerNorm gating, input LayerNorm). Two workloads
// the reference lacks, the paper's batch-norm-gated Mixer blocks in both mixing MLPs,
// run when named: mixer-fmnist-cp-bn and mixer-fmnist-tr-bn. One JSON line per workload, with
// the most bytes the step's tensors held at once. --recompute 1 checkpoints every block
// (MixerConfig::recompute; the workloads are then named ...-recompute); --gelu-recompute 1
// has the plain channel MLPs compute their GELU again in the backward
// (MixerConfig::gelu_recompute, ...-gelu-recompute). --dtype bf16 runs the forward and the
// loss under autocast (bfloat16 products, float32 norms, entmax and weights), the workloads
// then named ...-bf16. PyTorch has no twin here: its CPU autocast (1.13) stops at the
// reference Mixer's first LayerNorm ("expected scalar type BFloat16 but found Float").
//
//   bench_mixer [--workload mixer-fmnist,mixer-fmnist-cpmumoe] [--recompute 0] [--gelu-recompute 0]
//               [--dtype float32|bf16] [--reps 10] [--warmup 3]
#include <omp.h>

#include <cstdio>
#include <sstream>
#include <string>

#include "experiments/bench/timing.h"
#include "models/mlp_mixer.h"
#include "mumoe.h"

using namespace mu;
using models::MixerMlp;

int main(int argc, char** argv) {
  bench::Options opt("bench_mixer", 10, 3,
                     {{"workload", "mixer-fmnist,mixer-fmnist-cpmumoe"}, {"recompute", "0"}, {"gelu-recompute", "0"},
                      {"dtype", "float32"}});
  opt.parse(argc, argv);
  const std::string dtype = opt.str("dtype");
  if (dtype != "float32" && dtype != "bf16") {
    std::fprintf(stderr, "bench_mixer: --dtype %s is not float32 or bf16\n", dtype.c_str());
    return 2;
  }
  const bool bf16 = dtype == "bf16";
  const bool recompute = opt.flag("recompute"), gelu_recompute = opt.flag("gelu-recompute");
  std::stringstream list(opt.str("workload"));
  std::string name;
  while (std::getline(list, name, ',')) {
    models::MixerConfig c = models::mixer_fmnist();
    if (name == "mixer-fmnist") {
    } else if (name == "mixer-fmnist-cpmumoe") {
      c.channel_block = MixerMlp::CPMuMoE;
      c.gate_norm = nn::GateNorm::LayerNorm;
      c.moe_input_norm = true;
    } else if (name == "mixer-fmnist-cp-bn") {
      c.mlp(MixerMlp::CPMuMoE);
    } else if (name == "mixer-fmnist-tr-bn") {
      c.mlp(MixerMlp::TRMuMoE);
    } else {
      std::fprintf(stderr, "bench_mixer: unknown workload %s\n", name.c_str());
      return 2;
    }
    c.recompute = recompute;
    c.gelu_recompute = gelu_recompute;
    manual_seed(0);
    models::MlpMixer model(c);
    optim::AdamW adamw(model.parameters(), optim::AdamWOptions(1e-3).weight_decay(1e-4));
    const int64_t B = 128;
    Tensor img = rand({B, 1, 28, 28});
    Tensor y = randint(0, 10, {B});
    auto step = [&] {
      adamw.zero_grad();
      Tensor loss;
      {
        AutocastGuard autocast(kBFloat16, bf16);
        loss = cross_entropy(model.forward(img), y);
      }
      loss.backward();
      adamw.step();
    };
    bench::Timing t = bench::time_it(step, opt.reps, opt.warmup);
    const long long peak = bench::peak_tensor_bytes(step);
    bench::print_step_result(name + (recompute ? "-recompute" : "") + (gelu_recompute ? "-gelu-recompute" : "") +
                                 (bf16 ? "-bf16" : ""),
                             t,
                             omp_get_max_threads(),
                             (long long)model.num_parameters(), peak);
  }
  return 0;
}
