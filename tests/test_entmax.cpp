// sparsemax, entmax15 and entmax_bisect: hand-derived small cases, an independent float64
// bisection reference, the sort-based formula of the benchmark reference, layouts, edge
// cases and gradchecks. Every case runs on each test device: inputs are made on the CPU
// and moved with on(); results are read back through to_vector / at (host copies).
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "helpers.h"
#include "nn/entmax.h"

using namespace mu;
using autograd::TensorList;

namespace {

const double kInf = std::numeric_limits<double>::infinity();

// ---------------------------------------------------------------- references (plain loops)

// One line of the reference: p, and u_i - τ for every entry (positive on the support),
// u = (α-1)(x - max x).
struct RefLine {
  std::vector<double> p, gap;
};

// The α-entmax of one line by plain bisection on τ, to 1e-15: Σ max(u - τ, 0)^(1/(α-1))
// is >= 1 at τ = -1 (the max entry alone gives 1) and 0 at τ = 0, and falls in between.
RefLine ref_bisect(const std::vector<double>& x, double alpha) {
  double m = -kInf;
  for (double v : x) m = std::max(m, v);
  std::vector<double> u(x.size());
  for (size_t i = 0; i < x.size(); ++i) u[i] = (alpha - 1) * (x[i] - m);
  double e = 1 / (alpha - 1);
  auto mass = [&](double tau) {
    double s = 0;
    for (double v : u) s += v > tau ? std::pow(v - tau, e) : 0.0;
    return s;
  };
  double lo = -1, hi = 0;
  for (int it = 0; it < 200 && hi - lo > 1e-15; ++it) {
    double mid = (lo + hi) / 2;
    (mass(mid) >= 1 ? lo : hi) = mid;
  }
  double tau = (lo + hi) / 2;
  RefLine r;
  for (double v : u) {
    r.p.push_back(v > tau ? std::pow(v - tau, e) : 0.0);
    r.gap.push_back(v - tau);
  }
  return r;
}

// entmax15 exactly as the benchmark reference's (torch_reference.py) entmax15 computes it:
// halve, subtract the max, sort, τ_k from cumulative means of z and z², support = how
// many k have τ_k <= z_k, p = max(z - τ_K, 0)².
std::vector<double> ref_entmax15_sorted(const std::vector<double>& x) {
  size_t d = x.size();
  std::vector<double> z(d);
  for (size_t i = 0; i < d; ++i) z[i] = x[i] / 2;
  double m = *std::max_element(z.begin(), z.end());
  for (double& v : z) v -= m;
  std::vector<double> zs = z;
  std::sort(zs.begin(), zs.end(), std::greater<double>());
  std::vector<double> tau(d);
  double cum = 0, cum_sq = 0;
  size_t support = 0;
  for (size_t k = 0; k < d; ++k) {
    double rho = double(k + 1);
    cum += zs[k];
    cum_sq += zs[k] * zs[k];
    double mean = cum / rho, mean_sq = cum_sq / rho;
    double ss = rho * (mean_sq - mean * mean);
    double delta = (1 - ss) / rho;
    tau[k] = mean - std::sqrt(std::max(delta, 0.0));
    if (tau[k] <= zs[k]) ++support;
  }
  std::vector<double> p(d);
  for (size_t i = 0; i < d; ++i) p[i] = std::pow(std::max(z[i] - tau[support - 1], 0.0), 2);
  return p;
}

// ---------------------------------------------------------------- lines of a tensor

// Row-major flat indices of every line along `dim` of a tensor of this shape.
std::vector<std::vector<int64_t>> lines_of(const Shape& shape, int64_t dim) {
  int64_t outer = 1, inner = 1, n = shape[size_t(dim)];
  for (int64_t k = 0; k < int64_t(shape.size()); ++k) {
    if (k < dim) outer *= shape[size_t(k)];
    if (k > dim) inner *= shape[size_t(k)];
  }
  std::vector<std::vector<int64_t>> out;
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      std::vector<int64_t> line;
      for (int64_t j = 0; j < n; ++j) line.push_back((o * n + j) * inner + i);
      out.push_back(line);
    }
  return out;
}

