// Custom differentiable ops, PyTorch style:
//
//   struct Cube : mu::autograd::Function<Cube> {
//     static Tensor forward(AutogradContext* ctx, const Tensor& x) {
//       ctx->save_for_backward({x});
//       return x * x * x;
//     }
//     static TensorList backward(AutogradContext* ctx, const TensorList& grad_out) {
//       Tensor x = ctx->get_saved_variables()[0];
//       return {grad_out[0] * 3.0 * x * x};
//     }
//   };
//   Tensor y = Cube::apply(x);
//
// forward runs without recording a graph; backward returns one gradient per Tensor
// argument of forward, in order (an undefined Tensor where there is none).
#pragma once
#include <any>
#include <map>
#include <string>
#include <type_traits>
#include <typeinfo>

#include "autograd/grad_mode.h"
#include "autograd/node.h"

namespace mu::autograd {

class AutogradContext {
 public:
  void save_for_backward(const TensorList& tensors) {
    saved_.clear();
    for (const Tensor& t : tensors) saved_.emplace_back(t);
  }
  // The saved tensors; throws if one was modified in place after it was saved.
  TensorList get_saved_variables() const {
    MU_CHECK(!released_, "trying to backward through the graph a second time (the saved tensors "
             "of a custom Function were freed); pass retain_graph=true to the first backward()");
    TensorList out;
    for (const SavedTensor& s : saved_) out.push_back(s.get());
    return out;
  }
  // Whether the i-th Tensor input needs a gradient (skip work for those that do not).
  bool needs_input_grad(size_t i) const { return i < needs_input_grad_.size() && needs_input_grad_[i]; }
  // Non-tensor state for backward: ctx->saved_data["dim"] = int64_t(1).
  std::map<std::string, std::any> saved_data;

  void release() { saved_.clear(); saved_data.clear(); released_ = true; }
  std::vector<bool> needs_input_grad_;

 private:
  std::vector<SavedTensor> saved_;
  bool released_ = false;
};

template <class Derived>
class FunctionNode : public Node {
 public:
  AutogradContext ctx;
  std::string name() const override {
    if constexpr (requires { Derived::name(); }) return Derived::name();
    else return typeid(Derived).name();
  }
  TensorList apply(const TensorList& grad_outputs) override {
    TensorList grads = grad_outputs;
    // Outputs no gradient reached get zeros, so backward can treat every output alike.
    for (size_t i = 0; i < grads.size(); ++i)
      if (!grads[i].defined()) grads[i] = zeros(output_shapes_[i], output_options_[i]);
    TensorList in = Derived::backward(&ctx, grads);
    MU_CHECK(in.size() == next_edges.size(), name(), "::backward returned ", in.size(),
             " gradients but forward took ", next_edges.size(), " tensor inputs");
    return in;
  }
  void release() override { ctx.release(); }
  std::vector<Shape> output_shapes_;
  std::vector<TensorOptions> output_options_;
};

template <class Derived>
struct Function {
  template <class... Args>
  static auto apply(Args&&... args) {
    auto node = std::make_shared<FunctionNode<Derived>>();
    TensorList inputs;
    (collect(inputs, args), ...);
    for (const Tensor& t : inputs) node->ctx.needs_input_grad_.push_back(t.defined() && t.requires_grad());
    bool record = needs_grad(inputs);
    auto out = [&] {
      NoGradGuard guard;
      return Derived::forward(&node->ctx, std::forward<Args>(args)...);
    }();
    if (!record) return out;
    TensorList outs;
    if constexpr (std::is_same_v<decltype(out), Tensor>) outs = {out};
    else outs = out;
    // An output that shares its impl with an input would overwrite that input's history.
    for (Tensor& o : outs)
      for (const Tensor& i : inputs)
        if (o.is_same(i)) o = o.view(o.shape());
    for (const Tensor& o : outs) {
      node->output_shapes_.push_back(o.shape());
      node->output_options_.push_back(TensorOptions(o.dtype()).device(o.device()));
    }
    set_history(outs, node, inputs);
    if constexpr (std::is_same_v<decltype(out), Tensor>) return outs[0];
    else return outs;
  }

 private:
  static void collect(TensorList& list, const Tensor& t) { list.push_back(t); }
  static void collect(TensorList& list, const TensorList& ts) { list.insert(list.end(), ts.begin(), ts.end()); }
  template <class T>
  static void collect(TensorList&, const T&) {}
};

}  // namespace mu::autograd
