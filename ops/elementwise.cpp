// Elementwise ops: each forward next to its gradient. Forward kernels are scalar
// lambdas run by ops/pointwise.h; gradients are composed from ops, or fused into one
// pass with a derivative lambda where that saves memory traffic.
#include <cmath>

#include "autograd/node.h"
#include "ops/ops.h"
#include "ops/pointwise.h"

namespace mu {

using autograd::record;
using autograd::save;
using autograd::TensorList;
using detail::map_float;
using detail::map_numeric;
using detail::zip_float;
using detail::zip_numeric;

// Constants of gelu's tanh form.
static constexpr double k = 0.7978845608028654, c = 0.044715;

// g * df(x), one pass: the gradient of every unary op of the form y = f(x).
template <class DF>
static Tensor chain(const Tensor& g, const Tensor& x, const char* op, DF df) {
  return zip_float(g, x, op, [df](auto gv, auto xv) { return gv * df(xv); });
}

// ---------------------------------------------------------------- unary

Tensor neg(const Tensor& x) {
  Tensor y = map_numeric(x, "neg", [](auto v) { return -v; });
  return record("NegBackward", y, {x}, [](const Tensor& g) -> TensorList { return {neg(g)}; });
}

Tensor exp(const Tensor& x) {
  Tensor y = map_float(x, "exp", [](auto v) { return std::exp(v); });
  return record("ExpBackward", y, {x}, [ys = save(y)](const Tensor& g) -> TensorList { return {g * ys.get()}; });
}

Tensor log(const Tensor& x) {
  Tensor y = map_float(x, "log", [](auto v) { return std::log(v); });
  return record("LogBackward", y, {x}, [xs = save(x)](const Tensor& g) -> TensorList { return {g / xs.get()}; });
}

Tensor sqrt(const Tensor& x) {
  Tensor y = map_float(x, "sqrt", [](auto v) { return std::sqrt(v); });
  return record("SqrtBackward", y, {x}, [ys = save(y)](const Tensor& g) -> TensorList {
    return {zip_float(g, ys.get(), "sqrt_backward", [](auto gv, auto yv) { return gv / (2 * yv); })};
  });
}

Tensor rsqrt(const Tensor& x) {
  Tensor y = map_float(x, "rsqrt", [](auto v) { return 1 / std::sqrt(v); });
  return record("RsqrtBackward", y, {x}, [ys = save(y)](const Tensor& g) -> TensorList {
    // d/dx x^(-1/2) = -y^3 / 2
    return {zip_float(g, ys.get(), "rsqrt_backward", [](auto gv, auto yv) { return gv * (-yv * yv * yv / 2); })};
  });
}

Tensor abs(const Tensor& x) {
  Tensor y = map_numeric(x, "abs", [](auto v) { return v < 0 ? -v : v; });
  return record("AbsBackward", y, {x}, [xs = save(x)](const Tensor& g) -> TensorList {
    return {chain(g, xs.get(), "abs_backward", [](auto v) { return decltype(v)(v > 0) - decltype(v)(v < 0); })};
  });
}

Tensor sign(const Tensor& x) {
  Tensor y = map_numeric(x, "sign", [](auto v) { return decltype(v)(v > 0) - decltype(v)(v < 0); });
  return record("SignBackward", y, {x}, [](const Tensor& g) -> TensorList { return {zeros_like(g)}; });
}

Tensor tanh(const Tensor& x) {
  Tensor y = map_float(x, "tanh", [](auto v) { return std::tanh(v); });
  return record("TanhBackward", y, {x}, [ys = save(y)](const Tensor& g) -> TensorList {
    return {zip_float(g, ys.get(), "tanh_backward", [](auto gv, auto yv) { return gv * (1 - yv * yv); })};
  });
}

Tensor sigmoid(const Tensor& x) {
  Tensor y = map_float(x, "sigmoid", [](auto v) { return 1 / (1 + std::exp(-v)); });
  return record("SigmoidBackward", y, {x}, [ys = save(y)](const Tensor& g) -> TensorList {
    return {zip_float(g, ys.get(), "sigmoid_backward", [](auto gv, auto yv) { return gv * yv * (1 - yv); })};
  });
}

Tensor relu(const Tensor& x) {
  Tensor y = map_numeric(x, "relu", [](auto v) { return v > 0 ? v : decltype(v)(0); });
  return record("ReluBackward", y, {x}, [ys = save(y)](const Tensor& g) -> TensorList {
    return {zip_float(g, ys.get(), "relu_backward", [](auto gv, auto yv) { return yv > 0 ? gv : decltype(gv)(0); })};
  });
}

Tensor gelu(const Tensor& x, const std::string& approximate) {
  MU_CHECK(approximate == "none" || approximate == "tanh", "gelu: approximate must be \"none\" or \"tanh\", got \"",
           approximate, "\"");
  if (approximate == "none") {
    // x * Phi(x), Phi the standard normal CDF; d/dx = Phi(x) + x * phi(x).
    Tensor y = map_float(x, "gelu", [](auto v) { return v * (0.5 * (1 + std::erf(v * M_SQRT1_2))); });
    return record("GeluBackward", y, {x}, [xs = save(x)](const Tensor& g) -> TensorList {
      return {chain(g, xs.get(), "gelu_backward", [](auto v) {
        using T = decltype(v);
        T cdf = T(0.5) * (1 + std::erf(v * T(M_SQRT1_2)));
        T pdf = std::exp(-T(0.5) * v * v) * T(0.5 * M_2_SQRTPI * M_SQRT1_2);  // 1/sqrt(2 pi)
        return cdf + v * pdf;
      })};
    });
  }
  // tanh form: 0.5 x (1 + tanh(k (x + c x^3))), k = sqrt(2/pi), c = 0.044715.
  Tensor y = map_float(x, "gelu", [](auto v) {
    using T = decltype(v);
    return T(0.5) * v * (1 + std::tanh(T(k) * (v + T(c) * v * v * v)));
  });
  return record("GeluTanhBackward", y, {x}, [xs = save(x)](const Tensor& g) -> TensorList {
    return {chain(g, xs.get(), "gelu_backward", [](auto v) {
      using T = decltype(v);
      T t = std::tanh(T(k) * (v + T(c) * v * v * v));
      return T(0.5) * (1 + t) + T(0.5) * v * (1 - t * t) * T(k) * (1 + T(3 * c) * v * v);
    })};
  });
}

Tensor pow(const Tensor& x, double e) {
  Tensor y = map_float(x, "pow", [e](auto v) { return decltype(v)(std::pow(v, decltype(v)(e))); });
  return record("PowBackward", y, {x}, [xs = save(x), e](const Tensor& g) -> TensorList {
    if (e == 0) return {zeros_like(g)};
    return {chain(g, xs.get(), "pow_backward", [e](auto v) { return decltype(v)(e * std::pow(v, decltype(v)(e - 1))); })};
  });
}

Tensor square(const Tensor& x) { return x * x; }

Tensor clamp(const Tensor& x, double lo, double hi) {
  bool has_lo = !std::isnan(lo), has_hi = !std::isnan(hi);
  Tensor y = map_numeric(x, "clamp", [=](auto v) {
    using T = decltype(v);
    if (has_lo && v < T(lo)) v = T(lo);
    if (has_hi && v > T(hi)) v = T(hi);
    return v;
  });
  // The gradient passes where x lies inside [lo, hi] (bounds included, as PyTorch).
  return record("ClampBackward", y, {x}, [xs = save(x), lo, hi, has_lo, has_hi](const Tensor& g) -> TensorList {
    return {chain(g, xs.get(), "clamp_backward", [=](auto v) {
      using T = decltype(v);
      return T((!has_lo || v >= T(lo)) && (!has_hi || v <= T(hi)));
    })};
  });
}

Tensor clamp_min(const Tensor& x, double lo) { return clamp(x, lo, NAN); }
Tensor clamp_max(const Tensor& x, double hi) { return clamp(x, NAN, hi); }

// ---------------------------------------------------------------- binary

Tensor add(const Tensor& a, const Tensor& b) {
  Tensor y = zip_numeric(a, b, "add", [](auto u, auto v) { return u + v; });
  return record("AddBackward", y, {a, b}, [sa = a.shape(), sb = b.shape()](const Tensor& g) -> TensorList {
    return {sum_to(g, sa), sum_to(g, sb)};
  });
}

Tensor sub(const Tensor& a, const Tensor& b) {
  Tensor y = zip_numeric(a, b, "sub", [](auto u, auto v) { return u - v; });
  return record("SubBackward", y, {a, b}, [sa = a.shape(), sb = b.shape()](const Tensor& g) -> TensorList {
    return {sum_to(g, sa), sum_to(neg(g), sb)};
  });
}

Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor y = zip_numeric(a, b, "mul", [](auto u, auto v) { return u * v; });
  bool ga = a.requires_grad(), gb = b.requires_grad();
  return record("MulBackward", y, {a, b}, [as = save(a), bs = save(b), ga, gb](const Tensor& g) -> TensorList {
    Tensor av = as.get(), bv = bs.get();
    return {ga ? sum_to(g * bv, av.shape()) : Tensor(), gb ? sum_to(g * av, bv.shape()) : Tensor()};
  });
}

