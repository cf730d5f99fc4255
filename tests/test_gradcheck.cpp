// gradcheck of every elementwise, reduction-sum, view and join op of the core, over
// several shapes, with broadcasting and with non-contiguous views made inside the
// checked function, on every test device (inputs drawn on the CPU and moved).
#include "helpers.h"

using namespace mu;
using autograd::TensorList;

// Inputs kept away from 0 (for log, sqrt, pow, abs's kink, div), made on the CPU.
static Tensor positive(const Shape& s) { return rand(s, kFloat64) + 0.5; }
static Tensor away_from_zero(const Shape& s) {
  Tensor r = randn(s, kFloat64);
  return where(r >= 0.0, r + 0.2, r - 0.2);
}

using Unary = Tensor (*)(const Tensor&);

TEST_CASE("gradcheck: unary ops on several shapes, contiguous and transposed") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(10);
    struct Case { const char* name; std::function<Tensor(const Tensor&)> f; bool positive_only; };
    std::vector<Case> cases = {
        {"neg", [](const Tensor& x) { return neg(x); }, false},
        {"exp", [](const Tensor& x) { return exp(x); }, false},
        {"log", [](const Tensor& x) { return log(x); }, true},
        {"sqrt", [](const Tensor& x) { return sqrt(x); }, true},
        {"rsqrt", [](const Tensor& x) { return rsqrt(x); }, true},
        {"abs", [](const Tensor& x) { return abs(x); }, false},
        {"tanh", [](const Tensor& x) { return tanh(x); }, false},
        {"sigmoid", [](const Tensor& x) { return sigmoid(x); }, false},
        {"relu", [](const Tensor& x) { return relu(x); }, false},
        {"gelu", [](const Tensor& x) { return gelu(x); }, false},
        {"gelu_tanh", [](const Tensor& x) { return gelu(x, "tanh"); }, false},
        {"pow3", [](const Tensor& x) { return pow(x, 3.0); }, false},
        {"pow-1.5", [](const Tensor& x) { return pow(x, -1.5); }, true},
        {"square", [](const Tensor& x) { return square(x); }, false},
        {"clamp", [](const Tensor& x) { return clamp(x, -0.5, 0.7); }, false},
        {"clamp_min", [](const Tensor& x) { return clamp_min(x, 0.1); }, false},
        {"clamp_max", [](const Tensor& x) { return clamp_max(x, -0.1); }, false},
        {"contiguous", [](const Tensor& x) { return x.contiguous() * 1.0; }, false},
        {"clone", [](const Tensor& x) { return x.clone(); }, false},
        {"to_float32_and_back", [](const Tensor& x) { return x.to(kFloat32).to(kFloat64) * 1.0; }, false},
    };
    for (const Case& c : cases) {
      for (Shape s : {Shape{5}, Shape{3, 4}, Shape{2, 3, 2}}) {
        INFO(std::string(c.name) << " on " << shape_str(s));
        Tensor x = on(c.positive_only ? positive(s) : away_from_zero(s), dev);
        auto f = c.f;
        autograd::GradcheckOptions o;
        if (std::string(c.name) == "to_float32_and_back") o.eps = 1e-3;  // a linear map; a wide step dwarfs float32 rounding
        auto r = autograd::gradcheck([f](const TensorList& in) { return f(in[0]); }, {x}, o);
        CHECK_MESSAGE(r.ok, r.message);
        if (s.size() >= 2) {  // the same op on a transposed (non-contiguous) view
          auto rt = autograd::gradcheck([f](const TensorList& in) { return f(in[0].transpose(0, 1)); }, {x}, o);
          CHECK_MESSAGE(rt.ok, rt.message);
        }
      }
    }
  }
}

