// The fused CP μMoE path (CPMuMoE::set_fused, ops/hadamard_gemm.h) against the plain
// composition (the planner's einsum: cuBLAS GEMMs and an elementwise product) on cuda:0,
// with a device synchronisation at the end of every step. Workloads:
//   cpmumoe-layer: torch_reference.py's layer, 2048 tokens, 768 -> 768, N = 256, R = 512;
//   gpt2-cp-fc / gpt2-cp-proj: GPT-2 124M's CPμMoE MLP layers at B·T = 8192 tokens,
//     768 -> 3072 and 3072 -> 768, N = 256, R = int(0.725 · 768) = 556 (PAPERS.md);
// each in float32 and bfloat16 (parameters and inputs in that dtype), for
//   phase "fwd": the layer's forward without a graph, and
//   phase "fwdbwd": forward, loss = mean(y²), backward (every factor, input and coefficient);
//   phase "core": the layer's core h alone, hadamard_gemm against two GEMMs and a product.
// impl is "fused" or "einsum". float32 runs with TF32 off (the fused float32 kernel uses
// FMA, so the comparison is like with like). On a machine without a GPU it says so and
// exits with status 1.
//
//   bench_gpu_fused_mumoe [--workload cpmumoe-layer,gpt2-cp-fc,gpt2-cp-proj] [--dtype f32,bf16]
//                         [--reps 20] [--warmup 3]
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "experiments/bench/timing.h"
#include "mumoe.h"
#include "nn/mumoe_layer.h"
#include "ops/hadamard_gemm.h"

using namespace mu;

namespace {

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

void print(const Workload& w, const std::string& dt, const char* phase, const char* impl, const bench::Timing& t) {
  std::printf("{\"workload\": \"%s-%s-%s\", \"impl\": \"%s\", \"threads\": 0, \"median_ms\": %.3f, "
              "\"min_ms\": %.3f, \"max_ms\": %.3f, \"tokens\": %lld, \"in\": %lld, \"out\": %lld, "
              "\"experts\": %lld, \"rank\": %lld, \"device\": \"%s\"}\n",
              w.name, dt.c_str(), phase, impl, t.median_ms, t.min_ms, t.max_ms, (long long)w.tokens, (long long)w.in,
              (long long)w.out, (long long)w.experts, (long long)w.rank, cuda::device_name(0).c_str());
  std::fflush(stdout);
}

void run(const Workload& w, const std::string& dt_name, const bench::Options& opt) {
  const DType dt = dt_name == "bf16" ? kBFloat16 : kFloat32;
  const Device dev = Device::cuda(0);
  manual_seed(0);
  nn::MoEShape s{w.in, w.out, {w.experts}, true};
  nn::CPMuMoE layer(s, w.rank);
  layer.to(dt);
  layer.to(dev);
  const Tensor z = randn({1, w.tokens, w.in}).to(dt).to(dev).requires_grad_();
  const Tensor a = softmax(randn({1, w.tokens, w.experts}), -1).to(dt).to(dev).requires_grad_();

  for (bool fused : {true, false}) {
    layer.set_fused(fused);
    const char* impl = fused ? "fused" : "einsum";
    auto fwd = [&] {
      NoGradGuard g;
      Tensor y = layer.forward(z, {a});
      cuda::synchronize(0);
    };
    print(w, dt_name, "fwd", impl, bench::time_it(fwd, opt.reps, opt.warmup));
    auto fwdbwd = [&] {
      layer.zero_grad();
      z.zero_grad();
      a.zero_grad();
      Tensor y = layer.forward(z, {a});
      mean(y * y).backward();
      cuda::synchronize(0);
    };
    print(w, dt_name, "fwdbwd", impl, bench::time_it(fwdbwd, opt.reps, opt.warmup));
  }

  // The core alone, on the flattened input with its 1 appended.
  NoGradGuard g;
  const Tensor zf = cat({z.reshape({w.tokens, w.in}), ones({w.tokens, 1}, TensorOptions(dt).device(dev))}, 1);
  const Tensor af = a.reshape({w.tokens, w.experts});
  const auto& f = layer.factors();  // U1, U_in, U_out
  auto core_fused = [&] {
    Tensor h = hadamard_gemm({zf, af}, {f[1].param, f[0].param});
    cuda::synchronize(0);
  };
  print(w, dt_name, "core", "fused", bench::time_it(core_fused, opt.reps, opt.warmup));
  auto core_plain = [&] {
    Tensor h = zf.matmul(f[1].param) * af.matmul(f[0].param);
    cuda::synchronize(0);
  };
  print(w, dt_name, "core", "einsum", bench::time_it(core_plain, opt.reps, opt.warmup));
}

}  // namespace

int main(int argc, char** argv) {
  bench::Options opt("bench_gpu_fused_mumoe", 20, 3,
                     {{"workload", "cpmumoe-layer,gpt2-cp-fc,gpt2-cp-proj"}, {"dtype", "f32,bf16"}});
  opt.parse(argc, argv);
  if (cuda::device_count() == 0) {
    std::fprintf(stderr,
                 "bench_gpu_fused_mumoe: no CUDA device on this machine (or a build without the CUDA backend); "
                 "this benchmark times cuda:0 only\n");
    return 1;
  }
  cuda::set_allow_tf32(false);
  for (const std::string& name : split(opt.str("workload"))) {
    const Workload* w = nullptr;
    for (const Workload& c : kWorkloads)
      if (name == c.name) w = &c;
    if (!w) {
      std::fprintf(stderr, "bench_gpu_fused_mumoe: unknown workload %s (cpmumoe-layer, gpt2-cp-fc, gpt2-cp-proj)\n",
                   name.c_str());
      return 2;
    }
    for (const std::string& dt : split(opt.str("dtype"))) {
      if (dt != "f32" && dt != "bf16") {
        std::fprintf(stderr, "bench_gpu_fused_mumoe: unknown dtype %s (f32 or bf16)\n", dt.c_str());
        return 2;
      }
      run(*w, dt, opt);
    }
  }
  return 0;
}
