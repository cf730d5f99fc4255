// nn::PKM: a product-key memory (Lample et al., 2019) as the approximation of a two-layer
// MLP of Csordás et al., "Approximating Two-Layer Feedforward Networks for Efficient
// Transformers" (Sec. 3.2, App. A.3): no query projection and no batch norm, the input
// itself is split into the two halves that query the sub-keys.
//
// Per head h, with x = x_a | x_b (d_model/2 each) and sub-key matrices K_a^h, K_b^h of
// shape (n_sub, d_model/2):
//
//   u_a = K_a^h x_a,  u_b = K_b^h x_b                  (n_sub each)
//   I_a = topK(u_a),  I_b = topK(u_b)                  K sub-keys per half
//   s[i·n_sub + j] = u_a[i] + u_b[j]   for i ∈ I_a, j ∈ I_b     (K² candidates)
//   E^h = topK(s)                                      K of the n_sub² values
//   y = Σ_h Σ_{e ∈ E^h} α_e V[e],   α = softmax(s[E^h]) or ReLU(s[E^h])
//
// V (n_sub², d_model) is the value table shared by the heads. The K² candidates always
// hold the K best of all n_sub² sums u_a[i] + u_b[j], so E^h is the exact top-K of the
// full score vector at the cost of 2·n_sub sub-key products. Value e = i·n_sub + j pairs
// sub-key i of the first half with sub-key j of the second (Lample et al.'s order; Eq. 15
// of Csordás et al. numbers them the other way round, which only permutes V's rows).
//
//   auto pkm = std::make_shared<nn::PKM>(nn::PKMOptions(512, 62).heads(4).k(32));
//
// Input (..., d_model) of any leading shape; each leading position is one token.
#pragma once
#include <string>

#include "nn/module.h"
#include "tensor/random.h"

namespace mu::nn {

// The activation over each head's K kept scores: Softmax is Lample et al.'s, ReLU
// (non-competing, the choice of Csordás et al., Sec. 6.2) the default.
enum class PKMActivation { Softmax, ReLU };
const char* to_string(PKMActivation activation);

struct PKMOptions {
  PKMOptions(int64_t d_model, int64_t n_sub) : d_model_(d_model), n_sub_(n_sub) {}
  PKMOptions& heads(int64_t h) { heads_ = h; return *this; }
  // Sub-keys kept per half and values kept per head, 1 <= K <= n_sub. No default.
  PKMOptions& k(int64_t k) { k_ = k; return *this; }
  PKMOptions& activation(PKMActivation a) { activation_ = a; return *this; }
  // The generator the initial sub-keys and values are drawn from (null: the global one). Not owned.
  PKMOptions& generator(Generator* g) { generator_ = g; return *this; }

  int64_t d_model() const { return d_model_; }
  int64_t n_sub() const { return n_sub_; }
  int64_t heads() const { return heads_; }
  int64_t k() const { return k_; }
  PKMActivation activation() const { return activation_; }
  Generator* generator() const { return generator_; }
  // n_sub², the rows of the value table.
  int64_t n_values() const;

  // Refuses, naming the option and its value, settings no memory can be built from.
  void validate() const;

 private:
  int64_t d_model_, n_sub_;
  int64_t heads_ = 1;
  int64_t k_ = 0;
  PKMActivation activation_ = PKMActivation::ReLU;
  Generator* generator_ = nullptr;
};

class PKM : public UnaryModule {
 public:
  explicit PKM(const PKMOptions& options);

  // x (..., d_model) -> (..., d_model). Keeps a detached copy of the selected value indices.
  Tensor forward(const Tensor& x) override;
  // Sub-keys from N(0, 1/d_model), values from N(0, 1/(K·heads)); see pkm.cpp for why.
  void reset_parameters();

  // The value indices of the last forward(), (..., heads, K) int64 in [0, n_sub²), each
  // head's in decreasing order of score; undefined before the first forward.
  const Tensor& last_indices() const { return last_indices_; }
  int64_t n_values() const { return options_.n_values(); }

  // Multiply-adds per token: the sub-key scores (heads · n_sub · d_model, both halves)
  // plus the values read (heads · K · d_model). The K² candidate additions, the
  // selections and the activation are not counted.
  int64_t flops_per_token() const;
  // num_parameters() of a memory built from these options, from shapes alone.
  static int64_t count_parameters(const PKMOptions& options);

  std::string extra_repr() const override;
  const PKMOptions& options() const { return options_; }

  Tensor sub_keys_a;  // (heads, n_sub, d_model/2): K_a^h, queried by the first half of x
  Tensor sub_keys_b;  // (heads, n_sub, d_model/2): K_b^h, queried by the second half
  Tensor values;      // (n_sub², d_model): V, shared by the heads

 private:
  PKMOptions options_;
  Tensor last_indices_;
};

}  // namespace mu::nn
