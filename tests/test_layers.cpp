// Layers against direct formulas in double (Linear, Embedding, LayerNorm, BatchNorm1d,
// Dropout, GELU, ReLU), the statistics of the init functions, and gradcheck of the
// layers' forward passes with respect to input and parameters.
#include <algorithm>
#include <cmath>

#include "helpers.h"
#include "nn/nn.h"

using namespace mu;
using autograd::TensorList;

namespace {

// Overwrites a parameter with fresh N(0, 1) values (+ shift), outside any graph.
void randomize(Tensor p, double shift = 0.0) {
  NoGradGuard g;
  p.copy_(randn(p.shape(), p.dtype()) + shift);
}

// x (..., in) · Wᵀ + b with three nested loops, in double.
std::vector<double> brute_linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  const int64_t in = w.size(1), out = w.size(0), rows = x.numel() / in;
  std::vector<double> xv = x.to_vector<double>(), wv = w.to_vector<double>(), y(size_t(rows * out));
  std::vector<double> bv = b.defined() ? b.to_vector<double>() : std::vector<double>(size_t(out), 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < out; ++o) {
      double s = bv[size_t(o)];
      for (int64_t k = 0; k < in; ++k) s += xv[size_t(r * in + k)] * wv[size_t(o * in + k)];
      y[size_t(r * out + o)] = s;
    }
  return y;
}

// LayerNorm over the last `group` elements of each sample: (x - mean) / sqrt(var + eps),
// biased variance, then * w + b elementwise when given.
std::vector<double> ref_layer_norm(const Tensor& x, int64_t group, const Tensor& w, const Tensor& b, double eps) {
  std::vector<double> xv = x.to_vector<double>(), y(xv.size());
  std::vector<double> wv = w.defined() ? w.to_vector<double>() : std::vector<double>(size_t(group), 1.0);
  std::vector<double> bv = b.defined() ? b.to_vector<double>() : std::vector<double>(size_t(group), 0.0);
  for (size_t s = 0; s < xv.size(); s += size_t(group)) {
    double mean = 0, var = 0;
    for (int64_t j = 0; j < group; ++j) mean += xv[s + size_t(j)];
    mean /= double(group);
    for (int64_t j = 0; j < group; ++j) var += (xv[s + size_t(j)] - mean) * (xv[s + size_t(j)] - mean);
    var /= double(group);
    for (int64_t j = 0; j < group; ++j)
      y[s + size_t(j)] = (xv[s + size_t(j)] - mean) / std::sqrt(var + eps) * wv[size_t(j)] + bv[size_t(j)];
  }
  return y;
}

// Per-channel mean and biased variance of x viewed as (n, C).
struct ChannelStats {
  std::vector<double> mean, var;
  int64_t n;
};
ChannelStats channel_stats(const Tensor& x) {
  const int64_t c = x.size(-1), n = x.numel() / c;
  std::vector<double> xv = x.to_vector<double>();
  ChannelStats s{std::vector<double>(size_t(c), 0.0), std::vector<double>(size_t(c), 0.0), n};
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < c; ++j) s.mean[size_t(j)] += xv[size_t(r * c + j)] / double(n);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < c; ++j) {
      double d = xv[size_t(r * c + j)] - s.mean[size_t(j)];
      s.var[size_t(j)] += d * d / double(n);
    }
  return s;
}

// (x - mean_c) / sqrt(var_c + eps) * w_c + b_c for x viewed as (n, C).
std::vector<double> ref_channel_norm(const Tensor& x, const std::vector<double>& mean, const std::vector<double>& var,
                                     const Tensor& w, const Tensor& b, double eps) {
  const int64_t c = x.size(-1);
  std::vector<double> xv = x.to_vector<double>(), y(xv.size());
  std::vector<double> wv = w.defined() ? w.to_vector<double>() : std::vector<double>(size_t(c), 1.0);
  std::vector<double> bv = b.defined() ? b.to_vector<double>() : std::vector<double>(size_t(c), 0.0);
  for (size_t i = 0; i < xv.size(); ++i) {
    size_t j = i % size_t(c);
    y[i] = (xv[i] - mean[j]) / std::sqrt(var[j] + eps) * wv[j] + bv[j];
  }
  return y;
}

