// Elementwise math, written once: every elementwise op and every fused derivative is a
// named functor here, which the CPU map loops (ops/cpu/map.cpp) and the CUDA map kernels
// (ops/cuda/) both instantiate for each scalar type the functor allows.
//
// Compiled by g++ (C++20) and nvcc (C++17): keep it C++17, call only the C math
// functions both compilers provide on host and device (the mu::fn::m_* wrappers), and
// mark every call operator MU_HOST_DEVICE.
//
// A functor states its traits through its base, Functor<arity, types, result, select>:
//   types   the scalar types it is instantiated for (Float: float, double; Numeric:
//           also int64_t; All: also bool);
//   result  Same (the operands' type) or Bool (comparisons);
//   select  its first operand is a bool condition (where); the scalar type is then
//           taken from the second operand.
// and names itself (`name`, used in error messages and kernel lookups).
#pragma once
#include <math.h>

#include <cstdint>
#include <type_traits>

#if defined(__CUDACC__)
#define MU_HOST_DEVICE __host__ __device__
#else
#define MU_HOST_DEVICE
#endif

namespace mu::fn {

enum class Types { Float, Numeric, All };
enum class Result { Same, Bool };

template <int Arity, Types Ty = Types::Float, Result Res = Result::Same, bool Select = false>
struct Functor {
  static constexpr int arity = Arity;
  static constexpr Types types = Ty;
  static constexpr Result result = Res;
  static constexpr bool select = Select;
};

// ---- math on both sides: one overload per floating type, so float stays float.
MU_HOST_DEVICE inline float m_exp(float x) { return ::expf(x); }
MU_HOST_DEVICE inline double m_exp(double x) { return ::exp(x); }
MU_HOST_DEVICE inline float m_log(float x) { return ::logf(x); }
MU_HOST_DEVICE inline double m_log(double x) { return ::log(x); }
MU_HOST_DEVICE inline float m_sqrt(float x) { return ::sqrtf(x); }
MU_HOST_DEVICE inline double m_sqrt(double x) { return ::sqrt(x); }
MU_HOST_DEVICE inline float m_tanh(float x) { return ::tanhf(x); }
MU_HOST_DEVICE inline double m_tanh(double x) { return ::tanh(x); }
MU_HOST_DEVICE inline float m_erf(float x) { return ::erff(x); }
MU_HOST_DEVICE inline double m_erf(double x) { return ::erf(x); }
MU_HOST_DEVICE inline double m_erfc(double x) { return ::erfc(x); }
MU_HOST_DEVICE inline float m_pow(float x, float y) { return ::powf(x, y); }
MU_HOST_DEVICE inline double m_pow(double x, double y) { return ::pow(x, y); }
MU_HOST_DEVICE inline float m_floor(float x) { return ::floorf(x); }
MU_HOST_DEVICE inline double m_floor(double x) { return ::floor(x); }
MU_HOST_DEVICE inline float m_trunc(float x) { return ::truncf(x); }
MU_HOST_DEVICE inline double m_trunc(double x) { return ::trunc(x); }

// ---- integer arithmetic that wraps around as two's complement, as PyTorch's does:
// signed overflow is undefined in C++, so signed integers go through their unsigned
// twins (whose arithmetic is modular); floats and bool are left as they are.
template <class T>
inline constexpr bool is_integer_v = std::is_integral<T>::value && !std::is_same<T, bool>::value;

template <class T>
MU_HOST_DEVICE T wrapping_add(T u, T v) {
  if constexpr (is_integer_v<T>) {
    using U = typename std::make_unsigned<T>::type;
    return T(U(u) + U(v));
  } else {
    return u + v;
  }
}
template <class T>
MU_HOST_DEVICE T wrapping_sub(T u, T v) {
  if constexpr (is_integer_v<T>) {
    using U = typename std::make_unsigned<T>::type;
    return T(U(u) - U(v));
  } else {
    return u - v;
  }
}
template <class T>
MU_HOST_DEVICE T wrapping_mul(T u, T v) {
  if constexpr (is_integer_v<T>) {
    using U = typename std::make_unsigned<T>::type;
    return T(U(u) * U(v));
  } else {
    return u * v;
  }
}

inline constexpr double kSqrt1_2 = 0.70710678118654752440;     // 1/sqrt(2)
inline constexpr double kInvSqrt2Pi = 0.39894228040143267794;  // 1/sqrt(2 pi)
inline constexpr double kGeluK = 0.7978845608028654;           // sqrt(2/pi), gelu's tanh form
inline constexpr double kGeluC = 0.044715;

// ================================================================ unary forward

struct Neg : Functor<1, Types::Numeric> {
  static constexpr const char* name = "neg";
  template <class T> MU_HOST_DEVICE T operator()(T v) const { return wrapping_sub(T(0), v); }
};
struct Exp : Functor<1> {
  static constexpr const char* name = "exp";
  template <class T> MU_HOST_DEVICE T operator()(T v) const { return m_exp(v); }
};
struct Log : Functor<1> {
  static constexpr const char* name = "log";
  template <class T> MU_HOST_DEVICE T operator()(T v) const { return m_log(v); }
};
struct Sqrt : Functor<1> {
  static constexpr const char* name = "sqrt";
  template <class T> MU_HOST_DEVICE T operator()(T v) const { return m_sqrt(v); }
};
struct Rsqrt : Functor<1> {
  static constexpr const char* name = "rsqrt";
  template <class T> MU_HOST_DEVICE T operator()(T v) const { return T(1) / m_sqrt(v); }
};
struct Abs : Functor<1, Types::Numeric> {
  static constexpr const char* name = "abs";
  template <class T> MU_HOST_DEVICE T operator()(T v) const { return v < 0 ? wrapping_sub(T(0), v) : v; }
};
struct Sign : Functor<1, Types::Numeric> {
  static constexpr const char* name = "sign";
  template <class T> MU_HOST_DEVICE T operator()(T v) const { return T(v > 0) - T(v < 0); }
};
struct Tanh : Functor<1> {
  static constexpr const char* name = "tanh";
  template <class T> MU_HOST_DEVICE T operator()(T v) const { return m_tanh(v); }
};
struct Sigmoid : Functor<1> {
  static constexpr const char* name = "sigmoid";
  template <class T> MU_HOST_DEVICE T operator()(T v) const { return T(1) / (T(1) + m_exp(-v)); }
};
struct Square : Functor<1, Types::Numeric> {
  static constexpr const char* name = "square";
  template <class T> MU_HOST_DEVICE T operator()(T v) const { return wrapping_mul(v, v); }
};
struct Relu : Functor<1, Types::Numeric> {
  static constexpr const char* name = "relu";
  // NaN is not below zero, so it passes through, as in PyTorch.
  template <class T> MU_HOST_DEVICE T operator()(T v) const { return v < 0 ? T(0) : v; }
};
// x * Phi(x), Phi the standard normal CDF (torch's approximate="none"), computed in
// double and rounded once: Phi(x) = erfc(-x/√2)/2 keeps its digits in the lower tail,
// where 1 + erf(x/√2) cancels (to 0 in float below x = -5.5, in double below -8.3), and
// the double product keeps float's digits down to its normals (and rounds to its
// subnormals below). The CPU's float32 runs have their own vector code (ops/cpu/map.cpp,
// as exact); this is what the other backends and dtypes compute.
struct Gelu : Functor<1> {
  static constexpr const char* name = "gelu";
  template <class T> MU_HOST_DEVICE T operator()(T v) const {
    const double x = double(v);
    return T(x * (0.5 * m_erfc(-x * kSqrt1_2)));
  }
};
// 0.5 x (1 + tanh(k (x + c x^3))) (torch's approximate="tanh").
struct GeluTanh : Functor<1> {
  static constexpr const char* name = "gelu";
  template <class T> MU_HOST_DEVICE T operator()(T v) const {
    return T(0.5) * v * (T(1) + m_tanh(T(kGeluK) * (v + T(kGeluC) * v * v * v)));
  }
};
// v^e, through m_pow except for the exponents whose power one operation gives with pow's
// own result, rounded once (v * v, 1 / v) or exact (v, 1), NaN and infinities included:
// pow(x, 2) and its gradient's pow(x, 1) are common, and libm's pow keeps a loop scalar
// (pow(x, 2) forward and backward over 1M floats: 12.8 -> 0.7-1.3 ms on two Zen 5 cores).
template <class T>
MU_HOST_DEVICE inline T pow_scalar(T v, double e) {
  if (e == 2) return v * v;
  if (e == 1) return v;
  if (e == 0) return T(1);
  if (e == -1) return T(1) / v;
  return m_pow(v, T(e));
}
// An integer to an integer power, as torch computes it: exact, wrapping as the dtype's
// products do (repeated squaring in unsigned arithmetic, where a signed overflow would be
// undefined); a negative exponent gives 1 for the base 1, +-1 for -1, and 0 for every
// other base, 0 included.
template <class T>
MU_HOST_DEVICE inline T int_pow(T base, T e) {
  if (e < 0) return base == T(1) ? T(1) : base == T(-1) ? ((e & 1) ? T(-1) : T(1)) : T(0);
  uint64_t r = 1, b = static_cast<uint64_t>(base);
  for (uint64_t n = static_cast<uint64_t>(e); n != 0; n >>= 1) {
    if (n & 1) r *= b;
    b *= b;
  }
  return static_cast<T>(r);
}
// Integers only with an integral e >= 0 (pow(Tensor, double) sends the others to float32).
struct PowScalar : Functor<1, Types::Numeric> {
  static constexpr const char* name = "pow";
  double e;
  template <class T> MU_HOST_DEVICE T operator()(T v) const {
    if constexpr (std::is_integral_v<T>) return int_pow(v, T(e));
    else return pow_scalar(v, e);
  }
};
// Either bound may be absent (has_lo / has_hi false).
struct Clamp : Functor<1, Types::Numeric> {
  static constexpr const char* name = "clamp";
  double lo, hi;
  bool has_lo, has_hi;
  template <class T> MU_HOST_DEVICE T operator()(T v) const {
    if (has_lo && v < T(lo)) v = T(lo);
    if (has_hi && v > T(hi)) v = T(hi);
    return v;
  }
};

// ================================================================ unary gradients: g * f'(.)
// Each takes the output gradient g and the saved x or y of the forward.

struct SqrtGrad : Functor<2> {  // (g, y): g / (2 y)
  static constexpr const char* name = "sqrt_backward";
  template <class T> MU_HOST_DEVICE T operator()(T g, T y) const { return g / (2 * y); }
};
struct RsqrtGrad : Functor<2> {  // (g, y): d/dx x^(-1/2) = -y^3 / 2
  static constexpr const char* name = "rsqrt_backward";
  template <class T> MU_HOST_DEVICE T operator()(T g, T y) const { return g * (-y * y * y / 2); }
};
struct AbsGrad : Functor<2> {  // (g, x): g sign(x)
  static constexpr const char* name = "abs_backward";
  template <class T> MU_HOST_DEVICE T operator()(T g, T x) const { return g * (T(x > 0) - T(x < 0)); }
};
struct TanhGrad : Functor<2> {  // (g, y)
  static constexpr const char* name = "tanh_backward";
  template <class T> MU_HOST_DEVICE T operator()(T g, T y) const { return g * (1 - y * y); }
};
struct SigmoidGrad : Functor<2> {  // (g, y)
  static constexpr const char* name = "sigmoid_backward";
  template <class T> MU_HOST_DEVICE T operator()(T g, T y) const { return g * y * (1 - y); }
};
// (g, x): 2 x g, bit for bit the g x + g x that square's gradient as a product would sum.
struct SquareGrad : Functor<2> {
  static constexpr const char* name = "square_backward";
  template <class T> MU_HOST_DEVICE T operator()(T g, T x) const { return T(2) * (g * x); }
};
struct ReluGrad : Functor<2> {  // (g, y)
  static constexpr const char* name = "relu_backward";
  // As torch's threshold_backward: zero where y <= 0, so a NaN output passes its gradient.
  template <class T> MU_HOST_DEVICE T operator()(T g, T y) const { return y <= 0 ? T(0) : g; }
};
// (g, x): g (Phi(x) + x phi(x)), in double as Gelu (x² of a float is exact there) and
// rounded once.
struct GeluGrad : Functor<2> {
  static constexpr const char* name = "gelu_backward";
  template <class T> MU_HOST_DEVICE T operator()(T g, T v) const {
    const double x = double(v);
    const double cdf = 0.5 * m_erfc(-x * kSqrt1_2), pdf = m_exp(-0.5 * x * x) * kInvSqrt2Pi;
    return T(double(g) * (cdf + x * pdf));
  }
};
struct GeluTanhGrad : Functor<2> {  // (g, x)
  static constexpr const char* name = "gelu_backward";
  template <class T> MU_HOST_DEVICE T operator()(T g, T x) const {
    T t = m_tanh(T(kGeluK) * (x + T(kGeluC) * x * x * x));
    return g * (T(0.5) * (1 + t) + T(0.5) * x * (1 - t * t) * T(kGeluK) * (1 + T(3 * kGeluC) * x * x));
  }
};
struct PowScalarGrad : Functor<2> {  // (g, x): e x^(e-1)
  static constexpr const char* name = "pow_backward";
  double e;
  template <class T> MU_HOST_DEVICE T operator()(T g, T x) const { return g * T(e * pow_scalar(x, e - 1)); }
};
// (g, x): the gradient passes where x lies inside the bounds (bounds included, as torch).
struct ClampGrad : Functor<2> {
  static constexpr const char* name = "clamp_backward";
  double lo, hi;
  bool has_lo, has_hi;
  template <class T> MU_HOST_DEVICE T operator()(T g, T x) const {
    // Bitwise, not short-circuit: one select the compiler vectorises (a branch per test
    // took 2.4 ms for 1M floats).
    const bool inside = (!has_lo | (x >= T(lo))) & (!has_hi | (x <= T(hi)));
    return inside ? g : T(0);
  }
};

// ================================================================ binary

struct Add : Functor<2, Types::Numeric> {
  static constexpr const char* name = "add";
  template <class T> MU_HOST_DEVICE T operator()(T u, T v) const { return wrapping_add(u, v); }
};
struct Sub : Functor<2, Types::Numeric> {
  static constexpr const char* name = "sub";
  template <class T> MU_HOST_DEVICE T operator()(T u, T v) const { return wrapping_sub(u, v); }
};
struct Mul : Functor<2, Types::Numeric> {
  static constexpr const char* name = "mul";
  template <class T> MU_HOST_DEVICE T operator()(T u, T v) const { return wrapping_mul(u, v); }
};
// True division: floating point only (integers are promoted to float32 before it).
struct Div : Functor<2, Types::Float> {
  static constexpr const char* name = "div";
  template <class T> MU_HOST_DEVICE T operator()(T u, T v) const { return u / v; }
};
// Division rounded toward zero (trunc) or toward -infinity (floor), as torch.div's
// rounding_mode. For integers the op refuses a zero divisor before the kernel runs;
// INT64_MIN / -1 wraps to INT64_MIN as in PyTorch (C++'s division would trap).
struct DivRounded : Functor<2, Types::Numeric> {
  static constexpr const char* name = "div";
  bool floor = false;
  template <class T> MU_HOST_DEVICE T operator()(T u, T v) const {
    if constexpr (is_integer_v<T>) {
      if (v == T(-1)) return wrapping_sub(T(0), u);
      T q = u / v;
      // C++ truncates; floor moves a negative inexact quotient down by one.
      if (floor && (u % v != 0) && ((u < 0) != (v < 0))) q = q - 1;
      return q;
    } else {
      T q = u / v;
      return floor ? m_floor(q) : m_trunc(q);
    }
  }
};
// u + alpha v, the in-place add_(other, alpha).
struct AddScaled : Functor<2, Types::Numeric> {
  static constexpr const char* name = "add_";
  double alpha;
  template <class T> MU_HOST_DEVICE T operator()(T u, T v) const {
    // Integers stay exact (never through double) when alpha is an integer, which the op
    // requires for integer tensors.
    if constexpr (is_integer_v<T>) return wrapping_add(u, wrapping_mul(T(alpha), v));
    else return T(u + alpha * v);
  }
};
struct Pow : Functor<2, Types::Numeric> {
  static constexpr const char* name = "pow";
  template <class T> MU_HOST_DEVICE T operator()(T u, T v) const {
    if constexpr (std::is_integral_v<T>) return int_pow(u, v);
    else return m_pow(u, v);
  }
};
// NaN propagates from either side.
struct Maximum : Functor<2, Types::Numeric> {
  static constexpr const char* name = "maximum";
  template <class T> MU_HOST_DEVICE T operator()(T u, T v) const {
    if (u != u) return u;
    if (v != v) return v;
    return u > v ? u : v;
  }
};
struct Minimum : Functor<2, Types::Numeric> {
  static constexpr const char* name = "minimum";
  template <class T> MU_HOST_DEVICE T operator()(T u, T v) const {
    if (u != u) return u;
    if (v != v) return v;
    return u < v ? u : v;
  }
};
// 1 where a equals b or both are NaN: which elements hold a reduction's extremum.
struct EqualOrBothNaN : Functor<2> {
  static constexpr const char* name = "amax_backward";
  template <class T> MU_HOST_DEVICE T operator()(T a, T b) const { return T(a == b || (a != a && b != b)); }
};

// ---- comparisons and logic: bool results
struct Eq : Functor<2, Types::All, Result::Bool> {
  static constexpr const char* name = "eq";
  template <class T> MU_HOST_DEVICE bool operator()(T u, T v) const { return u == v; }
};
struct Ne : Functor<2, Types::All, Result::Bool> {
  static constexpr const char* name = "ne";
  template <class T> MU_HOST_DEVICE bool operator()(T u, T v) const { return u != v; }
};
struct Lt : Functor<2, Types::All, Result::Bool> {
  static constexpr const char* name = "lt";
  template <class T> MU_HOST_DEVICE bool operator()(T u, T v) const { return u < v; }
};
struct Le : Functor<2, Types::All, Result::Bool> {
  static constexpr const char* name = "le";
  template <class T> MU_HOST_DEVICE bool operator()(T u, T v) const { return u <= v; }
};
struct Gt : Functor<2, Types::All, Result::Bool> {
  static constexpr const char* name = "gt";
  template <class T> MU_HOST_DEVICE bool operator()(T u, T v) const { return u > v; }
};
struct Ge : Functor<2, Types::All, Result::Bool> {
  static constexpr const char* name = "ge";
  template <class T> MU_HOST_DEVICE bool operator()(T u, T v) const { return u >= v; }
};
// The logical ops see bool operands (the op converts others first).
struct LogicalNot : Functor<1, Types::All, Result::Bool> {
  static constexpr const char* name = "logical_not";
  template <class T> MU_HOST_DEVICE bool operator()(T v) const { return !bool(v); }
};
struct LogicalAnd : Functor<2, Types::All, Result::Bool> {
  static constexpr const char* name = "logical_and";
  template <class T> MU_HOST_DEVICE bool operator()(T u, T v) const { return bool(u) && bool(v); }
};
struct LogicalOr : Functor<2, Types::All, Result::Bool> {
  static constexpr const char* name = "logical_or";
  template <class T> MU_HOST_DEVICE bool operator()(T u, T v) const { return bool(u) || bool(v); }
};

// ================================================================ ternary

// cond ? a : b
struct Where : Functor<3, Types::All, Result::Same, /*select=*/true> {
  static constexpr const char* name = "where";
  template <class T> MU_HOST_DEVICE T operator()(bool c, T a, T b) const { return c ? a : b; }
};
// (g, a, b) -> g b a^(b-1): d/da a^b (0 where b == 0, as torch).
struct PowGradBase : Functor<3> {
  static constexpr const char* name = "pow_backward";
  template <class T> MU_HOST_DEVICE T operator()(T g, T a, T b) const { return b == 0 ? T(0) : g * b * m_pow(a, b - 1); }
};
// (g, a, y) -> g y log a: d/db a^b (0 where a == 0, as torch).
struct PowGradExponent : Functor<3> {
  static constexpr const char* name = "pow_backward";
  template <class T> MU_HOST_DEVICE T operator()(T g, T a, T y) const { return a == 0 ? T(0) : g * y * m_log(a); }
};
// (g, u, v) -> u's share of maximum(u, v)'s (minimum's) gradient: all of it where u
// wins, half on a tie.
struct ExtremumShare : Functor<3> {
  static constexpr const char* name = "extremum_backward";
  bool take_max;
  template <class T> MU_HOST_DEVICE T operator()(T g, T u, T v) const {
    if (u == v) return g / 2;
    return (take_max ? u > v : u < v) ? g : T(0);
  }
};

// Every functor, for the backends to register a map kernel for each.
template <class... F>
struct FunctorList {};
using AllFunctors =
    FunctorList<Neg, Exp, Log, Sqrt, Rsqrt, Abs, Sign, Tanh, Sigmoid, Square, Relu, Gelu, GeluTanh, PowScalar, Clamp,
                SqrtGrad, RsqrtGrad, AbsGrad, TanhGrad, SigmoidGrad, SquareGrad, ReluGrad, GeluGrad, GeluTanhGrad, PowScalarGrad,
                ClampGrad, Add, Sub, Mul, Div, DivRounded, AddScaled, Pow, Maximum, Minimum, EqualOrBothNaN, Eq, Ne, Lt, Le, Gt, Ge,
                LogicalNot, LogicalAnd, LogicalOr, Where, PowGradBase, PowGradExponent, ExtremumShare>;

}  // namespace mu::fn
