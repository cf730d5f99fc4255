#include "nn/topk_mlp.h"

#include <cmath>

#include "nn/init.h"
#include "ops/ops.h"
#include "tensor/checked.h"

namespace mu::nn {

void TopKMLPOptions::validate() const {
  MU_CHECK(d_model_ > 0 && d_ff_ > 0, "TopKMLP: d_model and d_ff must be positive, got d_model = ", d_model_,
           ", d_ff = ", d_ff_);
  MU_CHECK(k_ >= 1, "TopKMLP: k must be at least 1, got k = ", k_, " (set it with .k(K), 1 <= K <= d_ff = ", d_ff_,
           ")");
  MU_CHECK(k_ <= d_ff_, "TopKMLP: k = ", k_, " exceeds d_ff = ", d_ff_, "; at most d_ff hidden units can be kept");
}

TopKMLP::TopKMLP(const TopKMLPOptions& options) : UnaryModule("TopKMLP"), options_(options) {
  options_.validate();
  const int64_t D = options_.d_model(), F = options_.d_ff();
  keys = register_parameter("keys", empty({F, D}));
  if (options_.bias()) key_bias = register_parameter("key_bias", empty({F}));
  // The values are stored as rows, (d_ff, d_model), not in Linear's (d_model, d_ff)
  // layout: the forward reads K rows per token with embedding(), and its backward adds
  // into those rows alone.
  values = register_parameter("values", empty({F, D}));
  if (options_.bias()) bias = register_parameter("bias", empty({D}));
  reset_parameters();
}

void TopKMLP::reset_parameters() {
  Generator* gen = options_.generator();
  const double b1 = 1 / std::sqrt(double(options_.d_model())), b2 = 1 / std::sqrt(double(options_.d_ff()));
  init::uniform_(keys, -b1, b1, gen);
  if (key_bias.defined()) init::uniform_(key_bias, -b1, b1, gen);
  init::uniform_(values, -b2, b2, gen);
  if (bias.defined()) init::uniform_(bias, -b2, b2, gen);
}

Tensor TopKMLP::forward(const Tensor& x) {
  const int64_t D = options_.d_model(), K = options_.k();
  MU_CHECK(x.defined() && x.dim() >= 1 && x.size(-1) == D, "TopKMLP: expected input (..., ", D, "), got ",
           x.defined() ? x.describe() : std::string("an undefined tensor"));
  Shape lead(x.shape().begin(), x.shape().end() - 1);
  const int64_t M = numel_of(lead);
  Tensor u = matmul(x.reshape({M, D}), keys.t());  // (M, d_ff)
  if (key_bias.defined()) u = u + key_bias;
  // Selecting on the pre-activation and applying ReLU to the K kept scores gives
  // topK(ReLU(u)) (ReLU is monotone) without a ReLU over all d_ff units, and without
  // ties among the zeros of ReLU(u) when fewer than K units are positive.
  auto [top, idx] = topk(u, K, -1);  // (M, K)
  Tensor alpha = relu(top);
  // y_m = Σ_k α_mk v_{idx_mk}: a (1, K) x (K, d_model) product per token.
  Tensor rows = embedding(values, idx);  // (M, K, d_model)
  Tensor y = matmul(alpha.unsqueeze(1), rows).reshape({M, D});
  if (bias.defined()) y = y + bias;
  Shape idx_shape = lead;
  idx_shape.push_back(K);
  last_indices_ = idx.detach().reshape(idx_shape);
  Shape out_shape = lead;
  out_shape.push_back(D);
  return y.reshape(out_shape);
}

int64_t TopKMLP::flops_per_token() const {
  const int64_t D = options_.d_model();
  return checked_add(checked_mul(D, options_.d_ff(), "TopKMLP::flops_per_token"),
                     checked_mul(options_.k(), D, "TopKMLP::flops_per_token"), "TopKMLP::flops_per_token");
}

int64_t TopKMLP::count_parameters(const TopKMLPOptions& o) {
  o.validate();
  const char* op = "TopKMLP::count_parameters";
  // keys and values, d_ff x d_model each, plus b1 (d_ff) and b2 (d_model).
  int64_t n = checked_mul(2, checked_mul(o.d_ff(), o.d_model(), op), op);
  if (o.bias()) n = checked_add(n, checked_add(o.d_ff(), o.d_model(), op), op);
  return n;
}

std::string TopKMLP::extra_repr() const {
  return detail::str("d_model=", options_.d_model(), ", d_ff=", options_.d_ff(), ", k=", options_.k(),
                     ", bias=", options_.bias() ? "true" : "false");
}

}  // namespace mu::nn
