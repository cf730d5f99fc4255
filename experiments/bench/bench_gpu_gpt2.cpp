// GPT-2 124M training steps on cuda:0, against experiments/bench/torch_gpu.py (the same
// workloads in PyTorch eager on the same GPU):
//   gpt2-124m-<dtype>:         GPT2Config::gpt2_124m() (12 layers, 12 heads, width 768,
//                              context 1024, vocabulary 50257), dense MLP;
//   gpt2-124m-cpmumoe-<dtype>: the same with every MLP a CPμMoE block of N = 256 experts,
//                              rank int(0.725 d) = 556 by the paper's rule (mlp::cp_mumoe).
// Batch 8 x 1024 random tokens and targets (drawn once, kept on the GPU). One step = zero
// grads, loss = model(idx, targets) (inside an AutocastGuard for bf16: matmuls, einsum and
// attention in bfloat16 on float32 weights), backward, AdamW (lr 6e-4, weight decay 0.1 on
// every parameter, as torch_reference.py), then cuda::synchronize before the clock is read.
//
// Each line reports tokens/s and model FLOP utilisation: FLOPs per token over the step's
// time, against the peak of gpu_timing.h. FLOPs per token, as nanoGPT and llm.c count them:
// 6 x (multiply-adds per token of every weight matmul: c_attn and c_proj 4 d², the MLP, the
// tied lm_head V d) + 12 L T d for attention's QKᵀ and PV (forward 2 x 2 T d per layer,
// backward twice that, the causal mask not discounted). The MLP's multiply-adds are 8 d² for
// the dense one and, for CPμMoE, the block's own factorised count (nn::MuMoE::flops_per_token:
// the gating x G plus each layer's a U1, [z;1] U2, Hadamard and U3 products). Biases,
// norms, softmax and the optimiser are not counted. Peak device memory from
// cuda::memory_stats (bytes held by live tensors; the allocator's cached blocks excluded).
//
//   bench_gpu_gpt2 [--workload gpt2-124m,gpt2-124m-cpmumoe] [--dtype bf16|fp32|bf16,fp32]
//                  [--tf32 0] [--batch 8] [--seq 1024] [--peak-tflops 0] [--reps 10] [--warmup 3]
//                  [--device cuda] [--profile 0|1|shapes] [--recompute 0] [--chunked-loss 0]
//                  [--gelu-recompute 0]
//
// --recompute 1: every block checkpointed (GPT2Config::recompute; lines named
// ...-recompute-<dtype>): the peak memory it saves and the time it costs. The FLOPs per
// token stay the model's (the recomputed forward is not counted, as nanoGPT's MFU).
// --chunked-loss 1: the lm_head and loss in chunks of rows (GPT2Config::chunked_loss; lines
// named ...-chunked-<dtype>): the (B T, 50257) logits never held. --gelu-recompute 1: the
// dense MLPs compute their GELU again in the backward (GPT2Config::gelu_recompute;
// ...-gelu-recompute-<dtype>).
// --profile 1: after the timed steps, one more step under the kernel profiler
// (ops/profile.h), its per-kernel table on stderr (stdout keeps the JSON lines);
// --profile shapes: the same, one row per kernel and argument signature.
// Without a CUDA device it says so on stderr and exits with status 3. --device cpu runs the
// same steps on the CPU, to check the program where there is no GPU (not a benchmark).
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>

#include "experiments/bench/gpu_timing.h"
#include "experiments/bench/timing.h"
#include "models/gpt2.h"
#include "mumoe.h"
#include "tensor/cuda.h"

using namespace mu;

namespace {

// Multiply-adds per token of the forward pass's weight matmuls (see the header comment).
double matmul_macs_per_token(const models::GPT2& model) {
  const models::GPT2Config& c = model.config();
  const double d = double(c.n_embd);
  double macs = double(c.vocab_size) * d;  // lm_head
  for (int64_t i = 0; i < c.n_layer; ++i) {
    macs += 4 * d * d;  // c_attn (d -> 3d) and attn.c_proj (d -> d)
    auto moe = std::dynamic_pointer_cast<nn::MuMoE>(model.mlp(i));
    macs += moe ? double(moe->flops_per_token()) : 8 * d * d;  // c_fc (d -> 4d) and c_proj (4d -> d)
  }
  return macs;
}

}  // namespace