Tensor div(const Tensor& a, const Tensor& b) {
  Tensor y = zip_numeric(a, b, "div", [](auto u, auto v) { return u / v; });
  bool gb = b.requires_grad();
  return record("DivBackward", y, {a, b}, [sa = a.shape(), bs = save(b), ys = save(y), gb](const Tensor& g) -> TensorList {
    Tensor bv = bs.get();
    Tensor ga = g / bv;
    // d(a/b)/db = -(a/b)/b = -y/b
    Tensor gbv = gb ? sum_to(neg(ga * ys.get()), bv.shape()) : Tensor();
    return {sum_to(ga, sa), gbv};
  });
}

Tensor pow(const Tensor& a, const Tensor& b) {
  Tensor y = zip_float(a, b, "pow", [](auto u, auto v) { return std::pow(u, v); });
  return record("PowBackward", y, {a, b}, [as = save(a), bs = save(b), ys = save(y)](const Tensor& g) -> TensorList {
    Tensor av = as.get(), bv = bs.get(), yv = ys.get();
    // d/da a^b = b a^(b-1); d/db a^b = a^b log a (taken as 0 where a == 0, as PyTorch)
    Tensor da = detail::zip3_float(g, av, bv, "pow_backward",
                                   [](auto gv, auto u, auto v) { return v == 0 ? decltype(gv)(0) : gv * v * std::pow(u, v - 1); });
    Tensor db = detail::zip3_float(g, av, yv, "pow_backward",
                                   [](auto gv, auto u, auto w) { return u == 0 ? decltype(gv)(0) : gv * w * std::log(u); });
    return {sum_to(da, av.shape()), sum_to(db, bv.shape())};
  });
}

