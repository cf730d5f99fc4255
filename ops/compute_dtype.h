// How ops that compute a storage dtype (tensor/dtype.h) get their operands: widened
// exactly to its compute dtype, through the graph, the result rounded back once by the op.
#pragma once
#include "tensor/tensor.h"

namespace mu {

// x in its compute dtype: the 16-bit floats as float32, the narrow integers as int64 (both
// exact), a compute-dtype or undefined tensor as it is. Differentiable (a .to()).
inline Tensor in_compute_dtype(const Tensor& x) {
  if (!x.defined() || is_compute_dtype(x.dtype())) return x;
  return x.to(compute_dtype(x.dtype()));
}

}  // namespace mu
