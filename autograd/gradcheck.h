// Finite-difference check of an op's gradient, for op authors:
//
//   auto r = mu::autograd::gradcheck([](const TensorList& in) { return my_op(in[0], in[1]); },
//                                    {x, y});
//   CHECK_MESSAGE(r.ok, r.message);
//
// Inputs are copied to float64 leaves (keeping their strides, so non-contiguous
// layouts are exercised). The output is projected on a fixed random vector v; the
// analytic vector-Jacobian product (one backward pass of v) is compared, element by
// element, with central differences (f(x+eps) - f(x-eps)) · v / (2 eps).
#pragma once
#include <functional>
#include <string>

#include "autograd/node.h"

namespace mu::autograd {

struct GradcheckOptions {
  double eps = 1e-6;
  double atol = 1e-5;
  double rtol = 1e-3;
  uint64_t seed = 0;  // for the projection vector
  // Which inputs to differentiate: empty = every floating-point input.
  std::vector<bool> check_inputs;
};

// Two elements are reported, and the message names both: the worst element, the one
// furthest beyond its tolerance (|analytic - numeric| - (atol + rtol |numeric|), which
// decides `ok`), and the element with the largest |analytic - numeric|. They differ when
// a large error sits on a large derivative (within rtol) and a smaller one on a small
// derivative (beyond atol).
struct GradcheckResult {
  bool ok = true;
  std::string message;      // "gradcheck passed" or "failed", then both elements
  int input = -1;           // worst element: which input,
  std::vector<int64_t> index;  // its multi-index,
  double analytic = 0, numeric = 0;  // both derivatives,
  double excess = 0;        // and its error minus its tolerance (> 0: it fails)
  double max_abs_error = 0;          // the largest |analytic - numeric| over all elements,
  int max_abs_error_input = -1;      // at this input
  std::vector<int64_t> max_abs_error_index;  // and multi-index
};

using GradcheckFn = std::function<Tensor(const TensorList&)>;

GradcheckResult gradcheck(const GradcheckFn& fn, const TensorList& inputs, const GradcheckOptions& options = {});

}  // namespace mu::autograd
