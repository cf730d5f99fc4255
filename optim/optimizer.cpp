// Optimizer base: group bookkeeping, the step loop, and state dicts.
#include "optim/optimizer.h"

#include <cmath>
#include <set>
#include <unordered_map>

#include "autograd/grad_mode.h"

namespace mu::optim {

// ---------------------------------------------------------------- ParamGroup

double ParamGroup::get_lr() const {
  MU_CHECK(lr.has_value(), "ParamGroup: lr is unset (it is filled in when the group is added to an optimizer)");
  return *lr;
}

double ParamGroup::get_weight_decay() const {
  MU_CHECK(weight_decay.has_value(),
           "ParamGroup: weight_decay is unset (it is filled in when the group is added to an optimizer)");
  return *weight_decay;
}

double ParamGroup::option(const std::string& name) const {
  auto it = options.find(name);
  if (it != options.end()) return it->second;
  std::string known;
  for (const auto& [k, v] : options) known += (known.empty() ? "" : ", ") + k;
  MU_FAIL("ParamGroup: no option \"", name, "\" (this group has: ", known.empty() ? "none" : known, ")");
}

// ---------------------------------------------------------------- construction

Optimizer::Optimizer(std::string name, double lr, double weight_decay, std::map<std::string, double> defaults,
                     std::vector<std::string> buffers)
    : name_(std::move(name)),
      default_lr_(lr),
      default_weight_decay_(weight_decay),
      defaults_(std::move(defaults)),
      buffers_(std::move(buffers)) {}

void Optimizer::init_groups(std::vector<ParamGroup> groups) {
  for (ParamGroup& g : groups) add_param_group(std::move(g));
  size_t total = 0;
  for (const ParamGroup& g : groups_) total += g.params.size();
  MU_CHECK(total > 0, name_, ": got an empty parameter list");
}

void Optimizer::add_param_group(ParamGroup group) {
  const size_t gi = groups_.size();
  if (!group.lr) group.lr = default_lr_;
  if (!group.weight_decay) group.weight_decay = default_weight_decay_;
  for (const auto& [k, v] : group.options) {
    if (defaults_.count(k)) continue;
    std::string known;
    for (const auto& [dk, dv] : defaults_) known += (known.empty() ? "" : ", ") + dk;
    MU_FAIL(name_, ": unknown option \"", k, "\" in parameter group ", gi, " (", name_, " options: ", known, ")");
  }
  // insert() keeps the group's own values and adds the defaults it did not name.
  group.options.insert(defaults_.begin(), defaults_.end());
  // NaN fails both comparisons, so it is refused too.
  MU_CHECK(*group.lr >= 0.0, name_, ": invalid learning rate ", *group.lr, " in parameter group ", gi);
  MU_CHECK(*group.weight_decay >= 0.0, name_, ": invalid weight_decay ", *group.weight_decay, " in parameter group ",
           gi);
  check_group(group);

  for (size_t i = 0; i < group.params.size(); ++i) {
    const Tensor& p = group.params[i];
    MU_CHECK(p.defined(), name_, ": parameter ", i, " of group ", gi, " is an undefined tensor");
    MU_CHECK(p.is_floating_point(), name_, ": parameter ", i, " of group ", gi, " is ", p.describe(),
             "; only floating-point tensors can be optimised");
    MU_CHECK(p.is_leaf(), name_, ": parameter ", i, " of group ", gi, " (", p.describe(),
             ") is not a leaf tensor; optimise the leaves it was computed from");
    // The same tensor twice would be updated twice per step.
    for (size_t g = 0; g <= gi; ++g) {
      const auto& ps = g < gi ? groups_[g].params : group.params;
      size_t end = g < gi ? ps.size() : i;
      for (size_t j = 0; j < end; ++j)
        MU_CHECK(!ps[j].is_same(p), name_, ": parameter ", i, " of group ", gi,
                 " also appears as parameter ", j, " of group ", g, "; each parameter may appear once");
    }
  }
  group.initial_lr = *group.lr;
  state_.emplace_back(group.params.size());
  groups_.push_back(std::move(group));
}

const ParamState& Optimizer::state(size_t group, size_t index) const {
  MU_CHECK(group < groups_.size(), name_, "::state: group ", group, " out of range (", groups_.size(), " groups)");
  MU_CHECK(index < state_[group].size(), name_, "::state: parameter ", index, " out of range (group ", group,
           " has ", state_[group].size(), ")");
  return state_[group][index];
}

// ---------------------------------------------------------------- step

void Optimizer::step() {
  NoGradGuard no_grad;
  // Every group is checked before any is updated: a refused step leaves the parameters,
  // the step counts and the moments as they were, not some groups stepped.
  std::vector<std::vector<ParamUpdate>> per_group(groups_.size());
  for (size_t g = 0; g < groups_.size(); ++g) {
    const ParamGroup& group = groups_[g];
    std::vector<ParamUpdate>& items = per_group[g];
    for (size_t i = 0; i < group.params.size(); ++i) {
      const Tensor& p = group.params[i];
      Tensor grad = p.grad();
      if (!grad.defined()) continue;  // as torch: no gradient, no update, no state change
      MU_CHECK(grad.shape() == p.shape() && grad.dtype() == p.dtype() && grad.device() == p.device(), name_,
               ": parameter ", i, " of group ", g, " is ", p.describe(), " but its gradient is ", grad.describe());
      // An expanded parameter (stride 0) cannot be written element by element.
      check_distinct_elements(p, name_.c_str());
      for (const auto& [b, t] : state_[g][i]) {
        if (b == "step") continue;  // the host-side counter, not a per-element buffer
        MU_CHECK(t.shape() == p.shape() && t.dtype() == p.dtype() && t.device() == p.device(), name_, ": state \"",
                 b, "\" of parameter ", i, " of group ", g, " is ", t.describe(), " but the parameter is ",
                 p.describe(), "; was the parameter converted or moved after the optimizer stepped?");
      }
      items.push_back({p, grad, &state_[g][i]});
    }
  }
  for (size_t g = 0; g < groups_.size(); ++g)
    if (!per_group[g].empty()) update(groups_[g], per_group[g]);
}

void Optimizer::zero_grad() {
  for (const ParamGroup& g : groups_)
    for (const Tensor& p : g.params) p.zero_grad();
}

// ---------------------------------------------------------------- state dicts

static Tensor scalar_f64(double v) { return scalar_tensor(v, kFloat64); }
static Tensor scalar_i64(int64_t v) { return scalar_tensor(double(v), kInt64); }

static std::string group_key(size_t g, const std::string& field) {
  return "group." + std::to_string(g) + "." + field;
}
static std::string state_key(size_t g, size_t i, const std::string& buffer) {
  return "state." + std::to_string(g) + "." + std::to_string(i) + "." + buffer;
}

nn::StateDict Optimizer::state_dict() const {
  nn::StateDict sd;
  for (size_t g = 0; g < groups_.size(); ++g) {
    const ParamGroup& group = groups_[g];
    sd.emplace_back(group_key(g, "num_params"), scalar_i64(int64_t(group.params.size())));
    sd.emplace_back(group_key(g, "lr"), scalar_f64(*group.lr));
    sd.emplace_back(group_key(g, "initial_lr"), scalar_f64(group.initial_lr));
    sd.emplace_back(group_key(g, "weight_decay"), scalar_f64(*group.weight_decay));
    for (const auto& [k, v] : group.options) sd.emplace_back(group_key(g, k), scalar_f64(v));
  }
  for (size_t g = 0; g < groups_.size(); ++g)
    for (size_t i = 0; i < state_[g].size(); ++i)
      for (const auto& [b, t] : state_[g][i]) sd.emplace_back(state_key(g, i, b), t);
  return sd;
}

// The single value of a scalar entry, refusing anything that is not one number.
static double scalar_value(const std::string& opt, const std::string& key, const Tensor& t) {
  MU_CHECK(t.defined() && t.numel() == 1, opt, "::load_state_dict: entry \"", key,
           "\" must hold one number, got ", t.defined() ? t.describe() : std::string("an undefined tensor"));
  // Every scalar of the state (counts, rates, options) is finite; inf or NaN is damage.
  const double v = t.item();
  MU_CHECK(std::isfinite(v), opt, "::load_state_dict: entry \"", key, "\" holds ", v, ", not a finite number");
  return v;
}

void Optimizer::load_state_dict(const nn::StateDict& sd) {
  NoGradGuard no_grad;
  const std::string who = name_ + "::load_state_dict";
  std::unordered_map<std::string, const Tensor*> index;
  for (const auto& [k, t] : sd) {
    MU_CHECK(index.emplace(k, &t).second, who, ": entry \"", k, "\" appears twice");
  }
  std::set<std::string> used;
  auto take = [&](const std::string& key) -> const Tensor* {
    auto it = index.find(key);
    if (it == index.end()) return nullptr;
    used.insert(key);
    return it->second;
  };
  auto need = [&](const std::string& key) -> const Tensor& {
    const Tensor* t = take(key);
    MU_CHECK(t != nullptr, who, ": missing entry \"", key, "\" (", name_, " with ", groups_.size(),
             " parameter group", groups_.size() == 1 ? "" : "s", ")");
    return *t;
  };

  // Everything is checked into these copies first, so a refused dict changes nothing.
  std::vector<ParamGroup> groups = groups_;
  std::vector<std::vector<ParamState>> state(groups_.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    ParamGroup& group = groups[g];
    const std::string np_key = group_key(g, "num_params");
    double np = scalar_value(who, np_key, need(np_key));
    MU_CHECK(np == double(group.params.size()), who, ": entry \"", np_key, "\" says ", np,
             " parameters, but group ", g, " of this optimizer has ", group.params.size());
    group.lr = scalar_value(who, group_key(g, "lr"), need(group_key(g, "lr")));
    group.initial_lr = scalar_value(who, group_key(g, "initial_lr"), need(group_key(g, "initial_lr")));
    group.weight_decay = scalar_value(who, group_key(g, "weight_decay"), need(group_key(g, "weight_decay")));
    for (auto& [k, v] : group.options) v = scalar_value(who, group_key(g, k), need(group_key(g, k)));
    MU_CHECK(*group.lr >= 0.0 && *group.weight_decay >= 0.0 && group.initial_lr >= 0.0, who, ": group ", g,
             " has lr ", *group.lr, ", initial_lr ", group.initial_lr, " and weight_decay ", *group.weight_decay,
             "; all must be >= 0");
    check_group(group);

    state[g].resize(group.params.size());
    for (size_t i = 0; i < group.params.size(); ++i) {
      const Tensor& p = group.params[i];
      // A parameter's buffers are all present (it has been updated) or all absent.
      size_t present = 0;
      std::string first_present, first_missing;
      for (const std::string& b : buffers_) {
        if (index.count(state_key(g, i, b))) {
          ++present;
          if (first_present.empty()) first_present = state_key(g, i, b);
        } else if (first_missing.empty()) {
          first_missing = state_key(g, i, b);
        }
      }
      if (present == 0) continue;
      MU_CHECK(present == buffers_.size(), who, ": entry \"", first_present, "\" is present but \"", first_missing,
               "\" is missing");
      for (const std::string& b : buffers_) {
        const std::string key = state_key(g, i, b);
        const Tensor& src = need(key);
        MU_CHECK(src.defined(), who, ": entry \"", key, "\" is an undefined tensor");
        if (b == "step") {
          // Step counters are whole numbers; float tensors holding one are accepted.
          double s = scalar_value(who, key, src);
          // At most 2^53: every whole number up to there is exact in the double it was read as.
          MU_CHECK(s >= 0 && s == std::floor(s) && s <= 9007199254740992.0, who, ": entry \"", key, "\" holds ", s,
                   "; a step count must be a whole number in [0, 2^53]");
          state[g][i][b] = scalar_i64(int64_t(s));
          continue;
        }
        MU_CHECK(src.shape() == p.shape(), who, ": entry \"", key, "\" has shape ", shape_str(src.shape()),
                 ", but parameter ", i, " of group ", g, " has shape ", shape_str(p.shape()));
        MU_CHECK(src.is_floating_point(), who, ": entry \"", key, "\" is ", src.describe(),
                 "; optimizer buffers are floating-point");
        // A private dense buffer in the parameter's dtype and on its device, so the fused
        // update loops can walk it as one array and later steps never write into `sd`.
        Tensor buf = src.detach().to(p.dtype()).contiguous();
        if (buf.storage() == src.storage()) buf = buf.clone();
        state[g][i][b] = buf.to(p.device());
      }
    }
  }
  for (const auto& [k, t] : sd) {
    if (used.count(k)) continue;
    // Describe this optimizer's structure so the reader sees why the entry does not fit.
    std::string sizes, names;
    for (const ParamGroup& g : groups_) sizes += (sizes.empty() ? "" : "/") + std::to_string(g.params.size());
    for (const std::string& b : buffers_) names += (names.empty() ? "" : ", ") + b;
    MU_FAIL(who, ": unexpected entry \"", k, "\" (", name_, " has ", groups_.size(), " parameter group",
            groups_.size() == 1 ? "" : "s", " with ", sizes, " parameters and per-parameter buffers ", names, ")");
  }
  groups_ = std::move(groups);
  state_ = std::move(state);
}

}  // namespace mu::optim