// The reference applied to every line of x along dim, laid out like x (row-major).
RefLine ref_along(const Tensor& x, int64_t dim, double alpha) {
  std::vector<double> xv = x.to_vector<double>();
  RefLine all{std::vector<double>(xv.size()), std::vector<double>(xv.size())};
  for (const auto& line : lines_of(x.shape(), dim)) {
    std::vector<double> vals;
    for (int64_t f : line) vals.push_back(xv[size_t(f)]);
    RefLine r = ref_bisect(vals, alpha);
    for (size_t j = 0; j < line.size(); ++j) {
      all.p[size_t(line[j])] = r.p[j];
      all.gap[size_t(line[j])] = r.gap[j];
    }
  }
  return all;
}

// got against the reference: values within tol, exact zeros wherever the reference puts
// the entry clearly below τ, positive values wherever clearly above, and every line
// summing to 1.
void check_against(const Tensor& got, const Tensor& x, int64_t dim, const RefLine& ref, double tol) {
  REQUIRE(got.shape() == x.shape());
  REQUIRE(got.dtype() == x.dtype());
  std::vector<double> g = got.to_vector<double>();
  double sum_tol = got.dtype() == kFloat64 ? 1e-12 : 1e-5;
  for (const auto& line : lines_of(x.shape(), dim)) {
    double s = 0;
    for (int64_t f : line) {
      size_t i = size_t(f);
      INFO("element " << i << ": got " << g[i] << ", want " << ref.p[i] << ", u - tau = " << ref.gap[i]);
      CHECK(std::fabs(g[i] - ref.p[i]) <= tol);
      if (ref.gap[i] < -1e-9) CHECK(g[i] == 0.0);
      if (ref.gap[i] > 1e-9) CHECK(g[i] > 0.0);
      s += g[i];
    }
    CHECK(std::fabs(s - 1) <= sum_tol);
  }
}

void check_values(const Tensor& got, const std::vector<double>& want, double tol) {
  std::vector<double> g = got.to_vector<double>();
  REQUIRE(g.size() == want.size());
  for (size_t i = 0; i < g.size(); ++i) {
    INFO("element " << i << ": got " << g[i] << ", want " << want[i]);
    CHECK(std::fabs(g[i] - want[i]) <= tol);
    // Zeros in the closed forms are exact zeros in the output.
    if (want[i] == 0.0) CHECK(g[i] == 0.0);
  }
}

// The three maps as one function of α (sparsemax is α = 2, entmax15 α = 1.5).
using Map = std::function<Tensor(const Tensor&, int64_t)>;
struct Named {
  std::string name;
  double alpha;
  Map f;
};
std::vector<Named> all_maps() {
  std::vector<Named> m = {{"sparsemax", 2.0, [](const Tensor& x, int64_t d) { return nn::sparsemax(x, d); }},
                          {"entmax15", 1.5, [](const Tensor& x, int64_t d) { return nn::entmax15(x, d); }}};
  for (double a : {1.25, 1.5, 2.0, 3.0})
    m.push_back({"entmax_bisect", a, [a](const Tensor& x, int64_t d) { return nn::entmax_bisect(x, a, d); }});
  return m;
}

// Bisection leaves τ within ~1e-15 of the root; with α > 2 an entry just above τ maps
// through t^(1/(α-1)), which magnifies that (sqrt(1e-15) ~ 3e-8 for α = 3).
double f64_tol(const Named& m) { return m.alpha > 2 ? 1e-7 : 1e-11; }

// float64 lines (L, n) whose every entry lies at least `margin` from τ in u-space, so
// finite differences of size 1e-6 never cross a kink of the map.
Tensor lines_away_from_kinks(int64_t L, int64_t n, double alpha, double scale, double margin = 1e-3) {
  for (int attempt = 0; attempt < 1000; ++attempt) {
    Tensor x = randn({L, n}, kFloat64) * scale;
    RefLine r = ref_along(x, 1, alpha);
    bool ok = true;
    for (double gap : r.gap) ok = ok && std::fabs(gap) > margin;
    if (ok) return x;
  }
  FAIL("no input away from the kinks found");
  return {};
}

}  // namespace