// Sample mean and standard deviation of every element.
struct Moments {
  double mean, std, min, max;
};
Moments moments(const Tensor& t) {
  std::vector<double> v = t.to_vector<double>();
  double m = 0, s = 0;
  for (double x : v) m += x;
  m /= double(v.size());
  for (double x : v) s += (x - m) * (x - m);
  return {m, std::sqrt(s / double(v.size() - 1)), *std::min_element(v.begin(), v.end()),
          *std::max_element(v.begin(), v.end())};
}


std::vector<std::string> names_of_state(const nn::Module& m) {
  std::vector<std::string> out;
  for (const auto& [n, t] : m.state_dict()) out.push_back(n);
  return out;
}

double norm_pdf(double x) { return std::exp(-x * x / 2) / std::sqrt(2 * M_PI); }
double norm_cdf(double x) { return (1 + std::erf(x / std::sqrt(2.0))) / 2; }

}  // namespace

// ---------------------------------------------------------------- Linear

TEST_CASE("Linear with no inputs has a zero bias (torch's bound 1/sqrt(0) taken as 0): its output is the bias") {
  nn::Linear fc(0, 3);
  CHECK(fc.bias.to_vector<float>() == std::vector<float>(3, 0.0f));
  CHECK(fc.forward(ones({2, 0})).to_vector<float>() == std::vector<float>(6, 0.0f));
}

TEST_CASE("Linear matches x·Wᵀ + b computed with loops") {
  manual_seed(0);
  nn::Linear fc(5, 4);
  CHECK(fc.weight.shape() == Shape{4, 5});
  CHECK(fc.bias.shape() == Shape{4});
  Tensor x = randn({3, 5});
  Tensor y = fc(x);
  CHECK(y.shape() == Shape{3, 4});
  check_close(y, brute_linear(x, fc.weight, fc.bias), 1e-6);

  SUBCASE("3-D input applies to the last dim") {
    Tensor x3 = randn({2, 3, 5});
    Tensor y3 = fc(x3);
    CHECK(y3.shape() == Shape{2, 3, 4});
    check_close(y3, brute_linear(x3, fc.weight, fc.bias), 1e-6);
    // A non-contiguous input gives the same result as its dense copy.
    Tensor xt = randn({5, 3, 2}).permute({2, 1, 0});
    check_close(fc(xt), brute_linear(xt.contiguous(), fc.weight, fc.bias), 1e-6);
  }
  SUBCASE("without bias") {
    nn::Linear nb(nn::LinearOptions(5, 4).bias(false));
    CHECK_FALSE(nb.bias.defined());
    CHECK(nb.named_parameters().size() == 1);
    CHECK(nb.num_parameters() == 20);
    check_close(nb(x), brute_linear(x, nb.weight, Tensor()), 1e-6);
    nn::Linear nb2(5, 4, false);
    CHECK_FALSE(nb2.bias.defined());
    CHECK(nb2.extra_repr() == "in_features=5, out_features=4, bias=false");
  }
  SUBCASE("gradients reach weight and bias") {
    Tensor xg = x.detach().requires_grad_();
    fc(xg).sum().backward();
    // d(sum y)/dW[o][k] = sum_r x[r][k]; d/db[o] = rows; d/dx[r][k] = sum_o W[o][k].
    check_close(fc.bias.grad(), std::vector<double>(4, 3.0), 1e-6);
    check_close(fc.weight.grad(), sum(x, {0}).unsqueeze(0).expand({4, 5}).to_vector<double>(), 1e-5);
    check_close(xg.grad(), sum(fc.weight.detach(), {0}).unsqueeze(0).expand({3, 5}).to_vector<double>(), 1e-5);
  }
  CHECK_THROWS_MU(fc(randn({3, 4})), "Linear: expected input with last dim 5");
  CHECK(fc.extra_repr() == "in_features=5, out_features=4, bias=true");
}

TEST_CASE("Linear's default init is U(-1/sqrt(in), 1/sqrt(in)) for weight and bias") {
  manual_seed(1);
  nn::Linear fc(400, 100);
  const double bound = 1.0 / 20;
  Moments w = moments(fc.weight), b = moments(fc.bias);
  CHECK(w.min >= -bound);
  CHECK(w.max <= bound);
  // 40000 draws come within 0.1% of both ends, and the spread is the uniform one.
  CHECK(w.min < -0.999 * bound);
  CHECK(w.max > 0.999 * bound);
  CHECK(std::fabs(w.std / (bound / std::sqrt(3.0)) - 1) < 0.02);
  CHECK(std::fabs(w.mean) < 0.02 * bound);
  CHECK(b.min >= -bound);
  CHECK(b.max <= bound);
  CHECK(std::max(-b.min, b.max) > 0.8 * bound);
  // Same seed, same parameters.
  manual_seed(1);
  nn::Linear again(400, 100);
  CHECK(max_abs_diff(again.weight, fc.weight) == 0);
  CHECK(max_abs_diff(again.bias, fc.bias) == 0);
}

