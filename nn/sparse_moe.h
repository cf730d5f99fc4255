// Sparse mixtures of experts replacing a Transformer's two-layer MLP (d_model -> d_ff ->
// d_model), after "Approximating Two-Layer Feedforward Networks for Efficient
// Transformers" (σ-MoE) and the baselines it compares with:
//
//   s   = sel(x)                         selection scores over N_E experts
//   E_x = the K experts chosen for x     (top-K, or a balanced assignment for S-BASE)
//   y   = Σ_{e ∈ E_x} w_e(x) · W2_e ReLU(W1_e x)       each expert a G-wide MLP
//
// Selection kinds (Selection):
//   Sigmoid        σ-MoE: s = σ(W_s x), weights s (no renormalisation), entropy regulariser
//   Softmax        s = softmax(W_s x), weights s
//   SoftmaxRenorm  s = softmax(W_s x), weights renormalised over the K chosen
//   Switch         s = softmax(W_s x), usually K = 1, the load-balancing loss N_E Σ f_e P_e,
//                  an optional capacity of ceil(μ · T · K / N_E) assignments per expert
//                  (later tokens beyond it are dropped and counted)
//   NoisyTopK      logits + N(0, 1) · softplus(W_noise x) in training, weights softmax over
//                  the K kept noisy logits, the importance loss CV(Σ_x w(x))²
//   SBase          weights σ(W_s x); in training the experts come from a Sinkhorn-balanced
//                  assignment (rows sum to 1, columns to T / N_E), in evaluation from top-K
//
// Sparse execution: the chosen (token, expert) pairs are sorted by expert, each expert runs
// one GEMM on its own rows (grouped_mm), and the results are weighted and added back to
// their tokens, so compute grows with K · G, not with N_E (only the N_E-wide selection
// scores grow with N_E).
//
// forward() is route() (discrete, no gradient) then forward_routed() (differentiable in x
// and every parameter for a fixed routing), so a gradient check can hold the selection
// fixed. After each forward, aux_loss() is the weighted regulariser of that batch (a
// scalar in the graph, to be added to the training loss) and routing_stats() what the
// router did.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "nn/module.h"
#include "tensor/random.h"

namespace mu::nn {

enum class Selection { Sigmoid, Softmax, SoftmaxRenorm, Switch, NoisyTopK, SBase };
const char* to_string(Selection s);

// Expert initialisation. Dense: as the dense MLP the layer replaces (σ-MoE: W1 entries
// N(0, sqrt(2 / (d_model · n_layers))), W2 entries N(0, sqrt(2 / (d_ff · n_layers))) with
// d_ff = N_E · G). PerExpert: W2's deviation from each expert's own width G instead of d_ff.
enum class ExpertInit { Dense, PerExpert };

struct SparseMoEOptions {
  SparseMoEOptions(int64_t d_model, int64_t experts, int64_t expert_size)
      : d_model_(d_model), experts_(experts), expert_size_(expert_size) {}
  // Experts per token (the paper's K); Switch and S-BASE are usually run with K = 1.
  SparseMoEOptions& k(int64_t v) { k_ = v; return *this; }
  SparseMoEOptions& selection(Selection s) { selection_ = s; return *this; }
  // Expert dropout δ (training only): each (token, expert) score is zeroed with probability
  // δ before the top-K, without rescaling the others. Sigmoid, Softmax, SoftmaxRenorm and
  // SBase selections (the softmax ones drop after the softmax, as the σ-MoE paper's
  // ablations change only the selection function).
  SparseMoEOptions& expert_dropout(double d) { expert_dropout_ = d; return *this; }
  // Standard dropout p on each expert's hidden units (training only): every hidden value of
  // every (token, expert) pair is zeroed with probability p and the others scaled by
  // 1 / (1 - p). Any selection; the σ-MoE paper's "standard dropout" ablation in place of
  // expert dropout.
  SparseMoEOptions& hidden_dropout(double p) { hidden_dropout_ = p; return *this; }
  // γ of the entropy regulariser Σ_e p_e log p_e, p = batch mean of softmax(W_s x) (any selection).
  SparseMoEOptions& entropy_weight(double g) { entropy_weight_ = g; return *this; }
  // Weight of Switch's load-balancing loss and NoisyTopK's importance loss.
  SparseMoEOptions& balance_weight(double w) { balance_weight_ = w; return *this; }
  // Switch only: μ > 0 limits each expert to ceil(μ · T · K / N_E) assignments; 0: no limit.
  SparseMoEOptions& capacity_factor(double c) { capacity_factor_ = c; return *this; }
  // S-BASE: Sinkhorn iterations of the training-time assignment.
  SparseMoEOptions& sinkhorn_iterations(int n) { sinkhorn_iterations_ = n; return *this; }
  SparseMoEOptions& init(ExpertInit i) { init_ = i; return *this; }
  // The model's layer count, which scales the σ-MoE initialisation.
  SparseMoEOptions& n_layers(int64_t n) { n_layers_ = n; return *this; }
  // The generator the initialisation draws from (null: the global one). The layer's own
  // routing stream (expert dropout, gating noise) is seeded from it at construction, so
  // one seed fixes both; the pointer is not kept.
  SparseMoEOptions& generator(Generator* g) { generator_ = g; return *this; }