// ---------------------------------------------------------------- closed forms

TEST_CASE("sparsemax: small cases by the threshold formula") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    for (DType dt : {kFloat64, kFloat32}) {
      double tol = dt == kFloat64 ? 1e-15 : 1e-7;
      INFO(dtype_name(dt));
      // Sorted z: k = 1 passes (1 > 0), k = 2 fails (2·0 > 1 + 0 - 1 is false): τ = 0.
      check_values(nn::sparsemax(on(tensor({1.0, 0.0}, dt), dev)), {1, 0}, tol);
      // Already on the simplex: every k passes, τ = (1 - 1) / 3 = 0, p = z.
      check_values(nn::sparsemax(on(tensor({0.5, 0.4, 0.1}, dt), dev)), {0.5, 0.4, 0.1}, tol);
      // k = 3 fails (3·(-0.5) > 0.4 - 1 is false): τ = (0.9 - 1) / 2 = -0.05.
      check_values(nn::sparsemax(on(tensor({0.5, 0.4, -0.5}, dt), dev)), {0.55, 0.45, 0}, tol);
      // Support of one: 3 - τ = 1 with τ = 2; the runner-up sits exactly at τ and gets 0.
      check_values(nn::sparsemax(on(tensor({3.0, 1.0, 2.0}, dt), dev)), {1, 0, 0}, tol);
      // Ties share equally, whatever the common value.
      check_values(nn::sparsemax(on(tensor({7.0, 7.0, 7.0, 7.0}, dt), dev)), {0.25, 0.25, 0.25, 0.25}, tol);
      // Shift invariance: the same answer as for [0.5, 0.4, -0.5].
      check_values(nn::sparsemax(on(tensor({100.5, 100.4, 99.5}, dt), dev)), {0.55, 0.45, 0},
                   dt == kFloat64 ? 1e-13 : 1e-5);
      // A 0-dim tensor is one line of one element.
      CHECK(nn::sparsemax(full({}, -3.0, TensorOptions(dt).device(dev))).item() == 1.0);
    }
  }
}

TEST_CASE("entmax15: small cases built from a chosen tau and support") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    for (DType dt : {kFloat64, kFloat32}) {
      double tol = dt == kFloat64 ? 1e-14 : 1e-6;
      INFO(dtype_name(dt));
      // Two equal entries: symmetric, so [0.5, 0.5].
      check_values(nn::entmax15(on(tensor({0.3, 0.3}, dt), dev)), {0.5, 0.5}, tol);
      // p = (z/2 - τ)² on the support: sqrt(p) = (0.8, 0.6) sums in squares to 1; with
      // τ = 0.3, z = 2 (τ + sqrt p) = (2.2, 1.8), and entries with z/2 < τ get 0.
      check_values(nn::entmax15(on(tensor({2.2, 0.5, 1.8, -3.0}, dt), dev)), {0.64, 0, 0.36, 0}, tol);
      // Whole support: sqrt(p) = (0.6, 0.48, 0.64), τ = -1: z = 2 (-1 + sqrt p).
      check_values(nn::entmax15(on(tensor({-0.8, -1.04, -0.72}, dt), dev)), {0.36, 0.2304, 0.4096}, tol);
      // sqrt(p) = (2/3, 2/3, 1/3), τ = 0.25, and one entry off the support.
      Tensor x = on(tensor({2 * (0.25 + 2.0 / 3), 2 * (0.25 + 2.0 / 3), 2 * (0.25 + 1.0 / 3), 0.2}, dt), dev);
      check_values(nn::entmax15(x), {4.0 / 9, 4.0 / 9, 1.0 / 9, 0}, tol);
      // Support of one: the max alone gives τ = max/2 - 1 = 1.5, above every other z/2.
      check_values(nn::entmax15(on(tensor({5.0, 0.0, 1.0}, dt), dev)), {1, 0, 0}, tol);
      CHECK(nn::entmax15(full({}, 2.0, TensorOptions(dt).device(dev))).item() == 1.0);
    }
  }
}