TEST_CASE("gradcheck: binary ops with broadcasting and non-contiguous operands") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(11);
    struct Case { const char* name; std::function<Tensor(const Tensor&, const Tensor&)> f; bool positive_only; };
    std::vector<Case> cases = {
        {"add", [](const Tensor& a, const Tensor& b) { return a + b; }, false},
        {"sub", [](const Tensor& a, const Tensor& b) { return a - b; }, false},
        {"mul", [](const Tensor& a, const Tensor& b) { return a * b; }, false},
        {"div", [](const Tensor& a, const Tensor& b) { return a / b; }, false},
        {"pow", [](const Tensor& a, const Tensor& b) { return pow(a, b); }, true},
        {"maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); }, false},
        {"minimum", [](const Tensor& a, const Tensor& b) { return minimum(a, b); }, false},
        {"where", [](const Tensor& a, const Tensor& b) { return where(a > b, a, b * 2.0); }, false},
        {"masked_fill", [](const Tensor& a, const Tensor& b) { return masked_fill(a * b, b > 0.0, 0.5); }, false},
    };
    std::vector<std::pair<Shape, Shape>> shapes = {
        {{4}, {4}}, {{3, 4}, {4}}, {{3, 1}, {1, 4}}, {{2, 3, 4}, {3, 1}}, {{}, {2, 3}}, {{2, 3}, {}}};
    for (const Case& c : cases) {
      for (auto& [sa, sb] : shapes) {
        INFO(std::string(c.name) << " on " << shape_str(sa) << " and " << shape_str(sb));
        Tensor a = on(c.positive_only ? positive(sa) : away_from_zero(sa), dev);
        Tensor b = on(c.positive_only ? positive(sb) : away_from_zero(sb), dev);
        auto f = c.f;
        CHECK_GRAD([f](const TensorList& in) { return f(in[0], in[1]); }, (TensorList{a, b}));
      }
      // non-contiguous: a transposed, b a strided slice
      Tensor a = on(c.positive_only ? positive({4, 3}) : away_from_zero({4, 3}), dev);
      Tensor b = on(c.positive_only ? positive({4, 6}) : away_from_zero({4, 6}), dev);
      auto f = c.f;
      INFO(std::string(c.name) << " on non-contiguous views");
      CHECK_GRAD([f](const TensorList& in) { return f(in[0].t(), in[1].slice(1, 0, 6, 2).t()); }, (TensorList{a, b}));
    }
  }
}

TEST_CASE("gradcheck: scalar-tensor arithmetic") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(12);
    Tensor x = on(positive({3, 2}), dev);
    CHECK_GRAD([](const TensorList& in) { return (in[0] + 2.0) * 3.0 - 1.0; }, TensorList{x});
    CHECK_GRAD([](const TensorList& in) { return 2.0 / in[0] + (1.0 - in[0]); }, TensorList{x});
  }
}

TEST_CASE("gradcheck: sum and mean over dims, keepdim, all") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(13);
    Tensor x = on(randn({3, 4, 5}, kFloat64), dev);
    CHECK_GRAD([](const TensorList& in) { return in[0].sum(); }, TensorList{x});
    CHECK_GRAD([](const TensorList& in) { return in[0].sum({1}); }, TensorList{x});
    CHECK_GRAD([](const TensorList& in) { return in[0].sum({0, 2}, true); }, TensorList{x});
    CHECK_GRAD([](const TensorList& in) { return in[0].mean({-1}); }, TensorList{x});
    CHECK_GRAD([](const TensorList& in) { return in[0].permute({2, 0, 1}).mean({0, 1}, true); }, TensorList{x});
    CHECK_GRAD([](const TensorList& in) { return sum_to(in[0], {4, 1}); }, TensorList{x});
  }
}

TEST_CASE("gradcheck: views") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(14);
    Tensor x = on(randn({3, 4, 5}, kFloat64), dev);
    auto chk = [&](std::function<Tensor(const Tensor&)> f) {
      CHECK_GRAD([f](const TensorList& in) { return f(in[0]); }, TensorList{x});
    };
    chk([](const Tensor& t) { return t.view({12, 5}); });
    chk([](const Tensor& t) { return t.reshape({5, -1}); });
    chk([](const Tensor& t) { return t.transpose(0, 2).reshape({20, 3}); });
    chk([](const Tensor& t) { return t.permute({1, 2, 0}); });
    chk([](const Tensor& t) { return t.narrow(1, 1, 2); });
    chk([](const Tensor& t) { return t.slice(2, 0, 5, 2); });
    chk([](const Tensor& t) { return t.select(0, 1); });
    chk([](const Tensor& t) { return t.select(2, -1).t(); });
    chk([](const Tensor& t) { return t.unsqueeze(1).expand({3, 2, 4, 5}); });
    chk([](const Tensor& t) { return t.narrow(0, 0, 1).squeeze(0); });
    chk([](const Tensor& t) { return t.flatten(1); });
    // several views of one tensor combined: overlapping gradients add
    chk([](const Tensor& t) { return t.select(0, 0) * t.select(0, 2) + t.narrow(0, 1, 1).squeeze(0); });
  }
}

