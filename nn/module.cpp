#include "nn/module.h"

#include <set>

#include "autograd/grad_mode.h"

namespace mu::nn {

Tensor find(const StateDict& sd, const std::string& name) {
  for (const auto& [n, t] : sd)
    if (n == name) return t;
  return Tensor();
}

void Module::check_new_name(const std::string& name) const {
  MU_CHECK(!name.empty() && name.find('.') == std::string::npos, type_name_, ": invalid name \"", name,
           "\" (names are non-empty and contain no '.')");
  bool taken = find(params_, name).defined() || find(buffers_, name).defined();
  for (const auto& [n, m] : children_) taken = taken || n == name;
  MU_CHECK(!taken, type_name_, ": the name \"", name, "\" is already registered");
}

Tensor Module::register_parameter(const std::string& name, Tensor t, bool requires_grad) {
  check_new_name(name);
  MU_CHECK(t.defined(), type_name_, ": parameter \"", name, "\" is an undefined tensor");
  // A parameter is a leaf of its own, whatever graph produced its initial value.
  if (!t.is_leaf()) t = t.detach();
  if (t.is_floating_point()) t.requires_grad_(requires_grad);
  params_.emplace_back(name, t);
  return t;
}

Tensor Module::register_buffer(const std::string& name, Tensor t) {
  check_new_name(name);
  MU_CHECK(t.defined(), type_name_, ": buffer \"", name, "\" is an undefined tensor");
  buffers_.emplace_back(name, t.detach());
  return buffers_.back().second;
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> m) {
  check_new_name(name);
  MU_CHECK(m != nullptr, type_name_, ": child module \"", name, "\" is null");
  // A module inside itself would make every walk of the tree (parameters, state_dict,
  // train, apply) endless.
  MU_CHECK(!m->holds(this), type_name_, ": child module \"", name, "\" (", m->type_name(), ") ",
           m.get() == this ? "is this module itself" : "already holds this module", ": modules must form a tree, not a cycle");
  children_.emplace_back(name, std::move(m));
}

bool Module::holds(const Module* m) const {
  if (m == this) return true;
  for (const auto& [n, c] : children_)
    if (c->holds(m)) return true;
  return false;
}

void Module::collect(const std::string& prefix, bool params, bool bufs, bool recurse, StateDict& out) const {
  if (params)
    for (const auto& [n, t] : params_) out.emplace_back(prefix + n, t);
  if (bufs)
    for (const auto& [n, t] : buffers_) out.emplace_back(prefix + n, t);
  if (recurse)
    for (const auto& [n, m] : children_) m->collect(prefix + n + ".", params, bufs, true, out);
}

// Keeps the first entry of each tensor: a tensor registered twice (tied weights, a shared
// child) must reach an optimizer, and the parameter count, once.
static StateDict unique_tensors(const StateDict& sd) {
  StateDict out;
  std::set<const TensorImpl*> seen;
  for (const auto& [n, t] : sd)
    if (seen.insert(t.impl()).second) out.emplace_back(n, t);
  return out;
}

StateDict Module::named_parameters(bool recurse) const {
  StateDict out;
  collect("", true, false, recurse, out);
  return unique_tensors(out);
}

StateDict Module::named_buffers(bool recurse) const {
  StateDict out;
  collect("", false, true, recurse, out);
  return unique_tensors(out);
}

std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [n, t] : named_parameters(recurse)) out.push_back(t);
  return out;
}

std::vector<Tensor> Module::buffers(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [n, t] : named_buffers(recurse)) out.push_back(t);
  return out;
}

std::vector<std::shared_ptr<Module>> Module::children() const {
  std::vector<std::shared_ptr<Module>> out;
  for (const auto& [n, m] : children_) out.push_back(m);
  return out;
}

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::named_children() const { return children_; }

void Module::collect_modules(std::vector<Module*>& out, std::set<const Module*>& seen) {
  // A child registered in two places is visited once, so to() converts it once.
  if (!seen.insert(this).second) return;
  out.push_back(this);
  for (const auto& [n, m] : children_) m->collect_modules(out, seen);
}

std::vector<Module*> Module::modules() {
  std::vector<Module*> out;
  std::set<const Module*> seen;
  collect_modules(out, seen);
  return out;
}

void Module::train(bool on) {
  training_ = on;
  for (const auto& [n, m] : children_) m->train(on);
}

// Tensors already in place are skipped: set_data would drop their gradients for nothing.
void Module::to(Device device) {
  NoGradGuard g;
  for (Module* m : modules()) {
    for (auto& [n, t] : m->params_)
      if (t.device() != device) t.set_data(t.to(device));
    for (auto& [n, t] : m->buffers_)
      if (t.device() != device) t.set_data(t.to(device));
  }
}

