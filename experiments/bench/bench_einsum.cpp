// einsum's overhead against the same work written as explicit ops: the μMoE-style
// contraction y = einsum("btr,btr,or->bto", f1, f2, U_O) (a Hadamard product of two
// rank-space activations, then the output factor) at 2048 tokens, R = 512, O = 768,
// against (f1 * f2).matmul(U_Oᵀ); forward alone, and forward + backward.
//
//   bench_einsum [--reps 20] [--warmup 3] [--tokens 2048] [--rank 512] [--out 768]
// Prints one JSON line per measurement and the einsum / explicit ratio.
#include <omp.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "experiments/bench/timing.h"
#include "mumoe.h"

using namespace mu;

int main(int argc, char** argv) {
  bench::Options opt("bench_einsum", 20, 3, {{"tokens", "2048"}, {"rank", "512"}, {"out", "768"}});
  opt.parse(argc, argv);
  const int reps = opt.reps, warmup = opt.warmup;
  const int64_t T = opt.integer("tokens"), R = opt.integer("rank"), O = opt.integer("out");
  manual_seed(0);
  Tensor f1 = randn({1, T, R}).requires_grad_(), f2 = randn({1, T, R}).requires_grad_();
  Tensor w = randn({O, R}).requires_grad_();
  auto clear = [&] { f1.zero_grad(), f2.zero_grad(), w.zero_grad(); };
  auto by_einsum = [&] { return einsum("btr,btr,or->bto", {f1, f2, w}); };
  auto by_ops = [&] { return (f1 * f2).matmul(w.t()); };

  // Same values first: the comparison is between two ways of one computation.
  {
    NoGradGuard g;
    Tensor a = by_einsum(), b = by_ops();
    double diff = max((a - b).abs()).item(), scale = max(b.abs()).item();
    if (diff > 1e-4 * scale) {
      std::fprintf(stderr, "bench_einsum: einsum and explicit ops disagree (max diff %g, scale %g)\n", diff, scale);
      return 1;
    }
  }
  struct Row {
    const char* name;
    bench::Timing t;
  };
  auto fwd = [&](auto f) {
    return bench::time_it([&] {
      NoGradGuard g;
      f();
    }, reps, warmup);
  };
  auto fwd_bwd = [&](auto f) {
    return bench::time_it([&] {
      clear();
      f().sum().backward();
    }, reps, warmup);
  };
  Row rows[] = {{"einsum-fwd", fwd(by_einsum)}, {"explicit-fwd", fwd(by_ops)},
                {"einsum-fwd-bwd", fwd_bwd(by_einsum)}, {"explicit-fwd-bwd", fwd_bwd(by_ops)}};
  double flops = double(T) * double(R) * double(O);  // multiply-adds of the GEMM
  for (const Row& r : rows)
    std::printf("{\"workload\": \"einsum-btr-btr-or\", \"impl\": \"mumoe-%s\", \"threads\": %d, \"tokens\": %lld, "
                "\"rank\": %lld, \"out\": %lld, \"median_ms\": %.3f, \"min_ms\": %.3f, \"max_ms\": %.3f}\n",
                r.name, omp_get_max_threads(), (long long)T, (long long)R, (long long)O, r.t.median_ms, r.t.min_ms,
                r.t.max_ms);
  std::printf("einsum / explicit (median): forward %.3f, forward+backward %.3f  (GEMM %.2f GFLOP/s in explicit forward)\n",
              rows[0].t.median_ms / rows[1].t.median_ms, rows[2].t.median_ms / rows[3].t.median_ms,
              2 * flops / rows[1].t.median_ms / 1e6);
  return 0;
}
