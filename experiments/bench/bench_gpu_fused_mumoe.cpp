// The μMoE layers' fused paths against their plain compositions on cuda:0:
// - CP (CPMuMoE::set_fused): h = ([z; 1] U_in) ∗ (a U_1) in one hadamard_gemm kernel
//   (ops/hadamard_gemm.h), then one GEMM; plain: the planner's einsum (cuBLAS GEMMs and an
//   elementwise product);
// - TR (TRMuMoE::set_fused): the ring product q = (a U_1) · ([z; 1] U_in) formed inside the
//   output GEMM (ring_gemm, ops/ring_gemm.h); plain: a batched matmul writing q, then the
//   output GEMM (cuBLAS).
// Workloads, each in fp32 and bf16 (bf16: the forward in an AutocastGuard with float32
// factors, as bench_gpu_layers and training run it):
//   cpmumoe-layer, trmumoe-layer: torch_reference.py's layers (and bench_gpu_layers'), 2048
//     tokens, 768 -> 768, N = 256, CP R = 512, TR ranks (4, 4, 149);
//   gpt2-cp-fc, gpt2-cp-proj, gpt2-tr-fc, gpt2-tr-proj: GPT-2 124M's μMoE MLP layers at
//     B·T = 8192 tokens, 768 -> 3072 and 3072 -> 768, N = 256, CP R = int(0.725 · 768) = 556,
//     TR ranks (4, 4, int(0.195 · 768) = 149) (PAPERS.md);
// and phases
//   fwd: the layer's forward without a graph;
//   fwdbwd: zero grads, mean(layer(z, a)²).backward() (every factor, z and a take grads);
//   core: the fused op alone against its composition, without a graph: CP, hadamard_gemm
//     against two matmuls and a product; TR, ring_gemm(c, h, w) against
//     (c · h).reshape(M, P S) · w, for c (M, 4, 4), h (M, 4, R3), w (4 R3, O).
// Each (workload, dtype, phase) prints a line for path "fused" and one for "einsum" (the
// plain composition), then a line with impl "ratio" and einsum_over_fused = einsum median
// / fused median (> 1: the fused path is faster). flops: 2 (fwd), 6 (fwdbwd) x tokens x
// the layer's multiply-adds per token; core: 2 x tokens x R x (I + 1 + N) for CP,
// 2 x tokens x R3 (4 · 4 + 4 O) for TR. Every step ends with a device synchronisation
// before the clock is read. float32 runs with TF32 off unless --tf32 1 (the fused float32
// kernels use FMA on the CUDA cores either way).
//
//   bench_gpu_fused_mumoe [--workload cpmumoe-layer,...,gpt2-tr-proj] [--dtype fp32,bf16]
//                         [--phase fwd,fwdbwd,core] [--tf32 0] [--reps 20] [--warmup 3] [--device cuda]
//
// Without a CUDA device it says so on stderr and exits with status 3. --device cpu runs the
// same steps on the CPU, to check the program where there is no GPU (not a benchmark).
#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "experiments/bench/gpu_timing.h"
#include "experiments/bench/timing.h"
#include "mumoe.h"
#include "nn/entmax.h"
#include "nn/mumoe_layer.h"
#include "ops/hadamard_gemm.h"
#include "ops/ring_gemm.h"
#include "tensor/cuda.h"

using namespace mu;

namespace {

constexpr const char* kProg = "bench_gpu_fused_mumoe";

struct Workload {
  const char* name;
  bool tr;       // TRμMoE (ranks 4, 4, rank) or CPμMoE (rank)
  int64_t tokens, in, out, experts, rank;
};

constexpr int64_t kTrRing = 4;  // R_1 = R_2 = 4, as the papers fix them
const Workload kWorkloads[] = {
    {"cpmumoe-layer", false, 2048, 768, 768, 256, 512},
    {"gpt2-cp-fc", false, 8192, 768, 3072, 256, int64_t(0.725 * 768)},
    {"gpt2-cp-proj", false, 8192, 3072, 768, 256, int64_t(0.725 * 768)},
    {"trmumoe-layer", true, 2048, 768, 768, 256, 149},
    {"gpt2-tr-fc", true, 8192, 768, 3072, 256, int64_t(0.195 * 768)},
    {"gpt2-tr-proj", true, 8192, 3072, 768, 256, int64_t(0.195 * 768)},
};
const char* kWorkloadNames = "cpmumoe-layer,gpt2-cp-fc,gpt2-cp-proj,trmumoe-layer,gpt2-tr-fc,gpt2-tr-proj";

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
  std::unique_ptr<nn::MuMoELayer> made;
  if (w.tr) made = std::make_unique<nn::TRMuMoE>(s, std::vector<int64_t>{kTrRing, kTrRing, w.rank});
  else made = std::make_unique<nn::CPMuMoE>(s, w.rank);
  nn::MuMoELayer& layer = *made;
  auto set_fused = [&](bool on) {
    if (auto* tr = dynamic_cast<nn::TRMuMoE*>(&layer)) tr->set_fused(on);
    else dynamic_cast<nn::CPMuMoE&>(layer).set_fused(on);
  };
  layer.to(dev);
  // Drawn on the CPU, moved, then made leaves that take gradients.
  Tensor z = randn({1, w.tokens, w.in}).to(dev).requires_grad_();
  Tensor a = nn::entmax15(randn({1, w.tokens, w.experts})).to(dev).requires_grad_();
  const double layer_flops = double(layer.flops(w.tokens));

  for (const std::string& phase : phases) {
    bench::Timing t[2];  // fused, einsum
    for (int p = 0; p < 2; ++p) {
      const bool fused = p == 0;
      set_fused(fused);
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
      } else if (w.tr) {  // core: the output contraction alone
        NoGradGuard ng;
        AutocastGuard amp(kBFloat16, bf16);
        const int64_t P = kTrRing, R = kTrRing, S = w.rank;
        const TensorOptions f32 = TensorOptions(kFloat32).device(dev);
        const Tensor c = randn({w.tokens, P, R}, f32), h = randn({w.tokens, R, S}, f32);
        // Each path's weight in its own row order (both are the output core, permuted once).
        const Tensor w_ring = randn({S * P, w.out}, f32), w_plain = randn({P * S, w.out}, f32);
        auto step = [&] {
          Tensor y = fused ? ring_gemm(c, h, w_ring) : c.matmul(h).reshape({w.tokens, P * S}).matmul(w_plain);
          bench::sync(dev);
        };
        t[p] = bench::time_it(step, opt.reps, opt.warmup);
        flops = 2.0 * double(w.tokens) * double(S) * double(P * R + P * w.out);
      } else {  // core
        NoGradGuard ng;
        AutocastGuard amp(kBFloat16, bf16);
        const Tensor zf = cat({z.reshape({w.tokens, w.in}), ones({w.tokens, 1}, TensorOptions(kFloat32).device(dev))}, 1);
        const Tensor af = a.reshape({w.tokens, w.experts});
        const auto& f = layer.factors();  // CP: U1, U_in, U_out
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
                     {{"workload", kWorkloadNames},
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
        std::fprintf(stderr, "%s: unknown workload %s (%s)\n", kProg, name.c_str(), kWorkloadNames);
        return 2;
      }
      run(dev, *w, dtype, phases, tf32, opt);
    }
  return 0;
}
