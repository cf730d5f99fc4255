#include "nn/mumoe_block.h"

#include "nn/entmax.h"
#include "nn/init.h"
#include "ops/ops.h"
#include "tensor/checked.h"
#include "tensor/option_checks.h"

namespace mu::nn {

const char* to_string(MoEKind kind) {
  switch (kind) {
    case MoEKind::CP: return "CP";
    case MoEKind::TR: return "TR";
    case MoEKind::TT: return "TT";
    case MoEKind::Tucker: return "Tucker";
    case MoEKind::Hadamard: return "Hadamard";
    case MoEKind::Dense: return "Dense";
  }
  return "?";
}

const char* to_string(GateNorm norm) {
  switch (norm) {
    case GateNorm::None: return "None";
    case GateNorm::BatchNorm: return "BatchNorm";
    case GateNorm::LayerNorm: return "LayerNorm";
  }
  return "?";
}

const char* to_string(GateActivation activation) {
  switch (activation) {
    case GateActivation::Entmax15: return "Entmax15";
    case GateActivation::Softmax: return "Softmax";
    case GateActivation::Sparsemax: return "Sparsemax";
  }
  return "?";
}

// ---------------------------------------------------------------- options

MoEShape MuMoEOptions::layer_shape(int64_t index) const {
  MU_CHECK(index >= 0 && index < num_layers(), "MuMoEOptions::layer_shape: layer ", index, " out of range (",
           num_layers(), " layer", num_layers() == 1 ? "" : "s", ")");
  MoEShape s;
  // One layer maps in -> out; two map in -> hidden -> out.
  s.in = index == 0 ? in_ : hidden_;
  s.out = (index == 0 && hidden_ > 0) ? hidden_ : out_;
  s.experts = experts_;
  s.bias = bias_;
  return s;
}

std::vector<int64_t> MuMoEOptions::resolved_ranks() const {
  if (!ranks_.empty()) return ranks_;
  const size_t E = experts_.size();
  // TR: R_1..R_{E+2}; TT drops R_1 (fixed to 1). Every rank but the last is 4, as in the papers.
  if (kind_ == MoEKind::TR || kind_ == MoEKind::TT) {
    if (rank_ <= 0) return {};
    std::vector<int64_t> r(kind_ == MoEKind::TR ? E + 2 : E + 1, 4);
    r.back() = rank_;
    return r;
  }
  return {};
}

void MuMoEOptions::validate() const {
  // An enum read from a file or cast from an integer may hold a value no enumerator has.
  check_enum("MuMoE", "kind", kind_, MoEKind::Dense, "MoEKind", "CP, TR, TT, Tucker, Hadamard, Dense");
  check_enum("MuMoE", "gate_norm", gate_norm_, GateNorm::LayerNorm, "GateNorm", "None, BatchNorm, LayerNorm");
  check_enum("MuMoE", "activation", activation_, GateActivation::Sparsemax, "GateActivation",
             "Entmax15, Softmax, Sparsemax");
  MU_CHECK(in_ > 0 && out_ > 0, "MuMoE: input and output features must be positive, got in=", in_, ", out=", out_);
  MU_CHECK(!experts_.empty(), "MuMoE: set the experts per level, e.g. .experts({128})");
  for (size_t e = 0; e < experts_.size(); ++e)
    MU_CHECK(experts_[e] > 0, "MuMoE: level ", e, " (N_", e + 1, ", gate G", e + 1, ") has ", experts_[e],
             " experts; each level needs at least one");
  MU_CHECK(hidden_ >= 0, "MuMoE: hidden must be 0 (one layer) or positive, got ", hidden_);
  MU_CHECK(gelu_approximate_ == "none" || gelu_approximate_ == "tanh",
           "MuMoE: gelu_approximate must be \"none\" or \"tanh\", got \"", gelu_approximate_, "\"");
  MU_CHECK(gate_eps_ >= 0 && std::isfinite(gate_eps_), "MuMoE: gate_eps must be a finite non-negative number, got ",
           gate_eps_);
  if (gate_momentum_) check_unit_interval("MuMoE", "gate_momentum", *gate_momentum_);
  MU_CHECK(further_gate_std_ >= 0 && std::isfinite(further_gate_std_),
           "MuMoE: further_gate_std must be a finite non-negative number, got ", further_gate_std_);
  const int64_t E = int64_t(experts_.size());
  // .rank(R) is a shorthand (CP's rank; TR's and TT's last rank, the others 4); .ranks()
  // lists them all. Both at once would leave one silently unused.
  MU_CHECK(rank_ == 0 || ranks_.empty(), "MuMoE: set .rank(R) or .ranks({...}), not both (got rank ", rank_,
           " and ranks ", shape_str(ranks_), ")");
  switch (kind_) {
    case MoEKind::CP:
      MU_CHECK(ranks_.empty(), "MuMoE: a CP block has one rank: set .rank(R), not .ranks(", shape_str(ranks_), ")");
      MU_CHECK(rank_ > 0, "MuMoE: a CP block needs .rank(R) with R > 0, got ", rank_);
      break;
    case MoEKind::TR:
    case MoEKind::TT: {
      const int64_t want = kind_ == MoEKind::TR ? E + 2 : E + 1;
      std::vector<int64_t> r = resolved_ranks();
      MU_CHECK(!r.empty(), "MuMoE: a ", to_string(kind_), " block needs .rank(R) (the last rank) or .ranks({...})");
      MU_CHECK(int64_t(r.size()) == want, "MuMoE: a ", to_string(kind_), " block with ", E, " level",
               E == 1 ? "" : "s", " needs ", want, " ranks, got ", shape_str(r));
      break;
    }
    case MoEKind::Tucker:
      MU_CHECK(rank_ == 0, "MuMoE: a Tucker block has one rank per mode: set .ranks({R_N1, ..., R_NE, R_I, R_O}) (",
               E + 2, " entries), not .rank(", rank_, ")");
      MU_CHECK(int64_t(ranks_.size()) == E + 2, "MuMoE: a Tucker block with ", E, " level", E == 1 ? "" : "s",
               " needs .ranks({R_N1, ..., R_NE, R_I, R_O}) with ", E + 2, " entries, got ", shape_str(ranks_));
      break;
    case MoEKind::Hadamard:
    case MoEKind::Dense:
      MU_CHECK(rank_ == 0 && ranks_.empty(), "MuMoE: a ", to_string(kind_), " block has no ranks; remove .rank(", rank_,
               ") / .ranks(", shape_str(ranks_), ")");
      break;
  }
  for (int64_t r : ranks_) MU_CHECK(r > 0, "MuMoE: ranks must be positive, got ", shape_str(ranks_));
}

std::shared_ptr<MuMoELayer> make_mumoe_layer(const MuMoEOptions& o, const MoEShape& shape) {
  switch (o.kind()) {
    case MoEKind::CP: {
      auto l = std::make_shared<CPMuMoE>(shape, o.rank(), o.generator());
      l->set_fused(o.fused_cp());
      return l;
    }
    case MoEKind::TR: {
      auto l = std::make_shared<TRMuMoE>(shape, o.resolved_ranks(), o.generator());
      l->set_fused(o.fused_tr());
      return l;
    }
    case MoEKind::TT: {
      auto l = std::make_shared<TTMuMoE>(shape, o.resolved_ranks(), o.generator());
      l->set_fused(o.fused_tr());
      return l;
    }
    case MoEKind::Tucker: return std::make_shared<TuckerMuMoE>(shape, o.resolved_ranks(), o.generator());
    case MoEKind::Hadamard: return std::make_shared<HadamardMoE>(shape, o.generator());
    case MoEKind::Dense: return std::make_shared<DenseMoE>(shape, o.generator());
  }
  MU_FAIL("make_mumoe_layer: unknown kind");
  return nullptr;
}

int64_t count_layer_parameters(const MuMoEOptions& o, const MoEShape& shape) {
  switch (o.kind()) {
    case MoEKind::CP: return CPMuMoE::count_parameters(shape, o.rank());
    case MoEKind::TR: return TRMuMoE::count_parameters(shape, o.resolved_ranks());
    case MoEKind::TT: {
      // A tensor train is a ring whose closing rank R_1 is 1.
      std::vector<int64_t> r = o.resolved_ranks();
      r.insert(r.begin(), 1);
      return TRMuMoE::count_parameters(shape, r);
    }
    case MoEKind::Tucker: return TuckerMuMoE::count_parameters(shape, o.resolved_ranks());
    case MoEKind::Hadamard: return HadamardMoE::count_parameters(shape);
    case MoEKind::Dense: return DenseMoE::count_parameters(shape);
  }
  MU_FAIL("count_layer_parameters: unknown kind");
  return 0;
}

// ---------------------------------------------------------------- the block

MuMoE::MuMoE(const MuMoEOptions& options) : UnaryModule("MuMoE"), options_(options) {
  options_.validate();
  const int64_t E = int64_t(options_.experts().size());
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = options_.experts()[size_t(e)];
    // Zero gating: every expert gets the same coefficient at initialisation.
    gates_.push_back(register_parameter("G" + std::to_string(e + 1), zeros({options_.in(), n})));
  }
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = options_.experts()[size_t(e)];
    const std::string name = "gate_norm" + std::to_string(e + 1);
    // The gating logits are token-major, experts last: (positions, n) as coefficients()
    // feeds them, and (B, T, n) for any caller that keeps the sequence dim. channels_last
    // normalises each expert's logit over every position in both forms.
    if (options_.gate_norm() == GateNorm::BatchNorm)
      gate_norms_.push_back(register_module(
          name, std::make_shared<BatchNorm1d>(BatchNormOptions(n)
                                                  .affine(false)
                                                  .eps(options_.gate_eps())
                                                  .momentum(options_.gate_momentum())
                                                  .channels_last(true))));
    else if (options_.gate_norm() == GateNorm::LayerNorm)
      gate_norms_.push_back(register_module(
          name, std::make_shared<LayerNorm>(LayerNormOptions({n}).elementwise_affine(false).eps(options_.gate_eps()))));
  }
  if (options_.input_norm())
    input_norm_ = register_module("input_norm", std::make_shared<LayerNorm>(LayerNormOptions({options_.in()})));
  for (int64_t l = 0; l < options_.num_layers(); ++l)
    layers_.push_back(register_module("layer" + std::to_string(l + 1), make_mumoe_layer(options_, options_.layer_shape(l))));
  // After the factors, so that they are the same draws with and without it.
  if (options_.further_gate_std() > 0)
    for (int64_t e = 1; e < E; ++e) init::normal_(gates_[size_t(e)], 0.0, options_.further_gate_std(), options_.generator());
}

