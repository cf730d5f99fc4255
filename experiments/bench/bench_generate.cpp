// GPT2::generate with and without its key-value cache: B sequences of a P-token prompt
// grown by N new tokens (greedy, top_k 1, so that both runs give the same tokens; the
// count that differ is printed), in eval mode, random nanoGPT-initialised weights.
// Without the cache, step s forwards the whole context of P + s tokens (nanoGPT's loop):
// workload generate-<model>-whole-context; with it, the prompt once and then one position
// a step: generate-<model>-kv-cache. Each line has the median time of the whole call and
// the new tokens per second; the cached line also the speed-up. torch_generate.py runs
// both loops in PyTorch (compare.sh generate).
//
// The model's work per call, in multiply-adds of the weights (the attention rows aside):
// without the cache about Σ_s (P + s) · 12 n_layer d² (+ the head's d V on one position a
// step); with it (P + N) · 12 n_layer d². At P = 64, N = 64 that is 6112 against 128,
// 48 times fewer in the blocks; what the cached loop cannot shrink is the head (d V per new
// token) and reading every weight once a step.
//
// --dtype bf16 runs both loops under autocast (bfloat16 products and attention, float32
// weights), the workloads then named ...-bf16: on a GPU the form a sampling loop takes.
//
//   bench_generate [--model mini|124m] [--batch 1] [--prompt 64] [--new 64] [--device cpu|cuda]
//                  [--dtype float32|bf16] [--reps 3] [--warmup 1]
#include <omp.h>

#include <cstdio>
#include <string>

#include "experiments/bench/gpu_timing.h"
#include "experiments/bench/timing.h"
#include "mumoe.h"

using namespace mu;
using models::GPT2;
using models::GPT2Config;

int main(int argc, char** argv) {
  const char* prog = "bench_generate";
  bench::Options opt(prog, 3, 1,
                     {{"model", "mini"}, {"batch", "1"}, {"prompt", "64"}, {"new", "64"}, {"device", "cpu"},
                      {"dtype", "float32"}});
  opt.parse(argc, argv);
  const std::string which = opt.str("model");
  GPT2Config c;
  if (which == "124m") {
    c = GPT2Config::gpt2_124m();
  } else if (which == "mini") {  // torch_reference.py's gpt2-mini
    c.n_layer = 4;
    c.n_head = 4;
    c.n_embd = 256;
    c.block_size = 128;
  } else {
    std::fprintf(stderr, "%s: --model %s is not mini or 124m\n", prog, which.c_str());
    return 2;
  }
  const int64_t B = opt.integer("batch"), P = opt.integer("prompt"), N = opt.integer("new");
  if (P + N > c.block_size) {
    std::fprintf(stderr, "%s: --prompt %lld + --new %lld exceed the block size %lld, where the cache stops\n", prog,
                 (long long)P, (long long)N, (long long)c.block_size);
    return 2;
  }
  const std::string device = opt.str("device"), dtype = opt.str("dtype");
  const Device dev = bench::parse_target_device(prog, device);
  if (dtype != "float32" && dtype != "bf16") {
    std::fprintf(stderr, "%s: --dtype %s is not float32 or bf16\n", prog, dtype.c_str());
    return 2;
  }
  const bool bf16 = dtype == "bf16";

  Generator init(0);
  GPT2 model(c, &init);
  model.to(dev);
  model.eval();
  const Tensor prompt = randint(0, c.vocab_size, {B, P}, TensorOptions(kInt64), &init).to(dev);

  auto run = [&](bool cache) {
    AutocastGuard autocast(kBFloat16, bf16);
    return model.generate(prompt, N, 1.0, /*top_k=*/1, nullptr, cache);
  };
  // Both loops' greedy tokens, compared: the logits agree to rounding (test_gpt2_generate
  // checks the tokens on every device), so a difference here is a near tie gone the other
  // way, reported in the cached line rather than ending the run.
  const std::vector<int64_t> plain = run(false).to_vector<int64_t>(), cached = run(true).to_vector<int64_t>();
  int64_t differ = 0;
  for (size_t i = 0; i < plain.size(); ++i) differ += plain[i] != cached[i];
  double base_ms = 0;
  for (bool cache : {false, true}) {
    const bench::Timing t = bench::time_it(
        [&] {
          run(cache);
          bench::sync(dev);
        },
        opt.reps, opt.warmup);
    if (!cache) base_ms = t.median_ms;
    std::printf("{\"workload\": \"generate-%s-%s%s\", \"impl\": \"mumoe\", \"device\": \"%s\", \"threads\": %d, "
                "\"batch\": %lld, \"prompt\": %lld, \"new\": %lld, \"median_ms\": %.3f, \"min_ms\": %.3f, "
                "\"max_ms\": %.3f, \"new_tokens_per_s\": %.1f",
                which.c_str(), cache ? "kv-cache" : "whole-context", bf16 ? "-bf16" : "", device.c_str(),
                omp_get_max_threads(),
                (long long)B, (long long)P, (long long)N, t.median_ms, t.min_ms, t.max_ms,
                double(B * N) / (t.median_ms * 1e-3));
    if (cache) std::printf(", \"speedup\": %.2f, \"tokens_differ\": %lld", base_ms / t.median_ms, (long long)differ);
    std::printf("}\n");
    std::fflush(stdout);
  }
  return 0;
}
