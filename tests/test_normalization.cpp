// The fused layer_norm and batch_norm ops against the same functions composed from
// mean / rsqrt / arithmetic ops (values and gradients, several shapes, affine or not,
// train and eval, both channel layouts), running statistics against a brute-force loop
// in double, and their errors.
#include <optional>

#include "helpers.h"
#include "nn/nn.h"
#include "ops/kernels/norm.h"

using namespace mu;

namespace {

// ---------------------------------------------------------------- composed references

// LayerNorm from its formula with autograd ops, on the CPU: what nn::LayerNorm computed
// before the fused op.
Tensor composed_layer_norm(const Tensor& x, const Shape& ns, const Tensor& w, const Tensor& b, double eps) {
  Shape dims;
  for (int64_t i = -int64_t(ns.size()); i < 0; ++i) dims.push_back(i);
  Tensor centred = x - mean(x, dims, true);
  Tensor var = mean(centred * centred, dims, true);  // biased
  Tensor y = centred * rsqrt(var + eps);
  if (w.defined()) y = y * w;
  if (b.defined()) y = y + b;
  return y;
}

// Channel dim of a batch_norm input.
int64_t channel_dim(const Tensor& x, ChannelLayout layout) { return layout == ChannelLayout::Last ? x.dim() - 1 : 1; }

// A (C) tensor shaped to broadcast against x along its channel dim.
Tensor along_channels(const Tensor& v, const Tensor& x, ChannelLayout layout) {
  Shape s(size_t(x.dim()), 1);
  s[size_t(channel_dim(x, layout))] = v.numel();
  return v.reshape(s);
}

// batch_norm's output from its formula with autograd ops (no running-statistics update):
// the batch's mean and biased variance when training, else the given statistics.
Tensor composed_batch_norm(const Tensor& x, const Tensor& rm, const Tensor& rv, const Tensor& w, const Tensor& b,
                           bool training, double eps, ChannelLayout layout) {
  const int64_t cd = channel_dim(x, layout);
  Shape dims;
  for (int64_t d = 0; d < x.dim(); ++d)
    if (d != cd) dims.push_back(d);
  Tensor y;
  if (training) {
    Tensor centred = x - mean(x, dims, true);
    y = centred * rsqrt(mean(centred * centred, dims, true) + eps);
  } else {
    y = (x - along_channels(rm, x, layout)) * rsqrt(along_channels(rv, x, layout) + eps);
  }
  if (w.defined()) y = y * along_channels(w, x, layout);
  if (b.defined()) y = y + along_channels(b, x, layout);
  return y;
}

// Per-channel mean and biased variance in double, by a loop over every element.
struct ChannelStats {
  std::vector<double> mean, var;
  int64_t n = 0;  // values per channel
};
ChannelStats brute_stats(const Tensor& x, ChannelLayout layout) {
  const int64_t cd = channel_dim(x, layout), c = x.size(cd);
  std::vector<double> xv = x.to_vector<double>();
  ChannelStats s{std::vector<double>(size_t(c), 0.0), std::vector<double>(size_t(c), 0.0), x.numel() / c};
  for (int64_t f = 0; f < x.numel(); ++f) s.mean[size_t(unflat(x.shape(), f)[size_t(cd)])] += xv[size_t(f)];
  for (double& m : s.mean) m /= double(s.n);
  for (int64_t f = 0; f < x.numel(); ++f) {
    size_t k = size_t(unflat(x.shape(), f)[size_t(cd)]);
    s.var[k] += (xv[size_t(f)] - s.mean[k]) * (xv[size_t(f)] - s.mean[k]);
  }
  for (double& v : s.var) v /= double(s.n);
  return s;
}

// |got - want| <= tol * max(1, max |want|), both moved to the CPU.
void check_near(const Tensor& got, const Tensor& want, double tol) {
  REQUIRE(got.defined());
  REQUIRE(want.defined());
  Tensor g = got.cpu(), w = want.cpu();
  REQUIRE(g.shape() == w.shape());
  double scale = 1;
  for (double v : w.to_vector<double>()) scale = std::max(scale, std::fabs(v));
  double err = max_abs_diff(g, w);
  INFO("max |got - want| = " << err << ", scale " << scale);
  CHECK(err <= tol * scale);
}

// A fresh CPU leaf with the values of t (or undefined).
Tensor leaf(const Tensor& t) { return t.defined() ? t.detach().clone().requires_grad_() : Tensor(); }

// The same leaf on `dev` (or undefined).
Tensor leaf_on(const Tensor& t, Device dev) { return t.defined() ? on(leaf(t), dev) : Tensor(); }

double tol_for(DType dt) { return dt == kFloat64 ? 1e-12 : 2e-5; }

}  // namespace

