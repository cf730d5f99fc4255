// The entmax kernels of ops/cuda/entmax.cu (host side and kernels, as written) run under
// the host emulation of emu.h / emu_host.h and compared with the CPU's line functions of
// ops/cpu/entmax.cpp (both extracted by run.sh): sparsemax must equal the CPU bit for
// bit (same sort, same sequential scan), entmax15 (Newton's steps on the CPU, the sort
// and scan here), the bisection and the backward up to a few roundings. Shapes take every path: lines of 1, 2, 37, 300,
// 4096 (the longest in shared memory) and 5000 (global workspace) elements, inner > 1,
// grid-stride loops over more lines than blocks (the kernel launched directly with a
// small grid, so shared and workspace arrays are reused), ties, -inf entries, and NaN,
// +inf and all -inf lines.
#include "entmax_cuda.h"
#include "entmax_cpu.h"
#include <cstdio>
#include <random>
using namespace mu;
using kernels::EntmaxKind;

static int failures = 0;

// y as the CPU computes it, line by line.
template <class T>
std::vector<T> cpu_forward(const std::vector<T>& x, int64_t outer, int64_t n, int64_t inner, EntmaxKind kind,
                           double alpha, int n_iter) {
  std::vector<T> y(x.size());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t c = 0; c < inner; ++c) {
      const int64_t off = o * n * inner + c;
      if (kind == EntmaxKind::Sparsemax) cpu::sparsemax_line(x.data() + off, y.data() + off, n, inner);
      else if (kind == EntmaxKind::Entmax15) cpu::entmax15_line(x.data() + off, y.data() + off, n, inner);
      else cpu::entmax_bisect_line(x.data() + off, y.data() + off, n, inner, alpha, n_iter);
    }
  return y;
}

// Largest |a - b| relative to max |b| (NaN positions must agree), and whether bit-equal.
template <class T>
double compare(const std::vector<T>& a, const std::vector<T>& b, bool& equal) {
  double m = 0, s = 0;
  equal = true;
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = double(a[i]), y = double(b[i]);
    if ((x != x) != (y != y)) return INFINITY;
    if (x != x) continue;
    equal = equal && x == y;
    m = std::max(m, std::abs(x - y));
    s = std::max(s, std::abs(y));
  }
  return m / (s > 0 ? s : 1);
}

