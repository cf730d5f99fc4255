// The gpt2-mini workloads of ../shared/reference/torch_reference.py: GPT-2 with 4 layers,
// 4 heads, n_embd 256, context 128, vocabulary 50257, batch 8 x 128 random tokens and
// targets; the MLP dense (gpt2-mini), CPμMoE (gpt2-mini-cpmumoe, N = 64, R = int(0.78 d)) or
// TRμMoE (gpt2-mini-trmumoe, N = 64, ranks (4, 4, int(0.2 d))). One step = zero grads,
// loss = model(idx, targets), backward, AdamW(lr 6e-4, weight decay 0.1 on every parameter,
// as the reference's torch.optim.AdamW(m.parameters(), ...)). One workload the reference
// lacks, run when named: gpt2-124m-b1, GPT-2 small (GPT2Config::gpt2_124m) on one sequence
// of 1024 tokens, the shape of a paper-scale step per sequence. Prints one JSON line per
// workload, with the most bytes the step's tensors held at once. --recompute 1 checkpoints
// every block (GPT2Config::recompute; the workloads are then named ...-recompute);
// --chunked-loss 1 takes the lm_head and loss in chunks of rows (GPT2Config::chunked_loss,
// ...-chunked); --gelu-recompute 1 has the dense MLPs compute their GELU again in the
// backward (GPT2Config::gelu_recompute, ...-gelu-recompute). --dtype bf16 runs the forward
// under autocast (bfloat16 products, attention and logits, float32 weights and AdamW), the
// workloads then named ...-bf16; experiments/bench/torch_gpt2_autocast.py is its PyTorch
// twin (torch.autocast on the reference's step), `compare.sh gpt2` with DTYPE=bf16 runs both.
//
//   bench_gpt2 [--workload gpt2-mini,gpt2-mini-cpmumoe,gpt2-mini-trmumoe] [--recompute 0] [--chunked-loss 0]
//              [--gelu-recompute 0] [--dtype float32|bf16]
//              [--reps 10] [--warmup 3]
#include <omp.h>

#include <cstdio>
#include <sstream>
#include <string>

#include "experiments/bench/timing.h"
#include "models/gpt2.h"
#include "mumoe.h"

using namespace mu;

int main(int argc, char** argv) {
  bench::Options opt("bench_gpt2", 10, 3,
                     {{"workload", "gpt2-mini,gpt2-mini-cpmumoe,gpt2-mini-trmumoe"}, {"recompute", "0"}, {"chunked-loss", "0"}, {"gelu-recompute", "0"},
                      {"dtype", "float32"}});
  opt.parse(argc, argv);
  const std::string dtype = opt.str("dtype");
  if (dtype != "float32" && dtype != "bf16") {
    std::fprintf(stderr, "bench_gpt2: --dtype %s is not float32 or bf16\n", dtype.c_str());
    return 2;
  }
  const bool bf16 = dtype == "bf16";
  const bool recompute = opt.flag("recompute"), chunked = opt.flag("chunked-loss");
  const bool gelu_recompute = opt.flag("gelu-recompute");
  std::stringstream list(opt.str("workload"));
  std::string name;
  while (std::getline(list, name, ',')) {
    models::GPT2Config c = models::GPT2Config::gpt2_mini();
    int64_t B = 8;
    if (name == "gpt2-124m-b1") c = models::GPT2Config::gpt2_124m(), B = 1;
    if (name == "gpt2-mini-cpmumoe") c.mlp = models::mlp::cp_mumoe(64);
    else if (name == "gpt2-mini-trmumoe") c.mlp = models::mlp::tr_mumoe(64);
    else if (name != "gpt2-mini" && name != "gpt2-124m-b1") {
      std::fprintf(stderr, "bench_gpt2: unknown workload %s\n", name.c_str());
      return 2;
    }
    c.recompute = recompute;
    c.chunked_loss = chunked;
    c.gelu_recompute = gelu_recompute;
    manual_seed(0);
    models::GPT2 model(c);
    optim::AdamW adamw(model.parameters(), optim::AdamWOptions(6e-4).weight_decay(0.1));
    const int64_t T = c.block_size;
    Tensor idx = randint(0, c.vocab_size, {B, T}), tgt = randint(0, c.vocab_size, {B, T});
    auto step = [&] {
      adamw.zero_grad();
      // The loss alone outlives the forward, as in the reference (its model returns only
      // the loss): the logits are then the loss's alone, and their gradient goes over them.
      Tensor loss;
      {
        AutocastGuard autocast(kBFloat16, bf16);
        loss = model.forward(idx, tgt).loss;
      }
      loss.backward();
      adamw.step();
    };
    bench::Timing t = bench::time_it(step, opt.reps, opt.warmup);
    const long long peak = bench::peak_tensor_bytes(step);
    bench::print_step_result(name + (recompute ? "-recompute" : "") + (chunked ? "-chunked" : "") +
                                 (gelu_recompute ? "-gelu-recompute" : "") + (bf16 ? "-bf16" : ""),
                             t, omp_get_max_threads(),
                             (long long)model.num_parameters(), peak);
  }
  return 0;
}
