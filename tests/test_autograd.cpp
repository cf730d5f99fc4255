// The backward engine: accumulation, ordering, retain_graph, grad mode, detach,
// in-place safety and custom Functions. Expected gradients are worked out by hand.
#include "helpers.h"

using namespace mu;
using autograd::AutogradContext;
using autograd::TensorList;

TEST_CASE("a tensor used twice accumulates both gradients") {
  Tensor x = tensor({2.0, 3.0}, kFloat64).requires_grad_();
  Tensor y = (x * x + x * 3.0).sum();  // dy/dx = 2x + 3
  y.backward();
  CHECK(x.grad().to_vector<double>() == std::vector<double>{7.0, 9.0});
  // A second backward through a fresh graph adds to .grad
  (x * 2.0).sum().backward();
  CHECK(x.grad().to_vector<double>() == std::vector<double>{9.0, 11.0});
  x.zero_grad();
  CHECK(!x.grad().defined());
}

TEST_CASE("a diamond graph runs each node once, after all its consumers") {
  // a -> b = a*2, c = a*3 -> d = b*c ; dd/da = 2*3a + 3*2a = 12a
  Tensor a = tensor({1.0, -2.0}, kFloat64).requires_grad_();
  Tensor b = a * 2.0, c = a * 3.0;
  Tensor d = (b * c).sum();
  d.backward();
  CHECK(a.grad().to_vector<double>() == std::vector<double>{12.0, -24.0});
}

// The engine sums a node's incoming gradients in place when nothing else holds the one
// waiting. An add's backward hands one tensor to both of its inputs; when a second
// gradient then reaches one of them while the other still waits, the sum must not change
// the tensor the other holds. Which of p and r runs first depends on the order of the
// edges, so both orders are tried. Nor may a sum change the gradient the caller passed.
TEST_CASE("gradients summed in place never change a tensor that someone else holds") {
  for (bool p_first : {true, false}) {
    INFO("p " << (p_first ? "first" : "second"));
    Tensor x = tensor({1.0, 2.0, 3.0}, kFloat64).requires_grad_();
    Tensor a = x * 3.0, u = x * 2.0;
    Tensor p = a + u;   // a and u get the same gradient tensor
    Tensor r = u * 5.0;  // u's second gradient, 5 g
    Tensor w = p_first ? p + r : r + p;
    Tensor g = tensor({1.0, 1.0, 1.0}, kFloat64);
    w.backward(g);
    // da = g, du = g + 5 g; dx = 3 da + 2 du = 15 g.
    CHECK(x.grad().to_vector<double>() == std::vector<double>{15.0, 15.0, 15.0});
    CHECK(g.to_vector<double>() == std::vector<double>{1.0, 1.0, 1.0});
  }
  // A tensor used twice in one add: its two gradients are one tensor, summed out of place.
  Tensor y = tensor({1.0, -1.0}, kFloat64).requires_grad_();
  Tensor v = y * 4.0;
  (v + v).sum().backward();
  CHECK(y.grad().to_vector<double>() == std::vector<double>{8.0, 8.0});
}

TEST_CASE("backward of a non-scalar takes an explicit gradient") {
  Tensor x = tensor({1.0, 2.0, 3.0}, kFloat64).requires_grad_();
  Tensor y = x * x;
  CHECK_THROWS_MU(y.backward(), "scalar");
  y.backward(tensor({1.0, 0.5, 0.0}, kFloat64));
  CHECK(x.grad().to_vector<double>() == std::vector<double>{2.0, 2.0, 0.0});
  Tensor y2 = x * x;
  CHECK_THROWS_MU(y2.backward(ones({2}, kFloat64)), "shape");
}

TEST_CASE("retain_graph allows a second backward; without it the graph is freed") {
  Tensor x = tensor({1.0, 2.0}, kFloat64).requires_grad_();
  Tensor y = x.exp().sum();
  y.backward(Tensor(), /*retain_graph=*/true);
  y.backward();
  std::vector<double> g = x.grad().to_vector<double>();
  CHECK(g[0] == doctest::Approx(2 * std::exp(1.0)));
  CHECK(g[1] == doctest::Approx(2 * std::exp(2.0)));
  CHECK_THROWS_MU(y.backward(), "second time");
}

TEST_CASE("NoGradGuard records nothing; detach cuts the graph") {
  Tensor x = ones({2}).requires_grad_();
  {
    NoGradGuard g;
    Tensor y = x * 2.0;
    CHECK(!y.requires_grad());
    CHECK(y.grad_fn() == nullptr);
  }
  CHECK(autograd::is_grad_enabled());
  Tensor d = (x * 2.0).detach();
  CHECK(!d.requires_grad());
  CHECK(d.storage() != nullptr);
  Tensor z = (d * x).sum();  // only the x path carries gradient
  z.backward();
  CHECK(x.grad().to_vector<double>() == std::vector<double>{2.0, 2.0});
}