// ---------------------------------------------------------------- Embedding

TEST_CASE("Embedding picks rows by id and routes gradients back to them") {
  manual_seed(2);
  nn::Embedding emb(10, 4);
  CHECK(emb.weight.shape() == Shape{10, 4});
  Tensor ids = from_vector<int64_t>({1, 3, 3, 0, 9, 2}, {2, 3});
  Tensor out = emb(ids);
  CHECK(out.shape() == Shape{2, 3, 4});
  std::vector<int64_t> idv = ids.to_vector<int64_t>();
  for (int64_t i = 0; i < 6; ++i)
    for (int64_t d = 0; d < 4; ++d) CHECK(out.at({i / 3, i % 3, d}) == emb.weight.at({idv[size_t(i)], d}));
  out.sum().backward();
  // Each row's gradient counts how often it was picked.
  std::vector<double> counts = {1, 1, 1, 2, 0, 0, 0, 0, 0, 1};
  for (int64_t r = 0; r < 10; ++r)
    for (int64_t d = 0; d < 4; ++d) CHECK(emb.weight.grad().at({r, d}) == counts[size_t(r)]);

  CHECK_THROWS_MU(emb(from_vector<int64_t>({2, 10}, {2})), "index 10 is out of bounds for dimension 0 with size 10");
  CHECK_THROWS_MU(emb(from_vector<int64_t>({-1}, {1})), "index -1 is out of bounds");
  CHECK_THROWS_MU(emb(randn({2})), "Embedding: ids must be an int64 tensor");
  CHECK(emb.extra_repr() == "10, 4");
  // It can open a Sequential: ids in, vectors out.
  nn::Sequential seq({std::make_shared<nn::Embedding>(10, 4), std::make_shared<nn::Linear>(4, 2)});
  CHECK(seq(ids).shape() == Shape{2, 3, 2});
}

TEST_CASE("Embedding's default init is N(0, 1)") {
  manual_seed(3);
  nn::Embedding emb(nn::EmbeddingOptions(1000, 40));
  Moments m = moments(emb.weight);
  // 40000 draws: the standard error of the mean is 0.005, of the std 0.0035.
  CHECK(std::fabs(m.mean) < 0.025);
  CHECK(std::fabs(m.std - 1) < 0.02);
}

// ---------------------------------------------------------------- LayerNorm

TEST_CASE("LayerNorm matches the formula in double, affine and not") {
  manual_seed(4);
  for (DType dt : {kFloat64, kFloat32}) {
    const double tol = dt == kFloat64 ? 1e-12 : 2e-6;
    INFO(dtype_name(dt));
    {  // last dim, affine
      nn::LayerNorm ln(nn::LayerNormOptions({6}));
      ln.to(dt);
      // The defaults are the identity affine map; random values test the formula.
      CHECK(ln.weight.to_vector<double>() == std::vector<double>(6, 1.0));
      CHECK(ln.bias.to_vector<double>() == std::vector<double>(6, 0.0));
      randomize(ln.weight, 1.0);
      randomize(ln.bias);
      Tensor x = randn({4, 6}, dt) * 3.0 + 2.0;
      check_close(ln(x), ref_layer_norm(x, 6, ln.weight, ln.bias, 1e-5), tol);
      Tensor x3 = randn({2, 5, 6}, dt);
      check_close(ln(x3), ref_layer_norm(x3, 6, ln.weight, ln.bias, 1e-5), tol);
    }
    {  // two trailing dims, no affine, custom eps
      nn::LayerNorm ln(nn::LayerNormOptions({3, 4}).elementwise_affine(false).eps(0.1));
      CHECK(ln.parameters().empty());
      CHECK_FALSE(ln.weight.defined());
      Tensor x = randn({2, 3, 4}, dt);
      check_close(ln(x), ref_layer_norm(x, 12, Tensor(), Tensor(), 0.1), tol);
      // A transposed input normalises its own logical layout.
      Tensor xt = randn({4, 3, 2}, dt).permute({2, 1, 0});
      check_close(ln(xt), ref_layer_norm(xt.contiguous(), 12, Tensor(), Tensor(), 0.1), tol);
    }
    {  // a weight without a bias (nanoGPT's bias=False)
      nn::LayerNorm ln(nn::LayerNormOptions({6}).bias(false));
      ln.to(dt);
      CHECK(ln.parameters().size() == 1);
      CHECK_FALSE(ln.bias.defined());
      randomize(ln.weight, 1.0);
      Tensor x = randn({4, 6}, dt) * 3.0 + 2.0;
      check_close(ln(x), ref_layer_norm(x, 6, ln.weight, Tensor(), 1e-5), tol);
      CHECK(ln.extra_repr() == "[6], eps=1e-05, elementwise_affine=true, bias=false");
    }
  }
  nn::LayerNorm ln(nn::LayerNormOptions({6}));
  CHECK_THROWS_MU(ln(randn({4, 5})), "LayerNorm: expected input whose trailing dims are [6]");
  CHECK_THROWS_MU(nn::LayerNorm(nn::LayerNormOptions({0})), "normalized_shape must be positive");
  CHECK(ln.extra_repr() == "[6], eps=1e-05, elementwise_affine=true");
}

