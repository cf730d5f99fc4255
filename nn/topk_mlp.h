// nn::TopKMLP: a two-layer MLP whose hidden layer keeps only its K largest units per
// token (the top-K activation of Csordás et al., "Approximating Two-Layer Feedforward
// Networks for Efficient Transformers", Sec. 3.1):
//
//   u = W1 x + b1                       (d_ff)   every key is scored
//   y = Σ_{i ∈ topK(u)} ReLU(u_i) v_i + b2       only K values are read
//
// W1's rows are the keys k_i, W2's columns the values v_i (stored as the rows of
// `values`). The unkept units are zero, so their keys and values get no gradient. A
// drop-in replacement for Linear(d_model, d_ff) → ReLU → Linear(d_ff, d_model); with
// K = d_ff it is that MLP.
//
//   auto mlp = std::make_shared<nn::TopKMLP>(nn::TopKMLPOptions(512, 2048).k(128));
//
// Input (..., d_model) of any leading shape; each leading position is one token.
#pragma once
#include <string>

#include "nn/module.h"
#include "tensor/random.h"

namespace mu::nn {

struct TopKMLPOptions {
  TopKMLPOptions(int64_t d_model, int64_t d_ff) : d_model_(d_model), d_ff_(d_ff) {}
  // Hidden units kept per token, 1 <= K <= d_ff. No default: it is the layer's main knob.
  TopKMLPOptions& k(int64_t k) { k_ = k; return *this; }
  // The biases b1 and b2 of the two layers.
  TopKMLPOptions& bias(bool b) { bias_ = b; return *this; }
  // The generator the initial weights are drawn from (null: the global one). Not owned.
  TopKMLPOptions& generator(Generator* g) { generator_ = g; return *this; }

  int64_t d_model() const { return d_model_; }
  int64_t d_ff() const { return d_ff_; }
  int64_t k() const { return k_; }
  bool bias() const { return bias_; }
  Generator* generator() const { return generator_; }

  // Refuses, naming the option and its value, settings no layer can be built from.
  void validate() const;

 private:
  int64_t d_model_, d_ff_;
  int64_t k_ = 0;
  bool bias_ = true;
  Generator* generator_ = nullptr;
};

class TopKMLP : public UnaryModule {
 public:
  explicit TopKMLP(const TopKMLPOptions& options);

  // x (..., d_model) -> (..., d_model). Keeps a detached copy of the kept units' indices.
  Tensor forward(const Tensor& x) override;
  // As two nn::Linear layers: keys and b1 from U(±1/sqrt(d_model)), values and b2 from
  // U(±1/sqrt(d_ff)), so a TopKMLP starts where the dense MLP it replaces would.
  void reset_parameters();

  // The hidden units kept by the last forward(), (..., K) int64, in decreasing order of
  // their pre-activation; undefined before the first forward.
  const Tensor& last_indices() const { return last_indices_; }

  // Multiply-adds per token: all d_ff keys (d_model · d_ff) plus the K values read
  // (K · d_model). Bias additions, the ReLU and the selection are not counted.
  int64_t flops_per_token() const;
  // num_parameters() of a layer built from these options, from shapes alone.
  static int64_t count_parameters(const TopKMLPOptions& options);

  std::string extra_repr() const override;
  const TopKMLPOptions& options() const { return options_; }

  Tensor keys;      // W1, (d_ff, d_model): row i is key k_i
  Tensor key_bias;  // b1, (d_ff); undefined without bias
  Tensor values;    // W2ᵀ, (d_ff, d_model): row i is value v_i
  Tensor bias;      // b2, (d_model); undefined without bias

 private:
  TopKMLPOptions options_;
  Tensor last_indices_;
};

}  // namespace mu::nn
