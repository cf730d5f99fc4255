// cross_entropy at a language model's output: logits (N = 1024, C = 50257) float32 that
// require grad, int64 targets, mean reduction. Workloads (the same in
// torch_cross_entropy.py, which compare.sh runs alongside):
//   cross-entropy-fwd      the loss alone, without grad mode;
//   cross-entropy-fwd-bwd  one step: drop the logits' gradient, loss, backward.
// Bytes: the logits are N C 4 = 206 MB. The forward's floor is one read of them; the
// backward's one read and one write of the gradient, so 3 N C 4 bytes for a step (the
// leaf's gradient accumulation, a copy into .grad, comes on top). Each line reports the
// floor as "bytes" and the rate it implies as "gbps". --dtype bf16 takes bfloat16 logits,
// as a language model's head gives them under autocast (half the bytes; the workloads
// are then named ...-bf16, and have no PyTorch line).
//
//   bench_cross_entropy [--reps 20] [--warmup 3] [--n 1024] [--c 50257] [--dtype float32|bf16]
#include <omp.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "experiments/bench/timing.h"
#include "mumoe.h"
#include "tensor/allocator.h"

using namespace mu;

int main(int argc, char** argv) {
  bench::Options opt("bench_cross_entropy", 20, 3, {{"n", "1024"}, {"c", "50257"}, {"dtype", "float32"}});
  opt.parse(argc, argv);
  const std::string dtype = opt.str("dtype");
  if (dtype != "float32" && dtype != "bf16") {
    std::fprintf(stderr, "bench_cross_entropy: --dtype %s is not float32 or bf16\n", dtype.c_str());
    return 2;
  }
  const bool bf16 = dtype == "bf16";
  const int reps = opt.reps, warmup = opt.warmup;
  const int64_t N = opt.integer("n"), C = opt.integer("c");
  manual_seed(0);
  Tensor x = (bf16 ? randn({N, C}).to(kBFloat16) : randn({N, C})).requires_grad_();
  Tensor t = randint(0, C, {N});

  // The fused loss agrees with log_softmax + gather before anything is timed.
  {
    Tensor fused = cross_entropy(x, t);
    NoGradGuard g;
    Tensor composed = -gather(log_softmax(x, 1), 1, t.reshape({N, 1})).mean();
    double a = fused.item(), b = composed.item();
    // The composed loss of bfloat16 logits rounds each log-probability to bfloat16 (2^-9
    // relative); the fused one sums in float32.
    if (!(std::abs(a - b) <= (bf16 ? 1e-2 : 1e-5) * std::abs(b))) {
      std::fprintf(stderr, "bench_cross_entropy: fused %.9g and composed %.9g losses disagree\n", a, b);
      return 1;
    }
  }
  // Steps after the first re-use the gradient's blocks from the caching allocator
  // (tensor/allocator.h) instead of faulting in 206 MB of fresh pages each time.
  bench::Timing fwd = bench::time_it([&] {
    NoGradGuard g;
    cross_entropy(x, t);
  }, reps, warmup);
  MemoryStats before = cpu_allocator::stats();
  bench::Timing step = bench::time_it([&] {
    x.zero_grad();
    cross_entropy(x, t).backward();
  }, reps, warmup);
  MemoryStats after = cpu_allocator::stats();

  const double logits_bytes = double(N) * double(C) * double(element_size(x.dtype()));
  const std::string suffix = bf16 ? "-bf16" : "";
  const std::string sizes = ", \"n\": " + std::to_string(N) + ", \"c\": " + std::to_string(C);
  bench::print_bytes_result("cross-entropy-fwd" + suffix, fwd, omp_get_max_threads(), logits_bytes, "mumoe", sizes);
  bench::print_bytes_result("cross-entropy-fwd-bwd" + suffix, step, omp_get_max_threads(), 3 * logits_bytes, "mumoe",
                            sizes);
  // Whether the timed steps went back to the system for memory: the cache should have
  // served them (peak unchanged, the cached bytes still there).
  std::fprintf(stderr, "bench_cross_entropy: allocator peak %.1f MB before the steps, %.1f MB after; cached %.1f MB\n",
               double(before.peak_bytes) / 1e6, double(after.peak_bytes) / 1e6, double(after.cached_bytes) / 1e6);
  return 0;
}
