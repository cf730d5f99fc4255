#include "nn/pkm.h"

#include <cmath>

#include "nn/init.h"
#include "ops/ops.h"
#include "tensor/checked.h"
#include "tensor/option_checks.h"

namespace mu::nn {

const char* to_string(PKMActivation activation) {
  switch (activation) {
    case PKMActivation::Softmax: return "Softmax";
    case PKMActivation::ReLU: return "ReLU";
  }
  return "?";
}

int64_t PKMOptions::n_values() const { return checked_mul(n_sub_, n_sub_, "PKM: n_values = n_sub²"); }

void PKMOptions::validate() const {
  // An enum read from a file or cast from an integer may hold a value no enumerator has.
  check_enum("PKM", "activation", activation_, PKMActivation::ReLU, "PKMActivation", "Softmax, ReLU");
  MU_CHECK(d_model_ > 0, "PKM: d_model must be positive, got d_model = ", d_model_);
  MU_CHECK(d_model_ % 2 == 0, "PKM: d_model must be even, got d_model = ", d_model_,
           "; the input is split into two halves of d_model/2 that query the two sub-key sets");
  MU_CHECK(n_sub_ > 0, "PKM: n_sub (sub-keys per half) must be positive, got n_sub = ", n_sub_);
  MU_CHECK(heads_ >= 1, "PKM: heads must be at least 1, got heads = ", heads_);
  MU_CHECK(k_ >= 1, "PKM: k must be at least 1, got k = ", k_, " (set it with .k(K), 1 <= K <= n_sub = ", n_sub_, ")");
  MU_CHECK(k_ <= n_sub_, "PKM: k = ", k_, " exceeds n_sub = ", n_sub_,
           "; each half keeps K of its n_sub sub-keys, so K <= n_sub");
  // The value table's size must be representable before anything is allocated.
  checked_mul(n_values(), d_model_, "PKM: the value table, n_sub² x d_model");
}

PKM::PKM(const PKMOptions& options) : UnaryModule("PKM"), options_(options) {
  options_.validate();
  const int64_t H = options_.heads(), n = options_.n_sub(), half = options_.d_model() / 2;
  sub_keys_a = register_parameter("sub_keys_a", empty({H, n, half}));
  sub_keys_b = register_parameter("sub_keys_b", empty({H, n, half}));
  values = register_parameter("values", empty({options_.n_values(), options_.d_model()}));
  reset_parameters();
}

void PKM::reset_parameters() {
  Generator* gen = options_.generator();
  // Sub-keys: std 1/sqrt(d_model). The full key of value i·n_sub + j is the concatenation
  // k_a^i | k_b^j, a d_model-vector of independent N(0, 1/d_model) entries, so each score
  // u_a[i] + u_b[j] has the variance of a LeCun-normal dense first layer (unit variance
  // for unit-variance inputs), whatever n_sub is.
  init::normal_(sub_keys_a, 0.0, 1 / std::sqrt(double(options_.d_model())), gen);
  init::normal_(sub_keys_b, 0.0, 1 / std::sqrt(double(options_.d_model())), gen);
  // Values: std 1/sqrt(K · heads). A dense second layer scales by 1/sqrt(fan-in), the
  // hidden units feeding each output; here only the K · heads kept values are read per
  // token (every other weight is zero), so each output's variance starts at the mean
  // square of the kept weights α, however large the table n_sub² is. With ReLU that is
  // of order one (a few units: the kept scores are the largest of n_sub² unit-variance
  // scores); with softmax, whose weights sum to one per head, it starts smaller.
  // Csordás et al. find the init matters little for PKMs (App. A.3, Tab. 6).
  init::normal_(values, 0.0, 1 / std::sqrt(double(options_.k() * options_.heads())), gen);
}

Tensor PKM::forward(const Tensor& x) {
  const int64_t D = options_.d_model(), half = D / 2, n = options_.n_sub(), H = options_.heads(), K = options_.k();
  MU_CHECK(x.defined() && x.dim() >= 1 && x.size(-1) == D, "PKM: expected input (..., ", D, "), got ",
           x.defined() ? x.describe() : std::string("an undefined tensor"));
  Shape lead(x.shape().begin(), x.shape().end() - 1);
  const int64_t M = numel_of(lead);
  Tensor xf = x.reshape({M, D});
  // Every head's sub-keys in one product per half: (M, d/2) x (d/2, H·n_sub).
  Tensor ua = matmul(xf.narrow(1, 0, half), sub_keys_a.reshape({H * n, half}).t()).reshape({M, H, n});
  Tensor ub = matmul(xf.narrow(1, half, half), sub_keys_b.reshape({H * n, half}).t()).reshape({M, H, n});
  auto [va, ia] = topk(ua, K, -1);  // (M, H, K) each
  auto [vb, ib] = topk(ub, K, -1);
  // The K² candidates per head: scores s[p·K + q] = va[p] + vb[q] and their value
  // indices ia[p]·n_sub + ib[q] (int64 arithmetic, no gradient).
  Tensor cand = (va.unsqueeze(-1) + vb.unsqueeze(-2)).reshape({M, H, K * K});
  Tensor cand_idx = (ia.unsqueeze(-1) * n + ib.unsqueeze(-2)).reshape({M, H, K * K});
  auto [scores, pos] = topk(cand, K, -1);  // (M, H, K)
  Tensor idx = gather(cand_idx, -1, pos);  // (M, H, K) in [0, n_sub²)
  Tensor alpha = options_.activation() == PKMActivation::Softmax ? softmax(scores, -1) : relu(scores);
  // y_m = Σ_{h,k} α_mhk V[idx_mhk]: one (1, H·K) x (H·K, d_model) product per token. The
  // rows are read with embedding(), whose backward adds into the selected rows of V.
  Tensor rows = embedding(values, idx.reshape({M, H * K}));  // (M, H·K, d_model)
  Tensor y = matmul(alpha.reshape({M, 1, H * K}), rows).reshape({M, D});
  Shape idx_shape = lead;
  idx_shape.push_back(H);
  idx_shape.push_back(K);
  last_indices_ = idx.detach().reshape(idx_shape);
  Shape out_shape = lead;
  out_shape.push_back(D);
  return y.reshape(out_shape);
}

int64_t PKM::flops_per_token() const {
  const char* op = "PKM::flops_per_token";
  const int64_t D = options_.d_model(), H = options_.heads();
  // Two halves of n_sub sub-keys of d_model/2 each: n_sub · d_model per head.
  const int64_t scores = checked_mul(H, checked_mul(options_.n_sub(), D, op), op);
  const int64_t reads = checked_mul(H, checked_mul(options_.k(), D, op), op);
  return checked_add(scores, reads, op);
}

int64_t PKM::count_parameters(const PKMOptions& o) {
  o.validate();
  const char* op = "PKM::count_parameters";
  // Sub-keys: 2 halves x heads x n_sub x d_model/2; values: n_sub² x d_model.
  const int64_t keys = checked_mul(o.heads(), checked_mul(o.n_sub(), o.d_model(), op), op);
  return checked_add(keys, checked_mul(o.n_values(), o.d_model(), op), op);
}

std::string PKM::extra_repr() const {
  return detail::str("d_model=", options_.d_model(), ", n_sub=", options_.n_sub(), ", n_values=", n_values(),
                     ", heads=", options_.heads(), ", k=", options_.k(), ", activation=",
                     to_string(options_.activation()));
}

}  // namespace mu::nn
