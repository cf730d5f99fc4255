// CPU kernels of layer_norm and batch_norm (declared in ops/kernels/norm.h). Statistics
// are sums carried in double: for float32 one pass of shifted sums (row_moments for a
// layer_norm row, channel_moments_f32 for a batch_norm channel), for float64 two passes
// (the mean, then the squared deviations from it). Sums over rows that different threads
// own (parameter gradients, batch statistics) are summed per thread into private arrays
// that are added up afterwards in thread order: no races, and the same result for the
// same thread count.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "ops/cpu/loops.h"
#include "ops/cpu/simd.h"
#include "ops/kernels/norm.h"

namespace mu::cpu {

// How many threads a kernel over `total` elements uses: one below the grain (start-up
// would cost more than the work), and one inside an enclosing parallel region.
static int threads_for(int64_t total) {
  return total >= kParallelGrain && !omp_in_parallel() ? omp_get_max_threads() : 1;
}

// Adds up per-thread partial arrays [threads][len] into out[len], in thread order.
template <class A>
static std::vector<A> sum_partials(const std::vector<A>& part, int threads, size_t len) {
  std::vector<A> out(len, A(0));
  for (int t = 0; t < threads; ++t)
    for (size_t j = 0; j < len; ++j) out[j] += part[size_t(t) * len + j];
  return out;
}

// ---------------------------------------------------------------- float32 row sums
//
// Two double sums over a float32 row in one pass, on vectors: each group of kWD floats is
// widened to a vector of doubles and its two terms added into the next of four
// accumulators per sum, so that eight dependency chains overlap. (Two passes of one
// `omp simd reduction` chain each, the mean and then the deviations from it, bound
// LayerNorm's forward at about 100 cycles a row of 128 on Zen 5, more than its memory
// traffic.) Accumulators and lanes are combined in a fixed order: a row's own values
// alone decide its results, whatever the thread count.
namespace {

using VD = Vec<double>::type;
constexpr int kWD = Vec<double>::width;
using WidenF = HalfFloats;  // kWD floats

[[gnu::always_inline]] inline WidenF load_widen(const float* p) {
  WidenF h;
  std::memcpy(&h, p, sizeof(h));
  return h;
}
[[gnu::always_inline]] inline VD widen(const float* p) { return widen_to_double(load_widen(p)); }

double lanes_sum(VD v) {
  double s = 0;
  for (int l = 0; l < kWD; ++l) s += v[l];
  return s;
}

// (Σ u_j, Σ v_j) over j in [0, n): terms(j, u, v) sets the VD terms of elements j ..
// j + kWD - 1, tail(j, u, v) the double terms of one of the last n mod kWD elements.
template <class Terms, class Tail>
[[gnu::always_inline]] inline void row_sums(int64_t n, double& su, double& sv, Terms terms, Tail tail) {
  VD u[4] = {}, v[4] = {};
  int64_t j = 0;
  for (; j + 4 * kWD <= n; j += 4 * kWD)
    for (int k = 0; k < 4; ++k) {
      VD tu, tv;
      terms(j + k * kWD, tu, tv);
      u[k] += tu;
      v[k] += tv;
    }
  for (; j + kWD <= n; j += kWD) {
    VD tu, tv;
    terms(j, tu, tv);
    u[0] += tu;
    v[0] += tv;
  }
  su = lanes_sum((u[0] + u[1]) + (u[2] + u[3]));
  sv = lanes_sum((v[0] + v[1]) + (v[2] + v[3]));
  for (; j < n; ++j) {
    double tu, tv;
    tail(j, tu, tv);
    su += tu;
    sv += tv;
  }
}

// (Σd, Σd²) over the deviations d = x[j] - shift of x[0, n).
[[gnu::always_inline]] inline void shifted_sums(const float* x, int64_t n, double shift, double& s1, double& s2) {
  row_sums(
      n, s1, s2,
      [&](int64_t j, VD& u, VD& v) {
        u = widen(x + j) - shift;
        v = u * u;
      },
      [&](int64_t j, double& u, double& v) {
        u = double(x[j]) - shift;
        v = u * u;
      });
}

// The mean and the biased variance of a row in one pass, from the deviations d = x - c
// from its first element c: mean = c + Σd / n, var = Σd² / n - (Σd / n)². The shift
// bounds the cancellation: (c - mean)² <= n var, as c is one of the values, so the
// subtraction loses at most a factor n + 1 of the double sums' relative error (about
// 1e-12 for rows of 10^4), where an unshifted Σx² / n - mean² would lose (mean / std)².
void row_moments(const float* x, int64_t n, double& mean, double& var) {
  // An infinite or NaN shift would make every difference NaN or infinite, a -inf row's
  // mean NaN instead of -inf (the two-pass sums' and the CUDA kernel's result): the shift
  // is 0 then. An empty row has none.
  const double c = n > 0 && std::isfinite(x[0]) ? double(x[0]) : 0.0;
  double s1, s2;
  shifted_sums(x, n, c, s1, s2);
  const double ms = s1 / double(n);
  mean = c + ms;
  const double v = s2 / double(n) - ms * ms;
  var = v < 0 ? 0.0 : v;  // a constant row can round to a tiny negative; NaN (a non-finite row, n = 0) stays
}

// The backward's first pass over a row: Σ gw and Σ gw xh with gw = g w (g where w is
// null) and xh = (x - m) rs, and, where fw / fb are given, fw += g xh and fb += g (the
// weight's and the bias's block sums). The terms are computed in float32 as the dx pass
// computes them and summed in double: the sums then carry no error the dx pass's own
// roundings do not already have, and each group of kWD elements takes two conversions.
// One pass for all four: g, x and xh are loaded and computed once.
void row_grad_sums(const float* g, const float* x, const float* w, float m, float rs, int64_t n, double& s1,
                   double& s2, float* fw, float* fb) {
  row_sums(
      n, s1, s2,
      [&](int64_t j, VD& u, VD& v) {
        const WidenF gv = load_widen(g + j), xh = (load_widen(x + j) - m) * rs;
        const WidenF gw = w ? gv * load_widen(w + j) : gv;
        if (fw) {
          const WidenF s = load_widen(fw + j) + gv * xh;
          std::memcpy(fw + j, &s, sizeof(s));
        }
        if (fb) {
          const WidenF s = load_widen(fb + j) + gv;
          std::memcpy(fb + j, &s, sizeof(s));
        }
        u = widen_to_double(gw);
        v = widen_to_double(gw * xh);
      },
      [&](int64_t j, double& u, double& v) {
        const float xh = (x[j] - m) * rs, gw = w ? g[j] * w[j] : g[j];
        if (fw) fw[j] += g[j] * xh;
        if (fb) fb[j] += g[j];
        u = double(gw);
        v = double(gw * xh);
      });
}

}  // namespace

// ---------------------------------------------------------------- layer_norm

template <class T>
static void layer_norm_forward_rows(const T* x, const T* w, const T* b, T* y, T* mean, T* rstd, int64_t rows,
                                    int64_t n, double eps) {
  using A = acc_t<T>;
  const bool par = threads_for(rows * n) > 1 && rows > 1;
  parallel_for_if(rows, par, [&](int64_t r) {
    const T* xr = x + r * n;
    T* yr = y + r * n;
    A m, var;  // the mean and the biased variance, as torch's
    if constexpr (std::is_same_v<T, float>) {
      row_moments(xr, n, m, var);
    } else {
      A s = 0;
      // omp simd lets the sum be split into vector lanes (a fixed order, so deterministic).
#pragma omp simd reduction(+ : s)
      for (int64_t j = 0; j < n; ++j) s += A(xr[j]);
      m = s / A(n);
      A v = 0;
#pragma omp simd reduction(+ : v)
      for (int64_t j = 0; j < n; ++j) {
        A d = A(xr[j]) - m;
        v += d * d;
      }
      var = v / A(n);
    }
    const A rs = A(1) / std::sqrt(var + A(eps));
    mean[r] = T(m);
    rstd[r] = T(rs);
    // The elementwise pass in T: the statistics are what needed the wide type.
    const T mt = T(m), rt = T(rs);
    // One loop per affine form, so that none tests a pointer per element.
    if (w && b)
      for (int64_t j = 0; j < n; ++j) yr[j] = (xr[j] - mt) * rt * w[j] + b[j];
    else if (w)
      for (int64_t j = 0; j < n; ++j) yr[j] = (xr[j] - mt) * rt * w[j];
    else if (b)
      for (int64_t j = 0; j < n; ++j) yr[j] = (xr[j] - mt) * rt + b[j];
    else
      for (int64_t j = 0; j < n; ++j) yr[j] = (xr[j] - mt) * rt;
  });
}

// With xh = (x - mean) rstd and gw = g w (g without weight), per row:
//   dx = rstd (gw - mean_j(gw) - xh mean_j(gw xh)),
// and over rows dweight = sum g xh, dbias = sum g.
template <class T>
static void layer_norm_backward_rows(const T* g, const T* x, const T* mean, const T* rstd, const T* w, T* dx, T* dw,
                                     T* db, int64_t rows, int64_t n) {
  using A = acc_t<T>;
  const int nt = rows > 1 ? threads_for(rows * n) : 1;
  // Per-thread column sums for dweight and dbias: [thread][n] each.
  std::vector<A> part_w(dw ? size_t(nt) * size_t(n) : 0, A(0)), part_b(db ? size_t(nt) * size_t(n) : 0, A(0));
  parallel_team(nt, [&](int t, int tn) {
    // A static block of rows per thread: which rows a partial sum holds depends on the
    // thread count only.
    const int64_t r0 = rows * t / tn, r1 = rows * (t + 1) / tn;
    A* pw = dw ? part_w.data() + size_t(t) * size_t(n) : nullptr;
    A* pb = db ? part_b.data() + size_t(t) * size_t(n) : nullptr;
    // dweight and dbias of a block of kBlock rows in T, then added into the A partials:
    // the per-row work stays in T (8 floats per AVX2 vector, no conversions) and one
    // block's rounding is that of kBlock terms.
    constexpr int64_t kBlock = 32;
    std::vector<T> bw(pw ? size_t(n) : 0, T(0)), bb(pb ? size_t(n) : 0, T(0));
    auto flush = [&] {
      for (int64_t j = 0; j < (pw ? n : 0); ++j) { pw[j] += A(bw[size_t(j)]); bw[size_t(j)] = T(0); }
      for (int64_t j = 0; j < (pb ? n : 0); ++j) { pb[j] += A(bb[size_t(j)]); bb[size_t(j)] = T(0); }
    };
    T* fw = pw ? bw.data() : nullptr;
    T* fb = pb ? bb.data() : nullptr;
    for (int64_t r = r0; r < r1; ++r) {
      const T* gr = g + r * n;
      const T* xr = x + r * n;
      const T m = mean[r], rs = rstd[r];
      bool sums_done = false;  // fw and fb already updated with the row
      if (dx) {
        A s1 = 0, s2 = 0;  // sum gw, sum gw xh
        if constexpr (std::is_same_v<T, float>) {
          row_grad_sums(gr, xr, w, m, rs, n, s1, s2, fw, fb);
          sums_done = true;
        } else {
#pragma omp simd reduction(+ : s1, s2)
          for (int64_t j = 0; j < n; ++j) {
            A gw = w ? A(gr[j]) * A(w[j]) : A(gr[j]);
            s1 += gw;
            s2 += gw * A((xr[j] - m) * rs);
          }
        }
        const T c1 = T(s1 / A(n)), c2 = T(s2 / A(n));
        T* dr = dx + r * n;
        if (w)
          for (int64_t j = 0; j < n; ++j) dr[j] = rs * (gr[j] * w[j] - c1 - (xr[j] - m) * rs * c2);
        else
          for (int64_t j = 0; j < n; ++j) dr[j] = rs * (gr[j] - c1 - (xr[j] - m) * rs * c2);
      }
      if (fw && !sums_done)
        for (int64_t j = 0; j < n; ++j) fw[j] += gr[j] * ((xr[j] - m) * rs);
      if (fb && !sums_done)
        for (int64_t j = 0; j < n; ++j) fb[j] += gr[j];
      if ((r - r0) % kBlock == kBlock - 1) flush();
    }
    flush();
  });
  if (dw) {
    std::vector<A> s = sum_partials(part_w, nt, size_t(n));
    for (int64_t j = 0; j < n; ++j) dw[j] = T(s[size_t(j)]);
  }
  if (db) {
    std::vector<A> s = sum_partials(part_b, nt, size_t(n));
    for (int64_t j = 0; j < n; ++j) db[j] = T(s[size_t(j)]);
  }
}

// The data of an optional tensor, or null.
template <class T>
static T* ptr_or_null(const Tensor& t) {
  return t.defined() ? t.data_ptr<T>() : nullptr;
}

static void layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& y,
                               const Tensor& mean, const Tensor& rstd, int64_t rows, int64_t n, double eps) {
  MU_DISPATCH_FLOAT(x.dtype(), "layer_norm_forward", [&] {
    layer_norm_forward_rows(x.data_ptr<scalar_t>(), ptr_or_null<scalar_t>(weight), ptr_or_null<scalar_t>(bias),
                            y.data_ptr<scalar_t>(), mean.data_ptr<scalar_t>(), rstd.data_ptr<scalar_t>(), rows, n,
                            eps);
  });
}

