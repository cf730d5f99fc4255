// Building blocks for elementwise ops (internal to ops/): run a scalar lambda over one,
// two or three tensors, checking dtypes and devices and broadcasting shapes, with no
// autograd recording. Gradient formulas use them to fuse a derivative into one pass.
#pragma once
#include "ops/cpu/map.h"
#include "tensor/tensor.h"

namespace mu::detail {

inline void require_cpu(const Tensor& t, const char* op) {
  MU_CHECK(t.device().is_cpu(), op, ": no CUDA kernel for this op yet; tensor is on ", t.device().str(),
           " (move it with .cpu())");
}

inline void require_same(const Tensor& a, const Tensor& b, const char* op) {
  MU_CHECK(a.dtype() == b.dtype(), op, ": dtype mismatch: ", dtype_name(a.dtype()), " vs ",
           dtype_name(b.dtype()), " (shapes ", shape_str(a.shape()), " and ", shape_str(b.shape()),
           "); convert one with .to(dtype)");
  MU_CHECK(a.device() == b.device(), op, ": device mismatch: ", a.device().str(), " vs ", b.device().str());
}

// y = f(x), same dtype as x; float32/float64 only.
template <class F>
Tensor map_float(const Tensor& x, const char* op, F f) {
  require_cpu(x, op);
  Tensor out = empty(x.shape(), x.dtype());
  MU_DISPATCH_FLOAT(x.dtype(), op, [&] { cpu::map1<scalar_t, scalar_t>(out, x, f); });
  return out;
}

// y = f(x), same dtype as x; float32/float64/int64.
template <class F>
Tensor map_numeric(const Tensor& x, const char* op, F f) {
  require_cpu(x, op);
  Tensor out = empty(x.shape(), x.dtype());
  MU_DISPATCH_NUMERIC(x.dtype(), op, [&] { cpu::map1<scalar_t, scalar_t>(out, x, f); });
  return out;
}

// z = f(a, b) broadcast, same dtype as the operands (which must agree).
template <class F>
Tensor zip_numeric(const Tensor& a, const Tensor& b, const char* op, F f) {
  require_same(a, b, op);
  require_cpu(a, op);
  Tensor out = empty(broadcast_shapes(a.shape(), b.shape(), op), a.dtype());
  MU_DISPATCH_NUMERIC(a.dtype(), op, [&] { cpu::map2<scalar_t, scalar_t, scalar_t>(out, a, b, f); });
  return out;
}

template <class F>
Tensor zip_float(const Tensor& a, const Tensor& b, const char* op, F f) {
  require_same(a, b, op);
  require_cpu(a, op);
  Tensor out = empty(broadcast_shapes(a.shape(), b.shape(), op), a.dtype());
  MU_DISPATCH_FLOAT(a.dtype(), op, [&] { cpu::map2<scalar_t, scalar_t, scalar_t>(out, a, b, f); });
  return out;
}

// w = f(a, b, c) broadcast, all three float of one dtype.
template <class F>
Tensor zip3_float(const Tensor& a, const Tensor& b, const Tensor& c, const char* op, F f) {
  require_same(a, b, op);
  require_same(a, c, op);
  require_cpu(a, op);
  Shape s = broadcast_shapes(broadcast_shapes(a.shape(), b.shape(), op), c.shape(), op);
  Tensor out = empty(s, a.dtype());
  MU_DISPATCH_FLOAT(a.dtype(), op, [&] { cpu::map3<scalar_t, scalar_t, scalar_t, scalar_t>(out, a, b, c, f); });
  return out;
}

// bool result of a comparison f(a, b), broadcast.
template <class F>
Tensor compare(const Tensor& a, const Tensor& b, const char* op, F f) {
  require_same(a, b, op);
  require_cpu(a, op);
  Tensor out = empty(broadcast_shapes(a.shape(), b.shape(), op), kBool);
  MU_DISPATCH_ALL(a.dtype(), op, [&] { cpu::map2<bool, scalar_t, scalar_t>(out, a, b, f); });
  return out;
}

// A 0-dim tensor holding `v` in t's dtype, for tensor-scalar arithmetic.
inline Tensor scalar_like(const Tensor& t, double v, const char* op) {
  MU_CHECK(t.is_floating_point() || v == double(int64_t(v)), op, ": scalar ", v,
           " is not an integer but the tensor is ", dtype_name(t.dtype()), "; convert it with .to(kFloat32)");
  return full({}, v, TensorOptions(t.dtype()).device(t.device()));
}

}  // namespace mu::detail
