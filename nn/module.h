// nn::Module: parameters, buffers and child modules registered by name, with the
// traversals, mode switches, device/dtype moves and state dicts built on them.
//
//   struct Net : nn::Module {
//     std::shared_ptr<nn::Linear> fc;
//     Net() : Module("Net") { fc = register_module("fc", std::make_shared<nn::Linear>(4, 2)); }
//     Tensor forward(const Tensor& x) { return fc->forward(x); }
//   };
//
// Member copies of registered tensors stay valid across to(device)/to(dtype): those move
// the data inside the shared tensor (Tensor::set_data), never replace the handle.
#pragma once
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "tensor/tensor.h"

namespace mu::nn {

// Name -> tensor, in registration order (dotted names for nested modules).
using StateDict = std::vector<std::pair<std::string, Tensor>>;
// The entry named `name`, or an undefined tensor.
Tensor find(const StateDict& sd, const std::string& name);

class Module {
 public:
  explicit Module(std::string type_name = "Module") : type_name_(std::move(type_name)) {}
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // ---- registration (names must be unique within this module and contain no '.')
  Tensor register_parameter(const std::string& name, Tensor t, bool requires_grad = true);
  Tensor register_buffer(const std::string& name, Tensor t);
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    add_child(name, m);
    return m;
  }

  // ---- traversal (recursive: own entries first, then each child's, in registration order;
  // a tensor or module registered under two names is listed once, under its first name)
  std::vector<Tensor> parameters(bool recurse = true) const;
  StateDict named_parameters(bool recurse = true) const;
  std::vector<Tensor> buffers(bool recurse = true) const;
  StateDict named_buffers(bool recurse = true) const;
  std::vector<std::shared_ptr<Module>> children() const;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_children() const;
  // This module and every descendant, depth first (this one first).
  std::vector<Module*> modules();

  // ---- modes and moves
  virtual void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  void to(Device device);
  void to(DType dtype);  // floating-point parameters and buffers only
  void zero_grad();      // every parameter's gradient back to none
  int64_t num_parameters() const;

  // ---- state: parameters and buffers by dotted name (every name, shared tensors included)
  StateDict state_dict() const;
  // Copies values into this module's tensors. Refuses, naming the entries, when strict and
  // an entry is missing or unexpected, and always when a shape differs.
  void load_state_dict(const StateDict& sd, bool strict = true);

  // ---- printing
  const std::string& type_name() const { return type_name_; }
  // One line of settings shown next to the type, e.g. "in=768, out=1000, bias=true".
  virtual std::string extra_repr() const { return ""; }
  // The module tree, each line with the module's own parameter count.
  std::string str() const;

 private:
  void add_child(const std::string& name, std::shared_ptr<Module> m);
  bool holds(const Module* m) const;  // m is this module or inside it
  void check_new_name(const std::string& name) const;
  void collect(const std::string& prefix, bool params, bool bufs, bool recurse, StateDict& out) const;
  void collect_modules(std::vector<Module*>& out, std::set<const Module*>& seen);
  void print(std::string& out, const std::string& name, int indent) const;

  std::string type_name_;
  bool training_ = true;
  StateDict params_;
  StateDict buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
};

// A module from one tensor to one tensor: what Sequential chains.
class UnaryModule : public Module {
 public:
  using Module::Module;
  virtual Tensor forward(const Tensor& x) = 0;
  Tensor operator()(const Tensor& x) { return forward(x); }
};

// Applies its children in order.
class Sequential : public UnaryModule {
 public:
  Sequential() : UnaryModule("Sequential") {}
  explicit Sequential(std::vector<std::shared_ptr<UnaryModule>> layers);
  void push_back(std::shared_ptr<UnaryModule> layer);
  Tensor forward(const Tensor& x) override;
  size_t size() const { return layers_.size(); }
  std::shared_ptr<UnaryModule> operator[](size_t i) const;
  // Layer i as its own type, e.g. seq.at<Linear>(0)->weight.
  template <class M>
  std::shared_ptr<M> at(size_t i) const {
    auto p = std::dynamic_pointer_cast<M>((*this)[i]);
    MU_CHECK(p != nullptr, "Sequential::at: layer ", i, " is a ", (*this)[i]->type_name(), ", not the requested type");
    return p;
  }

 private:
  std::vector<std::shared_ptr<UnaryModule>> layers_;
};

// Holds modules under the names "0", "1", ... (their forward calls are the owner's business).
class ModuleList : public Module {
 public:
  ModuleList() : Module("ModuleList") {}
  void push_back(std::shared_ptr<Module> m);
  size_t size() const { return items_.size(); }
  std::shared_ptr<Module> operator[](size_t i) const;
  template <class M>
  std::shared_ptr<M> at(size_t i) const {
    auto p = std::dynamic_pointer_cast<M>((*this)[i]);
    MU_CHECK(p != nullptr, "ModuleList::at: item ", i, " is a ", (*this)[i]->type_name(), ", not the requested type");
    return p;
  }

 private:
  std::vector<std::shared_ptr<Module>> items_;
};

}  // namespace mu::nn