// maximum/minimum: the gradient goes to the larger (smaller) operand, split in half on ties.
static Tensor extremum(const Tensor& a, const Tensor& b, bool take_max) {
  const char* op = take_max ? "maximum" : "minimum";
  Tensor y = zip_numeric(a, b, op, [take_max](auto u, auto v) {
    if (u != u) return u;  // NaN propagates
    if (v != v) return v;
    return take_max ? (u > v ? u : v) : (u < v ? u : v);
  });
  return record(take_max ? "MaximumBackward" : "MinimumBackward", y, {a, b},
                [as = save(a), bs = save(b), take_max](const Tensor& g) -> TensorList {
    Tensor av = as.get(), bv = bs.get();
    auto share = [take_max](auto gv, auto u, auto v) {
      using T = decltype(gv);
      if (u == v) return gv / 2;
      return (take_max ? u > v : u < v) ? gv : T(0);
    };
    Tensor da = detail::zip3_float(g, av, bv, "extremum_backward", share);
    Tensor db = detail::zip3_float(g, bv, av, "extremum_backward", share);
    return {sum_to(da, av.shape()), sum_to(db, bv.shape())};
  });
}

Tensor maximum(const Tensor& a, const Tensor& b) { return extremum(a, b, true); }
Tensor minimum(const Tensor& a, const Tensor& b) { return extremum(a, b, false); }

