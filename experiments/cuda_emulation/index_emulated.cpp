// The indexing kernels of ops/cuda/index.cu (host side and kernels, as written) run
// under the host emulation and compared with brute-force loops: gather (a strided,
// wider x), scatter_add (the thread-per-line path and the sort-by-destination path),
// index_select, index_add_rows' per-row sums (repeated indices, several outer slices,
// rows wider than a block), cumsum (thread per line, inner > 1, and the block scan of
// few long lines, both directions) and sort_indices (the shared-memory and the
// global-workspace bitonic paths, ties, NaN, descending, k < n, inner > 1). The radix
// sort the scatter and index_add paths take from cub is stood in for by a host stable
// sort on the same key bits (cub itself is not emulated); everything around it runs.
#include "index_cuda.h"
#include <algorithm>
#include <cstdio>
#include <numeric>
#include <random>
using namespace mu;
namespace ck = mu::cuda_kernels;

static int failures = 0;
static void report(const char* what, bool ok) {
  printf("%s: %s\n", what, ok ? "ok" : "FAIL");
  failures += !ok;
}

// Row-major position i of `shape` as a multi-index.
static std::vector<int64_t> unravel(int64_t i, const Shape& shape) {
  std::vector<int64_t> c(shape.size());
  for (int64_t d = int64_t(shape.size()) - 1; d >= 0; --d) c[size_t(d)] = i % shape[size_t(d)], i /= shape[size_t(d)];
  return c;
}
static int64_t offset(const std::vector<int64_t>& c, const Shape& st) {
  int64_t o = 0;
  for (size_t d = 0; d < c.size(); ++d) o += c[d] * st[d];
  return o;
}

template <class T>
void gather_case(int64_t dim) {
  std::mt19937_64 rng(1);
  // x (5, 7, 6) read through a transposed view of a (6, 7, 5) buffer; index (4, 5, 3),
  // narrower than x off dim, values along dim in [0, x's size there).
  const Shape xs = {5, 7, 6}, is = {4, 5, 3};
  std::vector<T> xb(5 * 7 * 6);
  for (size_t i = 0; i < xb.size(); ++i) xb[i] = T(int(i % 97) - 40);
  const EmuTensor x = emu_view(xb, xs, {1, 5, 35});
  std::vector<int64_t> idx(4 * 5 * 3);
  for (auto& v : idx) v = int64_t(rng() % uint64_t(xs[size_t(dim)]));
  std::vector<T> out(idx.size(), T(-99));
  ck::gather(emu_view(out, is), x, dim, emu_view(idx, is));
  bool ok = true;
  for (int64_t i = 0; i < int64_t(idx.size()); ++i) {
    auto c = unravel(i, is);
    c[size_t(dim)] = idx[size_t(i)];
    ok = ok && out[size_t(i)] == xb[size_t(offset(c, x.st))];
  }
  char w[64];
  snprintf(w, sizeof w, "gather dim %ld (strided x)", dim);
  report(w, ok);
}

template <class T>
void scatter_case(const Shape& os, const Shape& is, int64_t dim, const char* what) {
  std::mt19937_64 rng(2);
  int64_t on = 1, in = 1;
  for (auto s : os) on *= s;
  for (auto s : is) in *= s;
  std::vector<T> out(static_cast<size_t>(on)), src(static_cast<size_t>(in));
  for (auto& v : out) v = T(int(rng() % 9));
  for (auto& v : src) v = T(std::is_integral_v<T> ? double(rng() % 100) : double(rng() % 1000) / 7.0);
  std::vector<int64_t> idx(static_cast<size_t>(in));
  for (auto& v : idx) v = int64_t(rng() % uint64_t(os[size_t(dim)]));
  std::vector<T> ref = out;
  Shape ost(os.size(), 1);
  for (int64_t d = int64_t(os.size()) - 2; d >= 0; --d) ost[size_t(d)] = ost[size_t(d) + 1] * os[size_t(d) + 1];
  // The CPU's order: index's elements in row-major order, each added into its element.
  for (int64_t i = 0; i < in; ++i) {
    auto c = unravel(i, is);
    c[size_t(dim)] = idx[size_t(i)];
    T& r = ref[size_t(offset(c, ost))];
    r = r + src[size_t(i)];
  }
  ck::scatter_add(emu_view(out, os), dim, emu_view(idx, is), emu_view(src, is));
  report(what, std::memcmp(out.data(), ref.data(), out.size() * sizeof(T)) == 0);
}