TEST_CASE("entmax_bisect: small cases, and alpha = 2 and 1.5 are sparsemax and entmax15") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    for (DType dt : {kFloat64, kFloat32}) {
      double tol = dt == kFloat64 ? 1e-13 : 1e-6;
      INFO(dtype_name(dt));
      check_values(nn::entmax_bisect(on(tensor({0.5, 0.4, -0.5}, dt), dev), 2.0), {0.55, 0.45, 0}, tol);
      check_values(nn::entmax_bisect(on(tensor({2.2, 0.5, 1.8, -3.0}, dt), dev), 1.5), {0.64, 0, 0.36, 0}, tol);
      // α = 3: p = (2 z - τ)^(1/2). With p = (0.6, 0.4) and τ = 0.1, 2 z = τ + p² gives
      // z = (0.23, 0.13); z = 0 has 2 z < τ.
      check_values(nn::entmax_bisect(on(tensor({0.23, 0.13, 0.0}, dt), dev), 3.0), {0.6, 0.4, 0}, tol);
      // α = 1.25: p = (z/4 - τ)^4. With p = (0.5, 0.5) any z works; with p^(1/4) and τ = 0:
      check_values(nn::entmax_bisect(on(tensor({-1.0, -1.0}, dt), dev), 1.25), {0.5, 0.5}, tol);
      double a = std::pow(0.9, 0.25), b = std::pow(0.1, 0.25);
      check_values(nn::entmax_bisect(on(tensor({4 * a, 4 * b, -1.0}, dt), dev), 1.25), {0.9, 0.1, 0}, tol);

      manual_seed(11);
      Tensor x = on(randn({20, 9}, dt) * 2.0, dev);
      CHECK(max_abs_diff(nn::entmax_bisect(x, 2.0), nn::sparsemax(x)) <= (dt == kFloat64 ? 1e-13 : 1e-6));
      CHECK(max_abs_diff(nn::entmax_bisect(x, 1.5), nn::entmax15(x)) <= (dt == kFloat64 ? 1e-13 : 1e-6));
    }
  }
}

// ---------------------------------------------------------------- against the reference

TEST_CASE("all three match a float64 bisection reference on random inputs") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(12);
    for (const Named& m : all_maps()) {
      for (DType dt : {kFloat64, kFloat32}) {
        // float32 results are computed in double and rounded once.
        double tol = dt == kFloat64 ? f64_tol(m) : 1e-6;
        for (int trial = 0; trial < 40; ++trial) {
          int64_t n = 1 + trial % 37;
          double scale = std::vector<double>{0.1, 1.0, 3.0, 20.0}[size_t(trial % 4)];
          Tensor x = on(randn({3, n}, dt) * scale, dev);
          INFO(m.name << " alpha " << m.alpha << " " << dtype_name(dt) << " n " << n << " scale " << scale);
          check_against(m.f(x, -1), x, 1, ref_along(x, 1, m.alpha), tol);
        }
      }
    }
  }
}

