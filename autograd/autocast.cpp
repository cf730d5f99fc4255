#include "autograd/autocast.h"

namespace mu::autograd {

namespace {
thread_local bool t_enabled = false;
thread_local DType t_dtype = kBFloat16;
}  // namespace

bool is_autocast_enabled() { return t_enabled; }
DType autocast_dtype() { return t_dtype; }

AutocastGuard::AutocastGuard(DType dtype, bool enabled) : prev_enabled_(t_enabled), prev_dtype_(t_dtype) {
  MU_CHECK(dtype == kBFloat16, "AutocastGuard: the autocast dtype is bfloat16, got ", dtype_name(dtype),
           " (float16 would need loss scaling, which mumoe does not do)");
  t_enabled = enabled;
  t_dtype = dtype;
}

AutocastGuard::~AutocastGuard() {
  t_enabled = prev_enabled_;
  t_dtype = prev_dtype_;
}

namespace autocast {

Tensor to_low(const Tensor& x) {
  if (!t_enabled || !x.defined() || x.dtype() != kFloat32) return x;
  return x.to(t_dtype);
}

DType low_dtype(const Tensor& x) { return t_enabled && x.dtype() == kFloat32 ? t_dtype : x.dtype(); }

Tensor to_full(const Tensor& x) {
  if (!t_enabled || !x.defined() || (x.dtype() != kBFloat16 && x.dtype() != kFloat16)) return x;
  return x.to(kFloat32);
}

}  // namespace autocast

}  // namespace mu::autograd
