// ReduceOp::Mean after the sum (internal to dist/): the summed tensor divided by the
// group's size, in its own dtype.
#pragma once
#include "tensor/tensor.h"

namespace mu::dist::detail {

// t /= n in place in t's dtype (ops/elementwise.h's div): float32 and float64 divide in their
// own precision, bfloat16 divides its float value and rounds back once, int64 truncates
// (C++'s division). t is a contiguous CPU tensor of one of those dtypes.
void divide_in_place_cpu(const Tensor& t, int n);

}  // namespace mu::dist::detail