// The 16-bit floats compute in float32 and round once: the float64 reference over the
// narrow inputs, within the narrow dtype's half-ulp; empty ones keep their dtype.
TEST_CASE("all three of bfloat16 and float16 inputs match the reference rounded once") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(13);
    for (const Named& m : all_maps()) {
      for (DType dt : {kBFloat16, DType::Float16}) {
        INFO(m.name << " alpha " << m.alpha << " " << dtype_name(dt));
        Tensor x = on((randn({3, 9}) * 2.0).to(dt), dev);
        Tensor y = m.f(x, -1);
        CHECK(y.dtype() == dt);
        Tensor wide = x.cpu().to(kFloat64);  // the narrow values exactly
        const RefLine ref = ref_along(wide, 1, m.alpha);
        const std::vector<double> g = y.cpu().to(kFloat64).to_vector<double>();
        const double half_ulp = dt == kBFloat16 ? 1.0 / 256 : 1.0 / 2048;  // relative, of a value in [0, 1]
        for (size_t i = 0; i < g.size(); ++i) {
          INFO("element " << i << ": got " << g[i] << ", want " << ref.p[i]);
          CHECK(std::fabs(g[i] - ref.p[i]) <= half_ulp * std::max(ref.p[i], 1e-3) + 1e-6);
          if (ref.gap[i] < -1e-9) CHECK(g[i] == 0.0);  // outside the support: exactly 0
        }
        CHECK(m.f(on(zeros({0, 9}).to(dt), dev), -1).dtype() == dt);
      }
    }
  }
}

TEST_CASE("entmax15 matches the benchmark reference's sort-based formula") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(13);
    for (int trial = 0; trial < 60; ++trial) {
      int64_t n = 1 + trial % 50;
      Tensor x = on(randn({n}, kFloat64) * (trial % 3 == 0 ? 5.0 : 1.0), dev);
      INFO("n " << n);
      check_values(nn::entmax15(x), ref_entmax15_sorted(x.to_vector<double>()), 1e-12);
    }
  }
}

// The CPU finds entmax15's threshold by Newton steps checked against the support (a sort
// only if the check fails): lines built to be hard for that check. An entry exactly at the
// threshold (its p is 0 either way), entries a hair above and below it, all-equal lines,
// and spreads from 1e-9 to 1e6; each against the sort-based formula.
TEST_CASE("entmax15 at and around its threshold matches the sort-based formula") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    // sqrt(p) = (0.6, 0.8) puts τ = 0.25 for z = x / 2 = (0.85, 1.05); then entries at τ
    // (x = 0.5) and within 1e-12 of it on either side.
    std::vector<std::vector<double>> lines = {{1.7, 2.1, 0.5},
                                              {1.7, 2.1, 0.5 + 2e-12, 0.5 - 2e-12},
                                              {1.7, 2.1, 0.5, 0.5, 0.5, -7.0},
                                              std::vector<double>(64, 0.25),
                                              std::vector<double>(3, -1e30)};
    manual_seed(29);
    for (double scale : {1e-9, 1e-3, 1.0, 30.0, 1e6}) {
      std::vector<double> v = (randn({64}, kFloat64) * scale).to_vector<double>();
      v[5] = v[9];  // a tie
      lines.push_back(v);
    }
    for (const auto& line : lines) {
      INFO("line of " << line.size() << " starting " << line[0]);
      Tensor x = on(from_vector(line, {int64_t(line.size())}, kFloat64), dev);
      check_values(nn::entmax15(x), ref_entmax15_sorted(line), 1e-12);
    }
  }
}

TEST_CASE("a large tensor, split over threads, matches the reference") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(14);
    for (const Named& m : all_maps()) {
      INFO(m.name << " alpha " << m.alpha);
      Tensor x = on(randn({600, 64}, kFloat32) * 2.0, dev);
      check_against(m.f(x, 1), x, 1, ref_along(x, 1, m.alpha), 1e-6);
    }
  }
}

// ---------------------------------------------------------------- layouts and edge cases

TEST_CASE("every dim of a 3-D input, and non-contiguous inputs") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(15);
    Tensor base = on(randn({4, 5, 6}, kFloat64) * 2.0, dev);
    for (const Named& m : all_maps()) {
      for (Tensor x : {base, base.transpose(0, 2), base.slice(1, 0, 5, 2), base.permute({1, 2, 0})}) {
        for (int64_t dim : {0, 1, 2, -1, -3}) {
          int64_t d = dim < 0 ? dim + 3 : dim;
          INFO(m.name << " alpha " << m.alpha << " x " << shape_str(x.shape()) << " contiguous " << x.is_contiguous()
                      << " dim " << dim);
          Tensor y = m.f(x, dim);
          check_against(y, x, d, ref_along(x, d, m.alpha), f64_tol(m));
          // A view gives exactly what its contiguous copy gives.
          CHECK(max_abs_diff(y, m.f(x.contiguous(), dim)) == 0.0);
        }
      }
    }
  }
}

