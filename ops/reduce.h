// Reductions over any set of dims (an empty dims list means all dims), with keepdim.
#pragma once
#include "tensor/tensor.h"

namespace mu {

Tensor sum(const Tensor& x, const Shape& dims = {}, bool keepdim = false);
Tensor mean(const Tensor& x, const Shape& dims = {}, bool keepdim = false);
// Variance with Bessel's correction by default (correction = 1), as torch.var.
Tensor var(const Tensor& x, const Shape& dims = {}, int64_t correction = 1, bool keepdim = false);
Tensor std(const Tensor& x, const Shape& dims = {}, int64_t correction = 1, bool keepdim = false);
// Max/min over dims; the gradient is split evenly among tied maxima (as torch.amax).
Tensor amax(const Tensor& x, const Shape& dims = {}, bool keepdim = false);
Tensor amin(const Tensor& x, const Shape& dims = {}, bool keepdim = false);
// Values and first index of the max/min along one dim, as torch.max(x, dim).
ValuesIndices max(const Tensor& x, int64_t dim, bool keepdim = false);
ValuesIndices min(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor max(const Tensor& x);  // over all elements
Tensor min(const Tensor& x);
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor argmin(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor argmax(const Tensor& x);  // index into the flattened tensor
Tensor argmin(const Tensor& x);

// Sums a broadcast gradient back down to `shape` (the inverse of broadcasting).
Tensor sum_to(const Tensor& x, const Shape& shape);

}  // namespace mu
