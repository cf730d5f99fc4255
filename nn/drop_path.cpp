#include "nn/drop_path.h"

#include "ops/ops.h"
#include "tensor/option_checks.h"

namespace mu::nn {

void DropPathOptions::validate() const { check_unit_interval("DropPath", "p", p_); }

DropPath::DropPath(const DropPathOptions& options) : UnaryModule("DropPath"), options_(options) {
  options_.validate();
}

Tensor DropPath::forward(const Tensor& x) {
  MU_CHECK(x.defined() && x.dim() >= 1, "DropPath: expected a tensor with a batch dim, got ",
           x.defined() ? x.describe() : std::string("an undefined tensor"));
  MU_CHECK(x.is_floating_point(), "DropPath: needs a floating-point tensor, got ", dtype_name(x.dtype()));
  if (!is_training() || options_.p() == 0) return x;
  // One draw per sample, broadcast over the rest: dropout of a (B, 1, ..., 1) tensor of
  // ones is exactly the per-sample mask (0 or 1/(1-p)), and x * mask lets autograd derive
  // the gradient (the same mask times the upstream gradient).
  Shape s(size_t(x.dim()), 1);
  s[0] = x.size(0);
  Tensor mask = dropout(ones(s, TensorOptions(x.dtype()).device(x.device())), options_.p(), true, options_.generator());
  return x * mask;
}

std::string DropPath::extra_repr() const { return detail::str("p=", options_.p()); }

}  // namespace mu::nn