TEST_CASE("large magnitudes stay finite; -inf entries get 0") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(16);
    for (const Named& m : all_maps()) {
      for (DType dt : {kFloat64, kFloat32}) {
        INFO(m.name << " alpha " << m.alpha << " " << dtype_name(dt));
        Tensor x = randn({8, 10}, dt) * 1e4;
        // A near-tie at the top of a line at 1e5 keeps a support of two entries there.
        x.set({0, 0}, 1e5);
        x.set({0, 1}, 1e5 - 0.25);
        x = on(x, dev);  // set above writes host memory
        Tensor y = m.f(x, -1);
        for (double v : y.to_vector<double>()) CHECK(std::isfinite(v));
        check_against(y, x, 1, ref_along(x, 1, m.alpha), dt == kFloat64 ? f64_tol(m) : 1e-6);
        // Masked logits (-inf) are never selected and do not disturb the others.
        Tensor masked = on(tensor({0.5, -kInf, 0.4, -kInf, -0.5}, dt), dev);
        Tensor ym = m.f(masked, 0), yr = m.f(on(tensor({0.5, 0.4, -0.5}, dt), dev), 0);
        CHECK(ym.at({1}) == 0.0);
        CHECK(ym.at({3}) == 0.0);
        // (Bisection brackets τ by the line's length, so it may differ in the last bits.)
        double same = dt == kFloat64 ? 1e-13 : 1e-6;
        CHECK(std::fabs(ym.at({0}) - yr.at({0})) <= same);
        CHECK(std::fabs(ym.at({2}) - yr.at({1})) <= same);
      }
    }
  }
}

TEST_CASE("a NaN or +inf in a line makes that line NaN only; empty tensors pass through") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    for (const Named& m : all_maps()) {
      INFO(m.name << " alpha " << m.alpha);
      Tensor x = on(tensor({{0.1, std::nan(""), 0.3}, {0.5, 0.4, -0.5}, {kInf, 0.0, 1.0}}), dev);
      Tensor y = m.f(x, 1);
      for (int64_t j = 0; j < 3; ++j) {
        CHECK(std::isnan(y.at({0, j})));
        CHECK(std::isnan(y.at({2, j})));
      }
      // The clean middle line is what it would be on its own.
      CHECK(max_abs_diff(y.select(0, 1), m.f(on(tensor({0.5, 0.4, -0.5}), dev), 0)) == 0.0);
      CHECK(m.f(zeros({0, 4}, TensorOptions().device(dev)), 1).shape() == Shape{0, 4});
      CHECK(m.f(zeros({3, 0}, TensorOptions().device(dev)), 1).shape() == Shape{3, 0});
    }
  }
}

TEST_CASE("entmax_bisect approaches softmax as alpha -> 1") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(17);
    Tensor x = randn({6, 12}, kFloat64);
    Tensor s = softmax(x, -1);  // the reference, on the CPU
    double prev = kInf;
    for (double alpha : {1.1, 1.01, 1.001, 1.0001}) {
      double err = max_abs_diff(nn::entmax_bisect(on(x, dev), alpha), s);
      INFO("alpha " << alpha << ": max |entmax - softmax| = " << err);
      CHECK(err < prev / 5);
      prev = err;
    }
    // The gap shrinks like (α - 1): about 1e-4 at α = 1.0001 for inputs of unit scale.
    CHECK(prev < 3e-4);
  }
}