// ---------------------------------------------------------------- BatchNorm1d

TEST_CASE("BatchNorm1d in training mode normalises each channel by its batch statistics") {
  manual_seed(5);
  for (bool token_major : {false, true}) {
    INFO((token_major ? "(B, T, C)" : "(B, C)"));
    nn::BatchNorm1d bn(nn::BatchNormOptions(5).channels_last(token_major));
    bn.to(kFloat64);
    randomize(bn.weight, 1.0);
    randomize(bn.bias);
    Tensor x = token_major ? randn({3, 4, 5}, kFloat64) * 2.0 + 1.0 : randn({8, 5}, kFloat64) * 2.0 + 1.0;
    ChannelStats s = channel_stats(x);
    check_close(bn(x), ref_channel_norm(x, s.mean, s.var, bn.weight, bn.bias, 1e-5), 1e-12);
    // And in float32, against the same double formula.
    nn::BatchNorm1d bn32(nn::BatchNormOptions(5).affine(false).channels_last(token_major));
    CHECK(bn32.parameters().empty());
    Tensor x32 = x.to(kFloat32);
    check_close(bn32(x32), ref_channel_norm(x32, s.mean, s.var, Tensor(), Tensor(), 1e-5), 2e-6);
  }
}

TEST_CASE("BatchNorm1d's running statistics follow the momentum updates; eval uses them") {
  manual_seed(6);
  for (bool token_major : {false, true}) {
    INFO((token_major ? "(B, T, C)" : "(B, C)"));
    const int64_t c = 4;
    const double m = 0.1, eps = 1e-5;
    nn::BatchNorm1d bn(nn::BatchNormOptions(c).channels_last(token_major));
    randomize(bn.weight, 1.0);
    randomize(bn.bias);
    CHECK(bn.running_mean.to_vector<double>() == std::vector<double>(size_t(c), 0.0));
    CHECK(bn.running_var.to_vector<double>() == std::vector<double>(size_t(c), 1.0));
    std::vector<double> rm(size_t(c), 0.0), rv(size_t(c), 1.0);
    for (int step = 0; step < 3; ++step) {
      // Each step a batch with its own offset and scale, so the averages move visibly.
      Tensor x = (token_major ? randn({2, 3, c}) : randn({6, c})) * (1.0 + step) + 0.5 * step;
      x.requires_grad_();
      Tensor y = bn(x);
      CHECK(y.requires_grad());
      ChannelStats s = channel_stats(x);
      for (size_t j = 0; j < size_t(c); ++j) {
        rm[j] = (1 - m) * rm[j] + m * s.mean[j];
        rv[j] = (1 - m) * rv[j] + m * s.var[j] * double(s.n) / double(s.n - 1);  // unbiased
      }
    }
    // Updated outside the graph: plain tensors, no history.
    CHECK_FALSE(bn.running_mean.requires_grad());
    CHECK(bn.running_mean.grad_fn() == nullptr);
    CHECK(bn.running_var.grad_fn() == nullptr);
    CHECK(bn.num_batches_tracked.item() == 3);
    check_close(bn.running_mean, rm, 1e-6);
    check_close(bn.running_var, rv, 1e-6);

    bn.eval();
    Tensor x = token_major ? randn({2, 3, c}) : randn({6, c});
    check_close(bn(x), ref_channel_norm(x, rm, rv, bn.weight, bn.bias, eps), 2e-6);
    // Eval leaves the statistics alone and accepts a batch of one.
    check_close(bn(x.slice(0, 0, 1)), ref_channel_norm(x.slice(0, 0, 1), rm, rv, bn.weight, bn.bias, eps), 2e-6);
    CHECK(bn.num_batches_tracked.item() == 3);
    check_close(bn.running_mean, rm, 1e-6);
  }
}

