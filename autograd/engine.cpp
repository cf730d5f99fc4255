// The backward engine and the graph-building helpers every op uses.
#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "autograd/activation_checkpoint.h"
#include "autograd/autocast.h"
#include "autograd/grad_mode.h"
#include "autograd/hooks.h"
#include "autograd/node.h"
#include "ops/ops.h"

namespace mu::autograd {

SavedTensor::SavedTensor(const Tensor& t) {
  if (!t.defined()) return;
  if (checkpoint_save(t, slot_)) return;  // in a checkpointed region: a slot only
  t_ = t.detach();
  version_ = t.version();
}

Tensor SavedTensor::get() const {
  if (slot_) return checkpoint_get(*slot_);
  if (!t_.defined()) return t_;
  MU_CHECK(t_.version() == version_,
           "one of the tensors needed for gradient computation has been modified by an in-place "
           "operation: ", t_.describe(), " is at version ", t_.version(), "; expected version ",
           version_, " (the value it had when it was saved). Use an out-of-place op or clone() it first");
  return t_;
}

TensorList LambdaNode::apply(const TensorList& grad_outputs) {
  MU_CHECK(fn_ != nullptr, "trying to backward through the graph a second time (", name_,
           " was already run and its saved tensors freed); pass retain_graph=true to the first "
           "backward() if you need to backward twice");
  return fn_(grad_outputs);
}

TensorList AccumulateGrad::apply(const TensorList& grad_outputs) {
  const Tensor& g = grad_outputs[0];
  // The incoming gradient may alias a buffer other nodes also received (add's backward
  // passes the same tensor to both inputs), or be a view of a larger one: the leaf gets
  // memory of its own. A dense gradient nothing else refers to (this list holds the only
  // reference to it, and it is its storage's only tensor) is that already, and is kept
  // as it is rather than copied.
  const bool sole = g.impl_ptr().use_count() == 1 && g.storage().use_count() == 1 && g.is_contiguous() &&
                    g.storage_offset() == 0 && g.storage()->nbytes == size_t(g.numel()) * element_size(g.dtype());
  if (!leaf_->grad)
    leaf_->grad = sole ? g.impl_ptr() : g.clone().impl_ptr();
  else
    leaf_->grad = (Tensor(leaf_->grad) + g).impl_ptr();
  run_grad_ready_hooks(leaf_);
  return {};
}

bool needs_grad(const TensorList& inputs) {
  if (!is_grad_enabled()) return false;
  for (const Tensor& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

Edge gradient_edge(const Tensor& t) {
  if (!t.defined() || !t.requires_grad()) return {};
  TensorImpl* impl = t.impl();
  if (impl->grad_fn) return {impl->grad_fn, impl->output_nr};
  std::shared_ptr<Node> acc = impl->grad_accumulator.lock();
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(t.impl_ptr());
    impl->grad_accumulator = acc;
  }
  return {acc, 0};
}

void set_history(const TensorList& outputs, const std::shared_ptr<Node>& node, const TensorList& inputs) {
  node->next_edges.clear();
  node->input_shapes.clear();
  node->input_dtypes.clear();
  for (const Tensor& in : inputs) {
    node->next_edges.push_back(gradient_edge(in));
    node->input_shapes.push_back(in.defined() ? in.shape() : Shape{});
    node->input_dtypes.push_back(in.defined() ? in.dtype() : kFloat32);
  }
  node->num_outputs = uint32_t(outputs.size());
  for (size_t i = 0; i < outputs.size(); ++i) {
    // Integer and bool outputs (an index, a count, x.to(kInt64)) carry no gradient, as in
    // torch: they get no history, and the node sees no gradient for them.
    if (!outputs[i].defined() || !is_floating(outputs[i].dtype())) continue;
    TensorImpl* o = outputs[i].impl();
    o->grad_fn = node;
    o->output_nr = uint32_t(i);
    o->requires_grad = true;
  }
}

Tensor record(const char* name, Tensor out, const TensorList& inputs, BackwardFn fn) {
  if (!needs_grad(inputs)) return out;
  auto node = std::make_shared<LambdaNode>(name, std::move(fn));
  set_history({out}, node, inputs);
  return out;
}

TensorList record_multi(const char* name, TensorList outs, const TensorList& inputs, MultiBackwardFn fn) {
  if (!needs_grad(inputs)) return outs;
  auto node = std::make_shared<LambdaNode>(name, std::move(fn));
  set_history(outs, node, inputs);
  return outs;
}

namespace {
thread_local bool g_last_use = false;

// Marks the node being applied as run for the last time, for the extent of its apply.
struct LastUseScope {
  bool saved = g_last_use;
  explicit LastUseScope(bool last) { g_last_use = last; }
  ~LastUseScope() { g_last_use = saved; }
};
}  // namespace

bool last_use() { return g_last_use; }

// Whether a gradient waiting in a buffer may take the next one in place: it has no other
// owner (no other tensor, node, hook or view holds it or its memory, so no one sees it
// change), every element has memory of its own (not an expanded view), and the sum keeps
// its shape, dtype and device. A step of a residual network sums two gradients into
// every skip connection; in place, the sum writes into memory the cache holds already
// instead of a fresh block.
static bool can_add_in_place(const Tensor& acc, const Tensor& g) {
  return acc.impl_ptr().use_count() == 1 && acc.storage().use_count() == 1 && acc.is_contiguous() &&
         acc.shape() == g.shape() && acc.dtype() == g.dtype() && acc.device() == g.device() && !acc.is_same(g);
}

void run_backward(const TensorList& roots, const TensorList& grad_roots, bool retain_graph) {
  NoGradGuard no_grad;  // gradient formulas must not record graphs of their own
  AutocastGuard no_autocast(kBFloat16, false);  // nor cast: they use the dtypes the forward saved

  // 1. Count, for every node reachable from the roots, how many edges lead into it:
  //    a node runs only once all of its consumers have sent their gradients.
  std::unordered_map<Node*, int> dependencies;
  std::vector<Node*> stack;
  std::unordered_set<Node*> seen;
  for (const Tensor& r : roots) {
    Edge e = gradient_edge(r);
    if (e.fn && seen.insert(e.fn.get()).second) stack.push_back(e.fn.get());
  }
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const Edge& e : n->next_edges) {
      if (!e.fn) continue;
      dependencies[e.fn.get()] += 1;
      if (seen.insert(e.fn.get()).second) stack.push_back(e.fn.get());
    }
  }