static void layer_norm_backward(const Tensor& g, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                                const Tensor& weight, const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                                int64_t rows, int64_t n) {
  MU_DISPATCH_FLOAT(x.dtype(), "layer_norm_backward", [&] {
    layer_norm_backward_rows(g.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(), mean.data_ptr<scalar_t>(),
                             rstd.data_ptr<scalar_t>(), ptr_or_null<scalar_t>(weight), ptr_or_null<scalar_t>(dx),
                             ptr_or_null<scalar_t>(dweight), ptr_or_null<scalar_t>(dbias), rows, n);
  });
}

MU_REGISTER_KERNEL(kernels::layer_norm_forward, DeviceType::CPU, layer_norm_forward);
MU_REGISTER_KERNEL(kernels::layer_norm_backward, DeviceType::CPU, layer_norm_backward);

// ---------------------------------------------------------------- batch_norm
//
// x is viewed as (outer, c, inner). With inner == 1 (an (N, C) or channels-last input)
// a row of c elements holds one value of every channel, and the loops run along rows;
// otherwise every (o, k) pair is a contiguous line of `inner` values of channel k.

// Calls f(e, k) for every element e (flat index) of channel k, on several threads when
// large enough. Elements are disjoint, so f may write to e.
template <class F>
static void for_each_channel_element(int64_t outer, int64_t c, int64_t inner, F f) {
  const int64_t total = outer * c * inner;
  if (inner == 1) {
    const bool par = threads_for(total) > 1 && outer > 1;
    parallel_for_if(outer, par, [&](int64_t o) { for (int64_t k = 0; k < c; ++k) f(o * c + k, k); });
  } else {
    const int64_t lines = outer * c;
    const bool par = threads_for(total) > 1 && lines > 1;
    parallel_for_if(lines, par, [&](int64_t l) {
      const int64_t k = l % c, base = l * inner;
      for (int64_t i = 0; i < inner; ++i) f(base + i, k);
    });
  }
}