TEST_CASE("BatchNorm1d options: cumulative average, no running statistics, errors") {
  manual_seed(7);
  SUBCASE("momentum none averages all batches equally") {
    nn::BatchNorm1d bn(nn::BatchNormOptions(3).momentum(std::nullopt));
    std::vector<double> mean_sum(3, 0.0), var_sum(3, 0.0);
    for (int step = 0; step < 4; ++step) {
      Tensor x = randn({5, 3}) * (1.0 + step) + double(step);
      bn(x);
      ChannelStats s = channel_stats(x);
      for (size_t j = 0; j < 3; ++j) {
        mean_sum[j] += s.mean[j] / 4;
        var_sum[j] += s.var[j] * 5.0 / 4.0 / 4;
      }
    }
    check_close(bn.running_mean, mean_sum, 1e-6);
    check_close(bn.running_var, var_sum, 1e-6);
    CHECK(bn.extra_repr() == "3, eps=1e-05, momentum=none, affine=true, track_running_stats=true");
  }
  SUBCASE("without running statistics eval uses the batch") {
    nn::BatchNorm1d bn(nn::BatchNormOptions(3).track_running_stats(false));
    CHECK(bn.buffers().empty());
    bn.eval();
    Tensor x = randn({6, 3});
    ChannelStats s = channel_stats(x);
    check_close(bn(x), ref_channel_norm(x, s.mean, s.var, bn.weight, bn.bias, 1e-5), 2e-6);
  }
  nn::BatchNorm1d bn(3);
  CHECK(names_of_state(bn) == std::vector<std::string>{"weight", "bias", "running_mean", "running_var",
                                                          "num_batches_tracked"});
  CHECK_THROWS_MU(bn(randn({1, 3})), "expected more than 1 value per channel when training");
  CHECK_THROWS_MU(bn(randn({4, 2})), "BatchNorm1d: expected input (N, 3) or (N, 3, L)");
  CHECK_THROWS_MU(bn(randn({4, 3, 2, 3})), "BatchNorm1d: expected input");
  // A 3-D input is (N, C, L) unless told otherwise: a (B, T, C) one is refused with the hint.
  CHECK_THROWS_MU(bn(randn({4, 5, 3})), "set BatchNormOptions::channels_last(true)");
  nn::BatchNorm1d bt(nn::BatchNormOptions(3).channels_last(true));
  CHECK_THROWS_MU(bt(randn({4, 3, 5})), "BatchNorm1d: expected input (N, 3) or (B, T, 3) (channels_last)");
  CHECK(bt.extra_repr() == "3, eps=1e-05, momentum=0.1, affine=true, track_running_stats=true, channels_last=true");
  CHECK_THROWS_MU(nn::BatchNorm1d(nn::BatchNormOptions(3).momentum(1.5)), "momentum must lie in [0, 1]");
  CHECK(bn.extra_repr() == "3, eps=1e-05, momentum=0.1, affine=true, track_running_stats=true");
  // A failed forward left the statistics untouched.
  CHECK(bn.num_batches_tracked.item() == 0);
}

// ---------------------------------------------------------------- Dropout, GELU, ReLU

