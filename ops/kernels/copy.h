// Kernels of copies and fills (ops/copy.cpp).
#pragma once
#include "ops/dispatch.h"
#include "tensor/tensor.h"

namespace mu::kernels {

// dst[i] = src[i] converted to dst's dtype; src broadcast to dst's shape; both on the
// same device, any strides; they do not overlap (the op copies an overlapping source
// first).
MU_DECLARE_KERNEL(copy, void(const Tensor& dst, const Tensor& src));
// Every element of dst (any strides) set to `value` converted to dst's dtype. Writes
// without reading: fresh memory may hold bytes that are no valid value of the type.
MU_DECLARE_KERNEL(fill, void(const Tensor& dst, double value));

}  // namespace mu::kernels
