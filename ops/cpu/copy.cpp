// CPU kernels of copies and fills (declared in ops/kernels/copy.h).
#include "ops/cpu/map.h"
#include "ops/kernels/copy.h"

namespace mu::cpu {

// Every pair of dtypes, storage dtypes included: this is where .to() converts them.
static void copy(const Tensor& dst, const Tensor& src) {
  MU_DISPATCH_STORAGE(dst.dtype(), "copy", [&] {
    using TO = scalar_t;
    MU_DISPATCH_STORAGE(src.dtype(), "copy", [&] {
      map_n<TO, scalar_t>(dst, {src}, [](scalar_t v) { return convert_element<TO>(v); });
    });
  });
}

static void fill(const Tensor& dst, double value) {
  MU_DISPATCH_STORAGE(dst.dtype(), "fill_", [&] {
    const scalar_t v = convert_element<scalar_t>(value);
    scalar_t* base = dst.data_ptr<scalar_t>();
    for_each_run<1>(dst.shape(), {dst.strides()}, [&](const auto& off, int64_t n, const auto& st) {
      scalar_t* o = base + off[0];
      for (int64_t i = 0; i < n; ++i) o[i * st[0]] = v;
    });
  });
}

MU_REGISTER_KERNEL(kernels::copy, DeviceType::CPU, copy);
MU_REGISTER_KERNEL(kernels::fill, DeviceType::CPU, fill);

}  // namespace mu::cpu
