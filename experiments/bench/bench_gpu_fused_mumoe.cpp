// The CP μMoE layer's fused path (CPMuMoE::set_fused: hadamard_gemm, ops/hadamard_gemm.h,
// then one GEMM) against its plain composition (the planner's einsum: cuBLAS GEMMs and an
// elementwise product) on cuda:0. Workloads, each in fp32 and bf16 (bf16: the forward in
// an AutocastGuard with float32 factors, as bench_gpu_layers and training run it):
//   cpmumoe-layer: torch_reference.py's layer (and bench_gpu_layers'), 2048 tokens,
//     768 -> 768, N = 256, R = 512;
//   gpt2-cp-fc, gpt2-cp-proj: GPT-2 124M's CPμMoE MLP layers at B·T = 8192 tokens,
//     768 -> 3072 and 3072 -> 768, N = 256, R = int(0.725 · 768) = 556 (PAPERS.md);
// and phases
//   fwd: the layer's forward without a graph;
//   fwdbwd: zero grads, mean(layer(z, a)²).backward() (every factor, z and a take grads);
//   core: the layer's core h = ([z; 1] U_in) ∗ (a U_1) alone: hadamard_gemm against two
//     matmuls and a product, without a graph.
// Each (workload, dtype, phase) prints a line for path "fused" and one for "einsum", then a
// line with impl "ratio" and einsum_over_fused = einsum median / fused median (> 1: the
// fused path is faster). flops: 2 (fwd), 6 (fwdbwd) x tokens x the layer's multiply-adds
// per token; core: 2 x tokens x R x (I + 1 + N). Every step ends with a device
// synchronisation before the clock is read. float32 runs with TF32 off unless --tf32 1
// (the fused float32 kernel uses FMA on the CUDA cores either way).
//
//   bench_gpu_fused_mumoe [--workload cpmumoe-layer,gpt2-cp-fc,gpt2-cp-proj] [--dtype fp32,bf16]
//                         [--phase fwd,fwdbwd,core] [--tf32 0] [--reps 20] [--warmup 3] [--device cuda]
//
// Without a CUDA device it says so on stderr and exits with status 3. --device cpu runs the
// same steps on the CPU, to check the program where there is no GPU (not a benchmark).
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "experiments/bench/gpu_timing.h"
#include "experiments/bench/timing.h"
#include "mumoe.h"
#include "nn/entmax.h"
#include "nn/mumoe_layer.h"
#include "ops/hadamard_gemm.h"
#include "tensor/cuda.h"

using namespace mu;

