// AdamW: one fused loop per parameter over its memory (see the formulas in adamw.h).
#include "optim/adamw.h"

#include <cmath>

#include "optim/dense_update.h"

namespace mu::optim {

AdamW::AdamW(std::vector<ParamGroup> groups, const AdamWOptions& opts)
    : Optimizer("AdamW", opts.lr(), opts.weight_decay(),
                {{"beta1", opts.beta1()}, {"beta2", opts.beta2()}, {"eps", opts.eps()}},
                {"step", "exp_avg", "exp_avg_sq"}) {
  init_groups(std::move(groups));
}

AdamW::AdamW(const std::vector<Tensor>& params, const AdamWOptions& opts)
    : AdamW(std::vector<ParamGroup>{ParamGroup{.params = params}}, opts) {}

void AdamW::check_group(const ParamGroup& group) const {
  double b1 = group.option("beta1"), b2 = group.option("beta2"), eps = group.option("eps");
  // Written as negated ranges so that NaN is refused as well.
  MU_CHECK(b1 >= 0.0 && b1 < 1.0, "AdamW: invalid beta1 ", b1, " (must be in [0, 1))");
  MU_CHECK(b2 >= 0.0 && b2 < 1.0, "AdamW: invalid beta2 ", b2, " (must be in [0, 1))");
  MU_CHECK(eps >= 0.0, "AdamW: invalid eps ", eps, " (must be >= 0)");
}

namespace {

// The per-step scalars, each rounded once to the parameter's dtype as torch does when
// it hands a Python float to an in-place op on a float tensor.
template <class T>
struct AdamWScalars {
  T decay;      // 1 - lr * wd
  T beta1, one_minus_beta1;
  T beta2, one_minus_beta2;
  T bc2_sqrt;   // sqrt(1 - beta2^t)
  T eps;
  T neg_step;   // -lr / (1 - beta1^t)
};

// The update of elements [begin, end). CMakeLists.txt builds this file with
// -ffp-contract=off, so that only the explicit fmadds fuse (p·decay + step must round
// twice, as torch's separate in-place ops do), and with -fno-math-errno: the loop
// vectorises only when std::sqrt need not set errno, and v is never negative.
template <class T>
void adamw_range(T* p, const T* g, T* m, T* v, int64_t begin, int64_t end, AdamWScalars<T> s) {
  for (int64_t i = begin; i < end; ++i) {
    // The same roundings as torch's chain of in-place ops: param.mul_(decay);
    // exp_avg.mul_(b1).add_(g, 1-b1) and exp_avg_sq.mul_(b2).addcmul_(g, g, 1-b2), whose
    // adds its CPU kernels fuse; denom = (exp_avg_sq.sqrt() / bc2_sqrt).add_(eps);
    // param.addcdiv_(exp_avg, denom, -step), i.e. (-step·m)/denom, then the add.
    T pi = p[i] * s.decay;
    T mi = detail::fmadd(s.one_minus_beta1, g[i], m[i] * s.beta1);
    T vi = detail::fmadd(s.one_minus_beta2 * g[i], g[i], v[i] * s.beta2);
    T denom = std::sqrt(vi) / s.bc2_sqrt + s.eps;
    p[i] = pi + (s.neg_step * mi) / denom;
    m[i] = mi;
    v[i] = vi;
  }
}

template <class T>
void adamw_loop(T* p, const T* g, T* m, T* v, int64_t n, const AdamWScalars<T>& s) {
  detail::parallel_chunks(n, [&](int64_t begin, int64_t end) { adamw_range<T>(p, g, m, v, begin, end, s); });
}

}  // namespace

void AdamW::update(const ParamGroup& group, const Tensor& param, const Tensor& grad, ParamState& state) {
  detail::require_cpu(name(), param);
  if (state.empty()) {
    // Buffers are dense in the parameter's dtype whatever the parameter's strides.
    TensorOptions like = TensorOptions(param.dtype()).device(param.device());
    state["step"] = scalar_tensor(0.0, kInt64);
    state["exp_avg"] = zeros(param.shape(), like);
    state["exp_avg_sq"] = zeros(param.shape(), like);
  }
  int64_t& step = *state["step"].data_ptr<int64_t>();
  step += 1;

  const double lr = group.get_lr(), wd = group.get_weight_decay();
  const double beta1 = group.option("beta1"), beta2 = group.option("beta2"), eps = group.option("eps");
  // Bias corrections in double from the integer step, as torch's Python code computes them.
  const double bias_correction1 = 1.0 - std::pow(beta1, double(step));
  const double bias_correction2 = 1.0 - std::pow(beta2, double(step));
  const double step_size = lr / bias_correction1;

  detail::DenseParam dense(param);
  Tensor g = grad.contiguous();
  MU_DISPATCH_FLOAT(param.dtype(), "AdamW", [&] {
    using T = scalar_t;
    AdamWScalars<T> s{T(1.0 - lr * wd),
                      T(beta1),
                      T(1.0 - beta1),
                      T(beta2),
                      T(1.0 - beta2),
                      T(std::sqrt(bias_correction2)),
                      T(eps),
                      T(-step_size)};
    adamw_loop<T>(dense.work().data_ptr<T>(), g.data_ptr<T>(), state["exp_avg"].data_ptr<T>(),
                  state["exp_avg_sq"].data_ptr<T>(), param.numel(), s);
  });
  dense.finish();
}

}  // namespace mu::optim