// ---------------------------------------------------------------- layer_norm

TEST_CASE("layer_norm equals the composed formula: values and gradients of x, weight and bias") {
  manual_seed(1);
  struct Case {
    Shape x, ns;
    bool weight, bias;
    double eps;
  };
  const std::vector<Case> cases = {
      {{4, 6}, {6}, true, true, 1e-5},          {{2, 3, 5}, {5}, false, false, 1e-5},
      {{2, 3, 4}, {3, 4}, true, true, 0.1},     {{5, 7}, {7}, true, false, 1e-5},
      {{5, 7}, {7}, false, true, 1e-3},         {{6}, {6}, true, true, 1e-5},
      {{64, 768}, {768}, true, true, 1e-5},     // large enough to run on several threads
      {{3, 0, 4}, {4}, true, true, 1e-5},       // no rows
      // Shapes for the CUDA mappings: rows longer than a warp's reach (a block per row),
      // more rows than the grid has warps, and column sums over many row chunks with a
      // partly filled column tile.
      {{5, 1500}, {1500}, true, true, 1e-5},    {{17000, 8}, {8}, true, true, 1e-5},
      {{2000, 40}, {40}, true, false, 1e-5},
  };
  for (Device dev : test_devices())
    for (DType dt : {kFloat64, kFloat32})
      for (const Case& c : cases) {
        INFO(dev.str() << " " << dtype_name(dt) << " x " << shape_str(c.x) << " over " << shape_str(c.ns)
                       << (c.weight ? " weight" : "") << (c.bias ? " bias" : ""));
        Tensor x = randn(c.x, dt) * 2.0 + 0.5;
        Tensor w = c.weight ? randn(c.ns, dt) + 1.0 : Tensor();
        Tensor b = c.bias ? randn(c.ns, dt) : Tensor();
        Tensor g = randn(c.x, dt);
        // Reference: the composed ops on the CPU.
        Tensor xr = leaf(x), wr = leaf(w), br = leaf(b);
        Tensor yr = composed_layer_norm(xr, c.ns, wr, br, c.eps);
        if (yr.numel() > 0) yr.backward(g);
        // Fused, on the device.
        Tensor xd = leaf_on(x, dev), wd = leaf_on(w, dev), bd = leaf_on(b, dev);
        Tensor yd = layer_norm(xd, c.ns, wd, bd, c.eps);
        CHECK(yd.dtype() == dt);
        check_near(yd, yr, tol_for(dt));
        if (yr.numel() == 0) continue;
        yd.backward(on(g, dev));
        check_near(xd.grad(), xr.grad(), tol_for(dt) * 5);
        if (c.weight) check_near(wd.grad(), wr.grad(), tol_for(dt) * 5);
        if (c.bias) check_near(bd.grad(), br.grad(), tol_for(dt) * 5);
      }
}

TEST_CASE("layer_norm: non-contiguous input, no grad mode, and only the gradients asked for") {
  manual_seed(2);
  for (Device dev : test_devices()) {
    // A transposed input normalises its own logical layout.
    Tensor base = randn({5, 3, 4}, kFloat64);
    Tensor xt = on(base, dev).permute({2, 1, 0});  // (4, 3, 5)
    Tensor w = randn({5}, kFloat64), b = randn({5}, kFloat64);
    check_near(layer_norm(xt, {5}, on(w, dev), on(b, dev)),
               composed_layer_norm(base.permute({2, 1, 0}), {5}, w, b, 1e-5), 1e-12);
    {
      NoGradGuard ng;
      Tensor x = on(randn({3, 5}, kFloat64), dev).requires_grad_();
      CHECK_FALSE(layer_norm(x, {5}).requires_grad());
    }
    // Only weight requires grad: x gets none, weight's equals the composed one.
    Tensor x = randn({4, 5}, kFloat64), g = randn({4, 5}, kFloat64);
    Tensor wd = on(leaf(w), dev), xd = on(x, dev);
    layer_norm(xd, {5}, wd, on(b, dev)).backward(on(g, dev));
    Tensor wr = leaf(w);
    composed_layer_norm(x, {5}, wr, b, 1e-5).backward(g);
    check_near(wd.grad(), wr.grad(), 1e-12);
    CHECK_FALSE(xd.grad().defined());
  }
}

