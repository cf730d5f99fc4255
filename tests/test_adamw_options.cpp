// AdamW's amsgrad and maximize options against a brute-force float64 loop written from
// torch.optim.AdamW's documented algorithm (PyTorch parity is in test_optim_parity). The
// optimiser runs on every test device, from parameters and gradients made on the CPU.
#include <cmath>

#include "helpers.h"

using namespace mu;

namespace {

// Steps of AdamW on float64 parameters, one element at a time, from the formulas.
std::vector<double> reference(std::vector<double> p, const std::vector<std::vector<double>>& grads, double lr,
                              double b1, double b2, double eps, double wd, bool amsgrad, bool maximize) {
  std::vector<double> m(p.size(), 0), v(p.size(), 0), vmax(p.size(), 0);
  for (size_t t = 1; t <= grads.size(); ++t) {
    for (size_t i = 0; i < p.size(); ++i) {
      double g = maximize ? -grads[t - 1][i] : grads[t - 1][i];
      p[i] *= 1 - lr * wd;
      m[i] = b1 * m[i] + (1 - b1) * g;
      v[i] = b2 * v[i] + (1 - b2) * g * g;
      vmax[i] = std::max(vmax[i], v[i]);
      double vhat = (amsgrad ? vmax[i] : v[i]) / (1 - std::pow(b2, double(t)));
      p[i] -= lr / (1 - std::pow(b1, double(t))) * m[i] / (std::sqrt(vhat) + eps);
    }
  }
  return p;
}

}  // namespace

TEST_CASE("AdamW amsgrad and maximize follow the algorithm step by step") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(3);
    const int steps = 6;
    Tensor init = randn({7}, kFloat64);
    // Gradients that shrink, so that v falls and amsgrad's running max matters.
    std::vector<std::vector<double>> grads;
    for (int s = 0; s < steps; ++s) grads.push_back((randn({7}, kFloat64) * (3.0 / (1 + 2 * s))).to_vector<double>());
    for (bool amsgrad : {false, true}) {
      for (bool maximize : {false, true}) {
        CAPTURE(amsgrad);
        CAPTURE(maximize);
        Tensor p = on(init.clone().requires_grad_(), dev);
        optim::AdamW opt({p}, optim::AdamWOptions(0.05).betas(0.9, 0.99).weight_decay(0.1).amsgrad(amsgrad).maximize(maximize));
        for (int s = 0; s < steps; ++s) {
          p.set_grad(on(from_vector(grads[size_t(s)], {7}), dev));
          opt.step();
        }
        std::vector<double> want = reference(init.to_vector<double>(), grads, 0.05, 0.9, 0.99, 1e-8, 0.1, amsgrad, maximize);
        check_close(p, want, 1e-12);
        CHECK(opt.state(0, 0).count("max_exp_avg_sq") == (amsgrad ? 1u : 0u));
      }
    }
  }
}

TEST_CASE("AdamW amsgrad differs from plain AdamW when the second moment falls") {
  // Guards the reference above: with shrinking gradients the two must disagree.
  std::vector<std::vector<double>> grads = {{4.0}, {0.1}, {0.1}};
  auto a = reference({1.0}, grads, 0.1, 0.9, 0.5, 1e-8, 0.0, false, false);
  auto b = reference({1.0}, grads, 0.1, 0.9, 0.5, 1e-8, 0.0, true, false);
  CHECK(std::abs(a[0] - b[0]) > 1e-3);
}

TEST_CASE("AdamW refuses a group that changes amsgrad, and a maximize that is not 0 or 1") {
  Tensor p = zeros({2}).requires_grad_(), q = zeros({2}).requires_grad_();
  std::vector<optim::ParamGroup> groups(2);
  groups[0].params = {p};
  groups[1].params = {q};
  groups[1].options["amsgrad"] = 1.0;
  CHECK_THROWS_MU(optim::AdamW(groups, optim::AdamWOptions()), "amsgrad is off for this optimizer");
  groups[1].options = {{"maximize", 2.0}};
  CHECK_THROWS_MU(optim::AdamW(groups, optim::AdamWOptions()), "maximize must be 0 or 1, got 2");
}