  // 2. Gradients waiting for each node, summed over the edges that deliver them.
  std::unordered_map<Node*, TensorList> buffers;
  std::unordered_map<Node*, std::shared_ptr<Node>> keep_alive;
  auto deliver = [&](const Edge& e, const Tensor& g) {
    TensorList& buf = buffers[e.fn.get()];
    if (buf.empty()) buf.resize(e.fn->num_outputs);
    Tensor& slot = buf[e.input_nr];
    if (!slot.defined()) slot = g;
    else if (can_add_in_place(slot, g)) slot.add_(g);
    else slot = slot + g;
    keep_alive[e.fn.get()] = e.fn;
  };
  std::vector<Node*> ready;
  for (size_t i = 0; i < roots.size(); ++i) {
    Edge e = gradient_edge(roots[i]);
    if (!e.fn) continue;
    deliver(e, grad_roots[i]);
    if (dependencies[e.fn.get()] == 0 &&
        std::find(ready.begin(), ready.end(), e.fn.get()) == ready.end())
      ready.push_back(e.fn.get());
  }

  // 3. Run nodes in reverse topological order. A node that no gradient reached still
  //    passes through the loop, so that the nodes below it learn they have one consumer less.
  while (!ready.empty()) {
    Node* n = ready.back();
    ready.pop_back();
    std::shared_ptr<Node> hold = keep_alive[n];
    TensorList input_grads;
    auto it = buffers.find(n);
    if (it != buffers.end()) {
      TensorList grads = std::move(it->second);
      buffers.erase(it);
      LastUseScope last(!retain_graph);
      input_grads = n->apply(grads);
      MU_CHECK(input_grads.size() == n->next_edges.size() || n->next_edges.empty(), n->name(),
               " returned ", input_grads.size(), " gradients for ", n->next_edges.size(), " inputs");
    }
    if (!retain_graph) n->release();
    for (size_t i = 0; i < n->next_edges.size(); ++i) {
      const Edge& e = n->next_edges[i];
      if (!e.fn) continue;
      if (i < input_grads.size() && input_grads[i].defined()) {
        Tensor g = input_grads[i];
        MU_CHECK(g.shape() == n->input_shapes[i], n->name(), " returned a gradient of shape ",
                 shape_str(g.shape()), " for input ", i, " of shape ", shape_str(n->input_shapes[i]));
        if (i < n->input_dtypes.size() && g.dtype() != n->input_dtypes[i]) g = g.to(n->input_dtypes[i]);
        deliver(e, g);
      }
      keep_alive.emplace(e.fn.get(), e.fn);
      if (--dependencies[e.fn.get()] == 0) ready.push_back(e.fn.get());
    }
    keep_alive.erase(n);
  }
  run_backward_end_hooks();
}

}  // namespace mu::autograd

