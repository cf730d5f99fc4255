#include "nn/linear.h"

#include <cmath>

#include "autograd/autocast.h"
#include "nn/init.h"
#include "ops/ops.h"

namespace mu::nn {

Linear::Linear(const LinearOptions& options) : UnaryModule("Linear"), options_(options) {
  MU_CHECK(options.in_features() >= 0 && options.out_features() >= 0, "Linear: feature counts must be non-negative, got in_features=",
           options.in_features(), ", out_features=", options.out_features());
  weight = register_parameter("weight", empty({options.out_features(), options.in_features()}));
  if (options.bias()) bias = register_parameter("bias", empty({options.out_features()}));
  reset_parameters();
}

void Linear::reset_parameters() {
  // kaiming_uniform with a = sqrt(5): gain sqrt(1/3), so bound = sqrt(3) * gain / sqrt(in)
  // = 1/sqrt(in), the same bound torch then uses for the bias.
  init::kaiming_uniform_(weight, std::sqrt(5.0));
  // With no inputs the bound 1/sqrt(in) is infinite; torch's bound is then 0, a zero bias.
  if (bias.defined()) {
    double bound = options_.in_features() > 0 ? 1 / std::sqrt(double(options_.in_features())) : 0.0;
    init::uniform_(bias, -bound, bound);
  }
}

Tensor Linear::forward(const Tensor& x) {
  MU_CHECK(x.defined() && x.dim() >= 1 && x.size(-1) == options_.in_features(), "Linear: expected input with last dim ",
           options_.in_features(), ", got ", x.describe());
  // weight.t() is a transposed view: the GEMM reads it in place, nothing is copied. Under
  // autocast the bias is cast to bfloat16 too (as torch's F.linear), so the output stays
  // bfloat16 for the next low-precision op without a float32 round trip; the casts are
  // nodes of the graph, so the gradients arrive in float32.
  return mu::linear(x, weight, bias);
}

std::string Linear::extra_repr() const {
  return detail::str("in_features=", options_.in_features(), ", out_features=", options_.out_features(),
                     ", bias=", options_.bias() ? "true" : "false");
}

}  // namespace mu::nn
