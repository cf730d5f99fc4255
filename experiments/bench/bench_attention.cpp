// Fused causal attention, forward + backward, against experiments/bench/torch_attention.py
// (the same computation composed in PyTorch: softmax(q kᵀ/√D + mask) v with autograd).
// One step = clear the grads of q, k, v, out = scaled_dot_product_attention(q, k, v,
// causal), sum(out * w).backward() for a fixed random w. float32.
//
//   bench_attention [--workload attention-b8-h4-t128,attention-b1-h12-t1024] [--reps 20] [--warmup 3]
//
// Prints one JSON line per workload with "flops": the work a causal kernel must do,
// counting each T x T x D product as 2 T² D flops, halved for the causal mask: forward 2
// products (S = Q Kᵀ, O = P V), backward 5 (S again, dP, dV, dQ, dK), so 7 B H T² D in all.
#include <omp.h>

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>

#include "experiments/bench/timing.h"
#include "mumoe.h"

using namespace mu;

struct Workload {
  const char* name;
  int64_t B, H, T, D;
};

int main(int argc, char** argv) {
  bench::Options opt("bench_attention", 20, 3, {{"workload", "attention-b8-h4-t128,attention-b1-h12-t1024"}});
  opt.parse(argc, argv);
  const int reps = opt.reps, warmup = opt.warmup;
  const std::string workloads = opt.str("workload");
  const Workload known[] = {{"attention-b8-h4-t128", 8, 4, 128, 64}, {"attention-b1-h12-t1024", 1, 12, 1024, 64}};
  std::stringstream list(workloads);
  std::string name;
  while (std::getline(list, name, ',')) {
    const Workload* w = nullptr;
    for (const Workload& k : known)
      if (name == k.name) w = &k;
    if (w == nullptr) {
      std::fprintf(stderr, "bench_attention: unknown workload %s\n", name.c_str());
      return 2;
    }
    manual_seed(0);
    Shape s{w->B, w->H, w->T, w->D};
    Tensor q = randn(s).requires_grad_(), k = randn(s).requires_grad_(), v = randn(s).requires_grad_();
    Tensor up = randn(s);
    auto fwd_bwd = [&] {
      q.zero_grad(), k.zero_grad(), v.zero_grad();
      (scaled_dot_product_attention(q, k, v, true) * up).sum().backward();
    };
    auto fwd = [&] {
      NoGradGuard g;
      scaled_dot_product_attention(q, k, v, true);
    };
    bench::Timing t = bench::time_it(fwd_bwd, reps, warmup);
    bench::Timing tf = bench::time_it(fwd, reps, warmup);
    const double bhtd = double(w->B) * double(w->H) * double(w->T) * double(w->T) * double(w->D);
    const double flops = 7 * bhtd, fwd_flops = 2 * bhtd;
    std::printf("{\"workload\": \"%s\", \"impl\": \"mumoe\", \"threads\": %d, \"median_ms\": %.3f, \"min_ms\": %.3f, "
                "\"max_ms\": %.3f, \"flops\": %.0f, \"gflops\": %.1f, \"forward_median_ms\": %.3f, "
                "\"forward_gflops\": %.1f}\n",
                name.c_str(), omp_get_max_threads(), t.median_ms, t.min_ms, t.max_ms, flops,
                flops / t.median_ms / 1e6, tf.median_ms, fwd_flops / tf.median_ms / 1e6);
    std::fflush(stdout);
  }
  return 0;
}
