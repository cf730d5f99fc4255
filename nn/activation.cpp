#include "nn/activation.h"

#include "ops/ops.h"

namespace mu::nn {

Tensor ReLU::forward(const Tensor& x) { return relu(x); }

GELU::GELU(const GELUOptions& options) : UnaryModule("GELU"), options_(options) {
  // Checked here so a typo fails when the model is built, not at its first forward.
  MU_CHECK(options.approximate() == "none" || options.approximate() == "tanh",
           "GELU: approximate must be \"none\" or \"tanh\", got \"", options.approximate(), "\"");
}

Tensor GELU::forward(const Tensor& x) { return gelu(x, options_.approximate()); }

std::string GELU::extra_repr() const { return "approximate=" + options_.approximate(); }

Dropout::Dropout(const DropoutOptions& options) : UnaryModule("Dropout"), options_(options) {
  MU_CHECK(options.p() >= 0 && options.p() <= 1, "Dropout: probability has to be between 0 and 1, got ", options.p());
}

Tensor Dropout::forward(const Tensor& x) { return dropout(x, options_.p(), is_training(), options_.generator()); }

std::string Dropout::extra_repr() const { return detail::str("p=", options_.p()); }

}  // namespace mu::nn