// S per-channel sums: term(e, k, acc, st) adds element e's S terms into acc[0], acc[st],
// ..., acc[(S-1) st]. Returns them as [S][c]. Each thread sums a static block of rows
// (or lines) into its own [S][c] array; the arrays are added in thread order.
template <int S, class A, class Term>
static std::vector<A> channel_sums(int64_t outer, int64_t c, int64_t inner, Term term) {
  const size_t len = size_t(S) * size_t(c);
  const int nt = threads_for(outer * c * inner);
  std::vector<A> part(size_t(nt) * len, A(0));
  parallel_team(nt, [&](int t, int tn) {
    A* p = part.data() + size_t(t) * len;
    if (inner == 1) {
      // A row adds one term to every channel: p[k] with stride c between the S sums,
      // a contiguous loop over k.
      const int64_t o0 = outer * t / tn, o1 = outer * (t + 1) / tn;
      for (int64_t o = o0; o < o1; ++o)
        for (int64_t k = 0; k < c; ++k) term(o * c + k, k, p + k, c);
    } else {
      const int64_t lines = outer * c, l0 = lines * t / tn, l1 = lines * (t + 1) / tn;
      for (int64_t l = l0; l < l1; ++l) {
        const int64_t k = l % c, base = l * inner;
        A acc[S] = {};  // the line's own sums: one add per line into p
        for (int64_t i = 0; i < inner; ++i) term(base + i, k, acc, 1);
        for (int s = 0; s < S; ++s) p[size_t(s) * size_t(c) + size_t(k)] += acc[s];
      }
    }
  });
  return sum_partials(part, nt, len);
}