// ---------------------------------------------------------------- comparisons and selection

Tensor eq(const Tensor& a, const Tensor& b) { return detail::compare(a, b, "eq", [](auto u, auto v) { return u == v; }); }
Tensor ne(const Tensor& a, const Tensor& b) { return detail::compare(a, b, "ne", [](auto u, auto v) { return u != v; }); }
Tensor lt(const Tensor& a, const Tensor& b) { return detail::compare(a, b, "lt", [](auto u, auto v) { return u < v; }); }
Tensor le(const Tensor& a, const Tensor& b) { return detail::compare(a, b, "le", [](auto u, auto v) { return u <= v; }); }
Tensor gt(const Tensor& a, const Tensor& b) { return detail::compare(a, b, "gt", [](auto u, auto v) { return u > v; }); }
Tensor ge(const Tensor& a, const Tensor& b) { return detail::compare(a, b, "ge", [](auto u, auto v) { return u >= v; }); }

// Any dtype counts as a condition: nonzero is true.
static Tensor as_bool(const Tensor& t) { return t.dtype() == kBool ? t : t.to(kBool); }

Tensor logical_not(const Tensor& x) {
  Tensor b = as_bool(x), out = empty(x.shape(), kBool);
  detail::require_cpu(x, "logical_not");
  cpu::map1<bool, bool>(out, b, [](bool v) { return !v; });
  return out;
}
Tensor logical_and(const Tensor& a, const Tensor& b) {
  return detail::compare(as_bool(a), as_bool(b), "logical_and", [](auto u, auto v) { return u && v; });
}
Tensor logical_or(const Tensor& a, const Tensor& b) {
  return detail::compare(as_bool(a), as_bool(b), "logical_or", [](auto u, auto v) { return u || v; });
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  detail::require_same(a, b, "where");
  detail::require_cpu(a, "where");
  MU_CHECK(cond.device() == a.device(), "where: condition on ", cond.device().str(), ", values on ", a.device().str());
  Tensor c = as_bool(cond);
  Shape s = broadcast_shapes(broadcast_shapes(c.shape(), a.shape(), "where"), b.shape(), "where");
  Tensor y = empty(s, a.dtype());
  MU_DISPATCH_ALL(a.dtype(), "where", [&] {
    cpu::map3<scalar_t, bool, scalar_t, scalar_t>(y, c, a, b, [](bool k, scalar_t u, scalar_t v) { return k ? u : v; });
  });
  return record("WhereBackward", y, {a, b}, [cs = save(c), sa = a.shape(), sb = b.shape()](const Tensor& g) -> TensorList {
    Tensor z = zeros({}, g.dtype());
    Tensor cv = cs.get();
    return {sum_to(where(cv, g, z), sa), sum_to(where(cv, z, g), sb)};
  });
}

Tensor where(const Tensor& cond, const Tensor& a, double b) { return where(cond, a, detail::scalar_like(a, b, "where")); }

Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  Shape s = broadcast_shapes(x.shape(), mask.shape(), "masked_fill");
  MU_CHECK(s == x.shape(), "masked_fill: mask of shape ", shape_str(mask.shape()),
           " does not broadcast to the tensor's shape ", shape_str(x.shape()));
  return where(mask, detail::scalar_like(x, value, "masked_fill"), x);
}

bool allclose(const Tensor& a, const Tensor& b, double rtol, double atol) {
  MU_CHECK(a.shape() == b.shape(), "allclose: shapes ", shape_str(a.shape()), " and ", shape_str(b.shape()), " differ");
  std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(x[i]) || std::isnan(y[i])) return false;
    if (std::fabs(x[i] - y[i]) > atol + rtol * std::fabs(y[i])) return false;
  }
  return true;
}

// ---------------------------------------------------------------- operators

