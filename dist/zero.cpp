#include "dist/zero.h"

#include <algorithm>
#include <numeric>
#include <string>

#include "autograd/grad_mode.h"
#include "ops/ops.h"
#include "tensor/error.h"

namespace mu::dist {

namespace {

// The state entries of parameter (g, i) in a state dict ("state.<g>.<i>.<buffer>").
std::string state_prefix(size_t g, size_t i) { return "state." + std::to_string(g) + "." + std::to_string(i) + "."; }

// root's string on every rank.
std::string broadcast_string(ProcessGroup& pg, const std::string& s, int root) {
  Tensor n = from_vector(std::vector<int64_t>{int64_t(s.size())}, {1});
  pg.broadcast(n, root);
  const int64_t len = n.to_vector<int64_t>()[0];
  Tensor bytes = empty({len}, kUInt8);
  if (pg.rank() == root) std::copy(s.begin(), s.end(), bytes.data_ptr<uint8_t>());
  if (len > 0) pg.broadcast(bytes, root);
  return std::string(reinterpret_cast<const char*>(bytes.data_ptr<uint8_t>()), size_t(len));
}

// root's tensor (any dtype, shape and device) on every rank: on the CPU where root's is
// on the CPU (an optimizer's step count, say), else on `device`. Every rank must pass the
// collective a tensor of the same kind of device (MPI for CPU tensors, NCCL for CUDA
// ones), so the kind travels with the dtype and shape.
Tensor broadcast_tensor(ProcessGroup& pg, const Tensor& t, int root, Device device) {
  std::vector<int64_t> meta;
  if (pg.rank() == root) {
    meta.push_back(int64_t(t.dtype()));
    meta.push_back(t.device().is_cpu() ? 0 : 1);
    meta.push_back(t.dim());
    for (int64_t d : t.shape()) meta.push_back(d);
  }
  Tensor head = from_vector(std::vector<int64_t>{int64_t(meta.size())}, {1});
  pg.broadcast(head, root);
  Tensor m = pg.rank() == root ? from_vector(meta, {int64_t(meta.size())}) : empty({head.to_vector<int64_t>()[0]}, kInt64);
  pg.broadcast(m, root);
  const std::vector<int64_t> v = m.to_vector<int64_t>();
  const Shape shape(v.begin() + 3, v.begin() + 3 + v[2]);
  const Device where = v[1] == 0 ? Device::cpu() : device;
  Tensor out = pg.rank() == root ? t.contiguous().clone() : empty(shape, TensorOptions(DType(v[0])).device(where));
  pg.broadcast(out, root);
  return out;
}

}  // namespace

ZeroOptimizer::ZeroOptimizer(optim::Optimizer& opt, ProcessGroup& group) : opt_(opt), group_(group) {
  // Deal the parameters, largest first (ties by position), to the least loaded rank.
  struct Item {
    size_t g, i;
    int64_t numel;
  };
  std::vector<Item> items;
  owner_.resize(opt.param_groups().size());
  for (size_t g = 0; g < opt.param_groups().size(); ++g) {
    const auto& params = opt.param_groups()[g].params;
    owner_[g].assign(params.size(), 0);
    for (size_t i = 0; i < params.size(); ++i) items.push_back({g, i, params[i].numel()});
  }
  std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.numel > b.numel; });
  std::vector<int64_t> load(size_t(group.size()), 0);
  for (const Item& it : items) {
    const int r = int(std::min_element(load.begin(), load.end()) - load.begin());
    owner_[it.g][it.i] = r;
    load[size_t(r)] += it.numel;
  }
  release_state();  // an optimizer handed over with state keeps only its share
}

void ZeroOptimizer::step() {
  auto& groups = opt_.param_groups();
  // The others' parameters are hidden from the optimizer by taking their gradients away
  // for the step (an optimizer skips a parameter without one, its state untouched).
  std::vector<std::pair<Tensor, Tensor>> hidden;
  for (size_t g = 0; g < groups.size(); ++g)
    for (size_t i = 0; i < groups[g].params.size(); ++i) {
      const Tensor& p = groups[g].params[i];
      if (owner_[g][i] != group_.rank() && p.grad().defined()) {
        hidden.emplace_back(p, p.grad());
        p.set_grad(Tensor());
      }
    }
  try {
    opt_.step();
  } catch (...) {
    for (auto& [p, grad] : hidden) p.set_grad(grad);
    throw;
  }
  for (auto& [p, grad] : hidden) p.set_grad(grad);
  NoGradGuard no_grad;
  for (size_t g = 0; g < groups.size(); ++g)
    for (size_t i = 0; i < groups[g].params.size(); ++i) {
      Tensor p = groups[g].params[i];
      group_.broadcast(p, owner_[g][i]);
    }
}

void ZeroOptimizer::gather_state() {
  const nn::StateDict mine = opt_.state_dict();
  nn::StateDict full;
  // Hyper-parameters are the same everywhere: this rank's.
  for (const auto& [name, t] : mine)
    if (name.rfind("state.", 0) != 0) full.emplace_back(name, t);
  const auto& groups = opt_.param_groups();
  for (size_t g = 0; g < groups.size(); ++g)
    for (size_t i = 0; i < groups[g].params.size(); ++i) {
      const int root = owner_[g][i];
      const std::string prefix = state_prefix(g, i);
      // The owner's buffer names for this parameter, joined by '\n' (none before its first step).
      std::string names;
      if (group_.rank() == root)
        for (const auto& [name, t] : mine)
          if (name.rfind(prefix, 0) == 0) names += name + "\n";
      names = broadcast_string(group_, names, root);
      for (size_t at = 0; at < names.size();) {
        const size_t end = names.find('\n', at);
        const std::string name = names.substr(at, end - at);
        at = end + 1;
        const Tensor t = group_.rank() == root ? nn::find(mine, name) : Tensor();
        full.emplace_back(name, broadcast_tensor(group_, t, root, groups[g].params[i].device()));
      }
    }
  opt_.load_state_dict(full);
}

void ZeroOptimizer::release_state() {
  nn::StateDict kept;
  for (const auto& [name, t] : opt_.state_dict()) {
    if (name.rfind("state.", 0) == 0) {
      // state.<g>.<i>.<buffer>
      const size_t a = name.find('.', 6), b = name.find('.', a + 1);
      const size_t g = std::stoul(name.substr(6, a - 6)), i = std::stoul(name.substr(a + 1, b - a - 1));
      if (owner_[g][i] != group_.rank()) continue;
    }
    kept.emplace_back(name, t.clone());
  }
  opt_.load_state_dict(kept);
}

int64_t ZeroOptimizer::state_bytes() const {
  int64_t bytes = 0;
  for (const auto& [name, t] : opt_.state_dict())
    if (name.rfind("state.", 0) == 0) bytes += t.numel() * int64_t(element_size(t.dtype()));
  return bytes;
}

}  // namespace mu::dist