// ---------------------------------------------------------------- float32 channel sums
//
// The float32 statistics on vectors, summed in double. With channels along the rows
// (inner == 1) a thread's rows are taken in blocks that stay in L1, and within a block
// kWD channels at a time, their sums in registers across the block's rows (four rows at
// a time, eight dependency chains): the generic loop above adds every row into memory,
// one store-to-load chain per channel a row. Lines (inner > 1) are summed as LayerNorm's
// rows (row_sums) and combined per channel. A thread's partial sums go to its own slice
// of the partial arrays, added in thread order: the same result for the same thread count.
namespace {

constexpr int64_t kRowBlock = 64;  // rows of a block: 64 x 64 channels is 16 KB

// Channels rounded up to whole vectors of doubles: the length of the per-channel double
// arrays below, whose lanes past c are zero.
int64_t padded_channels(int64_t c) { return (c + kWD - 1) / kWD * kWD; }

// n <= kWD floats from p widened to doubles, the lanes past n zero.
template <bool Full>
[[gnu::always_inline]] inline VD widen_first(const float* p, int64_t n) {
  if constexpr (Full) {
    return widen(p);
  } else {
    WidenF h{};
    for (int64_t i = 0; i < n; ++i) h[i] = p[i];
    return widen_to_double(h);
  }
}

[[gnu::always_inline]] inline VD load_vd(const double* p) {
  VD v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
[[gnu::always_inline]] inline void add_vd(double* p, VD v) {
  v += load_vd(p);
  std::memcpy(p, &v, sizeof(v));
}

// Adds the per-channel sums (Σu, Σv) over rows [r0, r1) of row-major (rows, c) data to
// su[0, cp) and sv[0, cp) (cp = padded_channels(c)). terms(full, e, j, n, u, v) sets the
// terms of channels j .. j + n - 1 (n <= kWD) of the row whose first element is e, zero
// in the lanes past n; `full` is std::true_type when n == kWD.
template <class Terms>
void row_channel_sums(int64_t r0, int64_t r1, int64_t c, double* su, double* sv, Terms terms) {
  for (int64_t b0 = r0; b0 < r1; b0 += kRowBlock) {
    const int64_t b1 = std::min(b0 + kRowBlock, r1);
    for (int64_t j = 0; j < c; j += kWD) {
      const int64_t n = std::min<int64_t>(kWD, c - j);
      auto block = [&](auto full) {
        VD u[4] = {}, v[4] = {};
        int64_t r = b0;
        for (; r + 4 <= b1; r += 4)
          for (int q = 0; q < 4; ++q) {
            VD tu, tv;
            terms(full, (r + q) * c, j, n, tu, tv);
            u[q] += tu;
            v[q] += tv;
          }
        for (; r < b1; ++r) {
          VD tu, tv;
          terms(full, r * c, j, n, tu, tv);
          u[0] += tu;
          v[0] += tv;
        }
        add_vd(su + j, (u[0] + u[1]) + (u[2] + u[3]));
        add_vd(sv + j, (v[0] + v[1]) + (v[2] + v[3]));
      };
      if (n == kWD) block(std::true_type{});
      else block(std::false_type{});
    }
  }
}

// Per-channel (Σu, Σv) of (outer, c, inner) float32 data, in double, as [2][c]. Channels
// along the rows (inner == 1): row_channel_sums with row_terms. Lines (inner > 1):
// line_sums(l, su, sv) sums line l (channel l mod c). Each thread's rows or lines go into
// its own [2][cp] slice, added up in thread order (sum_partials).
template <class RowTerms, class LineSums>
std::vector<double> channel_pair_sums(int64_t outer, int64_t c, int64_t inner, RowTerms row_terms,
                                      LineSums line_sums) {
  const int nt = threads_for(outer * c * inner);
  const int64_t cp = padded_channels(c);
  std::vector<double> part(size_t(nt) * 2 * size_t(cp), 0.0);
  parallel_team(nt, [&](int t, int tn) {
    double* su = part.data() + size_t(t) * 2 * size_t(cp);
    double* sv = su + cp;
    if (inner == 1) return row_channel_sums(outer * t / tn, outer * (t + 1) / tn, c, su, sv, row_terms);
    const int64_t lines = outer * c, l0 = lines * t / tn, l1 = lines * (t + 1) / tn;
    for (int64_t l = l0; l < l1; ++l) {
      double s1, s2;
      line_sums(l, s1, s2);
      su[l % c] += s1;
      sv[l % c] += s2;
    }
  });
  std::vector<double> s = sum_partials(part, nt, 2 * size_t(cp));  // [2][cp]
  s.erase(s.begin() + c, s.begin() + cp);                             // [2][c]
  s.resize(2 * size_t(c));
  return s;
}

// Per-channel mean and biased variance of (outer, c, inner) float32 x, in one pass of
// shifted double sums (row_moments' scheme: the shift of channel k is one of its values,
// x at (0, k, 0), or 0 where that is not finite).
void channel_moments_f32(const float* x, int64_t outer, int64_t c, int64_t inner, std::vector<double>& mean,
                         std::vector<double>& var) {
  std::vector<double> shift(size_t(padded_channels(c)), 0.0);
  for (int64_t k = 0; k < c; ++k) {
    const float first = x[k * inner];  // (0, k, 0)
    shift[size_t(k)] = std::isfinite(first) ? double(first) : 0.0;
  }
  const double* sp = shift.data();
  const std::vector<double> s = channel_pair_sums(
      outer, c, inner,
      [=](auto full, int64_t e, int64_t j, int64_t cnt, VD& u, VD& v) {
        u = widen_first<decltype(full)::value>(x + e + j, cnt) - load_vd(sp + j);
        v = u * u;
      },
      [=](int64_t l, double& s1, double& s2) { shifted_sums(x + l * inner, inner, sp[l % c], s1, s2); });
  const double n = double(outer * inner);
  mean.assign(size_t(c), 0.0);
  var.assign(size_t(c), 0.0);
  for (int64_t k = 0; k < c; ++k) {
    const double ms = s[size_t(k)] / n, v = s[size_t(c + k)] / n - ms * ms;
    mean[size_t(k)] = sp[k] + ms;
    var[size_t(k)] = v < 0 ? 0.0 : v;  // rounding below 0 for a constant channel; NaN stays
  }
}

// The backward's per-channel sums of float32 g and x in double, as [2][c]: Σ g, then
// Σ g (x - mean).
std::vector<double> channel_grad_sums_f32(const float* g, const float* x, const float* mean, int64_t outer,
                                          int64_t c, int64_t inner) {
  std::vector<double> m(size_t(padded_channels(c)), 0.0);
  for (int64_t k = 0; k < c; ++k) m[size_t(k)] = double(mean[k]);
  const double* mp = m.data();
  return channel_pair_sums(
      outer, c, inner,
      [=](auto full, int64_t e, int64_t j, int64_t cnt, VD& u, VD& v) {
        constexpr bool kFull = decltype(full)::value;
        u = widen_first<kFull>(g + e + j, cnt);
        v = u * (widen_first<kFull>(x + e + j, cnt) - load_vd(mp + j));
      },
      [=](int64_t l, double& s1, double& s2) {
        const float *gl = g + l * inner, *xl = x + l * inner;
        const double ml = mp[l % c];
        row_sums(
            inner, s1, s2,
            [&](int64_t j, VD& u, VD& v) {
              u = widen(gl + j);
              v = u * (widen(xl + j) - ml);
            },
            [&](int64_t j, double& u, double& v) {
              u = double(gl[j]);
              v = u * (double(xl[j]) - ml);
            });
      });
}

}  // namespace

template <class T>
static void batch_norm_forward_typed(const T* x, const T* w, const T* b, T* rm, T* rv, T* y, T* mean, T* invstd,
                                     int64_t outer, int64_t c, int64_t inner, bool training, double momentum,
                                     double eps) {
  using A = acc_t<T>;
  if (training) {
    const int64_t n = outer * inner;  // values per channel
    std::vector<A> m, v;  // per channel: the mean and the biased variance
    if constexpr (std::is_same_v<T, float>) {
      channel_moments_f32(x, outer, c, inner, m, v);
    } else {
      // Two passes: the mean, then the squared deviations from it.
      std::vector<A> s = channel_sums<1, A>(outer, c, inner, [=](int64_t e, int64_t, A* acc, int64_t) {
        acc[0] += A(x[e]);
      });
      m.resize(size_t(c));
      for (int64_t k = 0; k < c; ++k) m[size_t(k)] = s[size_t(k)] / A(n);
      const A* mp = m.data();
      v = channel_sums<1, A>(outer, c, inner, [=](int64_t e, int64_t k, A* acc, int64_t) {
        A d = A(x[e]) - mp[k];
        acc[0] += d * d;
      });
      for (A& q : v) q /= A(n);
    }
    for (int64_t k = 0; k < c; ++k) {
      const A var = v[size_t(k)];  // biased: what the batch is normalised by
      mean[k] = T(m[size_t(k)]);
      invstd[k] = T(A(1) / std::sqrt(var + A(eps)));
      if (rm) {
        // The running variance is the unbiased estimate (n / (n - 1) times the biased one).
        rm[k] = T((1 - momentum) * double(rm[k]) + momentum * double(m[size_t(k)]));
        rv[k] = T((1 - momentum) * double(rv[k]) + momentum * double(var) * double(n) / double(n - 1));
      }
    }
  } else {
    for (int64_t k = 0; k < c; ++k) {
      mean[k] = rm[k];
      invstd[k] = T(A(1) / std::sqrt(A(rv[k]) + A(eps)));
    }
  }
  // Per channel: y = (x - mean) * scale + shift, scale = invstd * w, shift = b.
  std::vector<T> scale(static_cast<size_t>(c)), shift(static_cast<size_t>(c));
  for (int64_t k = 0; k < c; ++k) {
    scale[size_t(k)] = w ? invstd[k] * w[k] : invstd[k];
    shift[size_t(k)] = b ? b[k] : T(0);
  }
  const T *sc = scale.data(), *sh = shift.data(), *mn = mean;
  for_each_channel_element(outer, c, inner, [=](int64_t e, int64_t k) { y[e] = (x[e] - mn[k]) * sc[k] + sh[k]; });
}

// With xm = x - mean and n values per channel, sums over each channel's values:
//   dbias = sum g, dweight = invstd sum g xm;
//   training: dx = w invstd (g - sum g / n - xm invstd^2 sum(g xm) / n);
//   eval (mean and invstd are constants): dx = g w invstd.
template <class T>
static void batch_norm_backward_typed(const T* g, const T* x, const T* mean, const T* invstd, const T* w, T* dx,
                                      T* dw, T* db, int64_t outer, int64_t c, int64_t inner, bool training) {
  using A = acc_t<T>;
  const int64_t n = outer * inner;
  const bool need_sums = dw || db || (dx && training);
  std::vector<A> s;  // [2][c]: sum g, sum g xm
  if (need_sums) {
    if constexpr (std::is_same_v<T, float>) {
      s = channel_grad_sums_f32(g, x, mean, outer, c, inner);
    } else {
      s = channel_sums<2, A>(outer, c, inner, [=](int64_t e, int64_t k, A* acc, int64_t st) {
        acc[0] += A(g[e]);
        acc[st] += A(g[e]) * A(x[e] - mean[k]);
      });
    }
  }
  for (int64_t k = 0; k < c; ++k) {
    if (db) db[k] = T(s[size_t(k)]);
    if (dw) dw[k] = T(s[size_t(c + k)] * A(invstd[k]));
  }
  if (!dx) return;
  // dx = a (g - cg - xm cx) per channel; eval has cg = cx = 0.
  std::vector<T> a(static_cast<size_t>(c)), cg(static_cast<size_t>(c), T(0)), cx(static_cast<size_t>(c), T(0));
  for (int64_t k = 0; k < c; ++k) {
    const A is = A(invstd[k]);
    a[size_t(k)] = T(w ? is * A(w[k]) : is);
    if (training) {
      cg[size_t(k)] = T(s[size_t(k)] / A(n));
      cx[size_t(k)] = T(is * is * s[size_t(c + k)] / A(n));
    }
  }
  const T *ap = a.data(), *cgp = cg.data(), *cxp = cx.data();
  for_each_channel_element(outer, c, inner,
                           [=](int64_t e, int64_t k) { dx[e] = ap[k] * (g[e] - cgp[k] - (x[e] - mean[k]) * cxp[k]); });
}

static void batch_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                               const Tensor& running_var, const Tensor& y, const Tensor& save_mean,
                               const Tensor& save_invstd, int64_t outer, int64_t c, int64_t inner, bool training,
                               double momentum, double eps) {
  MU_DISPATCH_FLOAT(x.dtype(), "batch_norm_forward", [&] {
    batch_norm_forward_typed(x.data_ptr<scalar_t>(), ptr_or_null<scalar_t>(weight), ptr_or_null<scalar_t>(bias),
                             ptr_or_null<scalar_t>(running_mean), ptr_or_null<scalar_t>(running_var),
                             y.data_ptr<scalar_t>(), save_mean.data_ptr<scalar_t>(),
                             save_invstd.data_ptr<scalar_t>(), outer, c, inner, training, momentum, eps);
  });
}

static void batch_norm_backward(const Tensor& g, const Tensor& x, const Tensor& save_mean, const Tensor& save_invstd,
                                const Tensor& weight, const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                                int64_t outer, int64_t c, int64_t inner, bool training) {
  MU_DISPATCH_FLOAT(x.dtype(), "batch_norm_backward", [&] {
    batch_norm_backward_typed(g.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(), save_mean.data_ptr<scalar_t>(),
                              save_invstd.data_ptr<scalar_t>(), ptr_or_null<scalar_t>(weight),
                              ptr_or_null<scalar_t>(dx), ptr_or_null<scalar_t>(dweight),
                              ptr_or_null<scalar_t>(dbias), outer, c, inner, training);
  });
}

MU_REGISTER_KERNEL(kernels::batch_norm_forward, DeviceType::CPU, batch_norm_forward);
MU_REGISTER_KERNEL(kernels::batch_norm_backward, DeviceType::CPU, batch_norm_backward);

}  // namespace mu::cpu