Tensor operator-(const Tensor& x) { return neg(x); }
Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator+(const Tensor& a, double b) { return add(a, detail::scalar_like(a, b, "add")); }
Tensor operator-(const Tensor& a, double b) { return sub(a, detail::scalar_like(a, b, "sub")); }
Tensor operator*(const Tensor& a, double b) { return mul(a, detail::scalar_like(a, b, "mul")); }
Tensor operator/(const Tensor& a, double b) { return div(a, detail::scalar_like(a, b, "div")); }
Tensor operator+(double a, const Tensor& b) { return add(detail::scalar_like(b, a, "add"), b); }
Tensor operator-(double a, const Tensor& b) { return sub(detail::scalar_like(b, a, "sub"), b); }
Tensor operator*(double a, const Tensor& b) { return mul(detail::scalar_like(b, a, "mul"), b); }
Tensor operator/(double a, const Tensor& b) { return div(detail::scalar_like(b, a, "div"), b); }
Tensor operator==(const Tensor& a, const Tensor& b) { return eq(a, b); }
Tensor operator!=(const Tensor& a, const Tensor& b) { return ne(a, b); }
Tensor operator<(const Tensor& a, const Tensor& b) { return lt(a, b); }
Tensor operator<=(const Tensor& a, const Tensor& b) { return le(a, b); }
Tensor operator>(const Tensor& a, const Tensor& b) { return gt(a, b); }
Tensor operator>=(const Tensor& a, const Tensor& b) { return ge(a, b); }
Tensor operator==(const Tensor& a, double b) { return eq(a, detail::scalar_like(a, b, "eq")); }
Tensor operator!=(const Tensor& a, double b) { return ne(a, detail::scalar_like(a, b, "ne")); }
Tensor operator<(const Tensor& a, double b) { return lt(a, full({}, b, a.dtype())); }
Tensor operator<=(const Tensor& a, double b) { return le(a, full({}, b, a.dtype())); }
Tensor operator>(const Tensor& a, double b) { return gt(a, full({}, b, a.dtype())); }
Tensor operator>=(const Tensor& a, double b) { return ge(a, full({}, b, a.dtype())); }

// ---------------------------------------------------------------- methods and in-place forms

Tensor Tensor::exp() const { return mu::exp(*this); }
Tensor Tensor::log() const { return mu::log(*this); }
Tensor Tensor::sqrt() const { return mu::sqrt(*this); }
Tensor Tensor::abs() const { return mu::abs(*this); }
Tensor Tensor::neg() const { return mu::neg(*this); }
Tensor Tensor::pow(double e) const { return mu::pow(*this, e); }

// out <- f(out, other), other broadcast to out's shape.
template <class F>
static Tensor& inplace(Tensor& self, const Tensor& other, const char* op, F f) {
  check_inplace(self, op);
  detail::require_same(self, other, op);
  detail::require_cpu(self, op);
  MU_CHECK(broadcast_shapes(self.shape(), other.shape(), op) == self.shape(), op, ": operand of shape ",
           shape_str(other.shape()), " does not broadcast to the destination's shape ", shape_str(self.shape()));
  Tensor src = other.storage() == self.storage() ? other.clone() : other;
  MU_DISPATCH_NUMERIC(self.dtype(), op, [&] { cpu::map2<scalar_t, scalar_t, scalar_t>(self, self, src, f); });
  self.bump_version();
  return self;
}

Tensor& Tensor::add_(const Tensor& other, double alpha) {
  return inplace(*this, other, "add_", [alpha](auto u, auto v) { return decltype(u)(u + alpha * v); });
}
Tensor& Tensor::add_(double value) { return add_(detail::scalar_like(*this, value, "add_")); }
Tensor& Tensor::mul_(const Tensor& other) { return inplace(*this, other, "mul_", [](auto u, auto v) { return u * v; }); }
Tensor& Tensor::mul_(double value) { return mul_(detail::scalar_like(*this, value, "mul_")); }
Tensor& Tensor::div_(const Tensor& other) { return inplace(*this, other, "div_", [](auto u, auto v) { return u / v; }); }

}  // namespace mu