TEST_CASE("layer_norm's weight and bias gradients are the sums over rows, the same on every run") {
  manual_seed(3);
  // 300 rows of 200: several threads each sum a block of rows.
  const int64_t rows = 300, n = 200;
  Tensor x = randn({rows, n}), g = randn({rows, n}), w = randn({n}) + 1.0, b = randn({n});
  for (Device dev : test_devices()) {
    auto run = [&] {
      Tensor wd = on(leaf(w), dev), bd = on(leaf(b), dev);
      layer_norm(on(x, dev), {n}, wd, bd).backward(on(g, dev));
      return std::pair{wd.grad().cpu(), bd.grad().cpu()};
    };
    auto [dw, db] = run();
    // Brute force in double: dweight_j = sum_r g_rj xhat_rj, dbias_j = sum_r g_rj.
    std::vector<double> xv = x.to_vector<double>(), gv = g.to_vector<double>();
    std::vector<double> want_w(size_t(n), 0.0), want_b(size_t(n), 0.0);
    for (int64_t r = 0; r < rows; ++r) {
      double m = 0, v = 0;
      for (int64_t j = 0; j < n; ++j) m += xv[size_t(r * n + j)] / double(n);
      for (int64_t j = 0; j < n; ++j) v += std::pow(xv[size_t(r * n + j)] - m, 2) / double(n);
      for (int64_t j = 0; j < n; ++j) {
        want_w[size_t(j)] += gv[size_t(r * n + j)] * (xv[size_t(r * n + j)] - m) / std::sqrt(v + 1e-5);
        want_b[size_t(j)] += gv[size_t(r * n + j)];
      }
    }
    check_close(dw, want_w, 1e-5);
    check_close(db, want_b, 1e-5);
    // Partial sums are added in a fixed order: bit-identical on a second run.
    auto [dw2, db2] = run();
    CHECK(max_abs_diff(dw, dw2) == 0.0);
    CHECK(max_abs_diff(db, db2) == 0.0);
  }
}

namespace {
// A row's mean and rstd = 1 / sqrt(var + eps) by the two-pass definition (var the biased
// variance, as torch's), in long double: the reference of the statistics tests below.
std::pair<long double, long double> two_pass_stats(const float* x, int64_t n, double eps) {
  long double m = 0, v = 0;
  for (int64_t j = 0; j < n; ++j) m += x[j];
  m /= n;
  for (int64_t j = 0; j < n; ++j) v += (x[j] - m) * (x[j] - m);
  return {m, 1 / std::sqrt(v / n + eps)};
}
}  // namespace

// The CPU kernel's statistics of float32 rows (one pass of sums shifted by the row's first
// value) against a two-pass loop in long double over the same float32 values: rows whose
// mean is up to 5·10^6 times their spread (where an unshifted Σx² / n - mean² loses
// digits: it fails here), a first value far from the mean, a constant row, rows of one,
// and lengths around the vector width.
TEST_CASE("layer_norm's CPU statistics keep their digits on rows far from zero") {
  if (!kernels::layer_norm_forward.has(DeviceType::CPU)) return;
  manual_seed(24);
  for (int64_t n : {1, 5, 8, 17, 128, 131, 1000}) {
    INFO("n " << n);
    const int64_t rows = 7;
    Tensor x = randn({rows, n});
    std::vector<float> xv = x.to_vector<float>();
    const double offsets[rows] = {0, 1e4, 3e4, -2e5, 1e6, 7, 3e4};
    const double spreads[rows] = {1, 1, 0.01, 0.1, 0.2, 0, 0.01};
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < n; ++j) xv[size_t(r * n + j)] = float(offsets[r] + spreads[r] * xv[size_t(r * n + j)]);
    if (n > 1) xv[size_t(6 * n)] = float(3e4 + 2.0);  // row 6 starts 200 spreads from its mean
    x = from_vector<float>(xv, {rows, n});
    Tensor y = empty({rows, n}), mean = empty({rows}), rstd = empty({rows});
    const double eps = 1e-5;
    kernels::layer_norm_forward(x.device(), x, Tensor(), Tensor(), y, mean, rstd, rows, n, eps);
    std::vector<float> mv = mean.to_vector<float>(), rv = rstd.to_vector<float>();
    for (int64_t r = 0; r < rows; ++r) {
      const auto [m, rs] = two_pass_stats(xv.data() + r * n, n, eps);
      const double want_rstd = double(rs);
      INFO("row " << r);
      CHECK(std::abs(mv[size_t(r)] - double(m)) <= 1e-6 * std::abs(double(m)) + 1e-30);
      CHECK(std::abs(rv[size_t(r)] - want_rstd) <= 1e-6 * want_rstd);
    }
  }
}

