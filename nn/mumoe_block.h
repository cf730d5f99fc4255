// nn::MuMoE: a μMoE block, the module models use. It owns the gating (one matrix G_e of
// shape (in, N_e) per expert level, initialised to zeros), the normalisation and
// activation of the gating logits, and one or two μMoE layers of a chosen factorization:
//
//   a_e = φ(norm_e(x G_e))                       e = 1..E, computed from the raw input x
//   y   = L(LN(x), a)                            one layer          (hidden = 0)
//   y   = L₂(GELU(L₁(LN(x), a)), a)              two layers sharing a (hidden = H > 0)
//
// LN is an optional input LayerNorm with affine parameters. The two-layer form is the
// MLP replacement of the GPT-2 and MLP-Mixer experiments; the one-layer form is the
// final-layer μMoE of the CLIP experiments.
//
//   auto head = std::make_shared<nn::MuMoE>(nn::MuMoEOptions(768, 1000).experts({128})
//                   .kind(nn::MoEKind::CP).rank(512).gate_norm(nn::GateNorm::BatchNorm));
//   auto mlp = std::make_shared<nn::MuMoE>(nn::MuMoEOptions(768, 768).hidden(3072)
//                   .experts({256}).kind(nn::MoEKind::TR).ranks({4, 4, 149})
//                   .gate_norm(nn::GateNorm::LayerNorm).input_norm(true));
//
// Input (..., in) of any leading shape; each leading position is one token. Batch-norm
// gating normalises each level's N_e logits over all leading positions of the batch.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nn/mumoe_layer.h"
#include "nn/norm.h"

namespace mu::nn {

// The factorization of the weight tensor (nn/mumoe_layer.h).
enum class MoEKind { CP, TR, TT, Tucker, Hadamard, Dense };
// Normalisation of the gating logits, without affine parameters.
enum class GateNorm { None, BatchNorm, LayerNorm };
// Map from normalised logits to expert coefficients, along the expert dim.
enum class GateActivation { Entmax15, Softmax, Sparsemax };

const char* to_string(MoEKind kind);
const char* to_string(GateNorm norm);
const char* to_string(GateActivation activation);

struct MuMoEOptions {
  MuMoEOptions(int64_t in, int64_t out) : in_(in), out_(out) {}
  // Experts per level, N_1..N_E (E >= 1 levels).
  MuMoEOptions& experts(std::vector<int64_t> n) { experts_ = std::move(n); return *this; }
  MuMoEOptions& kind(MoEKind k) { kind_ = k; return *this; }
  // CP: the rank R. TR and TT without ranks(): the last rank, the others 4 (the papers' choice).
  MuMoEOptions& rank(int64_t r) { rank_ = r; return *this; }
  // TR: (R_1, ..., R_{E+2}); TT: (R_2, ..., R_{E+2}); Tucker: (R_{N_1}, ..., R_{N_E}, R_I, R_O).
  MuMoEOptions& ranks(std::vector<int64_t> r) { ranks_ = std::move(r); return *this; }
  // A per-expert bias, folded in as an extra input row of every layer.
  MuMoEOptions& bias(bool b) { bias_ = b; return *this; }
  MuMoEOptions& gate_norm(GateNorm n) { gate_norm_ = n; return *this; }
  MuMoEOptions& activation(GateActivation a) { activation_ = a; return *this; }
  // eps of the gating normalisation; momentum of its running statistics (batch norm only).
  MuMoEOptions& gate_eps(double e) { gate_eps_ = e; return *this; }
  MuMoEOptions& gate_momentum(std::optional<double> m) { gate_momentum_ = m; return *this; }
  // A LayerNorm with affine parameters on the layers' input (not on the gating's).
  MuMoEOptions& input_norm(bool on) { input_norm_ = on; return *this; }
  // 0: one layer in -> out. H > 0: in -> H, GELU, H -> out, both layers sharing the coefficients.
  MuMoEOptions& hidden(int64_t h) { hidden_ = h; return *this; }
  // "none" (exact GELU, as torch_reference.py's block) or "tanh".
  MuMoEOptions& gelu_approximate(std::string a) { gelu_approximate_ = std::move(a); return *this; }
  // Standard deviation of a normal draw for the gates of levels past the first (0: zeros,
  // the paper's). With the paper's initialisation those levels start with identical experts
  // and uniform coefficients, get no gate gradient and identical expert updates, and so
  // never learn; a small value (0.01) lets them. Drawn after the factors, from generator().
  MuMoEOptions& further_gate_std(double s) { further_gate_std_ = s; return *this; }
  double further_gate_std() const { return further_gate_std_; }
  // The generator the layers' factors are drawn from (null: the global one). Not owned.
  MuMoEOptions& generator(Generator* g) { generator_ = g; return *this; }
  Generator* generator() const { return generator_; }
  // CP layers run the fused kernel (CPMuMoE::set_fused); off by default. Other kinds ignore it.
  MuMoEOptions& fused_cp(bool on) { fused_cp_ = on; return *this; }
  bool fused_cp() const { return fused_cp_; }
  // TR and TT layers form their ring product inside the output GEMM (TRMuMoE::set_fused);
  // off by default. Other kinds ignore it.
  MuMoEOptions& fused_tr(bool on) { fused_tr_ = on; return *this; }
  bool fused_tr() const { return fused_tr_; }

