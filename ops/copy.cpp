// Copies and conversions: contiguous, clone, to(dtype), to(device), copy_, fill_.
#include "autograd/node.h"
#include "ops/ops.h"
#include "ops/kernels/copy.h"

namespace mu {

using autograd::record;
using autograd::TensorList;


// A dense copy of x with the given dtype, on x's device. No graph.
static Tensor dense_copy(const Tensor& x, DType dtype) {
  Tensor out = empty(x.shape(), TensorOptions(dtype).device(x.device()));
  kernels::copy(x.device(), out, x);
  return out;
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  Tensor out = dense_copy(*this, dtype());
  return record("ContiguousBackward", out, {*this}, [](const Tensor& g) -> TensorList { return {g}; });
}

Tensor Tensor::clone() const {
  Tensor out = dense_copy(*this, dtype());
  return record("CloneBackward", out, {*this}, [](const Tensor& g) -> TensorList { return {g}; });
}

Tensor Tensor::to(DType t) const {
  check_dtype(t, "to");
  if (t == dtype()) return *this;
  Tensor out = dense_copy(*this, t);
  if (!is_floating(t)) return out;  // integer results carry no gradient
  DType from = dtype();
  return record("ToDtypeBackward", out, {*this}, [from](const Tensor& g) -> TensorList { return {g.to(from)}; });
}

Tensor Tensor::to(Device d) const {
  if (d == device()) return *this;
  if (d.is_cuda()) {
    int n = cuda::device_count();
    MU_CHECK(n > 0, "to(", d.str(), "): no CUDA device is available on this machine",
             cuda::is_available() ? "" : " (or this build has no CUDA support)");
  }
  Tensor src = contiguous();
  Tensor out = empty(shape(), TensorOptions(dtype()).device(d));
  cuda::memcpy(out.raw_data(), d, src.raw_data(), src.device(), size_t(numel()) * element_size(dtype()));
  Device from = device();
  return record("ToDeviceBackward", out, {*this}, [from](const Tensor& g) -> TensorList { return {g.to(from)}; });
}

Tensor& Tensor::fill_(double value) {
  check_inplace(*this, "fill_");
  check_value_fits(value, dtype(), "fill_");
  kernels::fill(device(), *this, value);
  bump_version();
  return *this;
}

Tensor& Tensor::copy_(const Tensor& src) {
  check_inplace(*this, "copy_");
  check_distinct_elements(*this, "copy_");
  MU_CHECK(src.device() == device(), "copy_: source on ", src.device().str(), ", destination on ", device().str(),
           "; move the source with .to(device) first");
  MU_CHECK(src.dim() <= dim() && broadcast_shapes(src.shape(), shape(), "copy_") == shape(), "copy_: source of shape ",
           shape_str(src.shape()), " cannot be broadcast to destination shape ", shape_str(shape()));
  // The source may overlap the destination (x.copy_(x.t())): read from a private copy.
  Tensor s = src.storage() == storage() ? dense_copy(src, src.dtype()) : src;
  kernels::copy(device(), *this, s);
  bump_version();
  return *this;
}

}  // namespace mu