// Rows holding infinities or NaN, and rows of length 0, give the statistics of the two-pass
// definition (mean = Σx / n, var = Σ(x - mean)² / n) in long double: a -inf row's mean is
// -inf and its rstd NaN, a NaN anywhere makes both NaN, an empty row's are NaN (0 / 0).
// float32 rows take the one-pass shifted sums, float64 rows two passes: both are checked.
TEST_CASE("layer_norm's CPU statistics of non-finite and empty rows follow the two-pass definition") {
  if (!kernels::layer_norm_forward.has(DeviceType::CPU)) return;
  const float inf = INFINITY, nan = NAN;
  const std::vector<std::vector<float>> rows = {
      {-inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf}, {-inf, 1, 2, 3, 4, 5, 6, 7, 8},
      {1, 2, 3, 4, nan, 6, 7, 8, 9},                         {1, 2, 3, 4, 5, 6, 7, 8, inf},
      {inf, 2, 3, 4, 5, 6, 7, 8, -inf},                      {nan, 2, 3, 4, 5, 6, 7, 8, 9},
      {1, 2, 3, 4, 5, 6, 7, 8, 9}};
  const double eps = 1e-5;
  auto same = [](double got, long double want) {
    if (std::isnan(want)) return std::isnan(got);
    if (std::isinf(want)) return got == double(want);
    return std::abs(got - double(want)) <= 1e-6 * (1 + std::abs(double(want)));
  };
  for (DType dt : {kFloat32, kFloat64}) {
    INFO(dtype_name(dt));
    const int64_t R = int64_t(rows.size()), n = int64_t(rows[0].size());
    std::vector<float> flat;
    for (const auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
    Tensor x = from_vector<float>(flat, {R, n}).to(dt);
    Tensor y = empty({R, n}, dt), mean = empty({R}, dt), rstd = empty({R}, dt);
    kernels::layer_norm_forward(x.device(), x, Tensor(), Tensor(), y, mean, rstd, R, n, eps);
    std::vector<double> mv = mean.to_vector<double>(), rv = rstd.to_vector<double>();
    for (int64_t r = 0; r < R; ++r) {
      const auto [m, want_rstd] = two_pass_stats(rows[size_t(r)].data(), n, eps);
      INFO("row " << r << ": mean " << mv[size_t(r)] << " (want " << double(m) << "), rstd " << rv[size_t(r)]
                  << " (want " << double(want_rstd) << ")");
      CHECK(same(mv[size_t(r)], m));
      CHECK(same(rv[size_t(r)], want_rstd));
    }
    // Rows of length 0: the mean and the variance are 0 / 0.
    Tensor e = empty({3, 0}, dt), ey = empty({3, 0}, dt), em = empty({3}, dt), er = empty({3}, dt);
    kernels::layer_norm_forward(e.device(), e, Tensor(), Tensor(), ey, em, er, 3, 0, eps);
    for (double m : em.to_vector<double>()) CHECK(std::isnan(m));
    for (double r : er.to_vector<double>()) CHECK(std::isnan(r));
  }
}

// The 16-bit floats compute in float32 and round once: the composed formula in float64
// over the narrow values, within the narrow dtype's half-ulp of the output's scale; the
// gradients come back in the narrow dtype; empty inputs keep their dtype.
TEST_CASE("layer_norm of bfloat16 and float16 inputs is the formula rounded once") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(21);
    for (DType dt : {kBFloat16, DType::Float16}) {
      INFO(dtype_name(dt));
      Tensor x = on(randn({3, 8}).to(dt), dev).requires_grad_(), w = on(randn({8}).to(dt), dev).requires_grad_();
      Tensor b = on(randn({8}).to(dt), dev);
      Tensor y = layer_norm(x, {8}, w, b);
      CHECK(y.dtype() == dt);
      Tensor want = composed_layer_norm(x.detach().cpu().to(kFloat64), {8}, w.detach().cpu().to(kFloat64),
                                        b.cpu().to(kFloat64), 1e-5);
      // Rounding moves a value by at most half its ulp, 2^-8 (bfloat16) or 2^-11 (float16) of
      // itself, so of the largest |want|; the margin is for float32's own rounding.
      check_near(y.detach().cpu().to(kFloat64), want, dt == kBFloat16 ? 1.0 / 200 : 1.0 / 1600);
      y.sum().backward();
      CHECK(x.grad().dtype() == dt);
      CHECK(w.grad().dtype() == dt);
      CHECK(layer_norm(on(zeros({0, 8}).to(dt), dev), {8}).dtype() == dt);
    }
  }
}

