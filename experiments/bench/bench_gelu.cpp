// The gelu-6272x512 workloads: GELU over the hidden activations of the Fashion-MNIST
// Mixer's channel MLPs, (128 x 49, 512) float32:
//   gelu-6272x512          exact GELU (x Φ(x), torch's approximate="none", the Mixer's),
//                          the forward alone, without grad mode;
//   gelu-6272x512-fwd-bwd  forward and backward (y.backward(g) with a fixed g), one step;
//   gelu-tanh-6272x512, gelu-tanh-6272x512-fwd-bwd  the same for approximate="tanh"
//                          (GPT-2's).
// torch_gelu.py beside this file times F.gelu on the same steps; compare.sh gelu runs both.
//
// Bytes each must move at least: the forward reads x and writes y (2 x 12.8 MB); the step
// also reads g and x and writes dx (5 x 12.8 MB). The CPU kernels are bound by arithmetic,
// not by those bytes: per vector of lanes the forward takes 34 multiplies and multiply-adds
// (ops/cpu/map.cpp; its tails are accurate down to float32's normals), so on a core with
// two FMA pipes at least 17 cycles.
//
//   bench_gelu [--reps 20] [--warmup 3]
#include <omp.h>

#include <string>

#include "experiments/bench/timing.h"
#include "mumoe.h"

using namespace mu;

int main(int argc, char** argv) {
  bench::Options opt("bench_gelu", 20, 3, {});
  opt.parse(argc, argv);
  const int64_t rows = 128 * 49, n = 512;
  const double tensor_bytes = double(rows * n) * sizeof(float);
  manual_seed(0);
  Tensor x = randn({rows, n}).requires_grad_();
  Tensor g = randn({rows, n});
  for (const std::string approximate : {"none", "tanh"}) {
    bench::Timing fwd = bench::time_it([&] {
      NoGradGuard no_grad;
      gelu(x, approximate);
    }, opt.reps, opt.warmup);
    bench::Timing step = bench::time_it([&] {
      x.zero_grad();
      gelu(x, approximate).backward(g);
    }, opt.reps, opt.warmup);
    const std::string name = approximate == "tanh" ? "gelu-tanh-6272x512" : "gelu-6272x512";
    bench::print_bytes_result(name, fwd, omp_get_max_threads(), 2 * tensor_bytes);
    bench::print_bytes_result(name + "-fwd-bwd", step, omp_get_max_threads(), 5 * tensor_bytes);
  }
  return 0;
}
