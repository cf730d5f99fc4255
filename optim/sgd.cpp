// SGD: one fused loop per parameter over its memory (see the formulas in sgd.h).
#include "optim/sgd.h"

#include <cmath>

#include "ops/kernels/optim.h"
#include "optim/dense_update.h"

namespace mu::optim {

SGD::SGD(std::vector<ParamGroup> groups, const SGDOptions& opts)
    : Optimizer("SGD", opts.lr(), opts.weight_decay(),
                {{"momentum", opts.momentum()}, {"dampening", opts.dampening()}, {"nesterov", opts.nesterov() ? 1.0 : 0.0}},
                {"momentum_buffer"}) {
  init_groups(std::move(groups));
}

SGD::SGD(const std::vector<Tensor>& params, const SGDOptions& opts)
    : SGD(std::vector<ParamGroup>{ParamGroup{.params = params}}, opts) {}

void SGD::check_group(const ParamGroup& group) const {
  double mom = group.option("momentum"), damp = group.option("dampening"), nest = group.option("nesterov");
  // Written as negated ranges so that NaN is refused as well.
  MU_CHECK(mom >= 0.0, "SGD: invalid momentum ", mom, " (must be >= 0)");
  MU_CHECK(!std::isnan(damp), "SGD: invalid dampening ", damp);
  MU_CHECK(nest == 0.0 || nest == 1.0, "SGD: nesterov must be 0 or 1, got ", nest);
  // Nesterov's look-ahead needs an undamped momentum buffer (as torch requires).
  MU_CHECK(nest == 0.0 || (mom > 0.0 && damp == 0.0), "SGD: Nesterov momentum requires momentum > 0 and "
           "dampening 0, got momentum ", mom, " and dampening ", damp);
}

void SGD::update(const ParamGroup& group, const Tensor& param, const Tensor& grad, ParamState& state) {
  const double lr = group.get_lr(), wd = group.get_weight_decay();
  const double momentum = group.option("momentum"), dampening = group.option("dampening");
  const bool nesterov = group.option("nesterov") != 0.0;
  const bool first = momentum != 0.0 && state.empty();
  // The buffer is dense in the parameter's dtype; its values are written by this update.
  if (first) state["momentum_buffer"] = empty(param.shape(), TensorOptions(param.dtype()).device(param.device()));

  detail::DenseParam dense(param);
  Tensor g = grad.contiguous();
  kernels::SGDStep s{-lr, wd, momentum, 1.0 - dampening, wd != 0.0, momentum != 0.0, nesterov, first};
  kernels::sgd_update(param.device(), dense.work(), g, momentum != 0.0 ? state["momentum_buffer"] : Tensor(), s);
  dense.finish();
}

}  // namespace mu::optim
