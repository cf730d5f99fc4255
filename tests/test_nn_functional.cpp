// softmax, log_softmax and dropout against direct formulas in double (the losses are
// tested in test_loss.cpp), on every test device: inputs drawn on the CPU and moved,
// results read back through to_vector / at (host copies).
#include <cmath>
#include <limits>

#include "helpers.h"
#include "ops/kernels/attention.h"

using namespace mu;

namespace {

const double kInf = std::numeric_limits<double>::infinity();

// exp(x_j) / sum_k exp(x_k) along dim, straight from the definition (in double, with
// no max subtracted: the inputs here are small), or its log.
std::vector<double> ref_softmax(const Tensor& x, int64_t dim, bool log) {
  std::vector<double> xv = x.to_vector<double>(), out(xv.size());
  for (int64_t f = 0; f < x.numel(); ++f) {
    std::vector<int64_t> at = unflat(x.shape(), f);
    double s = 0;
    for (int64_t k = 0; k < x.shape()[size_t(dim)]; ++k) {
      std::vector<int64_t> a = at;
      a[size_t(dim)] = k;
      s += std::exp(xv[size_t(flat(x.shape(), a))]);
    }
    double v = xv[size_t(f)];
    out[size_t(f)] = log ? v - std::log(s) : std::exp(v) / s;
  }
  return out;
}

}  // namespace

// ---------------------------------------------------------------- softmax, log_softmax

TEST_CASE("softmax and log_softmax match the formula over every dim") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(1);
    for (DType dt : {kFloat64, kFloat32}) {
      double tol = dt == kFloat64 ? 1e-13 : 1e-6;
      Tensor base = on(randn({3, 4, 5}, dt), dev);
      for (Tensor x : {base, base.transpose(0, 2), base.slice(1, 0, 4, 2)}) {
        for (int64_t dim : {0, 1, 2, -1}) {
          int64_t d = dim < 0 ? dim + 3 : dim;
          INFO(dtype_name(dt) << " x " << shape_str(x.shape()) << " dim " << dim);
          Tensor y = softmax(x, dim);
          CHECK(y.dtype() == dt);
          check_close(y, x.shape(), ref_softmax(x, d, false), tol);
          check_close(log_softmax(x, dim), x.shape(), ref_softmax(x, d, true), tol);
          // every line sums to 1
          check_close(sum(y, {dim}), sum(x, {dim}).shape(), std::vector<double>(size_t(x.numel() / x.shape()[size_t(d)]), 1.0),
                      tol * 10);
        }
      }
    }
  }
}

// The 16-bit floats compute in float32 and round once: the result is the formula (in
// double, over the narrow inputs) rounded to the narrow dtype, within its half-ulp; an
// empty tensor is no exception on any device.
TEST_CASE("softmax and log_softmax of bfloat16 and float16 are the formula rounded once") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(3);
    for (DType dt : {kBFloat16, DType::Float16}) {
      INFO(dtype_name(dt));
      Tensor x = on(randn({4, 6}).to(dt), dev);
      Tensor wide = x.cpu().to(kFloat64);  // the narrow values exactly
      const double ulp = dt == kBFloat16 ? 1.0 / 128 : 1.0 / 1024;  // relative spacing of the mantissa
      for (bool log : {false, true}) {
        Tensor y = log ? log_softmax(x, 1) : softmax(x, 1);
        CHECK(y.dtype() == dt);
        check_close(y.cpu().to(kFloat64), x.shape(), ref_softmax(wide, 1, log), ulp);
      }
      Tensor empty_x = on(zeros({0, 6}).to(dt), dev);
      CHECK(softmax(empty_x, 1).shape() == Shape{0, 6});
      CHECK(log_softmax(empty_x, 1).dtype() == dt);
    }
  }
}

TEST_CASE("softmax of a large tensor (split over threads) matches the formula") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(2);
    Tensor x = on(randn({300, 150}, kFloat32), dev);
    check_close(softmax(x, 1), x.shape(), ref_softmax(x, 1, false), 1e-6);
    check_close(log_softmax(x, 0), x.shape(), ref_softmax(x, 0, true), 1e-6);
    // Lines as long as a vocabulary (a sampler's softmax over GPT-2's logits), spread
    // wide; the formula with each row's sum taken once.
    const int64_t V = 50257;
    Tensor xl = on(randn({2, V}, kFloat32) * 6.0, dev);
    std::vector<double> xv = xl.to_vector<double>(), p(xv.size()), lp(xv.size());
    for (int64_t r = 0; r < 2; ++r) {
      double s = 0;
      for (int64_t j = 0; j < V; ++j) s += std::exp(xv[size_t(r * V + j)]);
      for (int64_t j = 0; j < V; ++j) {
        p[size_t(r * V + j)] = std::exp(xv[size_t(r * V + j)]) / s;
        lp[size_t(r * V + j)] = xv[size_t(r * V + j)] - std::log(s);
      }
    }
    check_close(softmax(xl, 1), xl.shape(), p, 1e-6);
    check_close(log_softmax(xl, 1), xl.shape(), lp, 1e-6);
  }
}

