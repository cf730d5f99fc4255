// CPU kernels of sparsemax, entmax15 and entmax_bisect (declared in
// ops/kernels/entmax.h), following the entmax package's definitions, with their exact
// gradients as one shared fused kernel. Every line is worked in double whatever the
// dtype (float32 only rounds the result), so the threshold τ and the support are those
// of the exact problem up to double rounding.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <type_traits>
#include <vector>

#include "ops/cpu/lines.h"
#include "ops/cpu/simd.h"
#include "ops/kernels/entmax.h"

namespace mu::cpu {

namespace {


constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// Per-thread working space for one line, grown on demand: a sort per line must not
// pay for an allocation per line.
double* scratch(int64_t size) {
  thread_local std::vector<double> buf;
  if (int64_t(buf.size()) < size) buf.resize(size_t(size));
  return buf.data();
}

// The line's maximum, or NaN when the line holds a NaN or +inf or only -inf: such a
// line has no finite shift and its output is NaN throughout (as softmax's would be).
template <class T>
double line_max(const T* xl, int64_t n, int64_t st) {
  double m = kNegInf;
  bool nan = false;
  for (int64_t j = 0; j < n; ++j) {
    double v = double(xl[j * st]);
    nan = nan || v != v;
    m = v > m ? v : m;
  }
  return nan || !std::isfinite(m) ? kNaN : m;
}

template <class T>
void fill_nan(T* yl, int64_t n, int64_t st) {
  for (int64_t j = 0; j < n; ++j) yl[j * st] = T(kNaN);
}

// Loads the candidates for the support, z = scale * (x - max) > -1, into s sorted in
// decreasing order and returns how many there are (-1, after filling y with NaN, for a
// line with no finite shift). Subtracting the max first keeps every z <= 0, so the
// thresholds below are O(1) whatever the input's magnitude. An entry with z <= -1 is
// never on the support, as the max alone already has z_1 - τ <= 1 (p_1 <= 1), so
// τ >= -1: leaving such entries out shortens the sort without changing τ.
template <class T>
int64_t load_candidates(const T* xl, T* yl, int64_t n, int64_t st, double scale, double* s, double& m) {
  m = line_max(xl, n, st);
  if (std::isnan(m)) {
    fill_nan(yl, n, st);
    return -1;
  }
  int64_t c = 0;
  for (int64_t j = 0; j < n; ++j) {
    double z = (double(xl[j * st]) - m) * scale;
    if (z > -1) s[c++] = z;
  }
  std::sort(s, s + c, std::greater<double>());
  return c;
}

// sparsemax: with z sorted decreasingly and S_k = z_1 + ... + z_k, the support is the
// set of k with k z_k > S_k - 1 (always a prefix 1..K) and τ = (S_K - 1) / K.
template <class T>
void sparsemax_line(const T* xl, T* yl, int64_t n, int64_t st) {
  double* s = scratch(n);
  double m;
  int64_t c = load_candidates(xl, yl, n, st, 1.0, s, m);
  if (c < 0) return;
  // Counted, as the entmax package does, rather than taking the last k that passes.
  double cum = 0;
  int64_t k_sup = 0;
  for (int64_t k = 0; k < c; ++k) {
    cum += s[k];
    k_sup += double(k + 1) * s[k] > cum - 1 ? 1 : 0;
  }
  // k = 1 always passes (z_1 = 0 > -1), so the support is never empty.
  double top = 0;
  for (int64_t k = 0; k < k_sup; ++k) top += s[k];
  double tau = (top - 1) / double(k_sup);
  // z - τ <= 0 gives an exact 0: off-support entries are zeros, not rounding residue.
  for (int64_t j = 0; j < n; ++j) {
    double t = double(xl[j * st]) - m - tau;
    yl[j * st] = T(t > 0 ? t : 0.0);
  }
}

// entmax15's threshold without a sort: τ solves f(τ) = Σ (z_i - τ)_+² = 1, f convex and
// decreasing up to max z = 0, with f(start) >= 1 (start = -1 always qualifies, as the max
// alone gives f(-1) >= 1). Newton's steps from there stay at or left of the root
// (convexity), so the set S = {z > τ} always holds the support; on S the equation is a
// quadratic, τ_S = mean_S - sqrt((1 - ss_S) / |S|), which is the answer
// exactly when S is the support: every z in S above τ_S and none outside it. That is
// checked, not assumed; false (after at most 64 steps, or when rounding stalls the steps)
// leaves the line to the sort below, a guard for rounding corner cases that none of the
// tests' lines (ties at the threshold, spreads from 1e-9 to 1e6) nor a training run has
// reached. A few passes over the line instead of a sort: the MLP-Mixer's gate (64
// experts) spent 5% of its step sorting.
bool entmax15_tau_newton(const double* z, int64_t n, double tau, double& tau_out) {
  for (int it = 0; it < 64; ++it) {
    // Over S = {z > τ}: s1 = Σ (z - τ), s2 = Σ (z - τ)², k = |S|, the smallest z in S and
    // the largest outside it; in vectors of partial results (GCC does not vectorise one
    // running double sum), then the tail, then the lanes combined.
    using V = Vec<double>::type;
    constexpr int W = Vec<double>::width;
    const V vtau = V{} + tau, zero = V{}, one = zero + 1.0, ninf = zero + kNegInf;
    V s1v = zero, s2v = zero, kv = zero, lov = zero, hiv = ninf;  // z <= 0, and max z = 0 is in S
    int64_t j = 0;
    for (; j + W <= n; j += W) {
      const V zj = load(z + j), d = zj - vtau;
      const auto in = d > zero;  // lanes of all ones (true) or zeros
      const V dp = in ? d : zero;
      s1v += dp;
      s2v += dp * dp;
      kv += in ? one : zero;
      lov = in && zj < lov ? zj : lov;
      hiv = !in && zj > hiv ? zj : hiv;
    }
    double s1 = 0, s2 = 0, k = 0, lo_in = 0, hi_out = kNegInf;
    for (int l = 0; l < W; ++l) {
      s1 += s1v[l], s2 += s2v[l], k += kv[l];
      lo_in = std::min(lo_in, lov[l]), hi_out = std::max(hi_out, hiv[l]);
    }
    for (; j < n; ++j) {
      const double d = z[j] - tau;
      if (d > 0) {
        s1 += d, s2 += d * d, k += 1;
        lo_in = std::min(lo_in, z[j]);
      } else {
        hi_out = std::max(hi_out, z[j]);
      }
    }
    // On S: Σ (z - t)² = |S| (mean - t)² + ss, with mean - τ = s1 / k, ss = s2 - s1² / k.
    const double ss = s2 - s1 * s1 / k;
    if (ss <= 1) {
      const double tau_s = tau + s1 / k - std::sqrt((1 - ss) / k);
      if (lo_in > tau_s && hi_out <= tau_s) {
        tau_out = tau_s;
        return true;
      }
    }
    const double next = tau + (s2 - 1) / (2 * s1);
    if (!(next > tau)) return false;
    tau = next;
  }
  return false;
}

// A start for entmax15_tau_newton from the two largest z, 0 and z2: for z2 > -1 the two
// alone give f(τ) = τ² + (z2 - τ)² = 1 at τ2 = (z2 - sqrt(2 - z2²)) / 2 < z2, and the
// other entries only add to f, so f(τ2) >= 1: a lower bound nearer the root than -1.
// On the MLP-Mixer's normalised gate logits (64 experts) it saves one of about 3.5 passes.
double entmax15_start(double z2) { return z2 > -1 ? (z2 - std::sqrt(2 - z2 * z2)) / 2 : -1.0; }

// The largest and second largest of a contiguous float32 line on float vectors (a line
// that holds NaN, or +inf, or only -inf gives a NaN max, as line_max).
struct TopTwo {
  double first, second;
};
TopTwo line_top_two(const float* x, int64_t n) {
  using VF = Vec<float>::type;
  constexpr int W = Vec<float>::width;
  constexpr float kInf = std::numeric_limits<float>::infinity();
  float m1 = -kInf, m2 = -kInf;
  bool nan = false;
  auto take = [&](float v) {
    nan = nan || v != v;
    m2 = std::max(m2, std::min(m1, v));
    m1 = std::max(m1, v);
  };
  int64_t j = 0;
  if (n >= W) {
    // Per lane: its largest and second largest, and whether it saw a NaN.
    VF a = VF{} - kInf, b = a;
    auto seen_nan = a != a;
    for (; j + W <= n; j += W) {
      const VF v = load(x + j);
      seen_nan = seen_nan | (v != v);
      const VF lo = v < a ? v : a;
      b = lo > b ? lo : b;
      a = v > a ? v : a;
    }
    for (int l = 0; l < W; ++l) {
      nan = nan || seen_nan[l] != 0;
      take(a[l]);
      take(b[l]);
    }
  }
  for (; j < n; ++j) take(x[j]);
  if (nan || !std::isfinite(m1)) return {kNaN, kNaN};
  return {double(m1), double(m2)};
}

// entmax15 on z = (x - max) / 2: on a support of the k largest entries, Σ (z_i - τ)² = 1
// gives τ_k = mean_k - sqrt((1 - ss_k) / k), ss_k the sum of squared deviations from
// mean_k; the support is the set of k with τ_k <= z_k and τ = τ_K. τ comes from
// entmax15_tau_newton when it succeeds, else from the sorted candidates.
template <class T>
void entmax15_line(const T* xl, T* yl, int64_t n, int64_t st) {
  double* s = scratch(3 * n);
  double* taus = s + n;
  double* z = s + 2 * n;
  double m, start = -1;
  if constexpr (std::is_same_v<T, float>) {
    if (st == 1) {  // the common case: a contiguous line, its max on vectors
      const TopTwo top = line_top_two(xl, n);
      m = top.first;
      if (!std::isnan(m)) start = entmax15_start((top.second - m) * 0.5);
    } else {
      m = line_max(xl, n, st);
    }
  } else {
    m = line_max(xl, n, st);
  }
  if (std::isnan(m)) return fill_nan(yl, n, st);
  for (int64_t j = 0; j < n; ++j) z[j] = (double(xl[j * st]) - m) * 0.5;
  double tau;
  if (!entmax15_tau_newton(z, n, start, tau)) {
    int64_t c = load_candidates(xl, yl, n, st, 0.5, s, m);
    // Welford's running mean and squared deviations: the package's k (mean_sq - mean²)
    // loses digits to cancellation, this does not.
    double mean = 0, ss = 0;
    int64_t k_sup = 0;
    for (int64_t k = 0; k < c; ++k) {
      double d = s[k] - mean;
      mean += d / double(k + 1);
      ss += d * (s[k] - mean);
      // A negative (1 - ss) / k means no τ puts the first k entries on the support;
      // clamped to 0 as in the package, the test below then fails for this k.
      double delta = (1 - ss) / double(k + 1);
      taus[k] = mean - std::sqrt(delta > 0 ? delta : 0.0);
      k_sup += taus[k] <= s[k] ? 1 : 0;
    }
    // k = 1 always passes (τ_1 = z_1 - 1), so the support is never empty.
    tau = taus[k_sup - 1];
  }
  for (int64_t j = 0; j < n; ++j) {
    double t = z[j] - tau;
    yl[j * st] = T(t > 0 ? t * t : 0.0);
  }
}

// t^(1/(α-1)) for t > 0 and 0 otherwise, with the common exponents spelled out: pow is
// what the bisection spends its time on.
struct ClampPow {
  double e;  // 1 / (α - 1)
  double operator()(double t) const {
    if (!(t > 0)) return 0.0;
    if (e == 1.0) return t;                    // α = 2, sparsemax
    if (e == 2.0) return t * t;                // α = 1.5, entmax15
    if (e == 4.0) return (t * t) * (t * t);    // α = 1.25
    if (e == 0.5) return std::sqrt(t);         // α = 3
    return std::pow(t, e);
  }
};

// entmax_bisect on u = (α-1)(x - max), the entmax package's EntmaxBisectFunction: Σ p(τ)
// falls from >= 1 at τ = -1 (the max alone gives 1) to <= 1 at τ = -(1/n)^(α-1) (all n
// entries at most 1/n), so τ is halved into that bracket n_iter times; p at the last
// midpoint is then rescaled to sum to 1.
template <class T>
void entmax_bisect_line(const T* xl, T* yl, int64_t n, int64_t st, double alpha, int n_iter) {
  double m = line_max(xl, n, st);
  if (std::isnan(m)) return fill_nan(yl, n, st);
  // Every τ tried is >= -1, so entries with u <= -1 always give 0: the sums skip them.
  double* u = scratch(n);
  int64_t c = 0;
  for (int64_t j = 0; j < n; ++j) {
    double v = (double(xl[j * st]) - m) * (alpha - 1);
    if (v > -1) u[c++] = v;
  }
  ClampPow p{1 / (alpha - 1)};
  auto mass = [&](double tau) {
    double sum = 0;
    for (int64_t j = 0; j < c; ++j) sum += p(u[j] - tau);
    return sum;
  };
  // The bracket's top uses the whole line's length, as the package does.
  double lo = -1.0, hi = -std::pow(1.0 / double(n), alpha - 1);
  double dm = hi - lo, f_lo = mass(lo) - 1, tau = lo;
  for (int it = 0; it < n_iter; ++it) {
    dm /= 2;
    tau = lo + dm;
    // Still at or below the root (sum >= 1, same sign as at lo): move the bracket up.
    if ((mass(tau) - 1) * f_lo >= 0) lo = tau;
  }
  // The max entry has u = 0 > τ, so the sum is positive.
  double sum = mass(tau);
  for (int64_t j = 0; j < n; ++j) yl[j * st] = T(p((double(xl[j * st]) - m) * (alpha - 1) - tau) / sum);
}

// q = p^e on the support (p > 0) and 0 off it (NaN included), e = 2 - α: the common
// exponents spelled out, each a select before any arithmetic, so that a loop over a
// contiguous line vectorises (a square root of a select never sees a negative).
template <int E>  // 0: sparsemax's 1; 1: entmax15's sqrt; -1: pow(p, e)
inline double support_power(double p, double e) {
  if constexpr (E == 0) return p > 0 ? 1.0 : 0.0;
  else if constexpr (E == 1) return std::sqrt(p > 0 ? p : 0.0);
  else return p > 0 ? std::pow(p, e) : 0.0;
}

// The gradient shared by all three: with q = p^(2-α) on the support and 0 off it,
// dx = q g - q (Σ q g) / (Σ q), q kept in dx until the line's sums are known. A
// contiguous line (stride 1) takes a vector loop for its sums. On the MLP-Mixer's gates
// (6272 lines of 64, 2 threads) a branch per element and a scalar square root made the
// backward 0.71 ms; 0.57 ms so.
template <int E, class T>
void entmax_backward_line(const T* gl, const T* yl, T* dl, int64_t n, int64_t st, double e) {
  double sq = 0, sqg = 0;
  int64_t j = 0;
  if (st == 1) {
    // entmax15's q = sqrt(p) of a float32 line is taken first, in float32 on whole vectors
    // (16 lanes a square root instead of 8, and the double lanes below were filled one
    // root at a time: 6272 lines of 64 on two threads, 0.50 -> 0.14 ms): the same q as
    // the double root rounded to float (a square root rounded twice, 53 then 24 bits, is
    // correctly rounded), which is the q that dl holds meanwhile; the sums read it back.
    constexpr bool roots_first = E == 1 && std::is_same_v<T, float>;
    if constexpr (roots_first)
      for (int64_t i = 0; i < n; ++i) {  // vectorised: vsqrtps
        const T p = yl[i];
        dl[i] = std::sqrt(p > 0 ? p : T(0));
      }
    // Whole vectors in vectors of partial sums (GCC does not vectorise one running double
    // sum); the tail, or a strided line, below.
    using V = Vec<double>::type;
    constexpr int W = Vec<double>::width;
    V sqv = {}, sqgv = {};
    for (; j + W <= n; j += W) {
      V q, gv;
      for (int l = 0; l < W; ++l) {
        q[l] = roots_first ? double(dl[j + l]) : support_power<E>(double(yl[j + l]), e);
        gv[l] = double(gl[j + l]);
      }
      sqv += q;
      sqgv += q * gv;
      if constexpr (!roots_first)
        for (int l = 0; l < W; ++l) dl[j + l] = T(q[l]);
    }
    for (int l = 0; l < W; ++l) sq += sqv[l], sqg += sqgv[l];
  }
  for (; j < n; ++j) {
    const double q = support_power<E>(double(yl[j * st]), e);
    sq += q;
    sqg += q * double(gl[j * st]);
    dl[j * st] = T(q);
  }
  const double c = sqg / sq;
  for (j = 0; j < n; ++j) dl[j * st] = T(double(dl[j * st]) * (double(gl[j * st]) - c));
}

template <class T>
void entmax_backward_lines(const T* g, const T* y, T* dx, int64_t outer, int64_t n, int64_t inner, double e) {
  for_each_line(outer, n, inner, [=](int64_t off, int64_t st) {
    if (e == 0.0) entmax_backward_line<0>(g + off, y + off, dx + off, n, st, e);
    else if (e == 0.5) entmax_backward_line<1>(g + off, y + off, dx + off, n, st, e);
    else entmax_backward_line<-1>(g + off, y + off, dx + off, n, st, e);
  });
}

// A sort costs about log2(n) comparisons per element.
int64_t sort_cost(int64_t n) {
  int64_t c = 1;
  while (n > 1) {
    n /= 2;
    ++c;
  }
  return c;
}

}  // namespace

static void entmax_forward(const Tensor& y, const Tensor& x, int64_t outer, int64_t n, int64_t inner,
                           kernels::EntmaxKind kind, double alpha, int n_iter) {
  // One element's work in elementwise-op units, for the threading threshold: a sort's
  // for sparsemax and entmax15, n_iter + 1 passes for the bisection.
  int64_t cost = kind == kernels::EntmaxKind::Bisect ? int64_t(n_iter) + 1 : sort_cost(n);
  MU_DISPATCH_FLOAT(x.dtype(), "entmax", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    scalar_t* yp = y.data_ptr<scalar_t>();
    for_each_line(
        outer, n, inner,
        [=](int64_t off, int64_t st) {
          switch (kind) {
            case kernels::EntmaxKind::Sparsemax: sparsemax_line(xp + off, yp + off, n, st); break;
            case kernels::EntmaxKind::Entmax15: entmax15_line(xp + off, yp + off, n, st); break;
            case kernels::EntmaxKind::Bisect: entmax_bisect_line(xp + off, yp + off, n, st, alpha, n_iter); break;
          }
        },
        cost);
  });
}

static void entmax_backward(const Tensor& dx, const Tensor& g, const Tensor& y, int64_t outer, int64_t n,
                            int64_t inner, double e) {
  MU_DISPATCH_FLOAT(y.dtype(), "entmax_backward", [&] {
    entmax_backward_lines(g.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), dx.data_ptr<scalar_t>(), outer, n, inner, e);
  });
}

MU_REGISTER_KERNEL(kernels::entmax_forward, DeviceType::CPU, entmax_forward);
MU_REGISTER_KERNEL(kernels::entmax_backward, DeviceType::CPU, entmax_backward);

}  // namespace mu::cpu
