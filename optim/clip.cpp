// Gradient norms and clipping: one reduction per device over all gradients, in double.
#include "optim/clip.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "autograd/grad_mode.h"
#include "ops/kernels/optim.h"

namespace mu::optim {

namespace {

std::vector<Tensor> defined_grads(const std::vector<Tensor>& params) {
  std::vector<Tensor> grads;
  for (const Tensor& p : params) {
    MU_CHECK(p.defined(), "clip_grad_norm: an undefined tensor was passed as a parameter");
    Tensor g = p.grad();
    if (g.defined()) grads.push_back(g);
  }
  return grads;
}

double total_norm(const std::vector<Tensor>& grads, double norm_type, const char* who) {
  // Negated test so that NaN is refused too.
  MU_CHECK(norm_type > 0.0, who, ": norm_type must be > 0 or INFINITY, got ", norm_type);
  const bool inf = std::isinf(norm_type);
  // One kernel call per device and dtype (one value read back from a GPU, not one per
  // gradient); the parts combine in the order of their first gradient.
  std::vector<std::pair<std::pair<Device, DType>, std::vector<Tensor>>> parts;
  for (const Tensor& g : grads) {
    MU_CHECK(g.is_floating_point(), who, ": gradient ", g.describe(), " is not floating-point");
    const std::pair<Device, DType> key{g.device(), g.dtype()};
    auto it = std::find_if(parts.begin(), parts.end(), [&](const auto& e) { return e.first == key; });
    if (it == parts.end()) it = parts.insert(parts.end(), {key, {}});
    it->second.push_back(g.contiguous());
  }
  double acc = 0.0;
  for (const auto& [key, list] : parts)
    acc = kernels::combine_norm_parts(acc, kernels::norm_power_sum(key.first, list, norm_type), inf);
  if (inf) return acc;
  return norm_type == 2.0 ? std::sqrt(acc) : norm_type == 1.0 ? acc : std::pow(acc, 1.0 / norm_type);
}

}  // namespace

double grad_norm(const std::vector<Tensor>& params, double norm_type) {
  return total_norm(defined_grads(params), norm_type, "grad_norm");
}

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm, double norm_type) {
  // Negated test so that NaN is refused too; a negative bound would flip the gradients.
  MU_CHECK(max_norm >= 0.0, "clip_grad_norm: max_norm must be >= 0, got ", max_norm);
  std::vector<Tensor> grads = defined_grads(params);
  if (grads.empty()) return 0.0;
  const double total = total_norm(grads, norm_type, "clip_grad_norm");
  const double coef = max_norm / (total + 1e-6);
  // torch multiplies by min(coef, 1); multiplying by 1 changes nothing, so only coef < 1
  // scales. A NaN coef (NaN total) fails `coef >= 1` and scales, spreading the NaN as torch does.
  if (!(coef >= 1.0)) {
    NoGradGuard no_grad;
    for (const Tensor& g : grads) {
      Tensor gm = g;  // mul_ is a method of a non-const handle; it writes the shared gradient
      gm.mul_(coef);
    }
  }
  return total;
}

}  // namespace mu::optim
