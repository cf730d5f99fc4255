// The layer-norm-1024x768 workload: layer_norm over the last dim of a (1024, 768) float32
// x with weight and bias, forward and backward (y.backward(g) with a fixed g, gradients
// of x, weight and bias), timed as one step. Two implementations in one program: the
// fused op (one forward and one backward kernel) and the same function composed from
// mean / rsqrt / arithmetic ops. torch_layer_norm.py beside this file times F.layer_norm
// on the same step; compare.sh layer_norm runs both.
//
// Bytes a step must move at least: forward reads x and writes y, backward reads g and x
// and writes dx: 5 x 3 MB (weight, bias and the per-row statistics are a few KB). GB/s
// below is that count over the median time.
//
//   bench_layer_norm [--reps 50] [--warmup 10] [--impl fused,composed]
#include <omp.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <string>

#include "experiments/bench/timing.h"
#include "mumoe.h"

using namespace mu;

namespace {

// LayerNorm over the last dim from its formula, one autograd op per step.
Tensor composed_layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps) {
  Tensor centred = x - mean(x, {-1}, true);
  Tensor var = mean(centred * centred, {-1}, true);  // biased
  return centred * rsqrt(var + eps) * w + b;
}

}  // namespace

int main(int argc, char** argv) {
  bench::Options opt("bench_layer_norm", 50, 10, {{"impl", "fused,composed"}});
  opt.parse(argc, argv);
  const int reps = opt.reps, warmup = opt.warmup;
  const std::string impls = opt.str("impl");
  const int64_t rows = 1024, n = 768;
  const double bytes = 5.0 * double(rows * n) * sizeof(float);
  manual_seed(0);
  Tensor x = randn({rows, n}).requires_grad_();
  Tensor w = (randn({n}) + 1.0).requires_grad_(), b = randn({n}).requires_grad_();
  Tensor g = randn({rows, n});

  double fused_ms = 0;
  std::stringstream list(impls);
  std::string impl;
  while (std::getline(list, impl, ',')) {
    std::function<Tensor()> forward;
    if (impl == "fused") forward = [&] { return layer_norm(x, {n}, w, b, 1e-5); };
    else if (impl == "composed") forward = [&] { return composed_layer_norm(x, w, b, 1e-5); };
    else {
      std::fprintf(stderr, "bench_layer_norm: unknown impl %s (fused or composed)\n", impl.c_str());
      return 2;
    }
    auto step = [&] {
      x.zero_grad();
      w.zero_grad();
      b.zero_grad();
      forward().backward(g);
    };
    bench::Timing t = bench::time_it(step, reps, warmup);
    if (impl == "fused") fused_ms = t.median_ms;
    // How many times slower than the fused op, when it ran first.
    char vs_fused[64] = "";
    if (impl != "fused" && fused_ms > 0)
      std::snprintf(vs_fused, sizeof vs_fused, ", \"vs_fused\": %.2f", t.median_ms / fused_ms);
    bench::print_bytes_result("layer-norm-1024x768", t, omp_get_max_threads(), bytes, "mumoe-" + impl, vs_fused);
  }
  return 0;
}