  int64_t in() const { return in_; }
  int64_t out() const { return out_; }
  const std::vector<int64_t>& experts() const { return experts_; }
  MoEKind kind() const { return kind_; }
  int64_t rank() const { return rank_; }
  const std::vector<int64_t>& ranks() const { return ranks_; }
  bool bias() const { return bias_; }
  GateNorm gate_norm() const { return gate_norm_; }
  GateActivation activation() const { return activation_; }
  double gate_eps() const { return gate_eps_; }
  std::optional<double> gate_momentum() const { return gate_momentum_; }
  bool input_norm() const { return input_norm_; }
  int64_t hidden() const { return hidden_; }
  const std::string& gelu_approximate() const { return gelu_approximate_; }

  // The (in, out) shape of layer `index` (0, or 0 and 1 with a hidden layer).
  MoEShape layer_shape(int64_t index) const;
  int64_t num_layers() const { return hidden_ > 0 ? 2 : 1; }
  // The ranks handed to the TR / TT / Tucker constructors: ranks(), or the default built from rank().
  std::vector<int64_t> resolved_ranks() const;
  // Refuses, with a message naming the option, settings no block can be built from.
  void validate() const;

 private:
  int64_t in_, out_;
  std::vector<int64_t> experts_;
  MoEKind kind_ = MoEKind::CP;
  int64_t rank_ = 0;
  std::vector<int64_t> ranks_;
  bool bias_ = true;
  bool fused_cp_ = false;
  bool fused_tr_ = false;
  GateNorm gate_norm_ = GateNorm::BatchNorm;
  GateActivation activation_ = GateActivation::Entmax15;
  double gate_eps_ = 1e-5;
  std::optional<double> gate_momentum_ = 0.1;
  bool input_norm_ = false;
  int64_t hidden_ = 0;
  std::string gelu_approximate_ = "none";
  double further_gate_std_ = 0.0;
  Generator* generator_ = nullptr;
};

// A μMoE layer of the options' kind and ranks with the given shape.
std::shared_ptr<MuMoELayer> make_mumoe_layer(const MuMoEOptions& options, const MoEShape& shape);
// Parameters of that layer, from shapes alone (nothing is allocated).
int64_t count_layer_parameters(const MuMoEOptions& options, const MoEShape& shape);

class MuMoE : public UnaryModule {
 public:
  explicit MuMoE(const MuMoEOptions& options);

  // x (..., in) -> (..., out). Keeps a detached copy of the coefficients (last_coefficients).
  Tensor forward(const Tensor& x) override;

  // The gating alone: a_e = φ(norm_e(x G_e)), one (..., N_e) tensor per level. In training
  // mode batch-norm gating uses (and updates the running statistics with) this batch.
  std::vector<Tensor> coefficients(const Tensor& x);
  // The expert computation for given coefficients: L(LN(x), a) or L₂(GELU(L₁(LN(x), a)), a).
  Tensor forward_with(const Tensor& x, const std::vector<Tensor>& a);
  // The two pieces between the layers, for passes that call the layers themselves
  // (expert analysis): the first layer's input LN(x), and the hidden activation GELU(h).
  Tensor layer_input(const Tensor& x);
  Tensor hidden_activation(const Tensor& h) const;

  // Detached copies of the coefficients of the last forward(), one (..., N_e) per level;
  // empty before the first forward.
  const std::vector<Tensor>& last_coefficients() const { return last_coefficients_; }

  int64_t num_layers() const { return int64_t(layers_.size()); }
  std::shared_ptr<MuMoELayer> layer(int64_t index) const;
  // G_e, shape (in, N_e).
  const Tensor& gate(int64_t level) const;
  int64_t levels() const { return int64_t(gates_.size()); }
  const MuMoEOptions& options() const { return options_; }

  // Multiply-adds per token: the gating products x G_e plus every layer's factorized
  // forward pass (normalisations and activations are not counted).
  int64_t flops_per_token() const;
  // num_parameters() of a block built from these options, computed from shapes alone, so
  // it also serves configurations too large to allocate (e.g. dense MoE blocks).
  static int64_t count_parameters(const MuMoEOptions& options);

  std::string extra_repr() const override;

 private:
  MuMoEOptions options_;
  std::vector<Tensor> gates_;
  std::vector<std::shared_ptr<UnaryModule>> gate_norms_;  // empty with GateNorm::None
  std::shared_ptr<LayerNorm> input_norm_;                  // null without input_norm
  std::vector<std::shared_ptr<MuMoELayer>> layers_;
  std::vector<Tensor> last_coefficients_;
};

}  // namespace mu::nn
