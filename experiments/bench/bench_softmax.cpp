// The softmax-1024x50257 and log-softmax-1024x50257 workloads: softmax and log_softmax over
// the last dim of (1024, 50257) float32 logits (a language model's output over GPT-2's
// vocabulary), forward and backward (y.backward(g) with a fixed g, the gradient of x),
// timed as one step. torch_softmax.py beside this file times F.softmax and F.log_softmax
// on the same step; compare.sh softmax runs both.
//
// Bytes a step must move at least: forward reads x and writes y, backward reads g and y
// and writes dx: 5 x 206 MB. GB/s below is that count over the median time.
//
//   bench_softmax [--reps 10] [--warmup 3] [--workload softmax-1024x50257,log-softmax-1024x50257]
#include <omp.h>

#include <cstdio>
#include <sstream>
#include <string>

#include "experiments/bench/timing.h"
#include "mumoe.h"

using namespace mu;

int main(int argc, char** argv) {
  bench::Options opt("bench_softmax", 10, 3, {{"workload", "softmax-1024x50257,log-softmax-1024x50257"}});
  opt.parse(argc, argv);
  const int64_t rows = 1024, n = 50257;
  const double bytes = 5.0 * double(rows * n) * sizeof(float);
  manual_seed(0);
  Tensor x = randn({rows, n}).requires_grad_();
  Tensor g = randn({rows, n});
  std::stringstream list(opt.str("workload"));
  std::string workload;
  while (std::getline(list, workload, ',')) {
    bool log;
    if (workload == "softmax-1024x50257") log = false;
    else if (workload == "log-softmax-1024x50257") log = true;
    else {
      std::fprintf(stderr, "bench_softmax: unknown workload %s (softmax-1024x50257 or log-softmax-1024x50257)\n",
                   workload.c_str());
      return 2;
    }
    auto step = [&] {
      x.zero_grad();
      (log ? x.log_softmax(-1) : x.softmax(-1)).backward(g);
    };
    bench::Timing t = bench::time_it(step, opt.reps, opt.warmup);
    bench::print_bytes_result(workload, t, omp_get_max_threads(), bytes);
  }
  return 0;
}
