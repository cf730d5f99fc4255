// Gradient check of a whole tiny GPT-2 in float64: for a few elements of several
// parameters (the tied token table, positions, attention, LayerNorms, the MLP or the μMoE
// block's gating and factors), the backward pass's gradient of the loss equals the central
// difference (L(p + eps) - L(p - eps)) / (2 eps) of the loss itself.
#include "helpers.h"
#include "models/gpt2.h"

using namespace mu;
using models::GPT2;
using models::GPT2Config;

namespace {

void check_model(GPT2Config c, const std::vector<std::string>& names) {
  Generator gen(31);
  manual_seed(32);
  GPT2 model(c, &gen);
  model.to(kFloat64);
  {
    NoGradGuard ng;
    // Away from the zero gating init (sparse, token-dependent coefficients), and LayerNorm
    // gains and biases away from 1 and 0, so each has a gradient of its own character.
    for (auto& [n, p] : model.named_parameters()) {
      const bool is_g = n.size() >= 3 && n.substr(n.size() - 3) == ".G1";
      if (is_g || n.find("ln_") != std::string::npos || n.find("norm") != std::string::npos)
        p.add_(randn(p.shape(), kFloat64, &gen) * 0.5);
    }
  }
  Tensor idx = randint(0, c.vocab_size, {2, 6}, TensorOptions(kInt64), &gen);
  Tensor tgt = randint(0, c.vocab_size, {2, 6}, TensorOptions(kInt64), &gen);
  auto loss = [&] { return model.forward(idx, tgt).loss.item(); };
  model.forward(idx, tgt).loss.backward();
  const nn::StateDict params = model.named_parameters();
  for (const std::string& name : names) {
    Tensor p = nn::find(params, name);
    REQUIRE_MESSAGE(p.defined(), "no parameter " << name);
    Tensor g = p.grad();
    REQUIRE(g.defined());
    // Three elements per parameter, spread over it; at least one must have a gradient.
    int nonzero = 0;
    for (int64_t j = 0; j < 3; ++j) {
      const int64_t f = (j * p.numel()) / 3 + (p.numel() > 3 ? 1 : 0);
      std::vector<int64_t> at = unflat(p.shape(), f);
      const double v = p.at(at), eps = 1e-6;
      double up, down;
      {
        NoGradGuard ng;
        p.set(at, v + eps);
        up = loss();
        p.set(at, v - eps);
        down = loss();
        p.set(at, v);
      }
      const double numeric = (up - down) / (2 * eps), analytic = g.at(at);
      INFO(name << " element " << f << ": analytic " << analytic << ", numeric " << numeric);
      CHECK(std::abs(analytic - numeric) <= 1e-7 + 1e-5 * std::abs(numeric));
      nonzero += std::abs(numeric) > 1e-6;
    }
    CHECK_MESSAGE(nonzero > 0, name << ": the loss does not move with any checked element");
  }
}

}  // namespace

TEST_CASE("gradcheck: tiny GPT-2 with the dense MLP, float64") {
  GPT2Config c;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 8;
  c.block_size = 8;
  c.vocab_size = 13;
  check_model(c, {"transformer.wte.weight", "transformer.wpe.weight", "transformer.h.0.ln_1.weight",
                  "transformer.h.0.attn.c_attn.weight", "transformer.h.0.attn.c_attn.bias",
                  "transformer.h.1.attn.c_proj.weight", "transformer.h.1.ln_2.bias", "transformer.h.0.mlp.c_fc.weight",
                  "transformer.h.1.mlp.c_proj.bias", "transformer.ln_f.weight", "transformer.ln_f.bias"});
}

TEST_CASE("gradcheck: tiny GPT-2 with the CPμMoE and TRμMoE MLPs, float64") {
  GPT2Config c;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 8;
  c.block_size = 8;
  c.vocab_size = 13;
  c.mlp = models::mlp::cp_mumoe(6, 5);
  check_model(c, {"transformer.wte.weight", "transformer.h.0.attn.c_attn.weight", "transformer.h.0.mlp.G1",
                  "transformer.h.1.mlp.G1", "transformer.h.0.mlp.input_norm.weight", "transformer.h.0.mlp.layer1.U1",
                  "transformer.h.0.mlp.layer1.U_in", "transformer.h.1.mlp.layer2.U_out"});
  c.mlp = models::mlp::tr_mumoe(6, 3);
  check_model(c, {"transformer.h.0.mlp.G1", "transformer.h.0.mlp.layer1.U1", "transformer.h.1.mlp.layer2.U_in",
                  "transformer.h.1.mlp.layer2.U_out", "transformer.wpe.weight"});
}
