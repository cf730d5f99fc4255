// AdamW: one fused loop per parameter over its memory (see the formulas in adamw.h).
#include "optim/adamw.h"

#include <cmath>
#include <map>
#include <tuple>

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

void AdamW::update(const ParamGroup& group, const std::vector<ParamUpdate>& items) {
  const double lr = group.get_lr(), wd = group.get_weight_decay();
  const double beta1 = group.option("beta1"), beta2 = group.option("beta2"), eps = group.option("eps");
  const bool maximize = group.option("maximize") != 0.0;
  // Parameters that share a step count, a device and a dtype share the step's scalars and
  // take it in one kernel call (one launch on CUDA). Usually that is the whole group.
  std::map<std::tuple<int64_t, int, int, int>, std::vector<size_t>> buckets;
  for (size_t k = 0; k < items.size(); ++k) {
    const Tensor& param = items[k].param;
    ParamState& state = *items[k].state;
    if (state.empty()) {
      // Buffers are dense in the parameter's dtype whatever the parameter's strides.
      TensorOptions like = TensorOptions(param.dtype()).device(param.device());
      state["step"] = scalar_tensor(0.0, kInt64);
      state["exp_avg"] = zeros(param.shape(), like);
      state["exp_avg_sq"] = zeros(param.shape(), like);
      if (amsgrad_) state["max_exp_avg_sq"] = zeros(param.shape(), like);
    }
    // The step count lives on the host, whatever the parameter's device.
    const int64_t step = ++*state["step"].data_ptr<int64_t>();
    const Device d = param.device();
    buckets[{step, int(d.type), d.index, int(param.dtype())}].push_back(k);
  }
  for (const auto& [key, members] : buckets) {
    const int64_t step = std::get<0>(key);
    // Bias corrections in double from the integer step, as torch's Python code computes them.
    const double bias_correction1 = 1.0 - std::pow(beta1, double(step));
    const double bias_correction2 = 1.0 - std::pow(beta2, double(step));
    const double step_size = lr / bias_correction1;
    kernels::AdamWStep s{1.0 - lr * wd, beta1, 1.0 - beta1, beta2, 1.0 - beta2, std::sqrt(bias_correction2),
                         eps, -step_size, amsgrad_, maximize};
    std::vector<detail::DenseParam> dense;
    kernels::AdamWTensors t;
    for (size_t k : members) {
      ParamState& state = *items[k].state;
      dense.emplace_back(items[k].param);
      t.params.push_back(dense.back().work());
      t.grads.push_back(items[k].grad.contiguous());
      t.exp_avgs.push_back(state["exp_avg"]);
      t.exp_avg_sqs.push_back(state["exp_avg_sq"]);
      if (amsgrad_) t.max_exp_avg_sqs.push_back(state["max_exp_avg_sq"]);
    }
    kernels::adamw_update(items[members[0]].param.device(), t, s);
    for (const detail::DenseParam& d : dense) d.finish();
  }
}

}  // namespace mu::optim
