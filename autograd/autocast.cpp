#include "autograd/autocast.h"

#include <unordered_map>

#include "autograd/grad_mode.h"

namespace mu::autograd {

namespace {
thread_local bool t_enabled = false;
thread_local DType t_dtype = kBFloat16;
thread_local int t_guards = 0;  // AutocastGuards alive on this thread

// The bfloat16 copies of parameters made where no graph is recorded, while a guard is
// alive: a sampling loop or an evaluation under autocast otherwise casts every weight
// again at every step (GPT-2 mini: 16M values cast per generated token). An entry holds
// its parameter (so that no other tensor can reuse its address), and the storage, view
// and version it was cast from: a parameter changed in place since, or given other data
// (set_data: Module::to), is cast again. The cache is emptied when the thread's last
// guard ends. Casts made while a graph is recorded are not kept: theirs carry the graph's
// edge to the parameter.
struct Cast {
  Tensor source;
  std::shared_ptr<Storage> storage;
  Shape shape, strides;
  int64_t offset;
  uint64_t version;
  Tensor low;
  bool still_of(const Tensor& x) const {
    return x.storage() == storage && x.shape() == shape && x.strides() == strides && x.storage_offset() == offset &&
           x.version() == version;
  }
};
thread_local std::unordered_map<const TensorImpl*, Cast> t_casts;
}  // namespace

bool is_autocast_enabled() { return t_enabled; }
DType autocast_dtype() { return t_dtype; }

AutocastGuard::AutocastGuard(DType dtype, bool enabled) : prev_enabled_(t_enabled), prev_dtype_(t_dtype) {
  MU_CHECK(dtype == kBFloat16, "AutocastGuard: the autocast dtype is bfloat16, got ", dtype_name(dtype),
           " (float16 would need loss scaling, which mumoe does not do)");
  t_enabled = enabled;
  t_dtype = dtype;
  ++t_guards;
}

AutocastGuard::~AutocastGuard() {
  t_enabled = prev_enabled_;
  t_dtype = prev_dtype_;
  if (--t_guards == 0) t_casts.clear();
}

namespace autocast {

Tensor to_low(const Tensor& x) {
  if (!t_enabled || !x.defined() || x.dtype() != kFloat32) return x;
  if (is_grad_enabled() || !x.is_leaf() || !x.requires_grad()) return x.to(t_dtype);
  // A parameter, no graph recorded: its cast kept until the last guard ends.
  auto it = t_casts.find(x.impl());
  if (it != t_casts.end() && it->second.still_of(x) && it->second.low.dtype() == t_dtype) return it->second.low;
  Tensor low = x.to(t_dtype);
  t_casts.insert_or_assign(x.impl(), Cast{x, x.storage(), x.shape(), x.strides(), x.storage_offset(), x.version(), low});
  return low;
}

size_t cached_casts() { return t_casts.size(); }

DType low_dtype(const Tensor& x) { return t_enabled && x.dtype() == kFloat32 ? t_dtype : x.dtype(); }

Tensor to_full(const Tensor& x) {
  if (!t_enabled || !x.defined() || !is_16bit_float(x.dtype())) return x;
  return x.to(kFloat32);
}

}  // namespace autocast

}  // namespace mu::autograd