TEST_CASE("softmax is stable for large magnitudes and handles -inf") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    // exp(1000) overflows; softmax is shift-invariant, so it equals softmax([0, 1, 2]).
    for (DType dt : {kFloat32, kFloat64}) {
      Tensor x = on(tensor({1000.0, 1001.0, 1002.0}, dt), dev);
      double e0 = 1, e1 = std::exp(1.0), e2 = std::exp(2.0), s = e0 + e1 + e2;
      check_close(softmax(x, 0), {3}, {e0 / s, e1 / s, e2 / s}, 1e-6);
      check_close(log_softmax(x, 0), {3}, {-std::log(s), 1 - std::log(s), 2 - std::log(s)}, 1e-6);
      Tensor xn = on(tensor({-1000.0, -1001.0, -1002.0}, dt), dev);
      check_close(softmax(xn, 0), {3}, {e2 / s, e1 / s, e0 / s}, 1e-6);
    }
    // Masked entries (-inf) get probability 0; log_softmax -inf.
    Tensor m = on(tensor({-kInf, 0.0, 0.0}), dev);
    check_close(softmax(m, 0), {3}, {0, 0.5, 0.5}, 1e-7);
    CHECK(std::isinf(log_softmax(m, 0).at({0})));
    CHECK(log_softmax(m, 0).at({1}) == doctest::Approx(-std::log(2.0)));
    // A 0-dim tensor is one line of one element.
    CHECK(softmax(full({}, 3.0, TensorOptions().device(dev)), 0).item() == 1.0);
  }
}

TEST_CASE("softmax and log_softmax gradients match their closed forms") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(3);
    Tensor x = on(randn({4, 6}, kFloat64).requires_grad_(), dev);
    Tensor g = randn({4, 6}, kFloat64);
    softmax(x, 1).backward(on(g, dev));
    // dx_ij = y_ij (g_ij - sum_k g_ik y_ik)
    std::vector<double> y = ref_softmax(x.detach(), 1, false), gv = g.to_vector<double>(), want(24);
    for (int i = 0; i < 4; ++i) {
      double s = 0;
      for (int k = 0; k < 6; ++k) s += gv[size_t(i * 6 + k)] * y[size_t(i * 6 + k)];
      for (int j = 0; j < 6; ++j) want[size_t(i * 6 + j)] = y[size_t(i * 6 + j)] * (gv[size_t(i * 6 + j)] - s);
    }
    check_close(x.grad(), {4, 6}, want, 1e-12);
    // log_softmax along dim 0: dx_ij = g_ij - softmax_ij sum_k g_kj
    Tensor x2 = x.detach().requires_grad_();
    log_softmax(x2, 0).backward(on(g, dev));
    std::vector<double> y0 = ref_softmax(x.detach(), 0, false);
    for (int j = 0; j < 6; ++j) {
      double s = 0;
      for (int k = 0; k < 4; ++k) s += gv[size_t(k * 6 + j)];
      for (int i = 0; i < 4; ++i) want[size_t(i * 6 + j)] = gv[size_t(i * 6 + j)] - y0[size_t(i * 6 + j)] * s;
    }
    check_close(x2.grad(), {4, 6}, want, 1e-12);
  }
}

// ---------------------------------------------------------------- dropout

TEST_CASE("dropout: same seed, same mask; zeros near p; survivors scaled by 1/(1-p)") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    double p = 0.3;
    Tensor x = full({200, 500}, 2.0, TensorOptions().device(dev));
    manual_seed(123);
    Tensor a = dropout(x, p);
    manual_seed(123);
    Tensor b = dropout(x, p);
    CHECK(a.to_vector<float>() == b.to_vector<float>());
    Tensor c = dropout(x, p);  // the generator moved on: a different mask
    CHECK(a.to_vector<float>() != c.to_vector<float>());
    std::vector<double> v = a.to_vector<double>();
    int64_t zeros_n = 0;
    bool scaled = true;
    for (double e : v) {
      if (e == 0) ++zeros_n;
      else scaled = scaled && std::fabs(e - 2.0 / (1 - p)) < 1e-5;
    }
    CHECK(scaled);
    // 100000 Bernoulli(0.3) draws: the standard deviation of the fraction is 0.0015.
    CHECK(std::fabs(double(zeros_n) / double(v.size()) - p) < 0.01);
    // The gradient is the same mask.
    Tensor xl = ones({1000}, TensorOptions(kFloat64).device(dev)).requires_grad_();
    manual_seed(5);
    Tensor y = dropout(xl, 0.5);
    y.sum().backward();
    CHECK(xl.grad().to_vector<double>() == y.detach().to_vector<double>());
  }
}