TEST_CASE("layer_norm errors name the problem") {
  Tensor x = randn({4, 5});
  CHECK_THROWS_MU(layer_norm(x, {6}), "layer_norm: expected an input whose trailing dims are [6] (normalized_shape), "
                                      "got shape [4, 5]");
  CHECK_THROWS_MU(layer_norm(x, {}), "normalized_shape must name at least one dim");
  CHECK_THROWS_MU(layer_norm(x, {2, 4, 5}), "trailing dims are [2, 4, 5]");
  CHECK_THROWS_MU(layer_norm(x, {5}, randn({4})), "layer_norm: weight must have shape [5], got [4]");
  CHECK_THROWS_MU(layer_norm(x, {5}, Tensor(), randn({5, 1})), "bias must have shape [5], got [5, 1]");
  CHECK_THROWS_MU(layer_norm(x, {5}, randn({5}, kFloat64)), "weight is float64 but the input is float32");
  CHECK_THROWS_MU(layer_norm(ones({2, 3}, kInt64), {3}), "layer_norm: needs a floating-point input, got int64");
}

// ---------------------------------------------------------------- batch_norm

namespace {

struct BnCase {
  Shape x;
  ChannelLayout layout;
};

std::string layout_name(ChannelLayout l) { return l == ChannelLayout::Last ? "channels-last" : "channels-first"; }

}  // namespace