template <class T>
void run(const char* what, int64_t outer, int64_t n, int64_t inner, int special, unsigned grid_override, int kinds,
         uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd;
  std::vector<T> x(size_t(outer * n * inner)), g(x.size());
  for (auto& v : x) v = T(nd(rng) * 1.5);
  for (auto& v : g) v = T(nd(rng));
  // Ties (a repeated value), -inf entries, and whole lines of NaN / +inf / -inf.
  if (special && n > 3) {
    x[0] = x[inner];
    x[2 * inner] = T(-INFINITY);
    if (outer > 3) {
      x[size_t(1 * n * inner + 1 * inner)] = T(NAN);
      x[size_t(2 * n * inner)] = T(INFINITY);
      for (int64_t j = 0; j < n; ++j) x[size_t((3 * n + j) * inner)] = T(-INFINITY);
    }
  }
  const EmuTensor xt = emu_view(x, {outer, n, inner});
  struct K { EntmaxKind kind; double alpha; const char* name; };
  const K ks[] = {{EntmaxKind::Sparsemax, 2, "sparsemax"}, {EntmaxKind::Entmax15, 1.5, "entmax15"},
                  {EntmaxKind::Bisect, 1.5, "bisect1.5"}, {EntmaxKind::Bisect, 1.25, "bisect1.25"},
                  {EntmaxKind::Bisect, 3, "bisect3"}, {EntmaxKind::Bisect, 1.7, "bisect1.7"}};
  double worst_f = 0, worst_b = 0;
  for (int ki = 0; ki < 6; ++ki) {
    const K& k = ks[ki];
    if (!(kinds >> ki & 1)) continue;  // long lines: a few kinds only (time)
    const int n_iter = n > 1000 ? 8 : 30;
    std::vector<T> y(x.size(), T(-7)), ref = cpu_forward(x, outer, n, inner, k.kind, k.alpha, n_iter);
    const EmuTensor yt = emu_view(y, {outer, n, inner});
    if (grid_override == 0) {
      cuda_kernels::entmax_forward(yt, xt, outer, n, inner, k.kind, k.alpha, n_iter);
    } else {
      // The host side's arguments with fewer blocks than lines: the grid-stride loop.
      const int64_t P = cuda::next_pow2(n);
      const bool shared = P <= cuda_kernels::kSharedMax;
      std::vector<double> ws(shared ? 0 : size_t(grid_override) * size_t(P));
      emu_launch(grid_override, unsigned(cuda_kernels::threads_for(P)), shared ? size_t(P) * 8 : 0, [&] {
        cuda_kernels::entmax_forward_kernel<T>(y.data(), x.data(), outer * inner, n, inner, k.kind, k.alpha, n_iter, P,
                                                shared ? nullptr : ws.data());
      });
    }
    bool eq;
    const double e = compare(y, ref, eq);
    // Sparsemax's sort and scan are the CPU's: bit-equal. The CPU finds entmax15's
    // threshold by Newton's steps and its closed form on the support (vector sums), the
    // GPU by the sort and the running scan: the same τ up to a few roundings. The
    // bisection's sums differ in order.
    const double tol = k.kind == EntmaxKind::Bisect ? (std::is_same_v<T, float> ? 1e-6 : 1e-12)
                       : k.kind == EntmaxKind::Entmax15 ? (std::is_same_v<T, float> ? 2.5e-7 : 1e-14)
                                                          : 0;
    const bool ok = k.kind == EntmaxKind::Sparsemax ? eq : e <= tol;
    failures += !ok;
    if (!ok) printf("  %s forward err %.2e%s  <-- FAIL\n", k.name, e, eq ? "" : " (not bit-equal)");
    worst_f = std::max(worst_f, e);
    // The backward from the CPU's y, e = 2 - α.
    std::vector<T> dx(x.size(), T(-7)), dref(x.size());
    const double ex = 2 - k.alpha;
    cpu::entmax_backward_lines(g.data(), ref.data(), dref.data(), outer, n, inner, ex);
    cuda_kernels::entmax_backward(emu_view(dx, {outer, n, inner}), emu_view(g, {outer, n, inner}),
                                  emu_view(ref, {outer, n, inner}), outer, n, inner, ex);
    const double eb = compare(dx, dref, eq);
    const bool okb = eb <= (std::is_same_v<T, float> ? 1e-6 : 1e-12);
    failures += !okb;
    if (!okb) printf("  %s backward err %.2e  <-- FAIL\n", k.name, eb);
    worst_b = std::max(worst_b, eb);
  }
  printf("%s %s (%ld, %ld, %ld) grid %s: worst forward err %.2e (sparsemax bit-equal), backward %.2e\n", what,
         std::is_same_v<T, float> ? "f32" : "f64", outer, n, inner, grid_override ? "of 2 blocks" : "as launched", worst_f, worst_b);
}

int main() {
  for (int f = 0; f < 2; ++f) {
    // kinds: a mask over sparsemax, entmax15, bisect α = 1.5, 1.25, 3, 1.7.
    auto go = [&](const char* w, int64_t o, int64_t n, int64_t i, int sp, unsigned gr, int kinds = 63) {
      if (f == 0) run<float>(w, o, n, i, sp, gr, kinds, 11 + n);
      else run<double>(w, o, n, i, sp, gr, kinds, 11 + n);
    };
    go("n=1", 3, 1, 1, 0, 0);
    go("n=2", 2, 2, 3, 0, 0);
    go("inner>1 specials", 5, 6, 3, 1, 0);
    go("warp-size block", 6, 37, 1, 1, 0);
    go("256 threads", 2, 300, 1, 0, 0, 1 | 2 | 4 | 32);
    go("grid-stride shared", 5, 40, 2, 1, 2);
    if (f == 1) {
      go("longest shared", 1, 4096, 1, 1, 0, 2);
      go("global workspace", 1, 5000, 1, 1, 0, 1 | 4);
      go("grid-stride workspace", 3, 4200, 1, 0, 2, 2);
    }
  }
  printf("%s\n", failures ? "FAIL" : "PASS");
  return failures ? 1 : 0;
}