  int64_t d_model() const { return d_model_; }
  int64_t experts() const { return experts_; }
  int64_t expert_size() const { return expert_size_; }
  int64_t k() const { return k_; }
  Selection selection() const { return selection_; }
  double expert_dropout() const { return expert_dropout_; }
  double hidden_dropout() const { return hidden_dropout_; }
  double entropy_weight() const { return entropy_weight_; }
  double balance_weight() const { return balance_weight_; }
  double capacity_factor() const { return capacity_factor_; }
  int sinkhorn_iterations() const { return sinkhorn_iterations_; }
  ExpertInit init() const { return init_; }
  int64_t n_layers() const { return n_layers_; }
  Generator* generator() const { return generator_; }
  // Refuses, naming the option and its value, settings no layer can be built from.
  void validate() const;

 private:
  int64_t d_model_, experts_, expert_size_;
  int64_t k_ = 4;
  Selection selection_ = Selection::Sigmoid;
  double expert_dropout_ = 0;
  double hidden_dropout_ = 0;
  double entropy_weight_ = 0;
  double balance_weight_ = 0.01;
  double capacity_factor_ = 0;
  int sinkhorn_iterations_ = 3;
  ExpertInit init_ = ExpertInit::Dense;
  int64_t n_layers_ = 1;
  Generator* generator_ = nullptr;
};

// The router's discrete decisions for one batch of T tokens, held fixed by forward_routed.
struct Routing {
  // experts[t · K + k]: the k-th expert of token t, or -1 where the capacity dropped it.
  std::vector<int64_t> experts;
  int64_t tokens = 0, k = 0;
  // NoisyTopK in training: the N(0, 1) draws (T, N_E) the noisy logits used; else undefined.
  Tensor noise;
  // Expert dropout in training: 1 where kept, 0 where dropped, (T, N_E); else undefined.
  Tensor keep;
  // Hidden dropout in training: the factor of hidden unit g of pair t · K + k, 0 where
  // dropped and 1 / (1 - p) where kept, (T · K, G); else undefined.
  Tensor hidden_keep;
  // Each token's first choice before the capacity (Switch's load-balancing loss counts
  // these), and how many pairs the capacity dropped.
  std::vector<int64_t> first_choice;
  int64_t dropped = 0;
};

// What the router did in the last forward.
struct RoutingStats {
  std::vector<int64_t> tokens_per_expert;  // assignments each expert ran (after the capacity)
  int64_t tokens = 0;                      // tokens routed
  int64_t assignments = 0;                 // (token, expert) pairs run
  int64_t dropped = 0;                     // pairs the capacity dropped
  double load_cv = 0;                      // σ / μ of tokens_per_expert (0: perfectly balanced)
  double selection_entropy = 0;            // entropy (nats) of p = batch mean of softmax(W_s x)
};

// The parameters apply() computes with (noise_w only for NoisyTopK).
struct SparseMoEWeights {
  Tensor selector, noise_w, w1, w2;
};

// What apply() returns: the output, the weighted regulariser (undefined when none) and p,
// the batch mean of softmax(W_s x) (detached), which the statistics report.
struct SparseMoEResult {
  Tensor y, aux, selection_mean;
};

// Modules that contribute a regulariser to the training loss (the model adds it).
class AuxiliaryLoss {
 public:
  virtual ~AuxiliaryLoss() = default;
  // The weighted regulariser of the last forward, a scalar in that forward's graph; an
  // undefined tensor when there is none.
  virtual Tensor aux_loss() const = 0;
};

class SparseMoE : public UnaryModule, public AuxiliaryLoss {
 public:
  explicit SparseMoE(const SparseMoEOptions& options);

