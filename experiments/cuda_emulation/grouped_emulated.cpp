// The host side of ops/cuda/grouped_mm.cu (as written) under the host emulation, cuBLAS
// stood in for by emu_cublas.h, against brute-force sums: grouped_mm and its weight
// gradient for float32, float64 and bfloat16, with empty groups (first, middle, last),
// x row-major, column-major or with padded rows, w dense, transposed in its last two dims
// or one matrix broadcast over the groups (group stride 0), K = 0, one group, and the
// grouped call refused (the per-group loop). Outputs start as NaN garbage.
#include "grouped_cuda.h"
#include <cmath>
#include <cstdio>
#include <random>
#include "emu_convert.h"
using namespace mu;
namespace ck = mu::cuda_kernels;

namespace mu::cuda {
cublasHandle_t cublas(int) { return nullptr; }  // the stand-ins ignore the handle
}  // namespace mu::cuda

static int failures = 0;

// A (rows, cols) matrix over its own buffer with strides (sr, sc).
template <class T>
struct Strided {
  std::vector<T> buf;
  int64_t sr, sc;
  double at(int64_t i, int64_t j, int64_t base = 0) const { return to_d(buf[size_t(base + i * sr + j * sc)]); }
};

template <class T>
void run(const std::vector<int64_t>& offsets, int64_t K, int64_t N, int x_layout, int w_layout, bool grouped,
         std::mt19937& g) {
  std::normal_distribution<double> nd;
  const int64_t G = int64_t(offsets.size()) - 1, M = offsets.back();
  // x (M, K): row-major, column-major, padded rows.
  Strided<T> x;
  x.sr = x_layout == 1 ? 1 : x_layout == 2 ? K + 3 : K;
  x.sc = x_layout == 1 ? M : 1;
  x.buf.resize(size_t(std::max<int64_t>(1, M * std::max<int64_t>(K, 1) + 3 * M)));
  for (auto& v : x.buf) v = from_d<T>(nd(g));
  // w (G, K, N): dense, transposed matrices, or one matrix for every group.
  const int64_t wsg = w_layout == 2 ? 0 : K * N, wsr = w_layout == 1 ? 1 : N, wsc = w_layout == 1 ? K : 1;
  std::vector<T> w(size_t(std::max<int64_t>(1, (w_layout == 2 ? 1 : G) * K * N)));
  for (auto& v : w) v = from_d<T>(nd(g));
  std::vector<T> dy(size_t(M * N));
  for (auto& v : dy) v = from_d<T>(nd(g));
  std::vector<T> out(size_t(M * N), from_d<T>(NAN)), dw(size_t(G * K * N), from_d<T>(NAN));
  const EmuTensor xt = emu_view(x.buf, {M, K}, {x.sr, x.sc});
  emu_cublas_grouped = grouped;
  ck::grouped_mm(emu_view(out, {M, N}), xt, emu_view(w, {G, K, N}, {wsg, wsr, wsc}), offsets);
  ck::grouped_mm_weight_grad(emu_view(dw, {G, K, N}), xt, emu_view(dy, {M, N}), offsets);
  const double tol = std::is_same_v<T, double> ? 1e-14 : std::is_same_v<T, float> ? 1e-6 : 5e-3;
  double worst = 0;
  auto check = [&](double got, double s, double mag) {
    worst = std::max(worst, std::isfinite(got) ? std::abs(got - s) / (mag + 1e-30) : INFINITY);
  };
  for (int64_t gi = 0; gi < G; ++gi) {
    for (int64_t r = offsets[size_t(gi)]; r < offsets[size_t(gi) + 1]; ++r)
      for (int64_t j = 0; j < N; ++j) {
        double s = 0, mag = 0;
        for (int64_t k = 0; k < K; ++k) {
          const double t = x.at(r, k) * to_d(w[size_t(gi * wsg + k * wsr + j * wsc)]);
          s += t, mag += std::abs(t);
        }
        check(to_d(out[size_t(r * N + j)]), s, mag);
      }
    for (int64_t k = 0; k < K; ++k)
      for (int64_t j = 0; j < N; ++j) {
        double s = 0, mag = 0;
        for (int64_t r = offsets[size_t(gi)]; r < offsets[size_t(gi) + 1]; ++r) {
          const double t = x.at(r, k) * to_d(dy[size_t(r * N + j)]);
          s += t, mag += std::abs(t);
        }
        check(to_d(dw[size_t((gi * K + k) * N + j)]), s, mag);
      }
  }
  const bool ok = worst <= tol;
  failures += !ok;
  if (!ok)
    printf("  FAIL: %s G %ld M %ld K %ld N %ld, x layout %d, w layout %d, %s: worst %.2e\n",
           std::is_same_v<T, double> ? "f64" : std::is_same_v<T, float> ? "f32" : "bf16", G, M, K, N, x_layout,
           w_layout, grouped ? "grouped" : "per group", worst);
}

template <class T>
void sweep(const char* name) {
  std::mt19937 g(5);
  const std::vector<std::vector<int64_t>> offsets = {{0, 0, 3, 3, 10, 11, 11}, {0, 7}, {0, 2, 5, 9}, {0, 0, 0}};
  int n = 0;
  const int before = failures;
  for (const auto& off : offsets)
    for (int64_t K : {0, 1, 5})
      for (int xl = 0; xl < 3; ++xl)
        for (int wl = 0; wl < 3; ++wl)
          for (bool grouped : {true, false}) {
            if (K == 0 && xl == 1) continue;  // a (M, 0) column-major view has no extent to lay out
            run<T>(off, K, 3 + n % 4, xl, wl, grouped, g);
            ++n;
          }
  printf("grouped_mm and its weight gradient, %s: %d cases (empty groups, layouts, K = 0, grouped and per group): %s\n",
         name, n, failures == before ? "ok" : "FAIL");
}

int main() {
  return emu_each_float_type([](auto tag, const char* name) { sweep<decltype(tag)>(name); }, failures);
}