std::vector<Tensor> MuMoE::coefficients(const Tensor& x) {
  const int64_t in = options_.in();
  MU_CHECK(x.defined() && x.dim() >= 1 && x.size(-1) == in, "MuMoE: expected input (..., ", in, "), got ",
           x.defined() ? x.describe() : std::string("an undefined tensor"));
  Shape lead(x.shape().begin(), x.shape().end() - 1);
  const int64_t M = numel_of(lead);
  // Every leading position is one row, so batch-norm statistics span all of them.
  Tensor flat = x.reshape({M, in});
  std::vector<Tensor> a;
  for (size_t e = 0; e < gates_.size(); ++e) {
    Tensor logits = flat.matmul(gates_[e]);  // (M, N_e)
    if (!gate_norms_.empty()) logits = gate_norms_[e]->forward(logits);
    Tensor p;
    switch (options_.activation()) {
      case GateActivation::Entmax15: p = entmax15(logits, -1); break;
      case GateActivation::Softmax: p = softmax(logits, -1); break;
      case GateActivation::Sparsemax: p = sparsemax(logits, -1); break;
    }
    Shape shape = lead;
    shape.push_back(gates_[e].size(1));
    a.push_back(p.reshape(shape));
  }
  return a;
}

Tensor MuMoE::layer_input(const Tensor& x) { return input_norm_ ? input_norm_->forward(x) : x; }