TEST_CASE("dropout: the same generator state draws the same mask on every device, bfloat16 included") {
  std::vector<double> cpu_mask;
  for (Device dev : test_devices()) {
    INFO(dev.str());
    Generator g(77);
    Tensor y = dropout(ones({3, 1000}, TensorOptions().device(dev)), 0.25, true, &g);
    std::vector<double> m = y.to_vector<double>();
    if (dev.is_cpu()) cpu_mask = m;
    else CHECK(m == cpu_mask);
    // bfloat16 keeps its dtype; its survivors are 1/(1-p) rounded once (4/3 -> 1.3359375).
    Generator h(77);
    Tensor yb = dropout(ones({3, 1000}, TensorOptions(kBFloat16).device(dev)), 0.25, true, &h);
    CHECK(yb.dtype() == kBFloat16);
    std::vector<double> mb = yb.to_vector<double>();
    for (size_t i = 0; i < mb.size(); ++i) {
      INFO("element " << i);
      CHECK(mb[i] == (m[i] == 0 ? 0.0 : 1.3359375));
    }
  }
}

TEST_CASE("dropout: every element's factor is the documented hash of its position, at every length") {
  // The mask element by element from attention_dropout_bits, one counter at a time; the
  // kernels draw eight counters at a time and split long tensors over threads. Lengths
  // around a vector (7, 8, 9), a thread's block (4095-4097) and several blocks on several
  // threads with a remainder (100003); p from a few dropped to nearly all.
  for (Device dev : test_devices())
    for (DType dt : {kFloat32, kFloat64})
      for (int64_t n : {1, 7, 8, 9, 4095, 4096, 4097, 100003})
        for (double p : {0.001, 0.1, 0.5, 0.999}) {
          INFO(dev.str() << " " << dtype_name(dt) << ", n " << n << ", p " << p);
          Generator g(1000 + uint64_t(n)), copy(1000 + uint64_t(n));
          const uint64_t key = kernels::attention_dropout_key(copy.next_u64());
          const uint64_t threshold = kernels::attention_dropout_threshold(p);
          std::vector<double> m = dropout(ones({n}, TensorOptions(dt).device(dev)), p, true, &g).to_vector<double>();
          const double kept = dt == kFloat32 ? double(float(1 / (1 - p))) : 1 / (1 - p);
          int64_t wrong = 0, first = -1;
          for (int64_t i = 0; i < n; ++i) {
            const double want = kernels::attention_dropout_bits(key, uint64_t(i)) >= threshold ? kept : 0.0;
            if (m[size_t(i)] != want && wrong++ == 0) first = i;
          }
          INFO("first wrong element " << first);
          CHECK(wrong == 0);
        }
}

TEST_CASE("dropout: identity in eval or with p = 0, zeros with p = 1, errors outside [0, 1]") {
  const Tensor x0 = randn({10, 10});  // drawn once: the same input on every device
  for (Device dev : test_devices()) {
    INFO(dev.str());
    Tensor x = on(x0, dev);
    CHECK(dropout(x, 0.5, false).is_same(x));
    CHECK(dropout(x, 0.0, true).is_same(x));
    std::vector<float> z = dropout(x, 1.0).to_vector<float>();
    CHECK(z == std::vector<float>(100, 0.0f));
    CHECK_THROWS_MU(dropout(x, 1.5), "dropout: probability has to be between 0 and 1, got 1.5");
    CHECK_THROWS_MU(dropout(x, -0.1), "dropout: probability has to be between 0 and 1");
  }
}

// ---------------------------------------------------------------- softmax: every line scheme