TEST_CASE("gradients through views reach the base tensor") {
  Tensor x = arange(0, 6, 1, kFloat64).reshape({2, 3}).detach().requires_grad_();
  // select row 1, transpose, narrow, expand: every view's backward re-indexes
  Tensor y = x.t().narrow(0, 1, 2).select(1, 1).unsqueeze(0).expand({3, 2}).sum();
  y.backward();
  // elements x[1][1] and x[1][2] each reached 3 times
  CHECK(x.grad().to_vector<double>() == std::vector<double>{0, 0, 0, 0, 3, 3});
}

TEST_CASE("broadcasting gradients are summed back to each operand's shape") {
  Tensor a = ones({2, 3}, kFloat64).requires_grad_();
  Tensor b = tensor({1.0, 2.0, 3.0}, kFloat64).requires_grad_();
  Tensor s = scalar_tensor(2.0, kFloat64).requires_grad_();
  ((a * b) * s).sum().backward();
  CHECK(b.grad().shape() == Shape{3});
  CHECK(b.grad().to_vector<double>() == std::vector<double>{4, 4, 4});
  CHECK(s.grad().shape() == Shape{});
  CHECK(s.grad().item() == 12.0);
  CHECK(a.grad().to_vector<double>() == std::vector<double>{2, 4, 6, 2, 4, 6});
}

TEST_CASE("in-place changes to saved tensors are detected at backward time") {
  Tensor w = ones({3}).requires_grad_();
  Tensor a = tensor({1.0, 2.0, 3.0});
  Tensor y = (w * a).sum();  // saves a
  a.add_(1.0);
  CHECK_THROWS_MU(y.backward(), "modified by an in-place operation");
}

TEST_CASE("in-place ops on tensors autograd tracks are refused, and allowed under NoGradGuard") {
  Tensor w = ones({3}).requires_grad_();
  CHECK_THROWS_MU(w.add_(1.0), "leaf tensor that requires grad");
  Tensor h = w * 2.0;
  CHECK_THROWS_MU(h.mul_(2.0), "part of the autograd graph");
  {
    NoGradGuard g;
    w.add_(1.0);
  }
  CHECK(w.to_vector<double>() == std::vector<double>{2, 2, 2});
}

TEST_CASE("requires_grad_ is refused on non-leaves and integer tensors") {
  CHECK_THROWS_MU(arange(3).requires_grad_(), "floating-point");
  Tensor x = ones({2}).requires_grad_();
  CHECK_THROWS_MU((x * 2.0).requires_grad_(), "leaf");
  CHECK_THROWS_MU(ones({2}).sum().backward(), "does not require grad");
}

// A custom op whose backward declines to give its second input a gradient.
struct FirstOnly : autograd::Function<FirstOnly> {
  static Tensor forward(AutogradContext*, const Tensor& a, const Tensor& b) { return a + b; }
  static TensorList backward(AutogradContext*, const TensorList& g) { return {g[0], Tensor()}; }
};

TEST_CASE("a branch that receives no gradient does not block the rest of the graph") {
  Tensor x = tensor({1.0, 2.0}, kFloat64).requires_grad_();
  Tensor y = x * 2.0;  // its node gets no gradient, but x's accumulator waits on it
  FirstOnly::apply(x, y).sum().backward();
  REQUIRE(x.grad().defined());
  CHECK(x.grad().to_vector<double>() == std::vector<double>{1.0, 1.0});
}

// y = x^3 with a hand-written gradient, as an op author would write it.
struct Cube : autograd::Function<Cube> {
  static const char* name() { return "CubeBackward"; }
  static Tensor forward(AutogradContext* ctx, const Tensor& x) {
    ctx->save_for_backward({x});
    return x * x * x;
  }
  static TensorList backward(AutogradContext* ctx, const TensorList& g) {
    Tensor x = ctx->get_saved_variables()[0];
    return {g[0] * x * x * 3.0};
  }
};

// Two outputs (first and second half), each with its own gradient; a scale in saved_data.
struct ScaledHalves : autograd::Function<ScaledHalves> {
  static TensorList forward(AutogradContext* ctx, const Tensor& x, double scale) {
    ctx->saved_data["scale"] = scale;
    int64_t h = x.size(0) / 2;
    return {x.narrow(0, 0, h) * scale, x.narrow(0, h, h) * scale};
  }
  static TensorList backward(AutogradContext* ctx, const TensorList& g) {
    double scale = std::any_cast<double>(ctx->saved_data["scale"]);
    return {cat({g[0], g[1]}, 0) * scale};
  }
};

