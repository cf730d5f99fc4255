// The CPU map kernel of every functor in ops/functors.h: one instantiation of the
// strided loop of ops/cpu/map.h per functor and scalar type, registered into the
// functor's table (ops/kernels/map.h). The CPU has no 16-bit float arithmetic: 16-bit
// float operands and outputs (autocast's bfloat16 activations) are widened to float32
// copies, computed in float32 and rounded once into the output.
#include "ops/cpu/map.h"

#include <type_traits>

#include "ops/cpu/vec_exp.h"
#include "ops/cpu/widen.h"
#include "ops/kernels/map.h"

namespace mu::cpu {

// float32 GELU and its derivative with the vectorisable erf and exp of ops/cpu/vec_exp.h
// (2.4 and 1 ulp): the formulas of fn::Gelu and fn::GeluGrad, whose libm erff keeps the
// loop scalar (several times slower; GELU was a third of an MLP-Mixer step).
struct GeluFloat {
  [[gnu::always_inline]] float operator()(float v) const { return v * (0.5f * (1.0f + erf_vec(v * float(fn::kSqrt1_2)))); }
};
struct GeluGradFloat {
  [[gnu::always_inline]] float operator()(float g, float x) const {
    float gauss;  // exp(-(x/√2)²) = exp(-x²/2), from inside the erf: one exp, not two
    const float cdf = 0.5f * (1.0f + erf_vec(x * float(fn::kSqrt1_2), gauss));
    const float pdf = gauss * float(fn::kInvSqrt2Pi);
    return g * (cdf + x * pdf);
  }
};

// The tanh form likewise, through 0.5 (1 + tanh(u)) = sigmoid(2u) with the vectorisable
// exp (libm's tanhf keeps the loop scalar): x / (1 + exp(-2u)), u = k (x + c x³), which
// has no cancellation at either end; its derivative s + 2 x s (1 - s) k (1 + 3 c x²).
struct GeluTanhFloat {
  [[gnu::always_inline]] float operator()(float x) const {
    const float u = float(fn::kGeluK) * (x + float(fn::kGeluC) * x * x * x);
    return x / (1.0f + exp_vec(-2.0f * u));
  }
};
struct GeluTanhGradFloat {
  [[gnu::always_inline]] float operator()(float g, float x) const {
    const float u = float(fn::kGeluK) * (x + float(fn::kGeluC) * x * x * x);
    const float s = 1.0f / (1.0f + exp_vec(-2.0f * u));
    return g * (s + 2.0f * x * s * (1.0f - s) * float(fn::kGeluK) * (1.0f + float(3 * fn::kGeluC) * x * x));
  }
};

template <class F>
static void map_kernel(const Tensor& out, const std::array<Tensor, 3>& in_given, const F& f) {
  std::array<Tensor, 3> in = in_given;
  for (int k = 0; k < F::arity; ++k)
    if (!is_compute_dtype(in[size_t(k)].dtype())) in[size_t(k)] = widened(in[size_t(k)]);
  if (!is_compute_dtype(out.dtype())) {
    Tensor wide = wide_like(out);
    map_kernel(wide, in, f);
    narrow_into(out, wide);
    return;
  }
  // The scalar type comes from the first value operand (after where's condition).
  const Tensor& typed = in[F::select ? 1 : 0];
  if constexpr (std::is_same_v<F, fn::Gelu>) {
    if (typed.dtype() == kFloat32) return map_n<float, float>(out, {in[0]}, GeluFloat{});
  } else if constexpr (std::is_same_v<F, fn::GeluGrad>) {
    if (typed.dtype() == kFloat32) return map_n<float, float, float>(out, {in[0], in[1]}, GeluGradFloat{});
  } else if constexpr (std::is_same_v<F, fn::GeluTanh>) {
    if (typed.dtype() == kFloat32) return map_n<float, float>(out, {in[0]}, GeluTanhFloat{});
  } else if constexpr (std::is_same_v<F, fn::GeluTanhGrad>) {
    if (typed.dtype() == kFloat32) return map_n<float, float, float>(out, {in[0], in[1]}, GeluTanhGradFloat{});
  }
  kernels::dispatch_functor<F>(typed.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using TO = std::conditional_t<F::result == fn::Result::Bool, bool, T>;
    if constexpr (F::arity == 1) {
      map_n<TO, T>(out, {in[0]}, f);
    } else if constexpr (F::arity == 2) {
      map_n<TO, T, T>(out, {in[0], in[1]}, f);
    } else if constexpr (F::select) {
      map_n<TO, bool, T, T>(out, {in[0], in[1], in[2]}, f);
    } else {
      map_n<TO, T, T, T>(out, {in[0], in[1], in[2]}, f);
    }
  });
}

template <class... F>
static bool register_map_kernels(fn::FunctorList<F...>) {
  (kernels::map<F>().set(DeviceType::CPU, &map_kernel<F>), ...);
  return true;
}

[[maybe_unused]] static const bool registered = register_map_kernels(fn::AllFunctors{});

}  // namespace mu::cpu