TEST_CASE("batch_norm equals the composed formula in training and eval, and moves the running statistics") {
  manual_seed(4);
  const std::vector<BnCase> cases = {
      {{8, 5}, ChannelLayout::First},       {{8, 5}, ChannelLayout::Last},  // (N, C) reads the same both ways
      {{4, 5, 6}, ChannelLayout::First},    {{4, 6, 5}, ChannelLayout::Last},
      {{2, 3, 2, 4}, ChannelLayout::First}, {{3, 2, 2, 3}, ChannelLayout::Last},
      {{64, 16, 64}, ChannelLayout::First},  // large: several threads per pass
      {{256, 4, 40}, ChannelLayout::Last},   {{1, 3, 7}, ChannelLayout::First},  // one sample, 7 values each
      // Shapes for the CUDA mappings of the channel sums: channels-first values cut into
      // chunks per channel; channels-last rows cut into many chunks (the last one short),
      // and many channels in one row.
      {{2, 40, 400}, ChannelLayout::First}, {{9000, 3}, ChannelLayout::Last},
      {{2, 3, 5000}, ChannelLayout::Last},
      // The CPU's float32 sums: channels-last rows of one whole vector of channels and a
      // part of one, over a number of rows that ends a block and a group of four early;
      // channels-first lines shorter than a vector.
      {{203, 13}, ChannelLayout::Last},     {{7, 13, 3}, ChannelLayout::First},
  };
  const double momentum = 0.1, eps = 1e-5;
  for (Device dev : test_devices())
    for (DType dt : {kFloat64, kFloat32})
      for (const BnCase& c : cases)
        for (bool affine : {true, false}) {
          const int64_t C = c.x[size_t(c.layout == ChannelLayout::Last ? c.x.size() - 1 : 1)];
          INFO(dev.str() << " " << dtype_name(dt) << " x " << shape_str(c.x) << " " << layout_name(c.layout)
                         << (affine ? " affine" : ""));
          Tensor w = affine ? randn({C}, dt) + 1.0 : Tensor(), b = affine ? randn({C}, dt) : Tensor();
          Tensor rm = on(zeros({C}, dt), dev), rv = on(ones({C}, dt), dev);
          std::vector<double> want_rm(size_t(C), 0.0), want_rv(size_t(C), 1.0);
          // Three training steps, each batch with its own offset and scale.
          for (int step = 0; step < 3; ++step) {
            INFO("training step " << step);
            Tensor x = randn(c.x, dt) * (1.0 + step) + 0.5 * step, g = randn(c.x, dt);
            Tensor xr = leaf(x), wr = leaf(w), br = leaf(b);
            Tensor yr = composed_batch_norm(xr, Tensor(), Tensor(), wr, br, true, eps, c.layout);
            yr.backward(g);
            Tensor xd = leaf_on(x, dev), wd = leaf_on(w, dev), bd = leaf_on(b, dev);
            Tensor yd = batch_norm(xd, rm, rv, wd, bd, true, momentum, eps, c.layout);
            check_near(yd, yr, tol_for(dt));
            yd.backward(on(g, dev));
            check_near(xd.grad(), xr.grad(), tol_for(dt) * 5);
            if (affine) {
              check_near(wd.grad(), wr.grad(), tol_for(dt) * 5);
              check_near(bd.grad(), br.grad(), tol_for(dt) * 5);
            }
            ChannelStats s = brute_stats(x, c.layout);
            for (size_t k = 0; k < size_t(C); ++k) {
              want_rm[k] = (1 - momentum) * want_rm[k] + momentum * s.mean[k];
              want_rv[k] = (1 - momentum) * want_rv[k] + momentum * s.var[k] * double(s.n) / double(s.n - 1);
            }
            check_close(rm.cpu(), want_rm, dt == kFloat64 ? 1e-12 : 1e-6);
            check_close(rv.cpu(), want_rv, dt == kFloat64 ? 1e-12 : 1e-6);
          }
          CHECK_FALSE(rm.requires_grad());
          // Eval: the running statistics normalise, and stay where they are.
          Tensor x = randn(c.x, dt) * 1.5, g = randn(c.x, dt);
          Tensor xr = leaf(x), wr = leaf(w), br = leaf(b);
          Tensor yr = composed_batch_norm(xr, rm.cpu(), rv.cpu(), wr, br, false, eps, c.layout);
          yr.backward(g);
          Tensor xd = leaf_on(x, dev), wd = leaf_on(w, dev), bd = leaf_on(b, dev);
          Tensor yd = batch_norm(xd, rm, rv, wd, bd, false, momentum, eps, c.layout);
          check_near(yd, yr, tol_for(dt));
          yd.backward(on(g, dev));
          check_near(xd.grad(), xr.grad(), tol_for(dt) * 5);
          if (affine) {
            check_near(wd.grad(), wr.grad(), tol_for(dt) * 5);
            check_near(bd.grad(), br.grad(), tol_for(dt) * 5);
          }
          check_close(rm.cpu(), want_rm, dt == kFloat64 ? 1e-12 : 1e-6);
          check_close(rv.cpu(), want_rv, dt == kFloat64 ? 1e-12 : 1e-6);
        }
}

TEST_CASE("batch_norm's statistics of channels far from zero keep their variance") {
  // Values 1e6 + N(0, 1) in float32: Σx² / n and mean² are about 1e12 times the variance,
  // so an unshifted one-pass Σx² / n - mean² in double would carry an error of order
  // 1e-16 x 1e12 x sqrt(n), near 1e-2 of it; the running statistics against brute_stats'
  // two passes in double.
  manual_seed(6);
  for (Device dev : test_devices())
    for (ChannelLayout layout : {ChannelLayout::Last, ChannelLayout::First}) {
      INFO(dev.str() << " " << layout_name(layout));
      const Shape shape = layout == ChannelLayout::Last ? Shape{4000, 11} : Shape{40, 11, 100};
      Tensor x = randn(shape) + 1e6;
      Tensor rm = on(zeros({11}), dev), rv = on(zeros({11}), dev);
      batch_norm(on(x, dev), rm, rv, Tensor(), Tensor(), true, 1.0, 1e-5, layout);
      ChannelStats s = brute_stats(x, layout);
      std::vector<double> want_rv(11);
      for (size_t k = 0; k < 11; ++k) want_rv[k] = s.var[k] * double(s.n) / double(s.n - 1);
      check_close(rm.cpu(), s.mean, 1e-7);
      check_close(rv.cpu(), want_rv, 1e-5);
    }
}

