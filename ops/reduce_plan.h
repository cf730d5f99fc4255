// Which dims a reduction folds and the shapes that result: computed once by the op
// (ops/reduce.cpp), handed to the reduction kernels of every device.
#pragma once
#include <vector>

#include "tensor/tensor.h"

namespace mu {

struct ReducePlan {
  std::vector<bool> reduced;  // per input dim
  Shape out_shape;            // with keepdim applied as requested
  Shape keep_shape;           // reduced dims as size 1
  int64_t outer = 1;          // number of output elements
  int64_t inner = 1;          // input elements per output element
};

// dims empty = reduce every dim. Throws naming op for out-of-range or repeated dims.
inline ReducePlan plan_reduce(const Tensor& x, const Shape& dims, bool keepdim, const char* op) {
  ReducePlan p;
  int64_t nd = x.dim();
  p.reduced.assign(size_t(nd), dims.empty());
  for (int64_t d : dims) {
    int64_t w = wrap_dim(d, nd, op);
    MU_CHECK(nd == 0 || !p.reduced[size_t(w)], op, ": dimension ", d, " appears more than once in the reduced dims");
    if (nd > 0) p.reduced[size_t(w)] = true;
  }
  for (int64_t d = 0; d < nd; ++d) {
    int64_t s = x.shape()[size_t(d)];
    if (p.reduced[size_t(d)]) {
      p.inner *= s;
      p.keep_shape.push_back(1);
      if (keepdim) p.out_shape.push_back(1);
    } else {
      p.outer *= s;
      p.keep_shape.push_back(s);
      p.out_shape.push_back(s);
    }
  }
  return p;
}

}  // namespace mu