  // x (..., d_model) -> (..., d_model); every leading position is one token.
  Tensor forward(const Tensor& x) override;
  // The discrete part: which experts each token of x (T, d_model) runs (in training with
  // the expert dropout, the noise or the balanced assignment of the selection kind).
  Routing route(const Tensor& x);
  // The differentiable part for a fixed routing: y (T, d_model); sets aux_loss().
  Tensor forward_routed(const Tensor& x, const Routing& r);
  // The same as a function of the weights, differentiable in x and each of them: what
  // forward_routed runs with this module's parameters (gradient checks pass their own).
  static SparseMoEResult apply(const SparseMoEOptions& options, const Tensor& x, const Routing& r,
                               const SparseMoEWeights& weights);

  Tensor aux_loss() const override { return aux_loss_; }
  const RoutingStats& routing_stats() const { return stats_; }
  const SparseMoEOptions& options() const { return options_; }
  // Restarts the routing stream (expert dropout, gating noise) at `seed`.
  void manual_seed_routing(uint64_t seed) { routing_gen_.manual_seed(seed); }

  // Multiply-adds per token of the experts (K · 2 · d_model · G) and of the selection
  // (d_model · N_E, twice for NoisyTopK); dense_flops_per_token() is the dense MLP of
  // d_ff = N_E · G the layer stands for (2 · d_model · d_ff).
  int64_t flops_per_token() const;
  int64_t dense_flops_per_token() const;
  static int64_t count_parameters(const SparseMoEOptions& options);

  std::string extra_repr() const override;

  Tensor selector;  // W_s (d_model, N_E)
  Tensor noise_w;   // W_noise (d_model, N_E), NoisyTopK only (zeros at init)
  Tensor w1;        // (N_E, d_model, G)
  Tensor w2;        // (N_E, G, d_model)

 private:
  // route() on given float32 logits z = x W_s (T, N_E), detached.
  Routing route_logits(const Tensor& x, const Tensor& z);
  // apply() on given logits z = x W_s (in the graph).
  static SparseMoEResult apply_logits(const SparseMoEOptions& options, const Tensor& x, const Tensor& z,
                                      const Routing& r, const SparseMoEWeights& weights);
  void keep_batch_results(const SparseMoEResult& res);

  SparseMoEOptions options_;  // its generator cleared after construction
  Generator routing_gen_;
  Tensor aux_loss_;
  Tensor selection_mean_;  // p of the last forward_routed (detached), for the statistics
  RoutingStats stats_;
};

// The options of σ-MoE with the paper's choices: sigmoid selection, K experts of size G,
// expert dropout δ, entropy regularisation γ, the dense-MLP initialisation (with
// selection rows of equal norm, which every SparseMoE gets).
SparseMoEOptions sigma_moe_options(int64_t d_model, int64_t experts, int64_t expert_size, int64_t k = 4,
                                   double expert_dropout = 0.0, double entropy_weight = 0.001);

// σ-MoE: a SparseMoE whose selection is Sigmoid.
//   auto mlp = std::make_shared<nn::SigmaMoE>(nn::sigma_moe_options(768, 16, 128).n_layers(12));
class SigmaMoE : public SparseMoE {
 public:
  explicit SigmaMoE(const SparseMoEOptions& options);
};

}  // namespace mu::nn
