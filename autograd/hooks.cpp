#include "autograd/hooks.h"

#include <atomic>
#include <map>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tensor/error.h"

namespace mu::autograd {

namespace {

// Every hook, by id (ids increase, so iterating a std::map runs hooks in the order they
// were added). A leaf's hooks are also indexed by its TensorImpl, which the engine looks up.
struct Registry {
  std::mutex mutex;
  uint64_t next_id = 1;
  std::map<uint64_t, std::function<void(const Tensor&)>> leaf_hooks;
  std::unordered_map<const TensorImpl*, std::vector<uint64_t>> by_leaf;
  std::unordered_map<uint64_t, const TensorImpl*> leaf_of;
  std::map<uint64_t, std::function<void()>> end_hooks;
};

Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: handles may outlive static destruction order
  return *r;
}

// How many hooks exist: the engine skips the registry (and its lock) while there are none.
std::atomic<int64_t> g_count{0};

void remove_hook(uint64_t id) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (r.end_hooks.erase(id) > 0) {
    --g_count;
    return;
  }
  auto it = r.leaf_of.find(id);
  if (it == r.leaf_of.end()) return;
  std::vector<uint64_t>& ids = r.by_leaf[it->second];
  std::erase(ids, id);
  if (ids.empty()) r.by_leaf.erase(it->second);
  r.leaf_of.erase(it);
  r.leaf_hooks.erase(id);
  --g_count;
}

}  // namespace

HookHandle make_hook_handle(uint64_t id) { return HookHandle(id); }

HookHandle& HookHandle::operator=(HookHandle&& other) noexcept {
  if (this != &other) {
    reset();
    id_ = other.id_;
    other.id_ = 0;
  }
  return *this;
}

void HookHandle::reset() {
  if (id_ != 0) remove_hook(id_);
  id_ = 0;
}

HookHandle add_grad_ready_hook(const Tensor& leaf, std::function<void(const Tensor&)> hook) {
  MU_CHECK(leaf.defined() && leaf.requires_grad() && leaf.grad_fn() == nullptr,
           "add_grad_ready_hook: the tensor must be a leaf that requires grad (a parameter), got ",
           leaf.defined() ? leaf.describe() : std::string("an undefined tensor"));
  MU_CHECK(hook != nullptr, "add_grad_ready_hook: the hook is empty");
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const uint64_t id = r.next_id++;
  r.leaf_hooks.emplace(id, std::move(hook));
  r.by_leaf[leaf.impl()].push_back(id);
  r.leaf_of.emplace(id, leaf.impl());
  ++g_count;
  return make_hook_handle(id);
}

HookHandle add_backward_end_hook(std::function<void()> hook) {
  MU_CHECK(hook != nullptr, "add_backward_end_hook: the hook is empty");
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const uint64_t id = r.next_id++;
  r.end_hooks.emplace(id, std::move(hook));
  ++g_count;
  return make_hook_handle(id);
}

void run_grad_ready_hooks(const std::shared_ptr<TensorImpl>& leaf) {
  if (g_count.load(std::memory_order_relaxed) == 0) return;
  // Copied out under the lock and run without it: a hook may add or remove hooks.
  std::vector<std::function<void(const Tensor&)>> run;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    auto it = r.by_leaf.find(leaf.get());
    if (it == r.by_leaf.end()) return;
    for (uint64_t id : it->second) run.push_back(r.leaf_hooks.at(id));
  }
  const Tensor t(leaf);
  for (auto& h : run) h(t);
}

void run_backward_end_hooks() {
  if (g_count.load(std::memory_order_relaxed) == 0) return;
  std::vector<std::function<void()>> run;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    for (auto& [id, h] : r.end_hooks) run.push_back(h);
  }
  for (auto& h : run) h();
}

}  // namespace mu::autograd