Tensor MuMoE::hidden_activation(const Tensor& h) const { return gelu(h, options_.gelu_approximate()); }

Tensor MuMoE::forward_with(const Tensor& x, const std::vector<Tensor>& a) {
  Tensor y = layers_[0]->forward(layer_input(x), a);
  // The second layer reuses the first layer's coefficients: one gating decision per token.
  if (layers_.size() > 1) y = layers_[1]->forward(hidden_activation(y), a);
  return y;
}

Tensor MuMoE::forward(const Tensor& x) {
  std::vector<Tensor> a = coefficients(x);
  last_coefficients_.clear();
  // Copies, so later in-place changes to the graph's tensors cannot alter what analysis reads.
  for (const Tensor& t : a) last_coefficients_.push_back(t.detach().clone());
  return forward_with(x, a);
}

std::shared_ptr<MuMoELayer> MuMoE::layer(int64_t index) const {
  MU_CHECK(index >= 0 && index < num_layers(), "MuMoE::layer: layer ", index, " out of range (", num_layers(),
           " layer", num_layers() == 1 ? "" : "s", "; 0-based: layer(0) is \"layer1\" in the state dict)");
  return layers_[size_t(index)];
}

const Tensor& MuMoE::gate(int64_t level) const {
  MU_CHECK(level >= 0 && level < levels(), "MuMoE::gate: level ", level, " out of range (", levels(), " level",
           levels() == 1 ? "" : "s", "; 0-based: gate(0) is the parameter \"G1\")");
  return gates_[size_t(level)];
}

