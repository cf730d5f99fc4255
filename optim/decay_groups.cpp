// decay_groups: the nanoGPT weight-decay split (see decay_groups.h).
#include "optim/decay_groups.h"

#include <unordered_set>

namespace mu::optim {

// Whether `name` is `prefix` itself or lies inside the module named `prefix`.
static bool under(const std::string& name, const std::string& prefix) {
  if (name == prefix) return true;
  return name.size() > prefix.size() && name.compare(0, prefix.size(), prefix) == 0 && name[prefix.size()] == '.';
}

std::vector<ParamGroup> decay_groups(const nn::Module& module, double weight_decay,
                                     const std::vector<std::string>& no_decay) {
  MU_CHECK(weight_decay >= 0.0, "decay_groups: invalid weight_decay ", weight_decay, " (must be >= 0)");
  nn::StateDict named = module.named_parameters();
  for (const std::string& prefix : no_decay) {
    bool found = false;
    for (const auto& [name, p] : named) found = found || under(name, prefix);
    // A misspelt name would silently leave the embeddings decayed.
    MU_CHECK(found, "decay_groups: no parameter is named \"", prefix, "\" or lies under it");
  }

  ParamGroup decay{.weight_decay = weight_decay};
  ParamGroup keep{.weight_decay = 0.0};
  std::unordered_set<const TensorImpl*> seen;
  for (const auto& [name, p] : named) {
    if (!p.requires_grad()) continue;
    if (!seen.insert(p.impl()).second) continue;  // a tied weight: its first name placed it already
    bool excluded = false;
    for (const std::string& prefix : no_decay) excluded = excluded || under(name, prefix);
    (p.dim() >= 2 && !excluded ? decay : keep).params.push_back(p);
  }
  return {decay, keep};
}

}  // namespace mu::optim
