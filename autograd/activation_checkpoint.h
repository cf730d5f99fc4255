// Activation checkpointing: a region of the forward pass whose saved tensors are dropped
// and computed again, by running the region a second time, when the backward pass first
// needs one of them. Memory for compute: a transformer block keeps only its input between
// the forward and the backward instead of every activation its ops save, at the cost of
// one more forward of the block (about a third more arithmetic for the step).
//
//   // y = block(x), with block's saved activations recomputed in the backward
//   Tensor y = autograd::checkpoint([&](const Tensor& x) { return block->forward(x); }, x);
//   // several inputs and outputs
//   TensorList out =
//       autograd::checkpoint([&](const TensorList& in) { return TensorList{f(in[0], in[1])}; }, {a, b});
//
// The region's graph is recorded as usual (its outputs, its parameters and every hook of
// them are as without checkpointing); only what its ops save for backward is replaced by
// a slot. When the backward pass reaches the region, the first slot read runs the
// function again, on the same inputs, with grad mode on, and fills every slot still
// wanted; each is freed with the node that saved it, as a saved tensor would be.
//
// The second run must do what the first did. So that it can:
//  - it runs under the autocast state of the first (the backward itself runs without);
//  - every random generator the first run drew from (the default generator, or one a
//    module holds, e.g. DropoutOptions::generator) is set back to the state it had
//    before the region's first draw, and restored afterwards: dropout masks come out the
//    same, and the generators end where the forward left them. A generator must outlive
//    the backward pass; one destroyed before it is an error. Draws on another thread do
//    not belong to the region, and a thread drawing from the same generator during the
//    recomputation would see part of its stream again: give such a thread a generator of
//    its own (as the data pipelines do).
//  - modules that change state in their forward leave it alone while recomputing()
//    (BatchNorm1d's running statistics are updated once per step, as without).
// What it cannot replay is checked: each tensor saved the second time must have the
// shape, dtype and device of the one saved the first time, and as many must be saved; an
// input of the region, or a tensor an op of the region saved (a weight of a product),
// changed in place between the forward and the backward is reported. (A tensor the
// region only reads, such as a bias that is added, cannot be checked: change none while
// a region waits for its backward.) Forward hooks of the region's modules run on the
// second run as well; a hook that records something can skip while recomputing().
//
// Without grad mode (NoGradGuard, evaluation) the function simply runs. A checkpoint
// inside another's region is part of the outer region (its function simply runs).
#pragma once
#include <functional>
#include <memory>
#include <string>

#include "autograd/node.h"

namespace mu::autograd {

using CheckpointFn = std::function<TensorList(const TensorList&)>;

// fn(inputs), with the tensors its ops save for backward recomputed in the backward
// pass rather than kept. fn and what it refers to (modules, generators) must live until
// the backward pass has passed the region. The region's graph holds fn: let fn refer to a
// module by reference or weak_ptr, not shared_ptr, if the module may keep a tensor of that
// graph (a sparse MoE's aux_loss()), or the two keep each other alive (checkpoint_module).
TensorList checkpoint(const CheckpointFn& fn, const TensorList& inputs);
// The same for a function of one tensor to one tensor.
Tensor checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& input);
// module->forward(input) as a region that holds the module weakly (see above); `what`
// names the module in the error raised if it is gone when the backward pass gets there.
template <class M>
Tensor checkpoint_module(const std::shared_ptr<M>& module, const Tensor& input, std::string what) {
  return checkpoint(
      [weak = std::weak_ptr<M>(module), what = std::move(what)](const Tensor& t) {
        std::shared_ptr<M> m = weak.lock();
        MU_CHECK(m != nullptr, what, " was destroyed before the backward pass could recompute it");
        return m->forward(t);
      },
      input);
}

// True on this thread while a checkpointed region runs the second time.
bool recomputing();

// The plumbing of SavedTensor (autograd/node.h):
// A saved tensor of a checkpointed region (autograd/activation_checkpoint.cpp).
struct CheckpointSlot;
// Called by SavedTensor's constructor: inside a region's first run, makes `slot` the
// stand-in for t and returns true; in the second run, hands t to the slot it refills and
// returns false (the saved tensor then keeps t, for the throwaway graph of that run).
bool checkpoint_save(const Tensor& t, std::shared_ptr<CheckpointSlot>& slot);
// The tensor a slot stands for, recomputing the region first when the slot is empty.
Tensor checkpoint_get(CheckpointSlot& slot);

}  // namespace mu::autograd
