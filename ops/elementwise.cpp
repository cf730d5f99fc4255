// Elementwise ops: each forward next to its gradient. Forward kernels are functors of
// ops/functors.h run on the operands' device by ops/pointwise.h; gradients are composed
// from ops, or fused into one pass with a derivative functor where that saves memory
// traffic.
#include <cmath>

#include "autograd/node.h"
#include "ops/ops.h"
#include "ops/pointwise.h"
#include "ops/type_promotion.h"

namespace mu {

using autograd::record;
using autograd::save;
using autograd::TensorList;
using detail::map;

// ---------------------------------------------------------------- unary
// Each gradient is one fused pass of a derivative functor (ops/functors.h) over the
// output gradient and the saved input x or output y.

Tensor neg(const Tensor& x) {
  MU_CHECK(!x.defined() || x.dtype() != kBool, "neg: negation of a bool tensor is not supported; use logical_not");
  Tensor y = map(fn::Neg{}, {x});
  return record("NegBackward", y, {x}, [](const Tensor& g) -> TensorList { return {neg(g)}; });
}

Tensor exp(const Tensor& x) {
  Tensor y = map(fn::Exp{}, {x});
  return record("ExpBackward", y, {x}, [ys = save(y)](const Tensor& g) -> TensorList { return {g * ys.get()}; });
}

Tensor log(const Tensor& x) {
  Tensor y = map(fn::Log{}, {x});
  return record("LogBackward", y, {x}, [xs = save(x)](const Tensor& g) -> TensorList { return {g / xs.get()}; });
}

Tensor sqrt(const Tensor& x) {
  Tensor y = map(fn::Sqrt{}, {x});
  return record("SqrtBackward", y, {x},
                [ys = save(y)](const Tensor& g) -> TensorList { return {map(fn::SqrtGrad{}, {g, ys.get()})}; });
}

Tensor rsqrt(const Tensor& x) {
  Tensor y = map(fn::Rsqrt{}, {x});
  return record("RsqrtBackward", y, {x},
                [ys = save(y)](const Tensor& g) -> TensorList { return {map(fn::RsqrtGrad{}, {g, ys.get()})}; });
}

Tensor abs(const Tensor& x) {
  Tensor y = map(fn::Abs{}, {x});
  return record("AbsBackward", y, {x},
                [xs = save(x)](const Tensor& g) -> TensorList { return {map(fn::AbsGrad{}, {g, xs.get()})}; });
}

Tensor sign(const Tensor& x) {
  Tensor y = map(fn::Sign{}, {x});
  return record("SignBackward", y, {x}, [](const Tensor& g) -> TensorList { return {zeros_like(g)}; });
}

Tensor tanh(const Tensor& x) {
  Tensor y = map(fn::Tanh{}, {x});
  return record("TanhBackward", y, {x},
                [ys = save(y)](const Tensor& g) -> TensorList { return {map(fn::TanhGrad{}, {g, ys.get()})}; });
}

Tensor sigmoid(const Tensor& x) {
  Tensor y = map(fn::Sigmoid{}, {x});
  return record("SigmoidBackward", y, {x},
                [ys = save(y)](const Tensor& g) -> TensorList { return {map(fn::SigmoidGrad{}, {g, ys.get()})}; });
}

Tensor relu(const Tensor& x) {
  Tensor y = map(fn::Relu{}, {x});
  return record("ReluBackward", y, {x},
                [ys = save(y)](const Tensor& g) -> TensorList { return {map(fn::ReluGrad{}, {g, ys.get()})}; });
}

// gelu's forward and backward are each one fused pass: x is read once, nothing else kept.
Tensor gelu(const Tensor& x, const std::string& approximate) {
  MU_CHECK(approximate == "none" || approximate == "tanh", "gelu: approximate must be \"none\" or \"tanh\", got \"",
           approximate, "\"");
  if (approximate == "none") {
    Tensor y = map(fn::Gelu{}, {x});
    return record("GeluBackward", y, {x},
                  [xs = save(x)](const Tensor& g) -> TensorList { return {map(fn::GeluGrad{}, {g, xs.get()})}; });
  }
  Tensor y = map(fn::GeluTanh{}, {x});
  return record("GeluTanhBackward", y, {x},
                [xs = save(x)](const Tensor& g) -> TensorList { return {map(fn::GeluTanhGrad{}, {g, xs.get()})}; });
}

// A bool base has no power, as in torch (nor does the pair of two bools).
static void check_pow_base(DType t, const Shape& shape) {
  MU_CHECK(t != kBool, "pow: a bool base ", shape_str(shape),
           " has no power; convert it with .to(kInt64) or .to(kFloat32)");
}

Tensor pow(const Tensor& x, double e) {
  MU_CHECK(x.defined(), "pow: the base is an undefined tensor");
  if (!x.is_floating_point()) {
    check_pow_base(x.dtype(), x.shape());
    // An integral exponent keeps the integers, exact (int_pow, ops/functors.h), as torch
    // does; a fraction, an infinity or NaN gives float32 (int ** 2.5 in torch). |e| below
    // 2^63 converts to int64 exactly.
    if (!(e == std::trunc(e) && std::fabs(e) < 9223372036854775808.0)) return pow(x.to(kFloat32), e);
    MU_CHECK(e >= 0, "pow: integers to negative integer powers are not allowed (", dtype_name(x.dtype()), " ",
             shape_str(x.shape()), " to the power ", e, "); convert the base with .to(kFloat32) first");
  }
  Tensor y = map(fn::PowScalar{{}, e}, {x});
  return record("PowBackward", y, {x}, [xs = save(x), e](const Tensor& g) -> TensorList {
    if (e == 0) return {zeros_like(g)};
    return {map(fn::PowScalarGrad{{}, e}, {g, xs.get()})};
  });
}

// One pass each way; as x * x it took two products and a sum to get 2 x g.
Tensor square(const Tensor& x) {
  Tensor y = map(fn::Square{}, {x});
  return record("SquareBackward", y, {x},
                [xs = save(x)](const Tensor& g) -> TensorList { return {map(fn::SquareGrad{}, {g, xs.get()})}; });
}

Tensor clamp(const Tensor& x, double lo, double hi) {
  bool has_lo = !std::isnan(lo), has_hi = !std::isnan(hi);
  if (x.defined() && !x.is_floating_point()) {
    // An integer tensor's bounds: a fraction or an infinity makes the result float32 (torch's
    // promotion: clamp(int64 {0, 5, 10}, 2.5, 7.5) is {2.5, 5, 7.5}); an integer bound must
    // fit the dtype (the functor converts it to the element type).
    auto integral = [](double v) { return std::isnan(v) || (std::isfinite(v) && v == std::trunc(v)); };
    if (!integral(lo) || !integral(hi)) return clamp(x.to(kFloat32), lo, hi);
    // A bound past the dtype's range on its own side binds nothing (clamp(x, 0, 1e30) of
    // int64 is clamp_min(x, 0)); one past the other side would give values the dtype
    // cannot hold, and check_value_fits says so.
    const auto [least, most] = integer_range(x.dtype());
    if (has_lo && lo <= least) has_lo = false;
    if (has_hi && hi >= most) has_hi = false;
    if (has_lo) check_value_fits(lo, x.dtype(), "clamp");
    if (has_hi) check_value_fits(hi, x.dtype(), "clamp");
  }
  Tensor y = map(fn::Clamp{{}, lo, hi, has_lo, has_hi}, {x});
  // The gradient passes where x lies inside [lo, hi] (bounds included, as PyTorch).
  return record("ClampBackward", y, {x}, [xs = save(x), lo, hi, has_lo, has_hi](const Tensor& g) -> TensorList {
    return {map(fn::ClampGrad{{}, lo, hi, has_lo, has_hi}, {g, xs.get()})};
  });
}

Tensor clamp_min(const Tensor& x, double lo) { return clamp(x, lo, NAN); }
Tensor clamp_max(const Tensor& x, double hi) { return clamp(x, NAN, hi); }

// ---------------------------------------------------------------- binary

namespace {

// a and b converted to the dtype PyTorch computes a binary op in (ops/type_promotion.h);
// `floating`: an integer or bool result becomes float32 (true division). The
// conversions are recorded, so each gradient comes back in its operand's own dtype.
// Float operands that all compute in float32 (bfloat16 or float16 beside float32:
// autocast's activations meeting a float32 bias or residual) are not converted: the
// kernels read each in its own dtype and write the promoted one, and the engine
// rounds each gradient to its operand's dtype.
//
// A 16-bit float result computes in float32 (the kernels widen as they read): a 0-dim
// float operand beside it (a number, with_number) goes in as float32, not rounded to 16
// bits first, and the result, float16 or bfloat16 by result_type's ranks (map reads them
// alike), is rounded once. torch does the same: float16 x / 1e5 is not x / inf.
std::pair<Tensor, Tensor> promoted(const Tensor& a, const Tensor& b, bool floating = false) {
  if (!a.defined() || !b.defined()) return {a, b};  // map() names the undefined operand
  DType r = result_type(a, b);
  if (floating && !is_floating(r)) r = kFloat32;
  if (r == kFloat32 && is_floating(a.dtype()) && is_floating(b.dtype()) && compute_dtype(a.dtype()) == kFloat32 &&
      compute_dtype(b.dtype()) == kFloat32)
    return {a, b};
  if (is_16bit_float(r)) {
    auto side = [r](const Tensor& t) { return t.dim() == 0 && is_floating(t.dtype()) ? t.to(kFloat32) : t.to(r); };
    if ((a.dim() == 0) != (b.dim() == 0)) return {side(a), side(b)};
  }
  return {a.to(r), b.to(r)};
}

// The 0-dim tensor standing for the number `v` beside tensor t, and t, in the dtypes
// PyTorch computes `t op v` in (an integer tensor and 0.5 give float32; a 16-bit float
// tensor with dimensions keeps its dtype, the number float32: see promoted; a 0-dim one
// takes the number in its own dtype, as scalar_like).
std::pair<Tensor, Tensor> with_number(const Tensor& t, Scalar v, bool floating = false) {
  MU_CHECK(t.defined(), "an op between a tensor and a number got an undefined tensor");
  DType r = result_type(t, v);
  if (floating && !is_floating(r)) r = kFloat32;
  const DType number = is_16bit_float(r) && t.dim() > 0 ? kFloat32 : r;
  // An integer number beside an integer tensor goes in as the integer itself (a double
  // would round it above 2^53).
  if (!is_floating(number) && v.has_int64()) {
    // The number takes the tensor's integer dtype (int8 x + 2 is int8), so it must fit it.
    if (number != kInt64)
      check_value_fits(double(v.to_int64()), number, "an op between a tensor and a number");
    return {t.to(r), from_vector(std::vector<int64_t>{v.to_int64()}, {}, TensorOptions(number)).to(t.device())};
  }
  return {t.to(r), full({}, v.to_double(), TensorOptions(number).device(t.device()))};
}

}  // namespace


Tensor add(const Tensor& a_in, const Tensor& b_in) {
  auto [a, b] = promoted(a_in, b_in);
  Tensor y = map(fn::Add{}, {a, b});
  return record("AddBackward", y, {a, b}, [sa = a.shape(), sb = b.shape()](const Tensor& g) -> TensorList {
    return {sum_to(g, sa), sum_to(g, sb)};
  });
}

Tensor sub(const Tensor& a_in, const Tensor& b_in) {
  // As PyTorch: a bool operand is an error (for a mask, logical_not was meant).
  MU_CHECK(!a_in.defined() || !b_in.defined() || (a_in.dtype() != kBool && b_in.dtype() != kBool),
           "sub: subtraction with a bool tensor (", dtype_name(a_in.dtype()), " - ", dtype_name(b_in.dtype()),
           ") is not supported; to invert a mask use logical_not");
  auto [a, b] = promoted(a_in, b_in);
  Tensor y = map(fn::Sub{}, {a, b});
  return record("SubBackward", y, {a, b}, [sa = a.shape(), sb = b.shape()](const Tensor& g) -> TensorList {
    return {sum_to(g, sa), sum_to(neg(g), sb)};
  });
}

Tensor mul(const Tensor& a_in, const Tensor& b_in) {
  auto [a, b] = promoted(a_in, b_in);
  Tensor y = map(fn::Mul{}, {a, b});
  bool ga = a.requires_grad(), gb = b.requires_grad();
  return record("MulBackward", y, {a, b}, [as = save(a), bs = save(b), ga, gb](const Tensor& g) -> TensorList {
    Tensor av = as.get(), bv = bs.get();
    return {ga ? sum_to(g * bv, av.shape()) : Tensor(), gb ? sum_to(g * av, bv.shape()) : Tensor()};
  });
}

Tensor div(const Tensor& a_in, const Tensor& b_in) {
  auto [a, b] = promoted(a_in, b_in, true);
  Tensor y = map(fn::Div{}, {a, b});
  bool gb = b.requires_grad();
  return record("DivBackward", y, {a, b}, [sa = a.shape(), bs = save(b), ys = save(y), gb](const Tensor& g) -> TensorList {
    Tensor bv = bs.get();
    Tensor ga = g / bv;
    // d(a/b)/db = -(a/b)/b = -y/b
    Tensor gbv = gb ? sum_to(neg(ga * ys.get()), bv.shape()) : Tensor();
    return {sum_to(ga, sa), gbv};
  });
}

Tensor div(const Tensor& a_in, const Tensor& b_in, const std::string& rounding_mode) {
  MU_CHECK(rounding_mode == "trunc" || rounding_mode == "floor", "div: rounding_mode must be \"trunc\" or \"floor\", got \"",
           rounding_mode, "\"");
  MU_CHECK(a_in.defined() && b_in.defined(), "div: an operand is an undefined tensor");
  MU_CHECK(a_in.dtype() != kBool || b_in.dtype() != kBool, "div: rounding division of two bool tensors is not supported");
  auto [a, b] = promoted(a_in, b_in);
  if (!is_floating(a.dtype())) {
    // An integer division by zero has no value (C++ would trap): refused on the host
    // before any kernel runs, as PyTorch raises ZeroDivisionError.
    MU_CHECK((b == 0).to(kInt64).sum().item() == 0, "div: integer division by zero (rounding_mode \"", rounding_mode, "\", divisor ",
             dtype_name(b.dtype()), " ", shape_str(b.shape()), ")");
  }
  // Piecewise constant: no gradient flows, as in PyTorch.
  return map(fn::DivRounded{{}, rounding_mode == "floor"}, {a, b});
}

// Integers to integer powers stay integers, exact and wrapping (int_pow): a negative
// exponent gives 1, +-1 or 0, as torch's integer pow.
Tensor pow(const Tensor& a_in, const Tensor& b_in) {
  MU_CHECK(a_in.defined() && b_in.defined(), "pow: an operand is an undefined tensor");
  auto [a, b] = promoted(a_in, b_in);
  check_pow_base(a.dtype(), a.shape());
  Tensor y = map(fn::Pow{}, {a, b});
  return record("PowBackward", y, {a, b}, [as = save(a), bs = save(b), ys = save(y)](const Tensor& g) -> TensorList {
    Tensor av = as.get(), bv = bs.get(), yv = ys.get();
    Tensor da = map(fn::PowGradBase{}, {g, av, bv});
    Tensor db = map(fn::PowGradExponent{}, {g, av, yv});
    return {sum_to(da, av.shape()), sum_to(db, bv.shape())};
  });
}

// maximum/minimum: the gradient goes to the larger (smaller) operand, split in half on ties.
static Tensor extremum(const Tensor& a_in, const Tensor& b_in, bool take_max) {
  auto [a, b] = promoted(a_in, b_in);
  Tensor y = take_max ? map(fn::Maximum{}, {a, b}) : map(fn::Minimum{}, {a, b});
  return record(take_max ? "MaximumBackward" : "MinimumBackward", y, {a, b},
                [as = save(a), bs = save(b), take_max](const Tensor& g) -> TensorList {
    Tensor av = as.get(), bv = bs.get();
    Tensor da = map(fn::ExtremumShare{{}, take_max}, {g, av, bv});
    Tensor db = map(fn::ExtremumShare{{}, take_max}, {g, bv, av});
    return {sum_to(da, av.shape()), sum_to(db, bv.shape())};
  });
}

Tensor maximum(const Tensor& a, const Tensor& b) { return extremum(a, b, true); }
Tensor minimum(const Tensor& a, const Tensor& b) { return extremum(a, b, false); }

// ---------------------------------------------------------------- comparisons and selection

Tensor eq(const Tensor& a, const Tensor& b) {
  auto [pa, pb] = promoted(a, b);
  return map(fn::Eq{}, {pa, pb});
}
Tensor ne(const Tensor& a, const Tensor& b) {
  auto [pa, pb] = promoted(a, b);
  return map(fn::Ne{}, {pa, pb});
}
Tensor lt(const Tensor& a, const Tensor& b) {
  auto [pa, pb] = promoted(a, b);
  return map(fn::Lt{}, {pa, pb});
}
Tensor le(const Tensor& a, const Tensor& b) {
  auto [pa, pb] = promoted(a, b);
  return map(fn::Le{}, {pa, pb});
}
Tensor gt(const Tensor& a, const Tensor& b) {
  auto [pa, pb] = promoted(a, b);
  return map(fn::Gt{}, {pa, pb});
}
Tensor ge(const Tensor& a, const Tensor& b) {
  auto [pa, pb] = promoted(a, b);
  return map(fn::Ge{}, {pa, pb});
}

// Any dtype counts as a condition: nonzero is true.
static Tensor as_bool(const Tensor& t) { return t.dtype() == kBool ? t : t.to(kBool); }

Tensor logical_not(const Tensor& x) { return map(fn::LogicalNot{}, {as_bool(x)}); }
Tensor logical_and(const Tensor& a, const Tensor& b) { return map(fn::LogicalAnd{}, {as_bool(a), as_bool(b)}); }
Tensor logical_or(const Tensor& a, const Tensor& b) { return map(fn::LogicalOr{}, {as_bool(a), as_bool(b)}); }

Tensor where(const Tensor& cond, const Tensor& a_in, const Tensor& b_in) {
  auto [a, b] = promoted(a_in, b_in);
  Tensor c = as_bool(cond);
  Tensor y = map(fn::Where{}, {c, a, b});
  return record("WhereBackward", y, {a, b}, [cs = save(c), sa = a.shape(), sb = b.shape()](const Tensor& g) -> TensorList {
    Tensor z = zeros({}, TensorOptions(g.dtype()).device(g.device()));
    Tensor cv = cs.get();
    return {sum_to(where(cv, g, z), sa), sum_to(where(cv, z, g), sb)};
  });
}

Tensor where(const Tensor& cond, const Tensor& a, Scalar b) {
  auto [pa, pb] = with_number(a, b);
  return where(cond, pa, pb);
}

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
Tensor operator+(const Tensor& a, Scalar b) {
  auto [pa, pb] = with_number(a, b);
  return add(pa, pb);
}
Tensor operator-(const Tensor& a, Scalar b) {
  auto [pa, pb] = with_number(a, b);
  return sub(pa, pb);
}
Tensor operator*(const Tensor& a, Scalar b) {
  auto [pa, pb] = with_number(a, b);
  return mul(pa, pb);
}
Tensor operator/(const Tensor& a, Scalar b) {
  auto [pa, pb] = with_number(a, b, true);
  return div(pa, pb);
}
Tensor operator+(Scalar a, const Tensor& b) {
  auto [pb, pa] = with_number(b, a);
  return add(pa, pb);
}
Tensor operator-(Scalar a, const Tensor& b) {
  auto [pb, pa] = with_number(b, a);
  return sub(pa, pb);
}
Tensor operator*(Scalar a, const Tensor& b) {
  auto [pb, pa] = with_number(b, a);
  return mul(pa, pb);
}
Tensor operator/(Scalar a, const Tensor& b) {
  auto [pb, pa] = with_number(b, a, true);
  return div(pa, pb);
}
Tensor operator==(const Tensor& a, const Tensor& b) { return eq(a, b); }
Tensor operator!=(const Tensor& a, const Tensor& b) { return ne(a, b); }
Tensor operator<(const Tensor& a, const Tensor& b) { return lt(a, b); }
Tensor operator<=(const Tensor& a, const Tensor& b) { return le(a, b); }
Tensor operator>(const Tensor& a, const Tensor& b) { return gt(a, b); }
Tensor operator>=(const Tensor& a, const Tensor& b) { return ge(a, b); }
Tensor operator==(const Tensor& a, Scalar b) {
  auto [pa, pb] = with_number(a, b);
  return eq(pa, pb);
}
Tensor operator!=(const Tensor& a, Scalar b) {
  auto [pa, pb] = with_number(a, b);
  return ne(pa, pb);
}
Tensor operator<(const Tensor& a, Scalar b) {
  auto [pa, pb] = with_number(a, b);
  return lt(pa, pb);
}
Tensor operator<=(const Tensor& a, Scalar b) {
  auto [pa, pb] = with_number(a, b);
  return le(pa, pb);
}
Tensor operator>(const Tensor& a, Scalar b) {
  auto [pa, pb] = with_number(a, b);
  return gt(pa, pb);
}
Tensor operator>=(const Tensor& a, Scalar b) {
  auto [pa, pb] = with_number(a, b);
  return ge(pa, pb);
}

// ---------------------------------------------------------------- methods and in-place forms

Tensor Tensor::exp() const { return mu::exp(*this); }
Tensor Tensor::log() const { return mu::log(*this); }
Tensor Tensor::sqrt() const { return mu::sqrt(*this); }
Tensor Tensor::abs() const { return mu::abs(*this); }
Tensor Tensor::neg() const { return mu::neg(*this); }
Tensor Tensor::pow(double e) const { return mu::pow(*this, e); }
Tensor Tensor::tanh() const { return mu::tanh(*this); }
Tensor Tensor::sigmoid() const { return mu::sigmoid(*this); }
Tensor Tensor::relu() const { return mu::relu(*this); }
Tensor Tensor::clamp(double min, double max) const { return mu::clamp(*this, min, max); }

// self <- f(self, other), other broadcast to self's shape.
template <class F>
static Tensor& inplace(Tensor& self, const Tensor& other, const F& f, const char* op) {
  check_inplace(self, op);
  check_distinct_elements(self, op);
  // A source sharing the destination's memory (x.add_(x.t())) is read from a private copy.
  Tensor src = other.storage() == self.storage() ? other.clone() : other;
  // A 0-dim float beside a 16-bit float self is read in float32 (see promoted): x.add_(1e5)
  // on float16 -6e4 gives 4e4, not inf.
  const bool narrow_self = is_16bit_float(self.dtype());
  if (src.defined() && narrow_self && src.dim() == 0 && self.dim() > 0 && is_floating(src.dtype())) {
    detail::map_into(self, f, {self, src.to(kFloat32)});
    self.bump_version();
    return self;
  }
  if (src.defined() && src.dtype() != self.dtype()) {
    // PyTorch's rule for in-place ops: the promoted result must fit self's dtype (a float
    // never goes into an integer tensor); then other is read in self's dtype.
    DType r = result_type(self, src);
    MU_CHECK(can_cast(r, self.dtype()), op, ": the result type ", dtype_name(r),
             " cannot be written into a tensor of dtype ", dtype_name(self.dtype()), " (self ",
             shape_str(self.shape()), ", other ", dtype_name(src.dtype()), " ", shape_str(src.shape()), ")");
    src = src.to(self.dtype());
  }
  detail::map_into(self, f, {self, src});
  self.bump_version();
  return self;
}

Tensor& Tensor::add_(const Tensor& other, double alpha) {
  MU_CHECK(is_floating(dtype()) || (std::isfinite(alpha) && alpha == std::trunc(alpha) && std::fabs(alpha) < 9.2e18),
           "add_: alpha ", alpha, " is not an integer but the tensor is ", dtype_name(dtype()));
  return inplace(*this, other, fn::AddScaled{{}, alpha}, "add_");
}
Tensor& Tensor::add_(double value) { return add_(detail::scalar_like(*this, value, "add_")); }
Tensor& Tensor::mul_(const Tensor& other) { return inplace(*this, other, fn::Mul{}, "mul_"); }
Tensor& Tensor::mul_(double value) { return mul_(detail::scalar_like(*this, value, "mul_")); }
// True division has a floating-point result, which an integer tensor cannot hold.
static void require_floating_quotient(const Tensor& self) {
  MU_CHECK(is_floating(self.dtype()), "div_: the result type of true division is floating point and cannot be written "
           "into a tensor of dtype ", dtype_name(self.dtype()), "; use div(a, b, \"trunc\") or \"floor\"");
}
Tensor& Tensor::div_(const Tensor& other) {
  require_floating_quotient(*this);
  return inplace(*this, other, fn::Div{}, "div_");
}
// A division, not a product with 1 / value: x / 1e-310 is 1e10 times x, where 1 / 1e-310
// is inf, and the quotient is rounded once. (Checked first: scalar_like would name the
// number, not the division, for an integer tensor.)
Tensor& Tensor::div_(double value) {
  require_floating_quotient(*this);
  return div_(detail::scalar_like(*this, value, "div_"));
}

}  // namespace mu