int64_t MuMoE::flops_per_token() const {
  const char* what = "MuMoE::flops_per_token";
  int64_t n = 0;
  for (int64_t e : options_.experts()) n = checked_add(n, checked_mul(options_.in(), e, what), what);
  for (const auto& l : layers_) n = checked_add(n, l->flops_per_token(), what);
  return n;
}

int64_t MuMoE::count_parameters(const MuMoEOptions& options) {
  const char* what = "MuMoE::count_parameters";
  options.validate();
  int64_t n = 0;
  // The gating matrices.
  for (int64_t e : options.experts()) n = checked_add(n, checked_mul(options.in(), e, what), what);
  // Gate norms have no affine parameters; the input LayerNorm has a weight and a bias.
  if (options.input_norm()) n = checked_add(n, checked_mul(2, options.in(), what), what);
  for (int64_t l = 0; l < options.num_layers(); ++l)
    n = checked_add(n, count_layer_parameters(options, options.layer_shape(l)), what);
  return n;
}

std::string MuMoE::extra_repr() const {
  std::string ex;
  for (int64_t n : options_.experts()) ex += (ex.empty() ? "" : "x") + std::to_string(n);
  std::string r;
  if (options_.kind() == MoEKind::CP) r = ", rank=" + std::to_string(options_.rank());
  if (!options_.resolved_ranks().empty()) r = ", ranks=" + shape_str(options_.resolved_ranks());
  return detail::str("in=", options_.in(), ", out=", options_.out(), ", hidden=", options_.hidden(),
                     ", experts=", ex, ", kind=", to_string(options_.kind()), r,
                     ", gate_norm=", to_string(options_.gate_norm()), ", activation=",
                     to_string(options_.activation()), ", input_norm=", options_.input_norm() ? "true" : "false",
                     options_.further_gate_std() > 0 ? detail::str(", further_gate_std=", options_.further_gate_std())
                                                     : std::string());
}

}  // namespace mu::nn