TEST_CASE("bad input gives a clear error") {
  Tensor x = randn({3, 4});
  CHECK_THROWS_MU(nn::entmax_bisect(x, 1.0), "alpha");
  CHECK_THROWS_MU(nn::entmax_bisect(x, 0.5), "alpha = 0.5");
  CHECK_THROWS_MU(nn::entmax_bisect(x, std::nan("")), "alpha");
  CHECK_THROWS_MU(nn::entmax_bisect(x, 1.5, -1, 0), "n_iter");
  CHECK_THROWS_MU(nn::sparsemax(x, 2), "dimension 2 out of range");
  CHECK_THROWS_MU(nn::entmax15(x, -3), "out of range");
  CHECK_THROWS_MU(nn::entmax15(randint(0, 5, {4})), "floating-point");
  CHECK_THROWS_MU(nn::sparsemax(randint(0, 5, {4})), "sparsemax");
  CHECK_THROWS_AS(nn::entmax15(Tensor()), mu::Error);
}

// ---------------------------------------------------------------- gradients

TEST_CASE("gradients equal the closed form on hand-picked inputs") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    Tensor g = on(tensor({1.0, -2.0, 4.0}, kFloat64), dev);
    // sparsemax([0.5, 0.4, -0.5]) has support {0, 1}: dx = g - mean_S(g) there, 0 off it.
    Tensor x = on(tensor({0.5, 0.4, -0.5}, kFloat64).requires_grad_(), dev);
    nn::sparsemax(x).backward(g);
    check_values(x.grad(), {1.5, -1.5, 0}, 1e-15);
    // entmax15 with sqrt(p) = (0.8, 0.6) on support {0, 2}: s = (0.8, 0, 0.6),
    // dx = s g - s (Σ s g) / (Σ s) = s (g - (0.8 - 0 + 2.4) / 1.4).
    Tensor x15 = on(tensor({2.2, 0.5, 1.8}, kFloat64).requires_grad_(), dev);
    nn::entmax15(x15).backward(g);
    double c = (0.8 * 1 + 0.6 * 4) / 1.4;
    check_values(x15.grad(), {0.8 * (1 - c), 0, 0.6 * (4 - c)}, 1e-13);
    // α = 3 with p = (0.6, 0.4, 0): q = p^(2-α) = 1/p on the support.
    Tensor x3 = on(tensor({0.23, 0.13, 0.0}, kFloat64).requires_grad_(), dev);
    nn::entmax_bisect(x3, 3.0).backward(g);
    double q0 = 1 / 0.6, q1 = 1 / 0.4, c3 = (q0 * 1 - q1 * 2) / (q0 + q1);
    check_values(x3.grad(), {q0 * (1 - c3), q1 * (-2 - c3), 0}, 1e-10);
    // Each map's gradient sums to zero along the line (the output's sum is constant).
    manual_seed(18);
    for (const Named& m : all_maps()) {
      INFO(m.name << " alpha " << m.alpha);
      Tensor xr = on(randn({5, 7}, kFloat64).requires_grad_(), dev);
      m.f(xr, 1).backward(on(randn({5, 7}, kFloat64), dev));
      // q = p^(2-α) grows without bound near the support's edge when α > 2: relative check.
      Tensor grad = xr.grad().cpu();  // line sums taken on the CPU
      double scale = 1 + max_abs_diff(grad, zeros({5, 7}, kFloat64));
      CHECK(max_abs_diff(grad.sum({1}), zeros({5}, kFloat64)) <= 1e-12 * scale);
    }
  }
}

TEST_CASE("gradcheck sparsemax, entmax15 and entmax_bisect away from the kinks") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(19);
    for (const Named& m : all_maps()) {
      for (double scale : {0.3, 1.0, 3.0}) {
        INFO(m.name << " alpha " << m.alpha << " scale " << scale);
        Map f = m.f;
        // Lines along the last dim.
        Tensor x = lines_away_from_kinks(4, 6, m.alpha, scale);
        CHECK_GRAD([f](const TensorList& in) { return f(in[0], -1); }, {on(x, dev)});
        // The same lines along dim 1 of a 3-D tensor (2, 6, 2): non-last, inner stride 2.
        Tensor x3 = x.reshape({2, 2, 6}).permute({0, 2, 1}).contiguous();
        CHECK_GRAD([f](const TensorList& in) { return f(in[0], 1); }, {on(x3, dev)});
        // A transposed view: lines along dim 0 with stride 1 in memory, not contiguous.
        Tensor xt = on(x, dev).t();
        REQUIRE(!xt.is_contiguous());
        CHECK_GRAD([f](const TensorList& in) { return f(in[0], 0); }, {xt});
      }
    }
  }
}

