// SGD: one fused loop per parameter over its memory (see the formulas in sgd.h).
#include "optim/sgd.h"

#include <cmath>

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

namespace {

template <class T>
struct SGDScalars {
  T lr_neg;             // -lr
  T weight_decay;       // used only when has_decay
  T momentum;           // used only when has_momentum
  T one_minus_damp;     // 1 - dampening
  bool has_decay, has_momentum, nesterov;
  bool first;           // the buffer is created from this step's direction
};

template <class T>
void sgd_loop(T* p, const T* g, T* buf, int64_t n, SGDScalars<T> s) {
  // Captured by value: the compiler then knows the stores to p and buf cannot change the
  // scalars, keeps them in registers and moves the branches out of the loop.
  detail::parallel_chunks(n, [=](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      T d = g[i];
      // torch skips the add when wd == 0, which matters for -0 and non-finite parameters.
      if (s.has_decay) d = detail::fmadd(s.weight_decay, p[i], d);
      if (s.has_momentum) {
        // First update: the buffer is a copy of d (torch.clone(d_p)), not μ·0 + (1-damp)·d.
        T b = s.first ? d : detail::fmadd(s.one_minus_damp, d, buf[i] * s.momentum);
        buf[i] = b;
        d = s.nesterov ? detail::fmadd(s.momentum, b, d) : b;
      }
      p[i] = detail::fmadd(s.lr_neg, d, p[i]);
    }
  });
}

}  // namespace

void SGD::update(const ParamGroup& group, const Tensor& param, const Tensor& grad, ParamState& state) {
  detail::require_cpu(name(), param);
  const double lr = group.get_lr(), wd = group.get_weight_decay();
  const double momentum = group.option("momentum"), dampening = group.option("dampening");
  const bool nesterov = group.option("nesterov") != 0.0;
  const bool first = momentum != 0.0 && state.empty();
  // The buffer is dense in the parameter's dtype; its values are written by this update.
  if (first) state["momentum_buffer"] = empty(param.shape(), TensorOptions(param.dtype()).device(param.device()));

  detail::DenseParam dense(param);
  Tensor g = grad.contiguous();
  MU_DISPATCH_FLOAT(param.dtype(), "SGD", [&] {
    using T = scalar_t;
    SGDScalars<T> s{T(-lr), T(wd), T(momentum), T(1.0 - dampening), wd != 0.0, momentum != 0.0, nesterov, first};
    T* buf = momentum != 0.0 ? state["momentum_buffer"].data_ptr<T>() : nullptr;
    sgd_loop<T>(dense.work().data_ptr<T>(), g.data_ptr<T>(), buf, param.numel(), s);
  });
  dense.finish();
}

}  // namespace mu::optim