void Module::to(DType dtype) {
  MU_CHECK(is_floating(dtype), type_name_, ".to: modules move to floating-point dtypes only, not ", dtype_name(dtype));
  NoGradGuard g;
  for (Module* m : modules()) {
    for (auto& [n, t] : m->params_)
      if (t.is_floating_point() && t.dtype() != dtype) t.set_data(t.to(dtype));
    for (auto& [n, t] : m->buffers_)
      if (t.is_floating_point() && t.dtype() != dtype) t.set_data(t.to(dtype));
  }
}

void Module::zero_grad() {
  for (Tensor& p : parameters()) p.zero_grad();
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (const Tensor& p : parameters()) n += p.numel();
  return n;
}

StateDict Module::state_dict() const {
  StateDict out;
  collect("", true, true, true, out);
  return out;
}

void Module::load_state_dict(const StateDict& sd, bool strict) {
  StateDict mine = state_dict();
  std::set<std::string> given, expected;
  for (const auto& [n, t] : sd) {
    MU_CHECK(t.defined(), type_name_, ".load_state_dict: entry \"", n, "\" is an undefined tensor");
    given.insert(n);
  }
  for (const auto& [n, t] : mine) expected.insert(n);
  std::string missing, unexpected;
  for (const auto& n : expected)
    if (!given.count(n)) missing += (missing.empty() ? "" : ", ") + n;
  for (const auto& n : given)
    if (!expected.count(n)) unexpected += (unexpected.empty() ? "" : ", ") + n;
  if (strict)
    MU_CHECK(missing.empty() && unexpected.empty(), type_name_, ".load_state_dict: ",
             missing.empty() ? "" : "missing entries: " + missing, !missing.empty() && !unexpected.empty() ? "; " : "",
             unexpected.empty() ? "" : "unexpected entries: " + unexpected);
  // Check every shape before writing anything, so a refused load changes nothing.
  for (const auto& [n, t] : mine) {
    Tensor src = find(sd, n);
    if (!src.defined()) continue;
    MU_CHECK(src.shape() == t.shape(), type_name_, ".load_state_dict: entry \"", n, "\" has shape ",
             shape_str(src.shape()), " but the module's tensor has shape ", shape_str(t.shape()));
  }
  NoGradGuard g;
  for (auto& [n, t] : mine) {
    Tensor src = find(sd, n);
    if (src.defined()) t.copy_(src.to(t.device()));
  }
}

static std::string with_commas(int64_t n) {
  std::string s = std::to_string(n), out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i && (s.size() - i) % 3 == 0) out += ',';
    out += s[i];
  }
  return out;
}

void Module::print(std::string& out, const std::string& name, int indent) const {
  int64_t own = 0;
  for (const auto& [n, t] : params_) own += t.numel();
  int64_t total = num_parameters();
  out += std::string(size_t(indent) * 2, ' ') + (name.empty() ? "" : "(" + name + "): ") + type_name_;
  std::string extra = extra_repr();
  if (!extra.empty()) out += "(" + extra + ")";
  out += "  [" + with_commas(total) + " params";
  if (!children_.empty() && own > 0) out += ", " + with_commas(own) + " own";
  out += "]\n";
  for (const auto& [n, m] : children_) m->print(out, n, indent + 1);
}

std::string Module::str() const {
  std::string out;
  print(out, "", 0);
  return out;
}

// ---------------------------------------------------------------- containers

Sequential::Sequential(std::vector<std::shared_ptr<UnaryModule>> layers) : UnaryModule("Sequential") {
  for (auto& l : layers) push_back(std::move(l));
}

void Sequential::push_back(std::shared_ptr<UnaryModule> layer) {
  register_module(std::to_string(layers_.size()), layer);
  layers_.push_back(std::move(layer));
}

Tensor Sequential::forward(const Tensor& x) {
  Tensor y = x;
  for (auto& l : layers_) y = l->forward(y);
  return y;
}

std::shared_ptr<UnaryModule> Sequential::operator[](size_t i) const {
  MU_CHECK(i < layers_.size(), "Sequential: index ", i, " out of range for ", layers_.size(), " layers");
  return layers_[i];
}

void ModuleList::push_back(std::shared_ptr<Module> m) {
  register_module(std::to_string(items_.size()), m);
  items_.push_back(std::move(m));
}

std::shared_ptr<Module> ModuleList::operator[](size_t i) const {
  MU_CHECK(i < items_.size(), "ModuleList: index ", i, " out of range for ", items_.size(), " modules");
  return items_[i];
}

}  // namespace mu::nn