namespace mu {

void Tensor::backward(const Tensor& gradient, bool retain_graph) const {
  MU_CHECK(requires_grad(), "backward: this tensor does not require grad and has no grad_fn: ",
           describe(), " (did you call requires_grad_() on the inputs, or run under NoGradGuard?)");
  Tensor g = gradient;
  if (!g.defined()) {
    MU_CHECK(numel() == 1, "backward: a gradient can be created implicitly only for a scalar output; "
             "this output has shape ", shape_str(shape()), ", so pass a gradient of that shape");
    g = ones_like(*this);
  } else {
    MU_CHECK(g.shape() == shape(), "backward: gradient has shape ", shape_str(g.shape()),
             " but the output has shape ", shape_str(shape()));
    MU_CHECK(g.dtype() == dtype(), "backward: gradient has dtype ", dtype_name(g.dtype()),
             " but the output has dtype ", dtype_name(dtype()));
    MU_CHECK(g.device() == device(), "backward: gradient on ", g.device().str(), " but the output on ",
             device().str(), "; move it with .to(", device().str(), ")");
  }
  autograd::run_backward({*this}, {g}, retain_graph);
}

Tensor& Tensor::requires_grad_(bool r) {
  TensorImpl* i = checked();
  MU_CHECK(!r || is_floating(i->dtype), "requires_grad_: only floating-point tensors can require "
           "gradients, this one is ", dtype_name(i->dtype));
  MU_CHECK(i->grad_fn == nullptr, "requires_grad_: can only be changed on leaf tensors; this one "
           "is the output of ", i->grad_fn->name(), " (use detach() to get a leaf)");
  i->requires_grad = r;
  return *this;
}

Tensor Tensor::grad() const {
  const auto& g = checked()->grad;
  return g ? Tensor(g) : Tensor();
}

// As torch's `p.grad = g`: the gradient matches the tensor in shape, dtype and device,
// so that an optimizer, backward's accumulation and a checkpoint never meet a mismatch
// long after the call that made it.
void Tensor::set_grad(const Tensor& g) const {
  if (g.defined()) {
    MU_CHECK(g.shape() == shape(), "set_grad: gradient of shape ", shape_str(g.shape()),
             " for a tensor of shape ", shape_str(shape()));
    MU_CHECK(g.dtype() == dtype(), "set_grad: gradient of dtype ", dtype_name(g.dtype()), " for a tensor of dtype ",
             dtype_name(dtype()), "; convert it first with .to(", dtype_name(dtype()), ")");
    MU_CHECK(g.device() == device(), "set_grad: gradient on ", g.device().str(), " for a tensor on ",
             device().str(), "; move it first with .to(", device().str(), ")");
  }
  checked()->grad = g.defined() ? g.impl_ptr() : nullptr;
}

}  // namespace mu
