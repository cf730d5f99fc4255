// Kernels of the reductions (ops/reduce.cpp). Each writes one value per output element
// into the dense `out` of shape plan.out_shape; `x` may have any strides.
#pragma once
#include "ops/dispatch.h"
#include "ops/reduce_plan.h"
#include "tensor/tensor.h"

namespace mu::kernels {

// Sum over the plan's reduced dims. out is x's dtype (int64 for bool x, float32 for the
// 16-bit floats, which are read as they are and summed in float32). float32 sums are
// carried in double.
MU_DECLARE_KERNEL(sum, void(const Tensor& out, const Tensor& x, const ReducePlan& plan));
// The max (take_max) or min of each run, NaN-propagating: a run holding NaN gives NaN.
// Every run is non-empty (the op checks).
MU_DECLARE_KERNEL(extremum, void(const Tensor& out, const Tensor& x, const ReducePlan& plan, bool take_max));
// The int64 position within each run of its first extremum (its first NaN, if any).
MU_DECLARE_KERNEL(arg_extremum, void(const Tensor& out, const Tensor& x, const ReducePlan& plan, bool take_max));

}  // namespace mu::kernels