namespace {

constexpr const char* kProg = "bench_gpu_fused_mumoe";

struct Workload {
  const char* name;
  int64_t tokens, in, out, experts, rank;
};

const Workload kWorkloads[] = {
    {"cpmumoe-layer", 2048, 768, 768, 256, 512},
    {"gpt2-cp-fc", 8192, 768, 3072, 256, int64_t(0.725 * 768)},
    {"gpt2-cp-proj", 8192, 3072, 768, 256, int64_t(0.725 * 768)},
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream list(s);
  std::string item;
  while (std::getline(list, item, ',')) out.push_back(item);
  return out;
}

void print(Device dev, const Workload& w, const std::string& dtype, const std::string& phase, const char* path,
           bool tf32, const bench::Timing& t, double flops) {
  bench::begin_line(dev, std::string(w.name) + "-" + phase + "-" + path + "-" + dtype, dtype, tf32, t);
  std::printf(", \"path\": \"%s\", \"phase\": \"%s\", \"tokens\": %lld, \"in\": %lld, \"out\": %lld, "
              "\"experts\": %lld, \"rank\": %lld, \"flops\": %.0f, \"tflops\": %.2f",
              path, phase.c_str(), (long long)w.tokens, (long long)w.in, (long long)w.out, (long long)w.experts,
              (long long)w.rank, flops, flops / (t.median_ms * 1e-3) / 1e12);
  bench::end_line();
}

void print_ratio(const Workload& w, const std::string& dtype, const std::string& phase, const bench::Timing& fused,
                 const bench::Timing& plain) {
  std::printf("{\"workload\": \"%s-%s-%s\", \"impl\": \"ratio\", \"einsum_over_fused\": %.3f}\n", w.name,
              phase.c_str(), dtype.c_str(), plain.median_ms / fused.median_ms);
  std::fflush(stdout);
}

void run(Device dev, const Workload& w, const std::string& dtype, const std::vector<std::string>& phases, bool tf32,
         const bench::Options& opt) {
  const bool bf16 = bench::parse_bf16(kProg, dtype);
  manual_seed(0);
  nn::MoEShape s{w.in, w.out, {w.experts}, true};
  nn::CPMuMoE layer(s, w.rank);
  layer.to(dev);
  // Drawn on the CPU, moved, then made leaves that take gradients.
  Tensor z = randn({1, w.tokens, w.in}).to(dev).requires_grad_();
  Tensor a = nn::entmax15(randn({1, w.tokens, w.experts})).to(dev).requires_grad_();
  const double layer_flops = double(layer.flops(w.tokens));

  for (const std::string& phase : phases) {
    bench::Timing t[2];  // fused, einsum
    for (int p = 0; p < 2; ++p) {
      const bool fused = p == 0;
      layer.set_fused(fused);
      double flops = 0;
      if (phase == "fwd") {
        auto step = [&] {
          NoGradGuard ng;
          AutocastGuard amp(kBFloat16, bf16);
          Tensor y = layer.forward(z, {a});
          bench::sync(dev);
        };
        t[p] = bench::time_it(step, opt.reps, opt.warmup);
        flops = 2 * layer_flops;
      } else if (phase == "fwdbwd") {
        auto step = [&] {
          layer.zero_grad();
          z.zero_grad();
          a.zero_grad();
          Tensor loss;
          {
            AutocastGuard amp(kBFloat16, bf16);
            loss = square(layer.forward(z, {a})).mean();
          }
          loss.backward();
          bench::sync(dev);
        };
        t[p] = bench::time_it(step, opt.reps, opt.warmup);
        flops = 6 * layer_flops;
      } else {  // core
        NoGradGuard ng;
        AutocastGuard amp(kBFloat16, bf16);
        const Tensor zf = cat({z.reshape({w.tokens, w.in}), ones({w.tokens, 1}, TensorOptions(kFloat32).device(dev))}, 1);
        const Tensor af = a.reshape({w.tokens, w.experts});
        const auto& f = layer.factors();  // U1, U_in, U_out
        auto step = [&] {
          Tensor h = fused ? hadamard_gemm({zf, af}, {f[1].param, f[0].param})
                           : zf.matmul(f[1].param) * af.matmul(f[0].param);
          bench::sync(dev);
        };
        t[p] = bench::time_it(step, opt.reps, opt.warmup);
        flops = 2.0 * double(w.tokens) * double(w.rank) * double(w.in + 1 + w.experts);
      }
      print(dev, w, dtype, phase, fused ? "fused" : "einsum", tf32, t[p], flops);
    }
    print_ratio(w, dtype, phase, t[0], t[1]);
  }
}

}  // namespace

int main(int argc, char** argv) {
  bench::Options opt(kProg, 20, 3,
                     {{"workload", "cpmumoe-layer,gpt2-cp-fc,gpt2-cp-proj"},
                      {"dtype", "fp32,bf16"},
                      {"phase", "fwd,fwdbwd,core"},
                      {"tf32", "0"},
                      {"device", "cuda"}});
  opt.parse(argc, argv);
  const Device dev = bench::parse_device(kProg, opt.str("device"));
  const bool tf32 = bench::parse_flag(kProg, "tf32", opt.str("tf32"));
  cuda::set_allow_tf32(tf32);
  const std::vector<std::string> phases = split(opt.str("phase"));
  for (const std::string& p : phases)
    if (p != "fwd" && p != "fwdbwd" && p != "core") {
      std::fprintf(stderr, "%s: unknown phase %s (fwd, fwdbwd or core)\n", kProg, p.c_str());
      return 2;
    }
  for (const std::string& dtype : split(opt.str("dtype"))) bench::parse_bf16(kProg, dtype);  // refuse early
  for (const std::string& dtype : split(opt.str("dtype")))
    for (const std::string& name : split(opt.str("workload"))) {
      const Workload* w = nullptr;
      for (const Workload& c : kWorkloads)
        if (name == c.name) w = &c;
      if (!w) {
        std::fprintf(stderr, "%s: unknown workload %s (cpmumoe-layer, gpt2-cp-fc, gpt2-cp-proj)\n", kProg,
                     name.c_str());
        return 2;
      }
      run(dev, *w, dtype, phases, tf32, opt);
    }
  return 0;
}
