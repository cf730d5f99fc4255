// sgemm-1024: times a.matmul(b) for two 1024 x 1024 float32 matrices of N(0, 1) values,
// as the sgemm-1024 workload of ../shared/reference/torch_reference.py does, once per
// CPU GEMM backend (native kernel, then OpenBLAS when linked). Prints one JSON line per
// backend in the reference's shape, plus the GFLOP/s rate.
//
//   bench_sgemm [--reps 20] [--warmup 3] [--n 1024]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "experiments/bench/timing.h"
#include "mumoe.h"
#include "ops/cpu/gemm.h"


int main(int argc, char** argv) {
  mu::bench::Options opt("bench_sgemm", 20, 3, {{"n", "1024"}});
  opt.parse(argc, argv);
  const int reps = opt.reps, warmup = opt.warmup;
  const int64_t n = opt.integer("n");

  mu::manual_seed(0);
  mu::Tensor a = mu::randn({n, n}), b = mu::randn({n, n});
  const std::string workload = n == 1024 ? "sgemm-1024" : "sgemm-" + std::to_string(n);

  std::vector<mu::cpu::GemmBackend> backends = {mu::cpu::GemmBackend::Native};
  if (mu::cpu::gemm_have_blas()) backends.push_back(mu::cpu::GemmBackend::Blas);
  for (auto be : backends) {
    mu::cpu::set_gemm_backend(be);
    mu::bench::Timing t = mu::bench::time_it([&] { a.matmul(b); }, reps, warmup);
    double gflops = 2.0 * double(n) * double(n) * double(n) / (t.median_ms * 1e-3) / 1e9;
    std::printf(
        "{\"workload\": \"%s\", \"impl\": \"mumoe-%s\", \"threads\": %d, \"median_ms\": %.3f, \"min_ms\": %.3f, "
        "\"max_ms\": %.3f, \"gflops\": %.1f}\n",
        workload.c_str(), mu::cpu::gemm_backend_name(be), omp_get_max_threads(), t.median_ms, t.min_ms, t.max_ms,
        gflops);
    std::fflush(stdout);
  }
  return 0;
}
