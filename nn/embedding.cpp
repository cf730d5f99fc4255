#include "nn/embedding.h"

#include "nn/init.h"
#include "ops/ops.h"

namespace mu::nn {

Embedding::Embedding(const EmbeddingOptions& options) : UnaryModule("Embedding"), options_(options) {
  MU_CHECK(options.num_embeddings() >= 0 && options.embedding_dim() >= 0,
           "Embedding: sizes must be non-negative, got num_embeddings=", options.num_embeddings(),
           ", embedding_dim=", options.embedding_dim());
  weight = register_parameter("weight", empty({options.num_embeddings(), options.embedding_dim()}));
  reset_parameters();
}

void Embedding::reset_parameters() { init::normal_(weight, 0.0, 1.0); }

Tensor Embedding::forward(const Tensor& ids) {
  MU_CHECK(ids.defined() && ids.dtype() == kInt64, "Embedding: ids must be an int64 tensor, got ", ids.describe());
  // The op checks every id against the table size and names the offending one.
  return embedding(weight, ids);
}

std::string Embedding::extra_repr() const {
  return detail::str(options_.num_embeddings(), ", ", options_.embedding_dim());
}

}  // namespace mu::nn