TEST_CASE("batch_norm without running statistics; strided running statistics are written back") {
  manual_seed(5);
  for (Device dev : test_devices()) {
    Tensor x = randn({6, 4, 3}, kFloat64);
    // No running statistics: training normalises by the batch and updates nothing.
    check_near(batch_norm(on(x, dev), Tensor(), Tensor(), Tensor(), Tensor(), true),
               composed_batch_norm(x, Tensor(), Tensor(), Tensor(), Tensor(), true, 1e-5, ChannelLayout::First),
               1e-12);
    // Running statistics that are every other element of a longer buffer.
    Tensor buf = on(zeros({8}, kFloat64), dev);
    Tensor rm = buf.slice(0, 0, 8, 2), rv = buf.slice(0, 1, 8, 2);
    rv.fill_(1.0);
    REQUIRE_FALSE(rm.is_contiguous());
    batch_norm(on(x, dev), rm, rv, Tensor(), Tensor(), true, 0.5);
    ChannelStats s = brute_stats(x, ChannelLayout::First);
    std::vector<double> want(8);
    for (size_t k = 0; k < 4; ++k) {
      want[2 * k] = 0.5 * s.mean[k];
      want[2 * k + 1] = 0.5 + 0.5 * s.var[k] * double(s.n) / double(s.n - 1);
    }
    check_close(buf.cpu(), want, 1e-12);
  }
}

TEST_CASE("batch_norm in eval on an empty batch: an empty output, zero weight and bias gradients") {
  for (Device dev : test_devices())
    for (ChannelLayout layout : {ChannelLayout::First, ChannelLayout::Last}) {
      INFO(dev.str() << " " << layout_name(layout));
      const Shape shape = layout == ChannelLayout::First ? Shape{0, 3, 4} : Shape{0, 4, 3};
      Tensor rm = on(tensor({0.5, -1.0, 2.0}, kFloat64), dev), rv = on(tensor({1.0, 2.0, 0.5}, kFloat64), dev);
      Tensor w = on(tensor({1.0, 2.0, 3.0}, kFloat64), dev).requires_grad_();
      Tensor b = on(tensor({0.1, 0.2, 0.3}, kFloat64), dev).requires_grad_();
      Tensor x = on(zeros(shape, kFloat64), dev).requires_grad_();
      Tensor y = batch_norm(x, rm, rv, w, b, false, 0.1, 1e-5, layout);
      CHECK(y.shape() == shape);
      y.sum().backward();
      check_close(w.grad(), {3}, {0, 0, 0}, 0);
      check_close(b.grad(), {3}, {0, 0, 0}, 0);
      CHECK(x.grad().shape() == shape);
      // The running statistics are read, not moved.
      check_close(rm, {3}, {0.5, -1.0, 2.0}, 0);
    }
}