template <class T>
void index_rows_case(int64_t outer, int64_t n, int64_t m, int64_t inner, const char* what) {
  std::mt19937_64 rng(3);
  std::vector<T> x(size_t(outer * n * inner)), g(size_t(outer * m * inner));
  for (auto& v : x) v = T(double(rng() % 1000) / 3.0);
  for (auto& v : g) v = T(double(rng() % 1000) / 7.0);
  std::vector<int64_t> idx(static_cast<size_t>(m));
  for (auto& v : idx) v = int64_t(rng() % uint64_t(n));
  if (m > 2) idx[1] = idx[0];  // a repeated row
  std::vector<T> out(size_t(outer * m * inner), T(-1)), grad(size_t(outer * n * inner), T(0));
  ck::index_select(emu_view(out, {outer, m, inner}), emu_view(x, {outer, n, inner}), emu_view(idx, {m}), outer, n, m, inner);
  bool ok = true;
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < m; ++j)
      for (int64_t c = 0; c < inner; ++c) ok = ok && out[size_t((o * m + j) * inner + c)] == x[size_t((o * n + idx[size_t(j)]) * inner + c)];
  std::string w = std::string("index_select ") + what;
  report(w.c_str(), ok);
  // index_add_rows: sums in order of j, as the CPU adds them.
  std::vector<T> ref(grad.size(), T(0));
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < m; ++j)
      for (int64_t c = 0; c < inner; ++c) {
        T& r = ref[size_t((o * n + idx[size_t(j)]) * inner + c)];
        r = r + g[size_t((o * m + j) * inner + c)];
      }
  ck::index_add_rows(emu_view(grad, {outer, n, inner}), emu_view(g, {outer, m, inner}), emu_view(idx, {m}), outer, n, m, inner);
  w = std::string("index_add_rows ") + what;
  report(w.c_str(), std::memcmp(grad.data(), ref.data(), grad.size() * sizeof(T)) == 0);
}

template <class T>
void cumsum_case(int64_t outer, int64_t n, int64_t inner, bool reverse, const char* what) {
  std::mt19937_64 rng(4);
  std::vector<T> x(size_t(outer * n * inner)), out(x.size(), T(-5)), ref(x.size());
  for (auto& v : x) v = std::is_integral_v<T> ? T(int64_t(rng() % 2001) - 1000) : T(double(rng() % 2001) / 1000.0 - 1.0);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t c = 0; c < inner; ++c) {
      cuda::acc_t<T> acc = 0;
      for (int64_t s = 0; s < n; ++s) {
        const int64_t off = (o * n + (reverse ? n - 1 - s : s)) * inner + c;
        acc += cuda::acc_t<T>(x[size_t(off)]);
        ref[size_t(off)] = T(acc);
      }
    }
  ck::cumsum(emu_view(out, {outer, n, inner}), emu_view(x, {outer, n, inner}), outer, n, inner, reverse);
  // The block scan adds in another order: float32 results within a float rounding of the
  // sequential double sum, float64 within a few of its own; int64 exact.
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double d = std::abs(double(out[i]) - double(ref[i])) / std::max(1.0, std::abs(double(ref[i])));
    worst = std::isnan(d) ? INFINITY : std::max(worst, d);  // std::max would pass over a NaN
  }
  const double tol = std::is_integral_v<T> ? 0 : std::is_same_v<T, float> ? 1.2e-7 : 1e-13;
  char w[160];
  snprintf(w, sizeof w, "cumsum %s %s (%ld, %ld, %ld) reverse %d (rel err %.1e)",
           std::is_same_v<T, float> ? "f32" : std::is_same_v<T, double> ? "f64" : "i64", what, outer, n, inner, reverse, worst);
  report(w, worst <= tol);
}

