// sparsemax, entmax15 and entmax_bisect: the ops (checks and autograd) around the fused
// line kernels of ops/kernels/entmax.h, whose exact gradient is one shared kernel.
#include "nn/entmax.h"

#include <cmath>

#include "autograd/autocast.h"
#include "autograd/node.h"
#include "ops/compute_dtype.h"
#include "ops/kernels/entmax.h"

namespace mu::nn {

using autograd::record;
using autograd::save;
using autograd::TensorList;

namespace {

// Shared plumbing: checks, runs the kind's line kernel over every line along `dim`, and
// records the backward with exponent e = 2 - α.
Tensor entmax_op(const Tensor& x_in, int64_t dim, const char* op, const char* node, kernels::EntmaxKind kind,
                 double alpha, int n_iter) {
  const Tensor x = autograd::autocast::to_full(x_in);  // in float32 under autocast
  MU_CHECK(x.is_floating_point(), op, ": needs a floating-point tensor, got ", dtype_name(x.dtype()));
  // The 16-bit floats compute in float32 and round once, as softmax (on every device).
  if (!is_compute_dtype(x.dtype()))
    return entmax_op(in_compute_dtype(x), dim, op, node, kind, alpha, n_iter).to(x.dtype());
  int64_t d = wrap_dim(dim, x.dim(), op);
  auto [outer, n, inner] = line_geometry(x.shape(), d);
  Tensor xc = x.detach().contiguous(), y = empty_like(xc);
  kernels::entmax_forward(x.device(), y, xc, outer, n, inner, kind, alpha, n_iter);
  const double e = 2 - alpha;  // the exponent of the shared backward
  return record(node, y, {x}, [ys = save(y), outer, n, inner, e](const Tensor& g) -> TensorList {
    Tensor gc = g.contiguous(), yv = ys.get(), dx = empty_like(yv);
    kernels::entmax_backward(yv.device(), dx, gc, yv, outer, n, inner, e);
    return {dx};
  });
}

}  // namespace

Tensor sparsemax(const Tensor& x, int64_t dim) {
  return entmax_op(x, dim, "sparsemax", "SparsemaxBackward", kernels::EntmaxKind::Sparsemax, 2.0, 0);
}

Tensor entmax15(const Tensor& x, int64_t dim) {
  return entmax_op(x, dim, "entmax15", "Entmax15Backward", kernels::EntmaxKind::Entmax15, 1.5, 0);
}

Tensor entmax_bisect(const Tensor& x, double alpha, int64_t dim, int n_iter) {
  MU_CHECK(std::isfinite(alpha) && alpha > 1, "entmax_bisect: alpha must be a finite number > 1, got alpha = ", alpha,
           " (alpha = 1 is softmax: use mu::softmax)");
  MU_CHECK(n_iter >= 1, "entmax_bisect: n_iter must be at least 1, got ", n_iter);
  return entmax_op(x, dim, "entmax_bisect", "EntmaxBisectBackward", kernels::EntmaxKind::Bisect, alpha, n_iter);
}

}  // namespace mu::nn