TEST_CASE("BatchNorm1d: momentum nullopt is the cumulative average; layouts by option; errors") {
  manual_seed(6);
  for (Device dev : test_devices())
    for (bool last : {false, true}) {
      INFO(dev.str() << (last ? " (B, T, C)" : " (N, C, L)"));
      const int64_t C = 3;
      nn::BatchNorm1d bn(nn::BatchNormOptions(C).momentum(std::nullopt).channels_last(last));
      bn.to(dev);
      std::vector<double> mean_sum(size_t(C), 0.0), var_sum(size_t(C), 0.0);
      const int steps = 4;
      for (int step = 0; step < steps; ++step) {
        Tensor x = randn(last ? Shape{2, 5, C} : Shape{2, C, 5}) * (1.0 + step) + double(step);
        Tensor y = bn(on(x, dev));
        ChannelStats s = brute_stats(x, last ? ChannelLayout::Last : ChannelLayout::First);
        // The output is the batch normalised, per channel.
        check_near(y, composed_batch_norm(x, Tensor(), Tensor(), Tensor(), Tensor(), true, 1e-5,
                                          last ? ChannelLayout::Last : ChannelLayout::First),
                   2e-5);
        for (size_t k = 0; k < size_t(C); ++k) {
          mean_sum[k] += s.mean[k] / steps;
          var_sum[k] += s.var[k] * double(s.n) / double(s.n - 1) / steps;
        }
      }
      CHECK(bn.num_batches_tracked.item() == steps);
      check_close(bn.running_mean.cpu(), mean_sum, 1e-6);
      check_close(bn.running_var.cpu(), var_sum, 1e-6);
    }
  nn::BatchNorm1d bn(3);
  // (N, C, L) by default: the channel dim is 1.
  CHECK(bn(randn({2, 3, 7})).shape() == Shape{2, 3, 7});
  CHECK_THROWS_MU(bn(randn({2, 7, 3})), "BatchNorm1d: expected input (N, 3) or (N, 3, L), got");
  CHECK_THROWS_MU(bn(randn({2, 7, 3})), "set BatchNormOptions::channels_last(true)");
  nn::BatchNorm1d bt(nn::BatchNormOptions(3).channels_last(true));
  CHECK(bt(randn({2, 7, 3})).shape() == Shape{2, 7, 3});
  CHECK_THROWS_MU(bt(randn({2, 3, 7})), "BatchNorm1d: expected input (N, 3) or (B, T, 3) (channels_last)");
  CHECK_THROWS_MU(bt(randn({2, 3, 7})), "leave BatchNormOptions::channels_last off");
  // A refused batch counts no batch.
  CHECK(bn.num_batches_tracked.item() == 1);
  CHECK_THROWS_MU(bn(randn({1, 3})), "expected more than 1 value per channel when training");
  CHECK(bn.num_batches_tracked.item() == 1);
}

TEST_CASE("batch_norm errors name the problem and the layout") {
  Tensor x = randn({4, 3, 5}), rm = zeros({3}), rv = ones({3});
  CHECK_THROWS_MU(batch_norm(randn({5}), Tensor(), Tensor(), Tensor(), Tensor(), true),
                  "batch_norm: expected an input of at least 2 dims, (N, C, ...), got shape [5]");
  CHECK_THROWS_MU(batch_norm(x, zeros({5}), ones({5}), Tensor(), Tensor(), true),
                  "batch_norm: running_mean has shape [5] but the input of shape [4, 3, 5] has 3 channels (dim 1, as "
                  "(N, C, ...); for channels-last input pass ChannelLayout::Last)");
  CHECK_THROWS_MU(batch_norm(x, rm, rv, randn({3}), Tensor(), true, 0.1, 1e-5, ChannelLayout::Last),
                  "running_mean has shape [3] but the input of shape [4, 3, 5] has 5 channels (dim 2, as "
                  "channels-last (N, ..., C); for (N, C, ...) input pass ChannelLayout::First)");
  CHECK_THROWS_MU(batch_norm(x, rm, rv, randn({4}), Tensor(), true), "weight has shape [4]");
  CHECK_THROWS_MU(batch_norm(x, rm, Tensor(), Tensor(), Tensor(), true), "must be given together");
  CHECK_THROWS_MU(batch_norm(x, Tensor(), Tensor(), Tensor(), Tensor(), false),
                  "running_mean and running_var are needed when training is false");
  CHECK_THROWS_MU(batch_norm(randn({1, 3}), rm, rv, Tensor(), Tensor(), true),
                  "expected more than 1 value per channel when training, got input of shape [1, 3]");
  CHECK_THROWS_MU(batch_norm(x, zeros({3}, kFloat64), ones({3}, kFloat64), Tensor(), Tensor(), true),
                  "running_mean is float64 but the input is float32");
  // 16-bit inputs are refused by the op on every device, empty ones too (autocast keeps
  // norms in float32).
  for (Device dev : test_devices())
    for (const Shape& shape : {Shape{4, 3, 5}, Shape{0, 3}}) {
      Tensor narrow = on(zeros(shape).to(kBFloat16), dev);
      CHECK_THROWS_MU(batch_norm(narrow, on(rm.to(kBFloat16), dev), on(rv.to(kBFloat16), dev)),
                      "batch_norm: a bfloat16 input is not supported (float32 or float64); convert it with .to(kFloat32)");
    }
  // A refused call moved nothing.
  CHECK(rm.to_vector<double>() == std::vector<double>(3, 0.0));
  // One value per channel is fine in eval.
  CHECK(batch_norm(randn({1, 3}), rm, rv).shape() == Shape{1, 3});
}