TEST_CASE("Dropout zeroes a fraction p and rescales in training; identity in eval") {
  manual_seed(8);
  nn::Dropout drop(0.3);
  CHECK(drop.extra_repr() == "p=0.3");
  Tensor x = ones({200, 200}).requires_grad_();
  Tensor y = drop(x);
  std::vector<double> v = y.to_vector<double>();
  int64_t zeros_seen = 0;
  bool only_two_values = true;
  for (double e : v) {
    zeros_seen += e == 0;
    only_two_values = only_two_values && (e == 0 || std::fabs(e - 1 / 0.7) < 1e-6);
  }
  CHECK(only_two_values);
  // 40000 draws: the standard error of the fraction is 0.0023.
  CHECK(std::fabs(double(zeros_seen) / 40000 - 0.3) < 0.012);
  // The gradient is the same mask and scale.
  y.sum().backward();
  CHECK(max_abs_diff(x.grad(), y.detach()) == 0);

  drop.eval();
  Tensor z = randn({50});
  CHECK(max_abs_diff(drop(z), z) == 0);
  drop.train();
  CHECK(max_abs_diff(nn::Dropout(0.0)(z), z) == 0);
  CHECK_THROWS_MU(nn::Dropout(1.5), "Dropout: probability has to be between 0 and 1");
}

TEST_CASE("GELU and ReLU modules apply their functions") {
  manual_seed(9);
  Tensor x = randn({30}) * 3.0;
  std::vector<double> xv = x.to_vector<double>(), erf_form, tanh_form, relu_form;
  for (double e : xv) {
    erf_form.push_back(0.5 * e * (1 + std::erf(e / std::sqrt(2.0))));
    tanh_form.push_back(0.5 * e * (1 + std::tanh(std::sqrt(2 / M_PI) * (e + 0.044715 * e * e * e))));
    relu_form.push_back(std::max(e, 0.0));
  }
  check_close(nn::GELU()(x), erf_form, 1e-6);
  check_close(nn::GELU("tanh")(x), tanh_form, 1e-6);
  check_close(nn::GELU(nn::GELUOptions().approximate("tanh"))(x), tanh_form, 1e-6);
  check_close(nn::ReLU()(x), relu_form, 0);
  CHECK(nn::GELU("tanh").extra_repr() == "approximate=tanh");
  CHECK_THROWS_MU(nn::GELU("fast"), "GELU: approximate must be \"none\" or \"tanh\", got \"fast\"");
}

// ---------------------------------------------------------------- init

TEST_CASE("gains and fans are torch's") {
  using nn::init::Nonlinearity;
  CHECK(nn::init::calculate_gain(Nonlinearity::Linear) == 1.0);
  CHECK(nn::init::calculate_gain(Nonlinearity::Sigmoid) == 1.0);
  CHECK(nn::init::calculate_gain(Nonlinearity::Tanh) == doctest::Approx(5.0 / 3.0));
  CHECK(nn::init::calculate_gain(Nonlinearity::ReLU) == doctest::Approx(std::sqrt(2.0)));
  CHECK(nn::init::calculate_gain(Nonlinearity::LeakyReLU) == doctest::Approx(std::sqrt(2.0 / (1 + 1e-4))));
  CHECK(nn::init::calculate_gain(Nonlinearity::LeakyReLU, std::sqrt(5.0)) == doctest::Approx(std::sqrt(1.0 / 3.0)));
  auto [fi, fo] = nn::init::calculate_fan_in_and_fan_out(zeros({8, 4, 3, 3}));
  CHECK(fi == 36);
  CHECK(fo == 72);
  CHECK_THROWS_MU(nn::init::calculate_fan_in_and_fan_out(zeros({3})), "at least 2 dimensions");
  CHECK_THROWS_MU(nn::init::xavier_uniform_(zeros({3})), "at least 2 dimensions");
  CHECK_THROWS_MU(nn::init::uniform_(zeros({3}, kInt64)), "needs a floating-point tensor");
}