TEST_CASE("custom Function: forward without a graph, backward as written, checked by gradcheck") {
  Tensor x = tensor({1.0, -2.0, 0.5}, kFloat64).requires_grad_();
  Tensor y = Cube::apply(x);
  CHECK(y.grad_fn()->name() == "CubeBackward");
  y.sum().backward();
  CHECK(x.grad().to_vector<double>() == std::vector<double>{3.0, 12.0, 0.75});
  CHECK_GRAD([](const TensorList& in) { return Cube::apply(in[0]); }, TensorList{randn({4, 3})});
  CHECK_GRAD([](const TensorList& in) { return Cube::apply(in[0].t()); }, TensorList{randn({3, 5})});
}

TEST_CASE("custom Function with two outputs: an unused output gets a zero gradient") {
  Tensor x = tensor({1.0, 2.0, 3.0, 4.0}, kFloat64).requires_grad_();
  TensorList halves = ScaledHalves::apply(x, 3.0);
  REQUIRE(halves.size() == 2);
  CHECK(halves[1].to_vector<double>() == std::vector<double>{9.0, 12.0});
  (halves[1] * halves[1]).sum().backward();  // only the second half is used
  // d/dx (3x)^2 = 18x on the second half, 0 on the first
  CHECK(x.grad().to_vector<double>() == std::vector<double>{0.0, 0.0, 54.0, 72.0});
  CHECK_GRAD([](const TensorList& in) {
    TensorList h = ScaledHalves::apply(in[0], 0.5);
    return h[0] * h[1];
  }, TensorList{randn({6})});
}

TEST_CASE("custom Function detects in-place changes to what it saved") {
  Tensor w = ones({2}, kFloat64).requires_grad_();
  Tensor prod = tensor({1.0, 2.0}, kFloat64) * w;  // saved by Cube
  Tensor out = Cube::apply(prod);
  {
    NoGradGuard g;  // the guard lets the write through; the version check still sees it
    prod.mul_(2.0);
  }
  CHECK_THROWS_MU(out.sum().backward(), "modified by an in-place operation");
}

TEST_CASE("gradcheck reports the worst element when a gradient is wrong") {
  struct WrongSquare : autograd::Function<WrongSquare> {
    static Tensor forward(AutogradContext* ctx, const Tensor& x) {
      ctx->save_for_backward({x});
      return x * x;
    }
    static TensorList backward(AutogradContext* ctx, const TensorList& g) {
      return {g[0] * ctx->get_saved_variables()[0] * 3.0};  // should be 2x
    }
  };
  auto r = autograd::gradcheck([](const TensorList& in) { return WrongSquare::apply(in[0]); },
                               {tensor({0.0, 0.0, 5.0}, kFloat64)});
  CHECK(!r.ok);
  CHECK(r.input == 0);
  CHECK(r.index == std::vector<int64_t>{2});
  CHECK(r.message.find("analytic") != std::string::npos);
  // numeric derivative of <x^2, v> at x=5 is 10 v[2]; the analytic one is 15 v[2]
  CHECK(r.analytic == doctest::Approx(1.5 * r.numeric).epsilon(1e-6));
}