namespace {

// softmax (or log_softmax) of x along dim, line by line in double with the line's max
// subtracted: a line holding NaN, or only -inf, is all NaN.
std::vector<double> ref_softmax_lines(const Tensor& x, int64_t dim, bool log) {
  const Shape& s = x.shape();
  int64_t outer = 1, n = s[size_t(dim)], inner = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= s[size_t(d)];
  for (size_t d = size_t(dim) + 1; d < s.size(); ++d) inner *= s[d];
  std::vector<double> v = x.to_vector<double>(), out(v.size());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      auto at = [&](int64_t j) { return size_t((o * n + j) * inner + i); };
      double m = -kInf;
      bool nan = false;
      for (int64_t j = 0; j < n; ++j) {
        nan = nan || std::isnan(v[at(j)]);
        m = std::max(m, v[at(j)]);
      }
      double sum = 0;
      for (int64_t j = 0; j < n; ++j) sum += std::exp(v[at(j)] - m);
      for (int64_t j = 0; j < n; ++j)
        out[at(j)] = nan || m == -kInf ? NAN : log ? v[at(j)] - m - std::log(sum) : std::exp(v[at(j)] - m) / sum;
    }
  return out;
}

// The backward's closed forms along dim from y (the softmax, in double) and g:
// softmax dx = y (g - sum g y); log_softmax dx = g - y sum g.
std::vector<double> ref_softmax_grad(const Shape& s, int64_t dim, const std::vector<double>& y,
                                     const std::vector<double>& g, bool log) {
  int64_t outer = 1, n = s[size_t(dim)], inner = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= s[size_t(d)];
  for (size_t d = size_t(dim) + 1; d < s.size(); ++d) inner *= s[d];
  std::vector<double> dx(y.size());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      auto at = [&](int64_t j) { return size_t((o * n + j) * inner + i); };
      double sum = 0;
      for (int64_t j = 0; j < n; ++j) sum += log ? g[at(j)] : g[at(j)] * y[at(j)];
      for (int64_t j = 0; j < n; ++j) dx[at(j)] = log ? g[at(j)] - y[at(j)] * sum : y[at(j)] * (g[at(j)] - sum);
    }
  return dx;
}

}  // namespace

// The shapes take each mapping of the CUDA kernels (ops/cuda/lines.cuh): contiguous lines
// longer than a block's reach (a block per line), many short contiguous lines (a warp per
// line, more lines than the grid has warps), and strided lines whose count along inner is
// not a multiple of the tile (37, 5) or exceeds the grid (137600); on the CPU, strided
// lines one at a time (inner 5) or in blocks of 64 side by side (inner 8, 37, two whole
// blocks and 3 lines over in 131, more than two thousand in 137600); lines holding NaN, only
// -inf, or some -inf sit in each. Forward and backward on every device, against double.
TEST_CASE("softmax and log_softmax on every line scheme, with NaN and -inf lines, values and gradients") {
  struct Case {
    Shape shape;
    int64_t dim;
  };
  const std::vector<Case> cases = {{{6, 2000}, 1}, {{17000, 3}, 1}, {{3, 1500, 37}, 1}, {{7, 3, 5}, 1},
                                   {{2, 137600}, 0}, {{4, 50, 131}, 1}, {{5, 9, 8}, 1}};
  for (Device dev : test_devices())
    for (DType dt : {kFloat64, kFloat32})
      for (const Case& c : cases) {
        INFO(dev.str() << " " << dtype_name(dt) << " shape " << shape_str(c.shape) << " dim " << c.dim);
        manual_seed(21);
        Tensor clean = randn(c.shape, kFloat64) * 3.0;
        // Specials in the first lines: line 0 holds a NaN, line 1 only -inf, line 2 one -inf.
        std::vector<double> v = clean.to_vector<double>();
        const Shape& s = c.shape;
        int64_t n = s[size_t(c.dim)], inner = 1;
        for (size_t d = size_t(c.dim) + 1; d < s.size(); ++d) inner *= s[d];
        auto at = [&](int64_t line, int64_t j) { return size_t((line / inner * n + j) * inner + line % inner); };
        v[at(0, n / 2)] = NAN;
        for (int64_t j = 0; j < n; ++j) v[at(1, j)] = -kInf;
        v[at(2, n - 1)] = -kInf;
        Tensor special = from_vector(v, s, dt);
        const double tol = dt == kFloat64 ? 1e-12 : 1e-6;
        for (bool log : {false, true}) {
          INFO((log ? "log_softmax" : "softmax"));
          Tensor xs = on(special, dev);
          check_close_special(log ? log_softmax(xs, c.dim) : softmax(xs, c.dim),
                              ref_softmax_lines(special, c.dim, log), tol);
          // Gradients on the clean input.
          Tensor x = on(clean.to(dt), dev).requires_grad_();
          Tensor g = randn(s, kFloat64).to(dt);
          (log ? log_softmax(x, c.dim) : softmax(x, c.dim)).backward(on(g, dev));
          std::vector<double> y = ref_softmax_lines(clean.to(dt), c.dim, false);
          check_close_special(x.grad(), ref_softmax_grad(s, c.dim, y, g.to_vector<double>(), log), tol * 10);
        }
      }
}
