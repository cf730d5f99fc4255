// Copies and conversions: contiguous, clone, to(dtype), to(device), copy_, fill_.
#include "autograd/node.h"
#include "ops/ops.h"
#include "ops/pointwise.h"

namespace mu {

using autograd::record;
using autograd::TensorList;

namespace cpu {
// dst[i] = src[i] converted to dst's dtype; src broadcast to dst's shape.
void copy_convert(const Tensor& dst, const Tensor& src) {
  MU_DISPATCH_ALL(dst.dtype(), "copy", [&] {
    using TO = scalar_t;
    MU_DISPATCH_ALL(src.dtype(), "copy", [&] {
      map1<TO, scalar_t>(dst, src, [](scalar_t v) { return static_cast<TO>(v); });
    });
  });
}
}  // namespace cpu

// A dense copy of x with the given dtype, on x's device. No graph.
static Tensor dense_copy(const Tensor& x, DType dtype) {
  Tensor out = empty(x.shape(), TensorOptions(dtype).device(x.device()));
  if (x.device().is_cpu()) {
    cpu::copy_convert(out, x);
  } else {
    MU_CHECK(x.is_contiguous() && dtype == x.dtype(), "copy on ", x.device().str(),
             ": only dense same-dtype copies have a CUDA kernel yet (", x.describe(), " -> ",
             dtype_name(dtype), ")");
    cuda::memcpy(out.raw_data(), out.device(), x.raw_data(), x.device(), size_t(x.numel()) * element_size(dtype));
  }
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
  detail::require_cpu(*this, "fill_");
  MU_DISPATCH_ALL(dtype(), "fill_", [&] {
    // Write-only: fresh memory may hold bytes that are not a valid value of the type.
    const scalar_t v = static_cast<scalar_t>(value);
    scalar_t* base = data_ptr<scalar_t>();
    cpu::for_each_run<1>(shape(), {strides()}, [&](const auto& off, int64_t n, const auto& st) {
      scalar_t* o = base + off[0];
      for (int64_t i = 0; i < n; ++i) o[i * st[0]] = v;
    });
  });
  bump_version();
  return *this;
}

Tensor& Tensor::copy_(const Tensor& src) {
  check_inplace(*this, "copy_");
  detail::require_cpu(*this, "copy_");
  detail::require_cpu(src, "copy_");
  MU_CHECK(src.dim() <= dim() && broadcast_shapes(src.shape(), shape(), "copy_") == shape(), "copy_: source of shape ",
           shape_str(src.shape()), " cannot be broadcast to destination shape ", shape_str(shape()));
  // The source may overlap the destination (x.copy_(x.t())): read from a private copy.
  Tensor s = src.storage() == storage() ? dense_copy(src, src.dtype()) : src;
  cpu::copy_convert(*this, s);
  bump_version();
  return *this;
}

}  // namespace mu