TEST_CASE("gradcheck's largest error and its worst element are reported apart and agree with the elements") {
  // y = x · c with a backward of g · c · (1 + d): element 0 has a large derivative and an
  // error within rtol (|diff| 1e-2 against a tolerance 1e-5 + 1e-3 · 100), element 1 a tiny
  // derivative and an error beyond atol (|diff| 1e-4 against 1e-5 + 1e-3 · 1e-2).
  struct Skewed : autograd::Function<Skewed> {
    static Tensor forward(AutogradContext*, const Tensor& x) { return x * tensor({100.0, 0.01}, kFloat64); }
    static TensorList backward(AutogradContext*, const TensorList& g) {
      return {g[0] * tensor({100.0 + 1e-2, 0.01 + 1e-4}, kFloat64)};
    }
  };
  autograd::GradcheckOptions o;
  o.seed = 1;
  auto fn = [](const TensorList& in) { return Skewed::apply(in[0]).sum().reshape({1}); };  // v is one number
  auto r = autograd::gradcheck(fn, {tensor({1.0, 2.0}, kFloat64)}, o);
  CHECK(!r.ok);
  // The worst element, by excess over tolerance, is element 1; the largest |diff| element 0.
  REQUIRE(r.index == std::vector<int64_t>{1});
  REQUIRE(r.max_abs_error_index == std::vector<int64_t>{0});
  CHECK(r.max_abs_error_input == 0);
  // With v the projection of the one output, element 1's derivatives are 0.01 v (numeric)
  // and (0.01 + 1e-4) v (analytic), element 0's errors 1e-2 |v|: ratios free of v.
  CHECK(r.analytic / r.numeric == doctest::Approx(1.01).epsilon(1e-6));
  const double diff = std::abs(r.analytic - r.numeric);
  CHECK(r.max_abs_error / diff == doctest::Approx(100.0).epsilon(1e-4));
  CHECK(r.excess == doctest::Approx(diff - (o.atol + o.rtol * std::abs(r.numeric))).epsilon(1e-9));
  CHECK(r.excess > 0);
  CHECK(r.message.find("worst element (furthest beyond atol + rtol |numeric|) is input 0 at index [1]") !=
        std::string::npos);
  CHECK(r.message.find("largest |diff| " ) != std::string::npos);
  CHECK(r.message.find("at input 0 at index [0]") != std::string::npos);
  // When one element is both, the message says so.
  auto same = autograd::gradcheck([](const TensorList& in) { return in[0] * in[0] * 1.5; },
                                  {tensor({3.0}, kFloat64)});
  CHECK(same.ok);
  CHECK(same.message.find("(the same element)") != std::string::npos);
}

namespace {
// x ↦ w² ⊙ x with w a parameter read from outside the inputs; the backward for w says 3w
// where it should say 2w (when `wrong`).
struct SquaredScale : autograd::Function<SquaredScale> {
  static Tensor forward(AutogradContext* ctx, const Tensor& w, const Tensor& x, bool wrong) {
    ctx->save_for_backward({w, x});
    ctx->saved_data["wrong"] = wrong;
    return w * w * x;
  }
  static TensorList backward(AutogradContext* ctx, const TensorList& g) {
    const TensorList s = ctx->get_saved_variables();
    const double k = std::any_cast<bool>(ctx->saved_data["wrong"]) ? 3.0 : 2.0;
    return {(g[0] * s[1] * s[0] * k).sum({0}), g[0] * s[0] * s[0]};
  }
};
}  // namespace

TEST_CASE("gradcheck differentiates parameters too, element by element or along random directions") {
  Generator gen(3);
  Tensor w = randn({3}, kFloat64, &gen).requires_grad_();
  Tensor x = randn({2, 3}, kFloat64, &gen);
  int calls = 0;
  bool wrong = false;
  auto fn = [&](const TensorList& in) {
    ++calls;
    return SquaredScale::apply(w, in[0], wrong);
  };
  // A gradient the caller had accumulated, and w's values: both as they were afterwards.
  w.set_grad(full({3}, 7.0, kFloat64));
  const std::vector<double> w_before = w.to_vector<double>();
  auto unchanged = [&] {
    CHECK(w.to_vector<double>() == w_before);
    REQUIRE(w.grad().defined());
    CHECK(w.grad().to_vector<double>() == std::vector<double>{7.0, 7.0, 7.0});
  };

  auto r = autograd::gradcheck(fn, {x}, {w});
  CHECK_MESSAGE(r.ok, r.message);
  CHECK(calls == 1 + 2 * (6 + 3));  // one pass for the backward, two per element of x and of w
  unchanged();

  autograd::GradcheckOptions o;
  o.directions = 4;
  calls = 0;
  r = autograd::gradcheck(fn, {x}, {w}, o);
  CHECK_MESSAGE(r.ok, r.message);
  CHECK(calls == 1 + 2 * 4);
  CHECK(r.direction >= 0);
  unchanged();

  wrong = true;
  r = autograd::gradcheck(fn, {x}, {w});
  CHECK(!r.ok);
  CHECK(r.parameter == 0);
  CHECK(r.input == -1);
  CHECK(r.analytic / r.numeric == doctest::Approx(1.5).epsilon(1e-6));  // 3w against 2w
  CHECK(r.message.find("is parameter 0 at index") != std::string::npos);
  unchanged();
  r = autograd::gradcheck(fn, {x}, {w}, o);
  CHECK(!r.ok);
  CHECK(r.direction >= 0);
  CHECK(r.message.find("worst direction (furthest beyond atol + rtol |numeric|) is direction ") != std::string::npos);
  unchanged();
  // Only x checked, with the wrong w gradient not looked at: it passes.
  r = autograd::gradcheck(fn, {x}, {}, o);
  CHECK_MESSAGE(r.ok, r.message);
}

