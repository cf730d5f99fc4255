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
//
// A layer's parameters are checked too when given (module.to(kFloat64) first):
//
//   auto r = mu::autograd::gradcheck([&](const TensorList& in) { return layer->forward(in[0]); },
//                                    {x}, layer->parameters(), GradcheckOptions{.directions = 4});
//
// Element by element costs two forward passes per element of every input and parameter;
// with `directions` = k it is 2k passes in all (as torch's fast mode), quick for a layer
// of thousands of parameters.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "autograd/node.h"

namespace mu::autograd {

struct GradcheckOptions {
  double eps = 1e-6;
  double atol = 1e-5;
  double rtol = 1e-3;
  uint64_t seed = 0;  // for the projection vector
  // Which inputs to differentiate: empty = every floating-point input.
  std::vector<bool> check_inputs;
  // 0: every element on its own. k > 0: k random directions u, each over every checked
  // input and parameter at once: the backward pass's v·J·u against
  // (f(x + eps u) - f(x - eps u)) · v / (2 eps), with the same tolerance. A wrong gradient
  // passes only if its error is orthogonal to every u (probability 0); the result then
  // names the direction, not an element.
  int directions = 0;
};

// Two elements are reported, and the message names both: the worst element, the one
// furthest beyond its tolerance (|analytic - numeric| - (atol + rtol |numeric|), which
// decides `ok`), and the element with the largest |analytic - numeric|. They differ when
// a large error sits on a large derivative (within rtol) and a smaller one on a small
// derivative (beyond atol).
struct GradcheckResult {
  bool ok = true;
  std::string message;      // "gradcheck passed" or "failed", then both elements
  int input = -1;           // worst element: which input (-1 when it is a parameter's),
  int parameter = -1;       // or which parameter (-1 when it is an input's),
  std::vector<int64_t> index;  // its multi-index,
  int direction = -1;       // with `directions` set: the worst direction (input, parameter and index unset)
  double analytic = 0, numeric = 0;  // both derivatives,
  double excess = 0;        // and its error minus its tolerance (> 0: it fails)
  double max_abs_error = 0;          // the largest |analytic - numeric| over all elements (directions),
  int max_abs_error_input = -1;      // at this input (-1: a parameter's)
  int max_abs_error_parameter = -1;  // or this parameter
  std::vector<int64_t> max_abs_error_index;  // and multi-index
  int max_abs_error_direction = -1;  // or in this direction
};

using GradcheckFn = std::function<Tensor(const TensorList&)>;

GradcheckResult gradcheck(const GradcheckFn& fn, const TensorList& inputs, const GradcheckOptions& options = {});
// The same, differentiating also `parameters`: tensors fn reads without taking them as
// inputs (a module's), each a float64 leaf that requires grad. They are moved in place
// for the differences and put back exactly; their gradients are left as they were.
GradcheckResult gradcheck(const GradcheckFn& fn, const TensorList& inputs, const std::vector<Tensor>& parameters,
                          const GradcheckOptions& options = {});

}  // namespace mu::autograd
