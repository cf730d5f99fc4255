// SGD: one fused update over every parameter of a group (see the formulas in sgd.h).
#include "optim/sgd.h"

#include <cmath>
#include <map>
#include <tuple>

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

void SGD::update(const ParamGroup& group, const std::vector<ParamUpdate>& items) {
  const double lr = group.get_lr(), wd = group.get_weight_decay();
  const double momentum = group.option("momentum"), dampening = group.option("dampening");
  const bool nesterov = group.option("nesterov") != 0.0;
  // Parameters whose momentum buffer is made this step (their first gradient) and the
  // others differ in one scalar; each such set, per device and dtype, is one kernel call.
  std::map<std::tuple<bool, int, int, int>, std::vector<size_t>> buckets;
  for (size_t k = 0; k < items.size(); ++k) {
    const Tensor& param = items[k].param;
    ParamState& state = *items[k].state;
    const bool first = momentum != 0.0 && state.empty();
    // The buffer is dense in the parameter's dtype; its values are written by this update.
    if (first) state["momentum_buffer"] = empty(param.shape(), TensorOptions(param.dtype()).device(param.device()));
    const Device d = param.device();
    buckets[{first, int(d.type), d.index, int(param.dtype())}].push_back(k);
  }
  for (const auto& [key, members] : buckets) {
    kernels::SGDStep s{-lr, wd, momentum, 1.0 - dampening, wd != 0.0, momentum != 0.0, nesterov, std::get<0>(key)};
    std::vector<detail::DenseParam> dense;
    kernels::SGDTensors t;
    for (size_t k : members) {
      dense.emplace_back(items[k].param);
      t.params.push_back(dense.back().work());
      t.grads.push_back(items[k].grad.contiguous());
      if (momentum != 0.0) t.momentum_buffers.push_back((*items[k].state)["momentum_buffer"]);
    }
    kernels::sgd_update(items[members[0]].param.device(), t, s);
    for (const detail::DenseParam& d : dense) d.finish();
  }
}

}  // namespace mu::optim