TEST_CASE("uniform_, normal_, constant_ fill with the requested distribution") {
  manual_seed(10);
  Tensor t = empty({200, 200});
  Moments u = moments(nn::init::uniform_(t, -2.0, 3.0));
  CHECK(u.min >= -2.0);
  CHECK(u.max < 3.0);
  CHECK(u.min < -1.99);
  CHECK(u.max > 2.99);
  // Standard error of the mean 0.0072, of the std about 0.003.
  CHECK(std::fabs(u.mean - 0.5) < 0.04);
  CHECK(std::fabs(u.std - 5 / std::sqrt(12.0)) < 0.02);

  Moments n = moments(nn::init::normal_(t, 1.5, 0.5));
  CHECK(std::fabs(n.mean - 1.5) < 0.015);
  CHECK(std::fabs(n.std - 0.5) < 0.01);

  CHECK(nn::init::constant_(t, 0.25).to_vector<double>() == std::vector<double>(40000, 0.25));
  CHECK(nn::init::zeros_(t).to_vector<double>() == std::vector<double>(40000, 0.0));
  CHECK(nn::init::ones_(t).to_vector<double>() == std::vector<double>(40000, 1.0));

  // Same seed, same values, in float64 too.
  Tensor a = empty({100}, kFloat64), b = empty({100}, kFloat64);
  manual_seed(3);
  nn::init::normal_(a);
  manual_seed(3);
  nn::init::normal_(b);
  CHECK(max_abs_diff(a, b) == 0);
  CHECK(moments(a).std > 0.5);

  // In place on a parameter that requires grad: it stays the same leaf.
  nn::Linear fc(3, 3);
  Tensor w = fc.weight;
  uint64_t version = w.version();
  nn::init::constant_(fc.weight, 2.0);
  CHECK(w.is_same(fc.weight));
  CHECK(w.is_leaf());
  CHECK(w.requires_grad());
  CHECK(w.version() > version);
  CHECK(w.at({2, 1}) == 2.0);
  nn::init::uniform_(fc.weight.slice(0, 0, 1), 5.0, 6.0);  // through a view
  CHECK(w.at({0, 1}) >= 5.0);
  CHECK(w.at({1, 1}) == 2.0);
}

TEST_CASE("kaiming and xavier functions draw with torch's bounds and spreads") {
  manual_seed(11);
  using nn::init::FanMode;
  using nn::init::Nonlinearity;
  Tensor t = empty({64, 625});  // fan_in 625, fan_out 64, 40000 elements

  SUBCASE("kaiming_uniform_, default leaky_relu with a = 0, fan_in") {
    const double bound = std::sqrt(2.0) * std::sqrt(3.0 / 625);
    Moments m = moments(nn::init::kaiming_uniform_(t));
    CHECK(m.min >= -bound);
    CHECK(m.max <= bound);
    CHECK(m.min < -0.999 * bound);
    CHECK(m.max > 0.999 * bound);
    CHECK(std::fabs(m.std / (bound / std::sqrt(3.0)) - 1) < 0.02);
  }
  SUBCASE("kaiming_uniform_, tanh, fan_out") {
    const double bound = 5.0 / 3.0 * std::sqrt(3.0 / 64);
    Moments m = moments(nn::init::kaiming_uniform_(t, 0.0, FanMode::FanOut, Nonlinearity::Tanh));
    CHECK(m.min >= -bound);
    CHECK(m.max <= bound);
    CHECK(m.max > 0.999 * bound);
  }
  SUBCASE("kaiming_normal_, relu, fan_out") {
    Moments m = moments(nn::init::kaiming_normal_(t, 0.0, FanMode::FanOut, Nonlinearity::ReLU));
    const double std = std::sqrt(2.0) / 8;
    CHECK(std::fabs(m.std / std - 1) < 0.02);
    CHECK(std::fabs(m.mean) < 0.02 * std);
  }
  SUBCASE("kaiming_normal_, linear, fan_in") {
    Moments m = moments(nn::init::kaiming_normal_(t, 0.0, FanMode::FanIn, Nonlinearity::Linear));
    CHECK(std::fabs(m.std / (1.0 / 25) - 1) < 0.02);
  }
  SUBCASE("xavier_uniform_ with a gain") {
    const double gain = nn::init::calculate_gain(Nonlinearity::Tanh);
    const double bound = gain * std::sqrt(6.0 / (625 + 64));
    Moments m = moments(nn::init::xavier_uniform_(t, gain));
    CHECK(m.min >= -bound);
    CHECK(m.max <= bound);
    CHECK(m.min < -0.999 * bound);
    CHECK(m.max > 0.999 * bound);
    CHECK(std::fabs(m.std / (bound / std::sqrt(3.0)) - 1) < 0.02);
  }
  SUBCASE("xavier_normal_") {
    Moments m = moments(nn::init::xavier_normal_(t));
    CHECK(std::fabs(m.std / std::sqrt(2.0 / (625 + 64)) - 1) < 0.02);
  }
}

