// The recorded graph: one Node per op application, edges pointing at the nodes that
// produced its inputs. A leaf that requires grad is reached through an AccumulateGrad
// node, shared by all of its uses, that adds incoming gradients into leaf.grad.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace mu::autograd {

using TensorList = std::vector<Tensor>;

struct Node;
struct CheckpointSlot;  // autograd/activation_checkpoint.h

struct Edge {
  std::shared_ptr<Node> fn;  // null: that input needs no gradient
  uint32_t input_nr = 0;     // which output of fn the gradient belongs to
};

struct Node {
  std::vector<Edge> next_edges;  // one per input of the op
  std::vector<Shape> input_shapes;  // to check what backward returns
  // Each gradient is rounded to its input's dtype (a float32 gradient of a bfloat16
  // operand that met a float32 one in an elementwise op).
  std::vector<DType> input_dtypes;
  uint32_t num_outputs = 1;

  // Frees the part of the graph that only this node keeps alive without recursing, so a
  // chain of a million ops is released in constant stack depth (autograd/node.cpp).
  virtual ~Node();
  virtual std::string name() const = 0;
  // Gradients w.r.t. the outputs in, one gradient per input out (undefined = none).
  virtual TensorList apply(const TensorList& grad_outputs) = 0;
  // Frees what backward needed; called after a pass without retain_graph.
  virtual void release() {}
};

// A tensor kept for backward, with the storage version it had when saved, so that an
// in-place change made in between is reported rather than silently used. Saved inside a
// checkpointed region (autograd/activation_checkpoint.h), it keeps a slot instead, which
// the region's second run fills when the backward pass first asks.
class SavedTensor {
 public:
  SavedTensor() = default;
  explicit SavedTensor(const Tensor& t);
  // The saved tensor; throws if it was modified in place since it was saved.
  Tensor get() const;
  bool defined() const { return t_.defined() || slot_ != nullptr; }

 private:
  Tensor t_;
  uint64_t version_ = 0;
  std::shared_ptr<CheckpointSlot> slot_;
};

inline SavedTensor save(const Tensor& t) { return SavedTensor(t); }

// True while a node's backward runs for the last time: the pass was not asked to retain
// the graph, so the node is released right after. A backward may then consume what it
// saved, e.g. write its gradient over a saved tensor that nothing else references
// (cross_entropy's over the logits, the largest tensor of a language model's step).
bool last_use();

// A built-in op's node: a closure from the output gradient to the input gradients.
using BackwardFn = std::function<TensorList(const Tensor& grad_output)>;
// The same for an op of several outputs: one gradient per output in (undefined where
// none reached that output), one per input out.
using MultiBackwardFn = std::function<TensorList(const TensorList& grad_outputs)>;

class LambdaNode : public Node {
 public:
  LambdaNode(std::string name, BackwardFn fn) : name_(std::move(name)) {
    if (fn) fn_ = [f = std::move(fn)](const TensorList& g) { return f(g[0]); };
  }
  LambdaNode(std::string name, MultiBackwardFn fn) : name_(std::move(name)), fn_(std::move(fn)) {}
  LambdaNode(std::string name, std::nullptr_t) : name_(std::move(name)) {}  // a node whose backward already ran
  std::string name() const override { return name_; }
  TensorList apply(const TensorList& grad_outputs) override;
  void release() override { fn_ = nullptr; }

 private:
  std::string name_;
  MultiBackwardFn fn_;
};

class AccumulateGrad : public Node {
 public:
  explicit AccumulateGrad(std::shared_ptr<TensorImpl> leaf) : leaf_(std::move(leaf)) {}
  std::string name() const override { return "AccumulateGrad"; }
  TensorList apply(const TensorList& grad_outputs) override;

 private:
  std::shared_ptr<TensorImpl> leaf_;
};

// True when grad mode is on and some input requires grad: the op must be recorded.
bool needs_grad(const TensorList& inputs);
// Where a gradient for `t` must be sent: its grad_fn, its leaf accumulator, or nowhere.
Edge gradient_edge(const Tensor& t);
// Connects `node` to `inputs` and makes it the grad_fn of `outputs` (output_nr = position).
void set_history(const TensorList& outputs, const std::shared_ptr<Node>& node, const TensorList& inputs);

// The one call every built-in op makes: when the op must be recorded, attaches a
// LambdaNode named `name` whose closure `fn` maps d(out) to one gradient per input.
Tensor record(const char* name, Tensor out, const TensorList& inputs, BackwardFn fn);
// The same for an op of several outputs, all made the outputs of one node.
TensorList record_multi(const char* name, TensorList outs, const TensorList& inputs, MultiBackwardFn fn);

// Runs the backward pass from `roots` seeded with `grad_roots` (same shapes).
void run_backward(const TensorList& roots, const TensorList& grad_roots, bool retain_graph);

}  // namespace mu::autograd
