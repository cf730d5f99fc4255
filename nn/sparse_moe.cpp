#include "nn/sparse_moe.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "autograd/activation_checkpoint.h"
#include "autograd/grad_mode.h"
#include "ops/ops.h"

namespace mu::nn {

const char* to_string(Selection s) {
  switch (s) {
    case Selection::Sigmoid: return "sigmoid";
    case Selection::Softmax: return "softmax";
    case Selection::SoftmaxRenorm: return "softmax-renorm";
    case Selection::Switch: return "switch";
    case Selection::NoisyTopK: return "noisy-top-k";
    case Selection::SBase: return "s-base";
  }
  return "?";
}

void SparseMoEOptions::validate() const {
  MU_CHECK(d_model_ > 0, "SparseMoE: d_model must be positive, got ", d_model_);
  MU_CHECK(experts_ > 0, "SparseMoE: experts must be positive, got ", experts_);
  MU_CHECK(expert_size_ > 0, "SparseMoE: expert_size must be positive, got ", expert_size_);
  MU_CHECK(k_ >= 1 && k_ <= experts_, "SparseMoE: k must be between 1 and experts = ", experts_, ", got ", k_);
  MU_CHECK(expert_dropout_ >= 0 && expert_dropout_ < 1, "SparseMoE: expert_dropout must be in [0, 1), got ",
           expert_dropout_);
  // Switch and NoisyTopK balance their experts with their own losses (and noise); the
  // σ-MoE paper gives them no expert dropout.
  MU_CHECK(expert_dropout_ == 0 || (selection_ != Selection::Switch && selection_ != Selection::NoisyTopK),
           "SparseMoE: expert_dropout applies to the sigmoid, softmax, softmax-renorm and s-base selections, not ",
           to_string(selection_));
  MU_CHECK(hidden_dropout_ >= 0 && hidden_dropout_ < 1, "SparseMoE: hidden_dropout must be in [0, 1), got ",
           hidden_dropout_);
  MU_CHECK(std::isfinite(entropy_weight_) && entropy_weight_ >= 0,
           "SparseMoE: entropy_weight must be finite and non-negative, got ", entropy_weight_);
  MU_CHECK(std::isfinite(balance_weight_) && balance_weight_ >= 0,
           "SparseMoE: balance_weight must be finite and non-negative, got ", balance_weight_);
  MU_CHECK(std::isfinite(capacity_factor_) && capacity_factor_ >= 0,
           "SparseMoE: capacity_factor must be finite and non-negative, got ", capacity_factor_);
  MU_CHECK(capacity_factor_ == 0 || selection_ == Selection::Switch,
           "SparseMoE: capacity_factor applies to the switch selection, not ", to_string(selection_));
  MU_CHECK(sinkhorn_iterations_ >= 1, "SparseMoE: sinkhorn_iterations must be at least 1, got ", sinkhorn_iterations_);
  MU_CHECK(n_layers_ >= 1, "SparseMoE: n_layers must be at least 1, got ", n_layers_);
}

SparseMoEOptions sigma_moe_options(int64_t d_model, int64_t experts, int64_t expert_size, int64_t k,
                                   double expert_dropout, double entropy_weight) {
  return SparseMoEOptions(d_model, experts, expert_size)
      .k(k)
      .selection(Selection::Sigmoid)
      .expert_dropout(expert_dropout)
      .entropy_weight(entropy_weight)
      .init(ExpertInit::Dense);
}

namespace {

// log Σ exp(x) along dim, kept; the max is taken out first so nothing overflows.
Tensor logsumexp(const Tensor& x, int64_t dim) {
  Tensor m = amax(x, {dim}, true).detach();
  return m + log(sum(exp(x - m), {dim}, true));
}

// softplus(x) = log(1 + e^x), written so that neither branch overflows.
Tensor softplus(const Tensor& x) { return relu(x) + log(exp(-abs(x)) + 1.0); }

// Host int64 values as a 1-D tensor on `dev`.
Tensor index_tensor(const std::vector<int64_t>& v, Device dev) {
  return from_vector(v, {int64_t(v.size())}).to(dev);
}

}  // namespace

SparseMoE::SparseMoE(const SparseMoEOptions& o) : UnaryModule("SparseMoE"), options_(o) {
  o.validate();
  const int64_t d = o.d_model(), N = o.experts(), G = o.expert_size();
  const double L = double(o.n_layers());
  // σ-MoE's initialisation: the dense MLP's deviations, from d_model and d_ff = N_E · G
  // (or, per expert, from G), scaled by the layer count.
  const double std1 = std::sqrt(2.0 / (double(d) * L));
  const double std2 = std::sqrt(2.0 / (double(o.init() == ExpertInit::Dense ? N * G : G) * L));
  Generator* gen = o.generator();
  NoGradGuard no_grad;
  w1 = register_parameter("w1", randn({N, d, G}, {}, gen) * std1);
  w2 = register_parameter("w2", randn({N, G, d}, {}, gen) * std2);
  // Selection: each expert's selector (a column) of unit norm, so that initially only the
  // angle to x sets its score; then every entry scaled to deviation std1. A unit column of
  // d entries has mean square 1/d, so the scale is std1 · sqrt(d), the same for all columns.
  Tensor s = randn({d, N}, {}, gen);
  s = s / sqrt(sum(s * s, {0}, true)) * (std1 * std::sqrt(double(d)));
  selector = register_parameter("selector", s);
  // Shazeer et al. start the noise at zero (softplus(0) · ε, the same for all experts).
  if (o.selection() == Selection::NoisyTopK) noise_w = register_parameter("noise_w", zeros({d, N}));
  routing_gen_.manual_seed((gen ? *gen : default_generator()).lock().next_u64());
  options_.generator(nullptr);  // not owned: a generator gone later must not be reached
}

Routing SparseMoE::route(const Tensor& x) {
  const SparseMoEOptions& o = options_;
  MU_CHECK(x.defined() && x.dim() == 2 && x.size(1) == o.d_model(), "SparseMoE::route: expected x of shape (T, ",
           o.d_model(), "), got ", x.defined() ? x.describe() : std::string("an undefined tensor"));
  NoGradGuard no_grad;
  // The selection logits in float32 whatever the autocast dtype: a ranking decided in
  // bfloat16 would tie experts that float32 separates.
  return route_logits(x, matmul(x.detach().to(kFloat32), selector.detach().to(kFloat32)));
}

Routing SparseMoE::route_logits(const Tensor& x, const Tensor& z) {
  const SparseMoEOptions& o = options_;
  NoGradGuard no_grad;
  const int64_t T = x.size(0), N = o.experts(), K = o.k();
  const bool training = is_training();
  Routing r;
  r.tokens = T;
  r.k = K;
  if (T == 0) return r;
  const TensorOptions zo = TensorOptions(kFloat32).device(z.device());
  Tensor score;
  switch (o.selection()) {
    case Selection::Sigmoid:
    case Selection::SBase: score = sigmoid(z); break;
    case Selection::Softmax:
    case Selection::SoftmaxRenorm:
    case Selection::Switch: score = z; break;  // softmax keeps the order of the logits
    case Selection::NoisyTopK:
      score = z;
      if (training) {
        r.noise = randn({T, N}, zo, &routing_gen_);
        score = z + r.noise * softplus(matmul(x.detach().to(kFloat32), noise_w.detach().to(kFloat32)));
      }
      break;
  }
  if (training && o.expert_dropout() > 0) {
    // The counter-based dropout mask (ops/kernels/dropout.h), drawn where z lives: a kept
    // entry is 1 / (1 - δ), a dropped one 0.
    r.keep = ne(dropout(ones({T, N}, zo), o.expert_dropout(), true, &routing_gen_), zeros({}, zo)).to(kFloat32);
    score = masked_fill(score, eq(r.keep, zeros({}, zo)), -std::numeric_limits<double>::infinity());
  }
  if (training && o.hidden_dropout() > 0)  // inverted dropout: kept units carry 1 / (1 - p)
    r.hidden_keep = dropout(ones({T * K, o.expert_size()}, zo), o.hidden_dropout(), true, &routing_gen_);
  if (training && o.selection() == Selection::SBase) {
    // Sinkhorn in the log domain on the logits: rows normalised to sum 1, columns to
    // T / N_E, alternately; the balanced matrix then ranks each token's experts.
    Tensor lp = r.keep.defined() ? masked_fill(z, eq(r.keep, zeros({}, zo)), -std::numeric_limits<double>::infinity())
                                 : z;
    const double log_col = std::log(double(T) / double(N));
    for (int it = 0; it < o.sinkhorn_iterations(); ++it) {
      lp = lp - logsumexp(lp, 1);
      lp = lp - logsumexp(lp, 0) + log_col;
    }
    score = lp;
  }
  ValuesIndices top = topk(score, K, -1);
  r.experts = top.indices.cpu().to_vector<int64_t>();
  // An expert ranked only because fewer than K survived the dropout is not run.
  const std::vector<float> vals = top.values.cpu().to_vector<float>();
  for (size_t i = 0; i < r.experts.size(); ++i)
    if (std::isinf(vals[i]) && vals[i] < 0) r.experts[i] = -1;
  r.first_choice.resize(size_t(T));
  for (int64_t t = 0; t < T; ++t) r.first_choice[size_t(t)] = r.experts[size_t(t * K)];
  if (o.capacity_factor() > 0) {
    // Switch's capacity: the first ceil(μ · T · K / N_E) pairs of each expert, in token
    // order, run; later ones are dropped (the token keeps its residual path only).
    const int64_t cap = int64_t(std::ceil(o.capacity_factor() * double(T) * double(K) / double(N)));
    std::vector<int64_t> used(size_t(N), 0);
    for (int64_t& e : r.experts) {
      if (e < 0) continue;
      if (used[size_t(e)] < cap) {
        ++used[size_t(e)];
      } else {
        e = -1;
        ++r.dropped;
      }
    }
  }
  return r;
}

// The batch's regulariser and mean selection, kept for aux_loss() and the statistics;
// not from a checkpointed region's second run (autograd/activation_checkpoint.h), whose
// graph is thrown away: aux_loss() would keep it, and all it saved, alive until the next
// forward.
void SparseMoE::keep_batch_results(const SparseMoEResult& res) {
  if (autograd::recomputing()) return;
  aux_loss_ = res.aux;
  selection_mean_ = res.selection_mean;
}

Tensor SparseMoE::forward_routed(const Tensor& x, const Routing& r) {
  SparseMoEResult res = apply(options_, x, r, {selector, noise_w, w1, w2});
  keep_batch_results(res);
  return res.y;
}

SparseMoEResult SparseMoE::apply(const SparseMoEOptions& o, const Tensor& x, const Routing& r,
                                 const SparseMoEWeights& wts) {
  MU_CHECK(wts.selector.defined(), "SparseMoE::apply: the selector weight must be given");
  MU_CHECK(x.defined() && x.dim() == 2 && x.size(1) == o.d_model(), "SparseMoE::apply: expected x of shape (T, ",
           o.d_model(), "), got ", x.defined() ? x.describe() : std::string("an undefined tensor"));
  return apply_logits(o, x, matmul(x, wts.selector), r, wts);
}

SparseMoEResult SparseMoE::apply_logits(const SparseMoEOptions& o, const Tensor& x, const Tensor& z, const Routing& r,
                                        const SparseMoEWeights& wts) {
  MU_CHECK(x.defined() && x.dim() == 2 && x.size(1) == o.d_model(), "SparseMoE::forward_routed: expected x of shape (T, ",
           o.d_model(), "), got ", x.defined() ? x.describe() : std::string("an undefined tensor"));
  const int64_t T = x.size(0), N = o.experts(), K = o.k(), d = o.d_model();
  MU_CHECK(r.tokens == T && r.k == K && int64_t(r.experts.size()) == T * K, "SparseMoE::forward_routed: the routing is for ",
           r.tokens, " tokens x ", r.k, " experts (", r.experts.size(), " entries), x has ", T, " tokens and k is ", K);
  MU_CHECK(!r.hidden_keep.defined() || r.hidden_keep.shape() == (Shape{T * K, o.expert_size()}),
           "SparseMoE::forward_routed: the routing's hidden dropout mask has shape ", shape_str(r.hidden_keep.shape()),
           ", expected (", T * K, ", ", o.expert_size(), ")");
  const Device dev = x.device();
  for (size_t i = 0; i < r.experts.size(); ++i)
    MU_CHECK(r.experts[i] >= -1 && r.experts[i] < N, "SparseMoE::forward_routed: routing entry ", i, " names expert ",
             r.experts[i], ", outside [0, ", N, ") (or -1 for dropped)");

  // The selection weights of every expert, then of the chosen ones.
  MU_CHECK(wts.selector.defined() && wts.w1.defined() && wts.w2.defined() &&
               (o.selection() != Selection::NoisyTopK || wts.noise_w.defined()),
           "SparseMoE::apply: every weight of the selection kind must be given");
  Tensor all;
  switch (o.selection()) {
    case Selection::Sigmoid:
    case Selection::SBase: all = sigmoid(z); break;
    case Selection::Softmax:
    case Selection::SoftmaxRenorm:
    case Selection::Switch: all = softmax(z, -1); break;
    case Selection::NoisyTopK:
      all = r.noise.defined() ? z + r.noise.to(z.dtype()) * softplus(matmul(x, wts.noise_w)) : z;
      break;
  }
  if (r.keep.defined()) all = all * r.keep.to(all.dtype());  // expert dropout: no rescaling
  std::vector<int64_t> safe(r.experts.size());
  std::vector<double> valid(r.experts.size());
  for (size_t i = 0; i < r.experts.size(); ++i) {
    safe[i] = std::max<int64_t>(r.experts[i], 0);
    valid[i] = r.experts[i] >= 0 ? 1.0 : 0.0;
  }
  const Tensor chosen = from_vector(safe, {T, K}).to(dev);
  // The routing's indices were checked above (and token_of, pair_of are built from them):
  // gathered without copying them back to the host for a second check.
  Tensor w = detail::gather_in_range(all, 1, chosen);  // (T, K)
  if (o.selection() == Selection::NoisyTopK) w = softmax(w, -1);  // softmax over the K kept logits
  if (o.selection() == Selection::SoftmaxRenorm) w = w / sum(w, {-1}, true);
  if (r.dropped > 0) w = w * from_vector(valid, {T, K}, TensorOptions(w.dtype())).to(dev);

  // Group the pairs by expert (token order within an expert), one GEMM per expert.
  std::vector<int64_t> offsets(size_t(N) + 1, 0);
  for (int64_t e : r.experts)
    if (e >= 0) ++offsets[size_t(e) + 1];
  for (int64_t e = 0; e < N; ++e) offsets[size_t(e) + 1] += offsets[size_t(e)];
  const int64_t A = offsets[size_t(N)];
  std::vector<int64_t> token_of(static_cast<size_t>(A)), pair_of(static_cast<size_t>(A));
  {
    std::vector<int64_t> at(offsets.begin(), offsets.end() - 1);
    for (int64_t p = 0; p < T * K; ++p) {
      const int64_t e = r.experts[size_t(p)];
      if (e < 0) continue;
      const int64_t slot = at[size_t(e)]++;
      token_of[size_t(slot)] = p / K;
      pair_of[size_t(slot)] = p;
    }
  }
  Tensor y;
  if (A == 0) {
    y = zeros({T, d}, TensorOptions(x.dtype()).device(dev)) + 0.0 * sum(w);  // no expert ran; w stays in the graph
  } else {
    const Tensor tok = index_tensor(token_of, dev), pairs = index_tensor(pair_of, dev);
    const Tensor xs = detail::index_select_in_range(x, 0, tok);         // (A, d)
    Tensor h = relu(grouped_mm(xs, wts.w1, offsets));                   // (A, G)
    if (r.hidden_keep.defined()) h = h * detail::index_select_in_range(r.hidden_keep.to(h.dtype()), 0, pairs);
    Tensor out = grouped_mm(h, wts.w2, offsets);                        // (A, d)
    out = out * detail::index_select_in_range(w.reshape({-1}), 0, pairs).unsqueeze(1);  // weighted
    y = detail::index_add_in_range(zeros({T, d}, TensorOptions(out.dtype()).device(dev)), 0, tok, out);
  }

  // Regularisers, on p = the batch mean of softmax(z) where they need it; in float32 at
  // least (bfloat16 logits under autocast are widened), float64 for a float64 layer.
  const Tensor p = mean(softmax(z.dtype() == kFloat64 ? z : z.to(kFloat32), -1), {0});  // (N)
  Tensor aux;
  auto add = [&](const Tensor& term) { aux = aux.defined() ? aux + term : term; };
  if (o.entropy_weight() > 0) add(sum(p * log(p)) * o.entropy_weight());
  if (o.balance_weight() > 0 && o.selection() == Selection::Switch && T > 0) {
    // N_E Σ_e f_e P_e: f_e the fraction of tokens whose first choice is e (a constant),
    // P_e the mean selection probability.
    std::vector<double> f(size_t(N), 0.0);
    for (int64_t e : r.first_choice)
      if (e >= 0) f[size_t(e)] += 1.0 / double(T);
    add(sum(from_vector(f, {N}, TensorOptions(p.dtype())).to(dev) * p) * (double(N) * o.balance_weight()));
  }
  if (o.balance_weight() > 0 && o.selection() == Selection::NoisyTopK && T > 0) {
    // CV(importance)², importance_e = Σ_x w_e(x) (population variance over the experts).
    const Tensor imp =
        detail::index_add_in_range(zeros({N}, TensorOptions(w.dtype()).device(dev)), 0, chosen.reshape({-1}), w.reshape({-1}));
    const Tensor m = mean(imp);
    add(mean((imp - m) * (imp - m)) / (m * m) * o.balance_weight());
  }
  return {y, aux, p.detach()};
}

Tensor SparseMoE::forward(const Tensor& x) {
  const SparseMoEOptions& o = options_;
  MU_CHECK(x.defined() && x.dim() >= 1 && x.size(-1) == o.d_model(), "SparseMoE: expected input with last dim ",
           o.d_model(), ", got ", x.defined() ? x.describe() : std::string("an undefined tensor"));
  const Tensor x2 = x.reshape({-1, o.d_model()});
  // The logits once, for the router (float32, detached) and the weights (in the graph);
  // under autocast the router gets its own float32 product (see route()).
  const Tensor z = matmul(x2, selector);
  const Routing r = z.dtype() == kFloat32 || z.dtype() == kFloat64 ? route_logits(x2, z.detach().to(kFloat32)) : route(x2);
  SparseMoEResult res = apply_logits(o, x2, z, r, {selector, noise_w, w1, w2});
  keep_batch_results(res);
  const Tensor& y = res.y;
  if (autograd::recomputing()) return y.reshape(x.shape());

  // Statistics of this batch.
  RoutingStats s;
  s.tokens = r.tokens;
  s.dropped = r.dropped;
  s.tokens_per_expert.assign(size_t(o.experts()), 0);
  for (int64_t e : r.experts)
    if (e >= 0) ++s.tokens_per_expert[size_t(e)];
  for (int64_t c : s.tokens_per_expert) s.assignments += c;
  const double mu = double(s.assignments) / double(o.experts());
  double var = 0;
  for (int64_t c : s.tokens_per_expert) var += (double(c) - mu) * (double(c) - mu) / double(o.experts());
  s.load_cv = mu > 0 ? std::sqrt(var) / mu : 0.0;
  if (r.tokens > 0)
    for (float pe : selection_mean_.cpu().to_vector<float>())
      if (pe > 0) s.selection_entropy -= double(pe) * std::log(double(pe));
  stats_ = s;
  return y.reshape(x.shape());
}

int64_t SparseMoE::flops_per_token() const {
  const SparseMoEOptions& o = options_;
  const int64_t selection = o.d_model() * o.experts() * (o.selection() == Selection::NoisyTopK ? 2 : 1);
  return o.k() * 2 * o.d_model() * o.expert_size() + selection;
}

int64_t SparseMoE::dense_flops_per_token() const {
  return 2 * options_.d_model() * options_.experts() * options_.expert_size();
}

int64_t SparseMoE::count_parameters(const SparseMoEOptions& o) {
  o.validate();
  const int64_t selection = o.d_model() * o.experts() * (o.selection() == Selection::NoisyTopK ? 2 : 1);
  return 2 * o.experts() * o.d_model() * o.expert_size() + selection;
}

std::string SparseMoE::extra_repr() const {
  const SparseMoEOptions& o = options_;
  return detail::str("d_model=", o.d_model(), ", experts=", o.experts(), ", expert_size=", o.expert_size(),
                     ", k=", o.k(), ", selection=", to_string(o.selection()));
}

SigmaMoE::SigmaMoE(const SparseMoEOptions& options) : SparseMoE(options) {
  MU_CHECK(options.selection() == Selection::Sigmoid, "SigmaMoE: the selection must be sigmoid, got ",
           to_string(options.selection()), " (use SparseMoE for the other kinds)");
}

}  // namespace mu::nn
