// Embedding: a table of num_embeddings vectors of size embedding_dim, looked up by
// int64 ids of any shape: (...) -> (..., embedding_dim).
//
//   auto wte = std::make_shared<nn::Embedding>(50257, 768);
#pragma once
#include "nn/module.h"

namespace mu::nn {

struct EmbeddingOptions {
  EmbeddingOptions(int64_t num_embeddings, int64_t embedding_dim)
      : num_embeddings_(num_embeddings), embedding_dim_(embedding_dim) {}
  int64_t num_embeddings() const { return num_embeddings_; }
  int64_t embedding_dim() const { return embedding_dim_; }

 private:
  int64_t num_embeddings_, embedding_dim_;
};

// A UnaryModule, so it can open a Sequential (ids in, vectors out).
class Embedding : public UnaryModule {
 public:
  explicit Embedding(const EmbeddingOptions& options);
  Embedding(int64_t num_embeddings, int64_t embedding_dim) : Embedding(EmbeddingOptions(num_embeddings, embedding_dim)) {}

  // Rows of weight picked by ids (int64, each in [0, num_embeddings)).
  Tensor forward(const Tensor& ids) override;
  // Torch's default: weight from N(0, 1).
  void reset_parameters();
  std::string extra_repr() const override;
  const EmbeddingOptions& options() const { return options_; }

  Tensor weight;  // (num_embeddings, embedding_dim)

 private:
  EmbeddingOptions options_;
};

}  // namespace mu::nn
