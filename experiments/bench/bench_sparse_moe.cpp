// Sparse execution of the σ-MoE layer: forward + backward time at fixed K and G as the
// expert count N_E grows, beside the dense MLP of the same d_ff = N_E · G. The experts run
// one GEMM each on their own tokens (grouped_mm), so the layer's work is K · G per token
// whatever N_E is, plus the N_E-wide selection product; the dense MLP's grows with N_E.
//
//   bench_sparse_moe [--experts 16,32,64,128] [--k 4] [--expert-size 128] [--d-model 512]
//                    [--tokens 8192] [--device cpu|cuda] [--profile 0] [--reps 3] [--warmup 1]
//
// Both devices are real targets here (the CPU one is the machine the tests run on).
// --profile 1 prints one σ-MoE step's kernel table (ops/profile.h) per N_E on stderr.
//
// One JSON line per (layer, N_E): median / min / max ms of forward + backward, the layer's
// multiply-adds per token and their fraction of the dense MLP's; then a summary line with
// the σ-MoE time at the largest N_E over the smallest (sparse execution keeps it near 1;
// the dense MLP's grows with N_E).
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "experiments/bench/gpu_timing.h"
#include "experiments/bench/timing.h"
#include "mumoe.h"
#include "nn/sparse_moe.h"

using namespace mu;

int main(int argc, char** argv) {
  const char* prog = "bench_sparse_moe";
  bench::Options opt(prog, 3, 1,
                     {{"experts", "16,32,64,128"},
                      {"k", "4"},
                      {"expert-size", "128"},
                      {"d-model", "512"},
                      {"tokens", "8192"},
                      {"device", "cpu"},
                      {"profile", "0"}});
  opt.parse(argc, argv);
  const std::string device = opt.str("device");
  const Device dev = bench::parse_target_device(prog, device);
  const bool profile = bench::parse_flag(prog, "profile", opt.str("profile"));
  const int64_t K = opt.integer("k"), G = opt.integer("expert-size"), d = opt.integer("d-model");
  const int64_t T = opt.integer("tokens");
  std::vector<int64_t> ns;
  {
    std::stringstream list(opt.str("experts"));
    std::string n;
    while (std::getline(list, n, ',')) ns.push_back(std::stoll(n));
  }

  manual_seed(0);
  const Tensor x = randn({T, d}).to(dev);
  const Tensor g = randn({T, d}).to(dev);  // the upstream gradient
  double first = 0, last = 0, dense_first = 0, dense_last = 0;
  for (size_t i = 0; i < ns.size(); ++i) {
    const int64_t N = ns[i];
    // σ-MoE in training mode, with its expert dropout and entropy regulariser.
    nn::SigmaMoE moe(nn::sigma_moe_options(d, N, G, K, 0.1, 0.001));
    moe.to(dev);
    moe.train();
    Tensor xl = x.detach().requires_grad_();
    auto step = [&] {
      moe.zero_grad();
      xl.zero_grad();
      Tensor y = moe.forward(xl);
      ((y * g).sum() + moe.aux_loss()).backward();
      bench::sync(dev);
    };
    const bench::Timing t = bench::time_it(step, opt.reps, opt.warmup);
    if (profile) {
      profile::enable();
      step();
      std::fprintf(stderr, "kernel profile of one σ-MoE step, N_E = %lld:\n%s\n", (long long)N, profile::table().c_str());
      profile::disable();
    }
    std::printf("{\"workload\": \"sigma-moe-d%lld-g%lld-k%lld-n%lld\", \"device\": \"%s\", \"tokens\": %lld, "
                "\"median_ms\": %.3f, \"min_ms\": %.3f, \"max_ms\": %.3f, \"macs_per_token\": %lld, "
                "\"dense_fraction\": %.4f, \"load_cv\": %.3f}\n",
                (long long)d, (long long)G, (long long)K, (long long)N, dev.str().c_str(), (long long)T, t.median_ms,
                t.min_ms, t.max_ms, (long long)moe.flops_per_token() / 2,
                double(moe.flops_per_token()) / double(moe.dense_flops_per_token()), moe.routing_stats().load_cv);
    std::fflush(stdout);

    // The dense MLP of the same d_ff.
    nn::Linear fc(d, N * G), proj(N * G, d);
    fc.to(dev);
    proj.to(dev);
    auto dense_step = [&] {
      fc.zero_grad();
      proj.zero_grad();
      xl.zero_grad();
      Tensor y = proj.forward(relu(fc.forward(xl)));
      (y * g).sum().backward();
      bench::sync(dev);
    };
    const bench::Timing td = bench::time_it(dense_step, opt.reps, opt.warmup);
    std::printf("{\"workload\": \"dense-mlp-d%lld-ff%lld\", \"device\": \"%s\", \"tokens\": %lld, \"median_ms\": %.3f, "
                "\"min_ms\": %.3f, \"max_ms\": %.3f, \"macs_per_token\": %lld}\n",
                (long long)d, (long long)(N * G), dev.str().c_str(), (long long)T, td.median_ms, td.min_ms, td.max_ms,
                (long long)(2 * d * N * G));
    std::fflush(stdout);
    if (i == 0) first = t.median_ms, dense_first = td.median_ms;
    last = t.median_ms;
    dense_last = td.median_ms;
  }
  std::printf("{\"summary\": \"forward+backward time at N_E = %lld over N_E = %lld\", \"sigma_moe\": %.3f, "
              "\"dense_mlp\": %.3f}\n",
              (long long)ns.back(), (long long)ns.front(), last / first, dense_last / dense_first);
  return 0;
}
