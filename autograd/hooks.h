// Hooks into the backward pass, for code that must act while gradients are still being
// computed: data-parallel training starts averaging a bucket of gradients across processes
// as soon as its last gradient is in (dist/ddp.h), overlapping communication with the rest
// of backward.
//
//   autograd::HookHandle h = autograd::add_grad_ready_hook(w, [](const Tensor& leaf) {
//     use(leaf.grad());                       // the leaf's .grad after this backward's accumulation
//   });
//   autograd::HookHandle e = autograd::add_backward_end_hook([] { finish(); });
//
// A grad-ready hook runs once per backward pass per leaf, on the thread running backward,
// right after that pass has added its gradient to the leaf's .grad (a leaf no gradient
// reached is not called). A backward-end hook runs after every backward pass, once the
// last node has run. Hooks run in the order they were added and may throw: the exception
// leaves backward. A handle removes its hook when it is destroyed (or reset()).
#pragma once
#include <cstdint>
#include <functional>

#include "tensor/tensor.h"

namespace mu::autograd {

class HookHandle {
 public:
  HookHandle() = default;
  HookHandle(HookHandle&& other) noexcept : id_(other.id_) { other.id_ = 0; }
  HookHandle& operator=(HookHandle&& other) noexcept;
  HookHandle(const HookHandle&) = delete;
  HookHandle& operator=(const HookHandle&) = delete;
  ~HookHandle() { reset(); }
  void reset();  // removes the hook (nothing when already removed)
  bool active() const { return id_ != 0; }

 private:
  friend HookHandle make_hook_handle(uint64_t id);
  explicit HookHandle(uint64_t id) : id_(id) {}
  uint64_t id_ = 0;
};

// `leaf` must be a tensor that requires grad and has no grad_fn (a parameter).
HookHandle add_grad_ready_hook(const Tensor& leaf, std::function<void(const Tensor& leaf)> hook);
HookHandle add_backward_end_hook(std::function<void()> hook);

// Called by the engine (autograd/engine.cpp).
void run_grad_ready_hooks(const std::shared_ptr<TensorImpl>& leaf);
void run_backward_end_hooks();

}  // namespace mu::autograd