// ---------------------------------------------------------------- long lines
// Lines longer than a CUDA block (256 threads), longer than the kernel's shared-memory
// work array (4096), and of length 1, plus a line of only -inf; the gradient on each
// device against the closed form built from the reference.

TEST_CASE("long lines, single-entry lines and all -inf lines; gradients against the closed form") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(20);
    for (const Named& m : all_maps()) {
      for (int64_t n : {300, 5000}) {
        INFO(m.name << " alpha " << m.alpha << " n " << n);
        Tensor x = randn({2, n}, kFloat64) * 3.0;
        Tensor xd = on(x, dev).requires_grad_();
        Tensor y = m.f(xd, 1);
        RefLine ref = ref_along(x, 1, m.alpha);
        check_against(y, x, 1, ref, f64_tol(m));
        // dx = q g - q (Σ q g) / (Σ q), q = p^(2-α) on the support, per line.
        if (m.alpha > 2) continue;  // q = 1/p there: the reference's p is not close enough near 0
        Tensor g = randn({2, n}, kFloat64);
        y.backward(on(g, dev));
        std::vector<double> gv = g.to_vector<double>(), want(gv.size());
        for (int64_t r = 0; r < 2; ++r) {
          double sq = 0, sqg = 0;
          for (int64_t j = 0; j < n; ++j) {
            size_t i = size_t(r * n + j);
            double q = ref.p[i] > 0 ? std::pow(ref.p[i], 2 - m.alpha) : 0.0;
            sq += q;
            sqg += q * gv[i];
          }
          for (int64_t j = 0; j < n; ++j) {
            size_t i = size_t(r * n + j);
            double q = ref.p[i] > 0 ? std::pow(ref.p[i], 2 - m.alpha) : 0.0;
            want[i] = q * gv[i] - q * sqg / sq;
          }
        }
        check_values(xd.grad(), want, 1e-8);
      }
      // One entry per line: p = 1 (gradient 0).
      Tensor one = on(randn({4, 1}, kFloat32), dev);
      for (double v : m.f(one, 1).to_vector<double>()) CHECK(v == 1.0);
      // A line of only -inf has no finite shift: NaN, the other line untouched.
      Tensor xi = on(tensor({{-kInf, -kInf, -kInf}, {0.5, 0.4, -0.5}}), dev);
      Tensor yi = m.f(xi, 1);
      for (int64_t j = 0; j < 3; ++j) CHECK(std::isnan(yi.at({0, j})));
      CHECK(max_abs_diff(yi.select(0, 1), m.f(on(tensor({0.5, 0.4, -0.5}), dev), 0)) == 0.0);
    }
  }
}

TEST_CASE("more lines than a CUDA grid's blocks match the reference; the backward equals the CPU's") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(21);
    Tensor x = randn({5000, 8}, kFloat64) * 2.0;
    Tensor g = randn({5000, 8}, kFloat64);
    for (const Named& m : all_maps()) {
      if (m.name == "entmax_bisect" && m.alpha != 1.25) continue;  // one bisection is enough here
      INFO(m.name << " alpha " << m.alpha);
      Tensor xd = on(x, dev).requires_grad_();
      Tensor y = m.f(xd, 1);
      check_against(y, x, 1, ref_along(x, 1, m.alpha), f64_tol(m));
      y.backward(on(g, dev));
      Tensor xc = x.detach().clone().requires_grad_();
      m.f(xc, 1).backward(g);
      CHECK(max_abs_diff(xd.grad(), xc.grad()) <= 1e-10);
    }
  }
}
