// sgemm-1024: times a.matmul(b) for two 1024 x 1024 float32 matrices of N(0, 1) values,
// as the sgemm-1024 workload of ../shared/reference/torch_reference.py does, once per
// CPU GEMM backend (native kernel, then OpenBLAS when linked). Prints one JSON line per
// backend in the reference's shape, plus the GFLOP/s rate.
//
//   bench_sgemm [--reps 20] [--warmup 3] [--n 1024] [--shape MxKxN] [--weight 0|1]
//               [--transposed-a 0|1]
//
// --shape times an M x K by K x N product instead (workload sgemm-MxKxN), e.g. an
// MLP-Mixer's channel products, 6272x128x512 and 6272x512x128; --weight 1 takes b as the
// transpose of an N x K weight, as a Linear layer's x · wᵀ reads it; --transposed-a 1
// takes a as the transpose of a K x M matrix, as a Linear layer's weight gradient gᵀ · x
// reads the output gradient g (e.g. 128x6272x512, the Mixer's second channel layer).
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
  mu::bench::Options opt("bench_sgemm", 20, 3, {{"n", "1024"}, {"shape", ""}, {"weight", "0"}, {"transposed-a", "0"}});
  opt.parse(argc, argv);
  const int reps = opt.reps, warmup = opt.warmup;
  int64_t M = opt.integer("n"), K = M, N = M;
  std::string workload = M == 1024 ? "sgemm-1024" : "sgemm-" + std::to_string(M);
  if (const std::string& shape = opt.str("shape"); !shape.empty()) {
    long long m = 0, k = 0, n = 0;
    char tail = 0;
    if (std::sscanf(shape.c_str(), "%lldx%lldx%lld%c", &m, &k, &n, &tail) != 3 || m < 1 || k < 1 || n < 1) {
      std::fprintf(stderr, "bench_sgemm: --shape %s is not MxKxN with three positive sizes (e.g. 6272x128x512)\n",
                   shape.c_str());
      return 2;
    }
    M = m, K = k, N = n;
    workload = "sgemm-" + shape;
  }
  const bool weight = opt.flag("weight");
  if (weight) workload += "-weight";
  const bool transposed_a = opt.flag("transposed-a");
  if (transposed_a) workload += "-at";

  mu::manual_seed(0);
  mu::Tensor a = transposed_a ? mu::randn({K, M}).t() : mu::randn({M, K});
  mu::Tensor b = weight ? mu::randn({N, K}).t() : mu::randn({K, N});

  std::vector<mu::cpu::GemmBackend> backends = {mu::cpu::GemmBackend::Native};
  if (mu::cpu::gemm_have_blas()) backends.push_back(mu::cpu::GemmBackend::Blas);
  for (auto be : backends) {
    mu::cpu::set_gemm_backend(be);
    mu::bench::Timing t = mu::bench::time_it([&] { a.matmul(b); }, reps, warmup);
    double gflops = 2.0 * double(M) * double(N) * double(K) / (t.median_ms * 1e-3) / 1e9;
    std::printf(
        "{\"workload\": \"%s\", \"impl\": \"mumoe-%s\", \"threads\": %d, \"median_ms\": %.3f, \"min_ms\": %.3f, "
        "\"max_ms\": %.3f, \"gflops\": %.1f}\n",
        workload.c_str(), mu::cpu::gemm_backend_name(be), omp_get_max_threads(), t.median_ms, t.min_ms, t.max_ms,
        gflops);
    std::fflush(stdout);
  }
  return 0;
}
