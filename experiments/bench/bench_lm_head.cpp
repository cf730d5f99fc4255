// A language model's head and loss: logits = x Wᵀ for x (N, K) and W (V, K), float32, both
// requiring grad, then the mean cross-entropy against int64 targets; one step is zero the
// gradients, loss, backward. Workload lm-head-loss at gpt2-mini's shape (N = 8 x 128
// positions, K = 256, V = 50257; torch_lm_head.py runs the same in PyTorch) by two impls:
//   unfused       cross_entropy(linear(x, W), t): the (N, V) logits and their gradient;
//   chunked-R     linear_cross_entropy(x, W, {}, t, {}, R): R rows of logits at a time
//                 (R = 0: the op's default, K rows and at least 512).
// FLOPs: three products of 2 N K V each (logits, dx, dW), 6 N K V in a step (79 GFLOP at
// this shape); the line's "gflops" is that over the median. The floor beside them is the
// products at the GEMM rate of bench_sgemm. Each line has the most bytes the step's tensors
// held at once.
//
//   bench_lm_head [--n 1024] [--k 256] [--v 50257] [--chunks 0,32,128,512] [--reps 5] [--warmup 2]
#include <omp.h>

#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>

#include "experiments/bench/timing.h"
#include "mumoe.h"

using namespace mu;

int main(int argc, char** argv) {
  bench::Options opt("bench_lm_head", 5, 2, {{"n", "1024"}, {"k", "256"}, {"v", "50257"}, {"chunks", "0,32,128,512"}});
  opt.parse(argc, argv);
  const int64_t N = opt.integer("n"), K = opt.integer("k"), V = opt.integer("v");
  manual_seed(0);
  Tensor x = randn({N, K}).requires_grad_(), w = (randn({V, K}) * 0.02).requires_grad_();
  Tensor t = randint(0, V, {N});
  const double flops = 6.0 * double(N) * double(K) * double(V);

  auto run = [&](const std::string& impl, auto&& loss_fn) {
    // Each impl's loss and gradients agree with the unfused head's before it is timed.
    auto step = [&] {
      x.zero_grad();
      w.zero_grad();
      loss_fn().backward();
    };
    bench::Timing tm = bench::time_it(step, opt.reps, opt.warmup);
    const long long peak = bench::peak_tensor_bytes(step);
    std::printf("{\"workload\": \"lm-head-loss\", \"impl\": \"%s\", \"threads\": %d, \"n\": %lld, \"k\": %lld, "
                "\"v\": %lld, \"median_ms\": %.3f, \"min_ms\": %.3f, \"max_ms\": %.3f, \"flops\": %.0f, "
                "\"gflops\": %.1f, \"peak_tensor_mib\": %.1f}\n",
                impl.c_str(), omp_get_max_threads(), (long long)N, (long long)K, (long long)V, tm.median_ms, tm.min_ms,
                tm.max_ms, flops, flops / (tm.median_ms * 1e-3) / 1e9, double(peak) / (1 << 20));
    std::fflush(stdout);
  };
  auto unfused = [&] { return cross_entropy(linear(x, w), t); };

  // The reference values: the unfused head's loss and gradients.
  x.zero_grad();
  w.zero_grad();
  Tensor ref_loss = unfused();
  ref_loss.backward();
  const Tensor ref_dx = x.grad().clone(), ref_dw = w.grad().clone();
  auto rel = [](const Tensor& a, const Tensor& b) { return (a - b).abs().max().item() / (b.abs().max().item() + 1e-30); };

  run("unfused", unfused);
  std::stringstream list(opt.str("chunks"));
  std::string item;
  while (std::getline(list, item, ',')) {
    const int64_t rows = std::stoll(item);
    auto chunked = [&] { return linear_cross_entropy(x, w, Tensor(), t, CrossEntropyOptions(), rows); };
    x.zero_grad();
    w.zero_grad();
    Tensor loss = chunked();
    loss.backward();
    const double e_loss = std::abs(loss.item() - ref_loss.item()) / std::abs(ref_loss.item());
    const double e_dx = rel(x.grad(), ref_dx), e_dw = rel(w.grad(), ref_dw);
    if (!(e_loss < 1e-5 && e_dx < 1e-4 && e_dw < 1e-4)) {
      std::fprintf(stderr, "bench_lm_head: chunked-%lld disagrees with the unfused head (loss %.3g, dx %.3g, dW %.3g "
                   "relative)\n", (long long)rows, e_loss, e_dx, e_dw);
      return 1;
    }
    run("chunked-" + item, chunked);
  }
  return 0;
}