TEST_CASE("gradcheck puts the parameters back when the function throws midway") {
  Tensor w = tensor({1.5, -2.0}, kFloat64).requires_grad_();
  int calls = 0;
  auto fn = [&](const TensorList& in) {
    if (++calls == 3) throw mu::Error("the third call fails");  // during the differences, w moved
    return w * in[0];
  };
  for (int directions : {0, 2}) {
    calls = 0;
    autograd::GradcheckOptions o;
    o.directions = directions;
    CHECK_THROWS_MU(autograd::gradcheck(fn, {tensor({1.0, 2.0}, kFloat64)}, {w}, o), "the third call fails");
    CHECK(w.to_vector<double>() == std::vector<double>{1.5, -2.0});
    CHECK(!w.grad().defined());
  }
}

TEST_CASE("gradcheck refuses parameters it cannot differentiate, naming them") {
  auto fn = [](const TensorList& in) { return in[0] * 2.0; };
  Tensor x = tensor({1.0}, kFloat64);
  CHECK_THROWS_MU(autograd::gradcheck(fn, {x}, {ones({2}).requires_grad_()}), "parameter 0 must be a float64 leaf");
  CHECK_THROWS_MU(autograd::gradcheck(fn, {x}, {ones({2}, kFloat64)}), "(does not require grad)");
  Tensor leaf = ones({2}, kFloat64).requires_grad_();
  CHECK_THROWS_MU(autograd::gradcheck(fn, {x}, {leaf, leaf * 2.0}), "parameter 1 must be a float64 leaf");
  CHECK_THROWS_MU(autograd::gradcheck(fn, {x}, {Tensor()}), "parameter 0 is undefined");
  autograd::GradcheckOptions o;
  o.directions = -1;
  CHECK_THROWS_MU(autograd::gradcheck(fn, {x}, o), "directions must be 0 (element by element) or more, got -1");
}

// As torch's `p.grad = g`: shape, dtype and device must match, each mismatch named when it
// is made rather than at the optimizer's step.
TEST_CASE("set_grad refuses a gradient of another shape, dtype or device") {
  Tensor p = zeros({3}, kFloat64).requires_grad_();
  CHECK_THROWS_MU(p.set_grad(zeros({4}, kFloat64)), "set_grad: gradient of shape [4] for a tensor of shape [3]");
  CHECK_THROWS_MU(p.set_grad(zeros({3}, kFloat32)),
                  "set_grad: gradient of dtype float32 for a tensor of dtype float64; convert it first with .to(float64)");
  CHECK_FALSE(p.grad().defined());  // a refused gradient is not kept
  p.set_grad(ones({3}, kFloat64));
  CHECK(p.grad().to_vector<double>() == std::vector<double>{1, 1, 1});
  p.set_grad(Tensor());
  CHECK_FALSE(p.grad().defined());
  if (cuda::is_available())
    CHECK_THROWS_MU(p.set_grad(zeros({3}, TensorOptions(kFloat64).device(Device::cuda()))),
                    "set_grad: gradient on cuda:0 for a tensor on cpu");
}

// Integer outputs carry no gradient (torch marks them non-differentiable): a custom
// Function's index output and a float tensor converted to int64 have no history, and
// backward through the float output is unchanged.
struct ValuesAndIndex : autograd::Function<ValuesAndIndex> {
  static TensorList forward(AutogradContext*, const Tensor& x) { return {x * 2.0, arange(x.numel())}; }
  static TensorList backward(AutogradContext*, const TensorList& g) {
    REQUIRE(g[0].defined());
    return {g[0] * 2.0};
  }
};

TEST_CASE("integer outputs of recorded ops and custom Functions do not require grad") {
  Tensor x = tensor({1.0, 2.0, 3.0}, kFloat64).requires_grad_();
  TensorList out = ValuesAndIndex::apply(x);
  CHECK(out[0].requires_grad());
  CHECK_FALSE(out[1].requires_grad());
  CHECK(out[1].grad_fn() == nullptr);
  out[0].sum().backward();
  CHECK(x.grad().to_vector<double>() == std::vector<double>{2.0, 2.0, 2.0});
  const Tensor as_int = (x * 1.5).to(kInt64);
  CHECK_FALSE(as_int.requires_grad());
  CHECK(as_int.to_vector<int64_t>() == std::vector<int64_t>{1, 3, 4});
  CHECK_FALSE(lt(x, tensor({2.0}, kFloat64)).requires_grad());
}
