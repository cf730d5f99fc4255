// Expert analysis of μMoE blocks (μMoE paper, Sections 4.1-4.2):
//
// - counterfactual passes: the block's output had one expert (or one combination of
//   experts across levels) not contributed, every other part of the pass unchanged. They
//   run in factorized form and equal zeroing that slice of the materialised weight
//   tensor(s); a two-layer block loses the expert in both layers.
// - expert re-writing (Eq. 5): y_o += λ āᵀa on chosen output heads o, with ā the mean
//   coefficients of a target subpopulation and a the input's coefficients.
// - coefficient statistics over a dataset: each expert's top-k activating inputs and the
//   mean coefficient of each expert per class label.
//
//   block->eval();
//   Tensor y_ablated = nn::forward_without_expert(*block, x, /*level=*/0, /*expert=*/17);
//   nn::CoefficientCollector stats({128}, /*top_k=*/16, /*num_classes=*/10);
//   for (auto& [x, idx, label] : batches) stats.add(*block, x, idx, label);
//   auto best = stats.top_k(0, 17);             // (dataset index, position, coefficient)
//   Tensor per_class = stats.class_means(0);    // (10, 128)
#pragma once
#include <optional>
#include <vector>

#include "nn/mumoe_block.h"

namespace mu::nn {

// ---------------------------------------------------------------- counterfactuals

// The block's output for x with expert n of level `level` (0-based) removed from every layer.
Tensor forward_without_expert(MuMoE& block, const Tensor& x, int64_t level, int64_t n);
// The block's output for x with the expert combination (n_1, ..., n_E) removed from every layer.
Tensor forward_without_combination(MuMoE& block, const Tensor& x, const std::vector<int64_t>& index);

// ---------------------------------------------------------------- re-writing (Eq. 5)

// ā: the mean over positions of the combined coefficients a_1 ⊗ ... ⊗ a_E, shape
// (N_1, ..., N_E) (for one level, the mean coefficient vector). Each a_e is (..., N_e) with
// the same leading dims; `mask` (those leading dims, any dtype, nonzero = member) picks the
// subpopulation, all positions when undefined.
Tensor mean_coefficients(const std::vector<Tensor>& a, const Tensor& mask = Tensor());
// λ āᵀa at every position: Σ_{n_1..n_E} ā[n_1, ..., n_E] a_1[n_1] ⋯ a_E[n_E], times λ.
// Shape: the coefficients' leading dims.
Tensor rewrite_term(const std::vector<Tensor>& a, const Tensor& mean, double lambda);
// The block's output with λ āᵀa added to each output head in `heads`. λ defaults to the
// total number of experts N_1 ⋯ N_E (the paper's choice); its sign sets the direction.
Tensor forward_with_rewrite(MuMoE& block, const Tensor& x, const Tensor& mean, const std::vector<int64_t>& heads,
                            std::optional<double> lambda = std::nullopt);

// ---------------------------------------------------------------- statistics over a dataset

// One position of one input where an expert's coefficient was high.
struct ExpertActivation {
  int64_t index = 0;     // the input's dataset index
  int64_t position = 0;  // the token within the input (row-major over its leading dims; 0 for (B, N) input)
  double coefficient = 0;
};

// Accumulates the coefficients of batches of inputs: keeps, for every expert of every
// level, the k positions with the highest coefficient, and per class label the sum of
// each expert's coefficients. Coefficients are read as float64 on the CPU.
class CoefficientCollector {
 public:
  // experts: N_e per level; top_k: positions kept per expert; num_classes: 0 when no labels are given.
  CoefficientCollector(std::vector<int64_t> experts, int64_t top_k, int64_t num_classes = 0);

  // a: one (B, ..., N_e) tensor per level (a block's last_coefficients()); indices: (B)
  // integer dataset indices; labels: (B) integers in [0, num_classes), required when
  // num_classes > 0. Every position of input b counts under its label.
  void add(const std::vector<Tensor>& a, const Tensor& indices, const Tensor& labels = Tensor());
  // Computes the block's coefficients for x (without recording a graph) and adds them.
  void add(MuMoE& block, const Tensor& x, const Tensor& indices, const Tensor& labels = Tensor());

  // The top-k positions of expert n at `level`, highest coefficient first (ties: lower
  // dataset index, then lower position, first). Only positive coefficients are kept, so an
  // expert that never fired has fewer than k entries.
  std::vector<ExpertActivation> top_k(int64_t level, int64_t n) const;
  // (num_classes, N_e) float64: mean coefficient of each expert over all positions of the
  // inputs with label c; NaN on a class with no inputs.
  Tensor class_means(int64_t level) const;
  // Inputs seen per class label.
  const std::vector<int64_t>& class_counts() const { return class_inputs_; }
  int64_t inputs_seen() const { return inputs_; }
  int64_t levels() const { return int64_t(experts_.size()); }

 private:
  std::vector<int64_t> experts_;
  int64_t k_;
  int64_t num_classes_;
  int64_t inputs_ = 0;
  // heaps_[e][n]: min-heap (worst on top) of expert n's best positions at level e.
  std::vector<std::vector<std::vector<ExpertActivation>>> heaps_;
  // sums_[e]: (num_classes x N_e) row-major sums of coefficients.
  std::vector<std::vector<double>> sums_;
  std::vector<int64_t> class_inputs_, class_positions_;
};

}  // namespace mu::nn