TEST_CASE("trunc_normal_ draws the truncated normal: inside [a, b], right moments, no mass piled on the bounds") {
  manual_seed(12);
  // The truncated normal's mean and std, from its closed form.
  auto truncated = [](double mean, double std, double a, double b) {
    double al = (a - mean) / std, be = (b - mean) / std, z = norm_cdf(be) - norm_cdf(al);
    double shift = (norm_pdf(al) - norm_pdf(be)) / z;
    double var = 1 + (al * norm_pdf(al) - be * norm_pdf(be)) / z - shift * shift;
    return std::pair<double, double>{mean + std * shift, std * std::sqrt(var)};
  };
  struct Case {
    double mean, std, a, b;
  };
  for (Case c : {Case{0.5, 1.0, -0.25, 1.5}, Case{0.0, 1.0, -2.0, 2.0}, Case{0.0, 1.0, 3.0, 4.0}}) {
    INFO("mean " << c.mean << " std " << c.std << " [" << c.a << ", " << c.b << "]");
    Tensor t = empty({200, 200}, kFloat64);
    nn::init::trunc_normal_(t, c.mean, c.std, c.a, c.b);
    Moments m = moments(t);
    auto [want_mean, want_std] = truncated(c.mean, c.std, c.a, c.b);
    CHECK(m.min >= c.a);
    CHECK(m.max <= c.b);
    CHECK(m.min < c.a + 0.01 * (c.b - c.a));
    CHECK(m.max > c.b - 0.01 * (c.b - c.a));
    // Standard errors are below 0.005 (mean) and 0.5% (std) here.
    CHECK(std::fabs(m.mean - want_mean) < 0.02 * want_std + 1e-3);
    CHECK(std::fabs(m.std / want_std - 1) < 0.02);
    // Clamping a plain normal would put a large share exactly on a bound.
    int64_t on_bounds = 0;
    for (double v : t.to_vector<double>()) on_bounds += v == c.a || v == c.b;
    CHECK(on_bounds < 5);
  }
  // GPT-2 style: std 0.02 truncated at two stds, in float32.
  Tensor w = empty({100, 100});
  Moments m = moments(nn::init::trunc_normal_(w, 0.0, 0.02, -0.04, 0.04));
  CHECK(m.min >= float(-0.04));
  CHECK(m.max <= float(0.04));
  CHECK(std::fabs(m.std / truncated(0, 0.02, -0.04, 0.04).second - 1) < 0.03);
  CHECK_THROWS_MU(nn::init::trunc_normal_(w, 0.0, 1.0, 1.0, -1.0), "expects a < b");
  CHECK_THROWS_MU(nn::init::trunc_normal_(w, 0.0, 0.0), "std must be a finite positive number");
}

// ---------------------------------------------------------------- gradcheck

TEST_CASE("gradcheck: Linear w.r.t. input, weight and bias") {
  manual_seed(13);
  nn::Linear fc(4, 3);
  fc.to(kFloat64);
  check_module_grad(fc, randn({2, 5, 4}, kFloat64), {&fc.weight, &fc.bias});
  nn::Linear nb(4, 3, false);
  nb.to(kFloat64);
  check_module_grad(nb, randn({4, 5}, kFloat64).t(), {&nb.weight});  // a transposed input
}

TEST_CASE("gradcheck: LayerNorm w.r.t. input, weight and bias") {
  manual_seed(14);
  nn::LayerNorm ln(nn::LayerNormOptions({5}));
  ln.to(kFloat64);
  randomize(ln.weight, 1.0);
  randomize(ln.bias);
  check_module_grad(ln, randn({3, 5}, kFloat64) * 2.0, {&ln.weight, &ln.bias});
  nn::LayerNorm ln2(nn::LayerNormOptions({2, 3}).elementwise_affine(false));
  ln2.to(kFloat64);
  check_module_grad(ln2, randn({2, 2, 3}, kFloat64), {});
}

TEST_CASE("gradcheck: BatchNorm1d w.r.t. input, weight and bias, in train and eval mode") {
  manual_seed(15);
  for (bool token_major : {false, true}) {
    INFO((token_major ? "(B, T, C)" : "(B, C)"));
    nn::BatchNorm1d bn(nn::BatchNormOptions(4).channels_last(token_major));
    bn.to(kFloat64);
    randomize(bn.weight, 1.0);
    randomize(bn.bias);
    Tensor x = token_major ? randn({2, 3, 4}, kFloat64) : randn({5, 4}, kFloat64);
    check_module_grad(bn, x, {&bn.weight, &bn.bias});
    // Eval: the running statistics gathered meanwhile are constants.
    bn.eval();
    check_module_grad(bn, x, {&bn.weight, &bn.bias});
  }
}