int main(int argc, char** argv) {
  const char* prog = "bench_gpu_gpt2";
  bench::Options opt(prog, 10, 3,
                     {{"workload", "gpt2-124m,gpt2-124m-cpmumoe"},
                      {"dtype", "bf16"},
                      {"tf32", "0"},
                      {"batch", "8"},
                      {"seq", "1024"},
                      {"peak-tflops", "0"},
                      {"device", "cuda"},
                      {"profile", "0"},
                      {"recompute", "0"},
                      {"chunked-loss", "0"},
                      {"gelu-recompute", "0"}});
  opt.parse(argc, argv);
  const Device dev = bench::parse_device(prog, opt.str("device"));
  const bool tf32 = bench::parse_flag(prog, "tf32", opt.str("tf32"));
  const bool by_shape = opt.str("profile") == "shapes";
  const bool profile = by_shape || bench::parse_flag(prog, "profile", opt.str("profile"));
  const bool recompute = bench::parse_flag(prog, "recompute", opt.str("recompute"));
  const bool chunked = bench::parse_flag(prog, "chunked-loss", opt.str("chunked-loss"));
  const bool gelu_recompute = bench::parse_flag(prog, "gelu-recompute", opt.str("gelu-recompute"));
  const double peak_override = std::strtod(opt.str("peak-tflops").c_str(), nullptr);
  cuda::set_allow_tf32(tf32);
  const int64_t B = opt.integer("batch"), T = opt.integer("seq");

  std::stringstream dtypes(opt.str("dtype"));
  std::string dtype;
  while (std::getline(dtypes, dtype, ',')) {
    const bool bf16 = bench::parse_bf16(prog, dtype);
    std::stringstream list(opt.str("workload"));
    std::string name;
    while (std::getline(list, name, ',')) {
      models::GPT2Config c = models::GPT2Config::gpt2_124m();
      if (name == "gpt2-124m-cpmumoe") c.mlp = models::mlp::cp_mumoe(256);  // rank 0: the paper's int(0.725 d)
      else if (name != "gpt2-124m") {
        std::fprintf(stderr, "%s: unknown workload %s (gpt2-124m or gpt2-124m-cpmumoe)\n", prog, name.c_str());
        return 2;
      }
      if (T > c.block_size) {
        std::fprintf(stderr, "%s: --seq %lld exceeds the context %lld\n", prog, (long long)T, (long long)c.block_size);
        return 2;
      }
      c.recompute = recompute;
      c.chunked_loss = chunked;
      c.gelu_recompute = gelu_recompute;
      bench::reset_peak(dev);  // the peak then counts this workload's weights, states and activations
      manual_seed(0);
      models::GPT2 model(c);
      model.to(dev);
      // Built after the move, so that its state tensors are created on the GPU.
      optim::AdamW adamw(model.parameters(), optim::AdamWOptions(6e-4).weight_decay(0.1));
      Tensor idx = randint(0, c.vocab_size, {B, T}).to(dev), tgt = randint(0, c.vocab_size, {B, T}).to(dev);
      auto step = [&] {
        adamw.zero_grad();
        Tensor loss;
        {
          AutocastGuard amp(kBFloat16, bf16);
          loss = model.forward(idx, tgt).loss;
        }
        loss.backward();  // runs without autocast, in the dtypes the forward saved
        adamw.step();
        bench::sync(dev);  // the kernels are queued: wait for them before the clock is read
      };
      const bench::Timing t = bench::time_it(step, opt.reps, opt.warmup);
      if (profile) {
        profile::enable(by_shape ? profile::Detail::Shapes : profile::Detail::Kernels);
        step();
        std::fprintf(stderr, "kernel profile of one step of %s-%s:\n%s\n", name.c_str(), dtype.c_str(),
                     profile::table().c_str());
        profile::disable();
      }

      const double flops_per_token = 6 * matmul_macs_per_token(model) +
                                     12.0 * double(c.n_layer) * double(T) * double(c.n_embd);
      const double tokens_per_s = double(B * T) / (t.median_ms * 1e-3);
      const double tflops = flops_per_token * tokens_per_s / 1e12;
      const double peak = bench::peak_tflops(bf16, tf32, peak_override);
      bench::begin_line(dev, name + (recompute ? "-recompute" : "") + (chunked ? "-chunked" : "") +
                            (gelu_recompute ? "-gelu-recompute" : "") + "-" + dtype, dtype,
                        tf32, t);
      std::printf(", \"params\": %lld, \"batch\": %lld, \"seq\": %lld, \"tokens_per_s\": %.0f, "
                  "\"flops_per_token\": %.0f, \"tflops\": %.2f, \"peak_tflops\": %.1f, \"mfu\": %.4f, "
                  "\"peak_memory_mb\": %.1f",
                  (long long)model.num_parameters(), (long long)B, (long long)T, tokens_per_s, flops_per_token,
                  tflops, peak, tflops / peak, double(bench::memory(dev).peak_bytes) / (1 << 20));
      bench::end_line();
    }
  }
  return 0;
}