template <class T>
void sort_case(int64_t outer, int64_t n, int64_t inner, int64_t k, bool descending, const char* what) {
  std::mt19937_64 rng(5);
  std::vector<T> x(size_t(outer * n * inner));
  for (auto& v : x) v = T(int64_t(rng() % 37));  // many ties
  if constexpr (!std::is_integral_v<T>) {
    for (size_t i = 3; i < x.size(); i += 11) x[i] = T(NAN);
    x[0] = T(-INFINITY);
  }
  std::vector<int64_t> idx(size_t(outer * k * inner), -1);
  ck::sort_indices(emu_view(idx, {outer, k, inner}), emu_view(x, {outer, n, inner}), outer, n, inner, k, descending);
  bool ok = true;
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t c = 0; c < inner; ++c) {
      auto at = [&](int64_t j) { return x[size_t((o * n + j) * inner + c)]; };
      std::vector<int64_t> p(static_cast<size_t>(n));
      std::iota(p.begin(), p.end(), 0);
      // NaN above every number; stable.
      std::stable_sort(p.begin(), p.end(), [&](int64_t a, int64_t b) {
        const T xa = at(a), xb = at(b);
        const bool na = xa != xa, nb = xb != xb;
        if (na || nb) return !na && nb ? !descending : na && !nb ? descending : false;
        return descending ? xa > xb : xa < xb;
      });
      for (int64_t j = 0; j < k; ++j) ok = ok && idx[size_t((o * k + j) * inner + c)] == p[size_t(j)];
    }
  char w[160];
  snprintf(w, sizeof w, "sort_indices %s %s (%ld, %ld, %ld) k %ld descending %d", std::is_same_v<T, float> ? "f32" : std::is_same_v<T, double> ? "f64" : "i64",
           what, outer, n, inner, k, descending);
  report(w, ok);
}

int main() {
  gather_case<float>(0);
  gather_case<int64_t>(1);
  gather_case<double>(2);
  scatter_case<float>({4, 6, 3}, {4, 5, 3}, 1, "scatter_add per line (m <= 64)");
  scatter_case<int64_t>({3, 4}, {2, 100}, 1, "scatter_add sorted by destination (m > 64, few lines)");
  scatter_case<double>({70, 3}, {90, 2}, 0, "scatter_add sorted by destination, dim 0 (strided lines)");
  index_rows_case<float>(2, 5, 7, 3, "(2, 5, 7, 3)");
  index_rows_case<double>(3, 4, 9, 300, "(3, 4, 9, 300): rows wider than 256 threads");
  index_rows_case<float>(1, 50, 1, 40, "(1, 50, 1, 40)");
  for (int r = 0; r < 2; ++r) {
    cumsum_case<float>(3, 5, 4, r, "per line, inner > 1");
    cumsum_case<int64_t>(300, 7, 1, r, "per line, more lines than a block");
    cumsum_case<float>(2, 2100, 1, r, "block scan");
    cumsum_case<double>(1, 3000, 1, r, "block scan");
    cumsum_case<int64_t>(1, 2048, 1, r, "block scan");
  }
  sort_case<float>(3, 5, 2, 5, false, "shared, inner > 1");
  sort_case<float>(2, 100, 1, 100, true, "shared");
  sort_case<double>(2, 33, 3, 7, false, "shared, k < n");
  sort_case<int64_t>(1, 1, 1, 1, false, "shared, n = 1");
  sort_case<int64_t>(2, 700, 1, 700, true, "shared");
  sort_case<float>(1, 2500, 1, 2500, false, "global workspace");
  sort_case<double>(1, 2049, 1, 10, true, "global workspace, k < n");
  printf("%s\n", failures ? "FAIL" : "PASS");
  return failures ? 1 : 0;
}