TEST_CASE("gradcheck: cat, stack, split, chunk, tril, triu") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(15);
    Tensor a = on(randn({2, 3}, kFloat64), dev), b = on(randn({4, 3}, kFloat64), dev);
    Tensor c = on(randn({2, 3}, kFloat64), dev);
    CHECK_GRAD([](const TensorList& in) { return cat({in[0], in[1]}, 0); }, (TensorList{a, b}));
    CHECK_GRAD([](const TensorList& in) { return cat({in[0].t(), in[1].t(), in[0].t()}, 1); }, (TensorList{a, b}));
    CHECK_GRAD([](const TensorList& in) { return stack({in[0], in[1]}, 1); }, (TensorList{a, c}));
    CHECK_GRAD([](const TensorList& in) { return stack({in[0], in[1].t().t()}, -1); }, (TensorList{a, c}));
    CHECK_GRAD([](const TensorList& in) {
      auto parts = split(in[0], 3, 0);  // sizes 3, 1
      return parts[0].sum({0}) * parts[1].squeeze(0);
    }, TensorList{b});
    CHECK_GRAD([](const TensorList& in) {
      auto parts = split(in[0], std::vector<int64_t>{1, 2}, 1);
      return parts[1] * 2.0 - parts[0];
    }, TensorList{b});
    CHECK_GRAD([](const TensorList& in) {
      auto parts = chunk(in[0], 2, 0);
      return parts[0] * parts[1];
    }, TensorList{b});
    CHECK_GRAD([](const TensorList& in) {
      auto parts = split(in[0], std::vector<int64_t>{1, 1, 1}, 1);  // the outer pieces get no gradient
      return parts[1].exp();
    }, TensorList{b});
    Tensor sq = on(randn({2, 4, 4}, kFloat64), dev);
    CHECK_GRAD([](const TensorList& in) { return tril(in[0]); }, TensorList{sq});
    CHECK_GRAD([](const TensorList& in) { return triu(in[0], 1); }, TensorList{sq});
    CHECK_GRAD([](const TensorList& in) { return tril(in[0].transpose(1, 2), -1); }, TensorList{sq});
  }
}

namespace {
// y = x with a backward that doubles the gradient: a wrong op for gradcheck to find.
struct DoubledGradient : autograd::Function<DoubledGradient> {
  static Tensor forward(autograd::AutogradContext*, const Tensor& x) { return x.clone(); }
  static TensorList backward(autograd::AutogradContext*, const TensorList& g) { return {g[0] * 2.0}; }
};
}  // namespace

TEST_CASE("gradcheck of a layer with its parameters, element by element and along directions, on every device") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(12);
    nn::Linear layer(3, 2);
    layer.to(kFloat64);
    layer.to(dev);
    Tensor x = on(randn({4, 3}, kFloat64), dev);
    const std::vector<double> w_before = layer.weight.to_vector<double>(), b_before = layer.bias.to_vector<double>();
    bool wrong = false;
    auto fn = [&](const TensorList& in) {
      Tensor y = layer.forward(in[0]);
      return wrong ? y + DoubledGradient::apply(layer.bias) : y;
    };
    for (int directions : {0, 3}) {
      INFO("directions " << directions);
      autograd::GradcheckOptions o;
      o.directions = directions;
      wrong = false;
      auto r = autograd::gradcheck(fn, {x}, layer.parameters(), o);
      CHECK_MESSAGE(r.ok, r.message);
      wrong = true;
      r = autograd::gradcheck(fn, {x}, layer.parameters(), o);
      CHECK(!r.ok);
      if (directions == 0) {
        CHECK(r.parameter == 1);  // the bias, whose gradient is 2 + 1 against 1 + 1
        CHECK(r.analytic / r.numeric == doctest::Approx(1.5).epsilon(1e-6));
      } else {
        CHECK(r.direction >= 0);
      }
      // The parameters as they were, to the bit, and no gradient left on them.
      CHECK(layer.weight.to_vector<double>() == w_before);
      CHECK(layer.bias.to_vector<double>() == b_before);
      CHECK(!layer.weight.grad().defined());
      CHECK(!layer.bias.grad().defined());
    }
  }
}
