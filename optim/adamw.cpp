// AdamW: one fused loop per parameter over its memory (see the formulas in adamw.h).
#include "optim/adamw.h"

#include <cmath>

#include "ops/kernels/optim.h"
#include "optim/dense_update.h"

namespace mu::optim {

AdamW::AdamW(std::vector<ParamGroup> groups, const AdamWOptions& opts)
    : Optimizer("AdamW", opts.lr(), opts.weight_decay(),
                {{"beta1", opts.beta1()},
                 {"beta2", opts.beta2()},
                 {"eps", opts.eps()},
                 {"amsgrad", opts.amsgrad() ? 1.0 : 0.0},
                 {"maximize", opts.maximize() ? 1.0 : 0.0}},
                opts.amsgrad() ? std::vector<std::string>{"step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"}
                               : std::vector<std::string>{"step", "exp_avg", "exp_avg_sq"}),
      amsgrad_(opts.amsgrad()) {
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
  double ams = group.option("amsgrad"), max = group.option("maximize");
  MU_CHECK(max == 0.0 || max == 1.0, "AdamW: maximize must be 0 or 1, got ", max);
  MU_CHECK(ams == (amsgrad_ ? 1.0 : 0.0), "AdamW: amsgrad is ", amsgrad_ ? "on" : "off",
           " for this optimizer (AdamWOptions::amsgrad) and a group may not change it, got amsgrad = ", ams);
}

void AdamW::update(const ParamGroup& group, const Tensor& param, const Tensor& grad, ParamState& state) {
  if (state.empty()) {
    // Buffers are dense in the parameter's dtype whatever the parameter's strides.
    TensorOptions like = TensorOptions(param.dtype()).device(param.device());
    state["step"] = scalar_tensor(0.0, kInt64);
    state["exp_avg"] = zeros(param.shape(), like);
    state["exp_avg_sq"] = zeros(param.shape(), like);
    if (amsgrad_) state["max_exp_avg_sq"] = zeros(param.shape(), like);
  }
  // The step count lives on the host, whatever the parameter's device.
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
  kernels::AdamWStep s{1.0 - lr * wd,
                       beta1,
                       1.0 - beta1,
                       beta2,
                       1.0 - beta2,
                       std::sqrt(bias_correction2),
                       eps,
                       -step_size,
                       amsgrad_,
                       group.option("maximize") != 0.0};
  kernels::adamw_update(param.device(), dense.work(), g, state["exp_avg"], state["exp_avg_sq"],
                        amsgrad_ ? state["max_exp_avg_sq"] : Tensor(), s);
  dense.finish();
}

}  // namespace mu::optim
