#include "models/gpt2.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "autograd/activation_checkpoint.h"
#include "autograd/autocast.h"
#include "autograd/grad_mode.h"
#include "nn/init.h"
#include "ops/ops.h"
#include "tensor/checked.h"
#include "tensor/option_checks.h"

namespace mu::models {

namespace {

constexpr double kLayerNormEps = 1e-5;  // nanoGPT's F.layer_norm(..., 1e-5)
constexpr double kInitStd = 0.02;       // nanoGPT's _init_weights

// nanoGPT's LayerNorm: a weight, and a bias only when the model has biases.
std::shared_ptr<nn::LayerNorm> gpt2_layer_norm(const GPT2Config& c) {
  return std::make_shared<nn::LayerNorm>(nn::LayerNormOptions({c.n_embd}).eps(kLayerNormEps).bias(c.bias));
}

// The keys and values one block's attention has seen, for generate(): (B, n_head,
// block_size, head size) each, allocated on first use in k's dtype and device, positions
// [0, len) filled.
struct KVCache {
  Tensor k, v;
  int64_t len = 0;
};

// One c_attn Linear gives q, k and v; heads attend causally through the fused kernel.
class CausalSelfAttention : public nn::UnaryModule {
 public:
  explicit CausalSelfAttention(const GPT2Config& c)
      : UnaryModule("CausalSelfAttention"), n_head_(c.n_head), block_size_(c.block_size), dropout_(c.dropout) {
    c_attn = register_module("c_attn", std::make_shared<nn::Linear>(c.n_embd, 3 * c.n_embd, c.bias));
    c_proj = register_module("c_proj", std::make_shared<nn::Linear>(c.n_embd, c.n_embd, c.bias));
    resid_dropout = register_module("resid_dropout", std::make_shared<nn::Dropout>(c.dropout));
  }

  Tensor forward(const Tensor& x) override {
    const auto [q, k, v] = heads_of(x);
    return merged(scaled_dot_product_attention(q, k, v, /*causal=*/true, dropout_, is_training()));
  }

  // forward() for generate(), at positions [cache.len, cache.len + T) of x (B, T, C), in
  // eval mode: the new keys and values go into the cache, and the queries attend to every
  // key so far. Two cases only: the whole prompt into an empty cache (causal, the same
  // call as forward()), or one new position, whose query sees every cached key (no mask).
  Tensor forward_cached(const Tensor& x, KVCache& cache) {
    const int64_t B = x.size(0), T = x.size(1), hs = x.size(2) / n_head_;
    MU_CHECK(cache.len == 0 || T == 1, "GPT2: a cached attention step takes one position, got ", T);
    MU_CHECK(cache.len + T <= block_size_, "GPT2: the key-value cache holds block_size = ", block_size_,
             " positions, asked for ", cache.len + T);
    const auto [q, k, v] = heads_of(x);
    if (!cache.k.defined()) {
      const TensorOptions o = TensorOptions(k.dtype()).device(k.device());
      cache.k = empty({B, n_head_, block_size_, hs}, o);
      cache.v = empty({B, n_head_, block_size_, hs}, o);
    }
    cache.k.narrow(2, cache.len, T).copy_(k);
    cache.v.narrow(2, cache.len, T).copy_(v);
    const int64_t seen = cache.len + T;
    Tensor y = cache.len == 0 ? scaled_dot_product_attention(q, k, v, /*causal=*/true, 0.0, false)
                              : scaled_dot_product_attention(q, cache.k.narrow(2, 0, seen),
                                                             cache.v.narrow(2, 0, seen), /*causal=*/false, 0.0, false);
    cache.len = seen;
    return merged(y);
  }

  std::shared_ptr<nn::Linear> c_attn, c_proj;
  std::shared_ptr<nn::Dropout> resid_dropout;

 private:
  // q, k and v of x (B, T, C), each (B, n_head, T, head size): one c_attn product, each
  // head a contiguous slice of the channels.
  std::array<Tensor, 3> heads_of(const Tensor& x) {
    const int64_t B = x.size(0), T = x.size(1), C = x.size(2);
    std::vector<Tensor> qkv = split(c_attn->forward(x), C, 2);
    auto heads = [&](const Tensor& t) { return t.reshape({B, T, n_head_, C / n_head_}).transpose(1, 2); };
    return {heads(qkv[0]), heads(qkv[1]), heads(qkv[2])};
  }
  // The heads side by side again, (B, n_head, T, hs) -> (B, T, C), then c_proj and dropout.
  Tensor merged(const Tensor& y) {
    const int64_t B = y.size(0), T = y.size(2), C = y.size(1) * y.size(3);
    return resid_dropout->forward(c_proj->forward(y.transpose(1, 2).reshape({B, T, C})));
  }

  int64_t n_head_, block_size_;
  double dropout_;
};

// GPT-2's MLP, with nanoGPT's names.
class DenseMLP : public nn::UnaryModule {
 public:
  explicit DenseMLP(const GPT2Config& c) : UnaryModule("MLP") {
    c_fc = register_module("c_fc", std::make_shared<nn::Linear>(c.n_embd, 4 * c.n_embd, c.bias));
    gelu = register_module("gelu", std::make_shared<nn::GELU>("tanh"));
    c_proj = register_module("c_proj", std::make_shared<nn::Linear>(4 * c.n_embd, c.n_embd, c.bias));
    dropout = register_module("dropout", std::make_shared<nn::Dropout>(c.dropout));
    gelu_recompute = c.gelu_recompute;
  }
  Tensor forward(const Tensor& x) override {
    // With gelu_recompute, c_proj keeps c_fc's output rather than the GELU's, and its
    // backward computes the GELU again (ops/linalg.h, gelu_linear): the same numbers.
    if (gelu_recompute)
      return dropout->forward(gelu_linear(c_fc->forward(x), c_proj->weight, c_proj->bias, "tanh"));
    return dropout->forward(c_proj->forward(gelu->forward(c_fc->forward(x))));
  }

  std::shared_ptr<nn::Linear> c_fc, c_proj;
  std::shared_ptr<nn::GELU> gelu;
  std::shared_ptr<nn::Dropout> dropout;
  bool gelu_recompute = false;  // GPT2Config::gelu_recompute, and GPT2::set_gelu_recompute
};

// x + attn(ln_1(x)), then x + mlp(ln_2(x)), or x + mlp(x) for an MLP that normalises its
// own input (MlpChoice::pre_norm false).
class Block : public nn::UnaryModule {
 public:
  Block(int64_t layer, const GPT2Config& c, Generator* gen) : UnaryModule("Block") {
    ln_1 = register_module("ln_1", gpt2_layer_norm(c));
    attn = register_module("attn", std::make_shared<CausalSelfAttention>(c));
    if (c.mlp.pre_norm) ln_2 = register_module("ln_2", gpt2_layer_norm(c));
    std::shared_ptr<nn::UnaryModule> m = c.mlp.make(layer, c, gen);
    MU_CHECK(m != nullptr, "GPT2: the MLP factory \"", c.mlp.name, "\" returned no module for layer ", layer);
    mlp = register_module("mlp", std::move(m));
  }
  Tensor forward(const Tensor& x) override { return with_mlp(x + attn->forward(ln_1->forward(x))); }
  // forward() for generate(), attention through the block's key-value cache.
  Tensor forward_cached(const Tensor& x, KVCache& cache) {
    return with_mlp(x + attn->forward_cached(ln_1->forward(x), cache));
  }

  std::shared_ptr<nn::LayerNorm> ln_1, ln_2;  // ln_2 null without pre_norm
  std::shared_ptr<CausalSelfAttention> attn;
  std::shared_ptr<nn::UnaryModule> mlp;

 private:
  // h + mlp(ln_2(h)), or h + mlp(h).
  Tensor with_mlp(const Tensor& h) {
    Tensor y = mlp->forward(ln_2 ? ln_2->forward(h) : h);
    MU_CHECK(y.defined() && y.shape() == h.shape(), "GPT2: the MLP \"", mlp->type_name(), "\" must map ",
             shape_str(h.shape()), " to the same shape, got ", y.defined() ? shape_str(y.shape()) : "undefined");
    return h + y;
  }
};

// The lm_head: logits = x · Wᵀ with W registered as the token embedding's own tensor, so
// the two names share one parameter and its gradient is the sum of both uses.
class TiedHead : public nn::Module {
 public:
  explicit TiedHead(const Tensor& w) : Module("TiedLinear") { weight = register_parameter("weight", w); }
  Tensor weight;
};

// A plain container, so that names read transformer.wte.weight as in nanoGPT.
class Transformer : public nn::Module {
 public:
  Transformer() : Module("Transformer") {}
};

// Sizes in the counts: every product and sum checked.
struct Counter {
  const char* what;
  int64_t mul(int64_t a, int64_t b) const { return checked_mul(a, b, what); }
  int64_t add(int64_t a, int64_t b) const { return checked_add(a, b, what); }
  int64_t linear(int64_t in, int64_t out, bool bias) const { return add(mul(in, out), bias ? out : 0); }
  int64_t norm(int64_t n, bool bias) const { return bias ? mul(2, n) : n; }
};

}  // namespace

// ---------------------------------------------------------------- MLP choices

namespace mlp {

MlpChoice dense() {
  MlpChoice m;
  m.name = "dense";
  m.make = [](int64_t, const GPT2Config& c, Generator*) -> std::shared_ptr<nn::UnaryModule> {
    // Its Linears are drawn again by init_weights, from the model's generator.
    return std::make_shared<DenseMLP>(c);
  };
  m.count = [](const GPT2Config& c) {
    Counter k{"GPT2 dense MLP count"};
    const int64_t h = k.mul(4, c.n_embd);
    return k.add(k.linear(c.n_embd, h, c.bias), k.linear(h, c.n_embd, c.bias));
  };
  m.pre_norm = true;
  m.position_wise = true;
  return m;
}

int64_t cp_rank(int64_t d, int64_t experts) {
  // int(0.78 * d) as Python computes it: the double product, truncated.
  if (experts == 64) return int64_t(0.78 * double(d));
  if (experts == 256) return int64_t(0.725 * double(d));
  MU_FAIL("GPT2: the paper gives the CPμMoE rank for 64 or 256 experts only, got ", experts,
          " experts; pass the rank explicitly, e.g. mlp::cp_mumoe(", experts, ", rank)");
  return 0;
}

int64_t tr_rank(int64_t d, int64_t experts) {
  if (experts == 64) return int64_t(0.2 * double(d));
  if (experts == 256) return int64_t(0.195 * double(d));
  MU_FAIL("GPT2: the paper gives the TRμMoE ranks for 64 or 256 experts only, got ", experts,
          " experts; pass the last rank explicitly, e.g. mlp::tr_mumoe(", experts, ", rank)");
  return 0;
}

nn::MuMoEOptions mumoe_options(const GPT2Config& c, nn::MoEKind kind, int64_t experts, int64_t rank) {
  MU_CHECK(kind == nn::MoEKind::CP || kind == nn::MoEKind::TR, "GPT2: the μMoE MLP is CP or TR, got ",
           nn::to_string(kind));
  MU_CHECK(experts > 0, "GPT2: the μMoE MLP needs at least one expert, got ", experts);
  MU_CHECK(rank >= 0, "GPT2: the μMoE MLP's rank must be positive (or 0 for the paper's rule), got ", rank);
  const bool cp = kind == nn::MoEKind::CP;
  if (rank == 0) rank = cp ? cp_rank(c.n_embd, experts) : tr_rank(c.n_embd, experts);
  MU_CHECK(rank > 0, "GPT2: the paper's rule gives rank 0 for n_embd = ", c.n_embd, " and ", experts,
           " experts; pass a positive rank");
  nn::MuMoEOptions o(c.n_embd, c.n_embd);
  o.hidden(4 * c.n_embd)                           // L1: d -> 4d, L2: 4d -> d
      .experts({experts})
      .kind(kind)
      .gate_norm(nn::GateNorm::LayerNorm)           // language models: LN gating (PAPERS.md)
      .activation(nn::GateActivation::Entmax15)
      .input_norm(true)                             // LN(x) with affine on the layers' input
      .bias(c.bias)                                 // the per-expert bias row, like the Linears' biases
      .gelu_approximate("none");                    // F.gelu, as torch_reference.py's MuMoEBlock
  if (cp) o.rank(rank);
  else o.ranks({4, 4, rank});
  return o;
}

// The μMoE block takes ln_2's place instead of following it (pre_norm false). The paper
// replaces "every MLP block's 2 linear layers with 2 μMoE layers" and writes the gating as
// a = φ(Gᵀz) on the block's input z, and the block (PAPERS.md) carries its own input
// LayerNorm with affine parameters: that LayerNorm does ln_2's job, so keeping ln_2 in
// front would normalise twice and add 2d parameters per block that the parameter-matched
// counts (Table 3: 124M for all three models) do not have. torch_reference.py's
// gpt2-mini-cpmumoe / -trmumoe workloads, the contract for this model, are built that way:
// `x + self.mlp(x)` with the gating computed from the residual stream and the LayerNorm
// inside the block (the gate's own LayerNorm makes the gating scale-free).
static MlpChoice mumoe_choice(nn::MoEKind kind, int64_t experts, int64_t rank) {
  MlpChoice m;
  m.name = detail::str(kind == nn::MoEKind::CP ? "cp_mumoe" : "tr_mumoe", "-", experts);
  m.make = [kind, experts, rank](int64_t, const GPT2Config& c, Generator* gen) -> std::shared_ptr<nn::UnaryModule> {
    // The factors draw from the model's generator (their own init, not nanoGPT's).
    return std::make_shared<nn::MuMoE>(mumoe_options(c, kind, experts, rank).generator(gen));
  };
  m.count = [kind, experts, rank](const GPT2Config& c) {
    return nn::MuMoE::count_parameters(mumoe_options(c, kind, experts, rank));
  };
  m.pre_norm = false;
  m.position_wise = true;  // LayerNorms and entmax gating, each per token
  return m;
}

MlpChoice cp_mumoe(int64_t experts, int64_t rank) { return mumoe_choice(nn::MoEKind::CP, experts, rank); }
MlpChoice tr_mumoe(int64_t experts, int64_t last_rank) { return mumoe_choice(nn::MoEKind::TR, experts, last_rank); }

MlpChoice sparse_moe(std::string name, std::function<nn::SparseMoEOptions(const GPT2Config&)> options) {
  MlpChoice m;
  m.name = std::move(name);
  auto resolved = [options](const GPT2Config& c, Generator* gen) {
    nn::SparseMoEOptions o = options(c).n_layers(c.n_layer).generator(gen);
    MU_CHECK(o.d_model() == c.n_embd, "GPT2: the sparse MoE MLP's d_model (", o.d_model(), ") must be n_embd (",
             c.n_embd, ")");
    return o;
  };
  m.make = [resolved](int64_t, const GPT2Config& c, Generator* gen) -> std::shared_ptr<nn::UnaryModule> {
    const nn::SparseMoEOptions o = resolved(c, gen);
    // A sigmoid selection is σ-MoE: built as such, so models can be asked what they hold.
    if (o.selection() == nn::Selection::Sigmoid) return std::make_shared<nn::SigmaMoE>(o);
    return std::make_shared<nn::SparseMoE>(o);
  };
  m.count = [resolved](const GPT2Config& c) { return nn::SparseMoE::count_parameters(resolved(c, nullptr)); };
  m.pre_norm = true;
  // Per token in eval mode, except Switch's capacity (GPT2::position_wise_mlps checks it).
  m.position_wise = true;
  return m;
}

MlpChoice sigma_moe(int64_t experts, int64_t expert_size, int64_t k, double expert_dropout, double entropy_weight) {
  return sparse_moe(detail::str("sigma_moe-", experts, "x", expert_size, "-k", k),
                    [=](const GPT2Config& c) {
                      return nn::sigma_moe_options(c.n_embd, experts, expert_size, k, expert_dropout, entropy_weight);
                    });
}

MlpChoice topk_mlp(int64_t k) {
  auto options = [k](const GPT2Config& c, Generator* gen) {
    return nn::TopKMLPOptions(c.n_embd, 4 * c.n_embd).k(k).bias(c.bias).generator(gen);
  };
  MlpChoice m;
  m.name = detail::str("topk_mlp-k", k);
  m.make = [options](int64_t, const GPT2Config& c, Generator* gen) -> std::shared_ptr<nn::UnaryModule> {
    return std::make_shared<nn::TopKMLP>(options(c, gen));
  };
  m.count = [options](const GPT2Config& c) { return nn::TopKMLP::count_parameters(options(c, nullptr)); };
  m.pre_norm = true;
  m.position_wise = true;
  return m;
}

MlpChoice pkm(int64_t n_sub, int64_t heads, int64_t k, nn::PKMActivation activation) {
  auto options = [=](const GPT2Config& c, Generator* gen) {
    return nn::PKMOptions(c.n_embd, n_sub).heads(heads).k(k).activation(activation).generator(gen);
  };
  MlpChoice m;
  m.name = detail::str("pkm-", n_sub, "x", n_sub, "-h", heads, "-k", k, "-", nn::to_string(activation));
  m.make = [options](int64_t, const GPT2Config& c, Generator* gen) -> std::shared_ptr<nn::UnaryModule> {
    return std::make_shared<nn::PKM>(options(c, gen));
  };
  m.count = [options](const GPT2Config& c) { return nn::PKM::count_parameters(options(c, nullptr)); };
  m.pre_norm = true;
  m.position_wise = true;
  return m;
}

MlpChoice custom(std::string name, MlpFactory make, bool pre_norm, MlpCounter count, bool position_wise) {
  MlpChoice m;
  m.name = std::move(name);
  m.make = std::move(make);
  m.count = std::move(count);
  m.pre_norm = pre_norm;
  m.position_wise = position_wise;
  return m;
}

}  // namespace mlp

// ---------------------------------------------------------------- config

GPT2Config GPT2Config::gpt2_124m() {
  GPT2Config c;
  c.n_layer = 12;
  c.n_head = 12;
  c.n_embd = 768;
  c.block_size = 1024;
  c.vocab_size = 50257;
  c.bias = true;
  c.dropout = 0.0;
  return c;
}

GPT2Config GPT2Config::gpt2_mini() {
  GPT2Config c;
  c.n_layer = 4;
  c.n_head = 4;
  c.n_embd = 256;
  c.block_size = 128;
  c.vocab_size = 50257;
  c.bias = true;  // nn.Linear and nn.LayerNorm defaults in torch_reference.py
  c.dropout = 0.0;
  return c;
}

void GPT2Config::validate() const {
  MU_CHECK(n_layer > 0, "GPT2Config: n_layer must be positive, got ", n_layer);
  MU_CHECK(n_head > 0, "GPT2Config: n_head must be positive, got ", n_head);
  MU_CHECK(n_embd > 0, "GPT2Config: n_embd must be positive, got ", n_embd);
  MU_CHECK(block_size > 0, "GPT2Config: block_size must be positive, got ", block_size);
  MU_CHECK(vocab_size > 0, "GPT2Config: vocab_size must be positive, got ", vocab_size);
  MU_CHECK(n_embd % n_head == 0, "GPT2Config: n_embd (", n_embd, ") must be divisible by n_head (", n_head, ")");
  check_unit_interval("GPT2Config", "dropout", dropout);  // NaN fails it too
  MU_CHECK(bool(mlp.make), "GPT2Config: the MLP choice \"", mlp.name, "\" has no factory");
  // 4 n_embd (the MLP width) and 3 n_embd (c_attn) must be sizes too.
  checked_mul(4, n_embd, "GPT2Config: the MLP width 4 * n_embd");
  // No table may exceed what one allocation can hold (float32, 4 bytes an element).
  const int64_t limit = kMaxAllocationBytes / 4;
  MU_CHECK(checked_mul(vocab_size, n_embd, "GPT2Config: vocab_size * n_embd") <= limit,
           "GPT2Config: the token embedding (", vocab_size, " x ", n_embd, ") is larger than any allocation");
  MU_CHECK(checked_mul(block_size, n_embd, "GPT2Config: block_size * n_embd") <= limit,
           "GPT2Config: the position embedding (", block_size, " x ", n_embd, ") is larger than any allocation");
  MU_CHECK(checked_mul(4 * n_embd, n_embd, "GPT2Config: 4 * n_embd * n_embd") <= limit,
           "GPT2Config: the MLP matrices (", 4 * n_embd, " x ", n_embd, ") are larger than any allocation");
}

// ---------------------------------------------------------------- model

GPT2::GPT2(const GPT2Config& config, Generator* gen) : Module("GPT2"), config_(config) {
  config_.validate();
  // A model no machine holds is refused before its first block is built (when the MLP
  // can be counted): the count itself refuses sizes past int64.
  if (config_.mlp.count) {
    const int64_t n = count_parameters(config_);
    MU_CHECK(n <= kMaxAllocationBytes / 4, "GPT2: ", n, " parameters (n_layer = ", config_.n_layer,
             ") are more than any machine holds");
  }
  const GPT2Config& c = config_;
  auto transformer = register_module("transformer", std::make_shared<Transformer>());
  wte_ = transformer->register_module("wte", std::make_shared<nn::Embedding>(c.vocab_size, c.n_embd));
  wpe_ = transformer->register_module("wpe", std::make_shared<nn::Embedding>(c.block_size, c.n_embd));
  drop_ = transformer->register_module("drop", std::make_shared<nn::Dropout>(c.dropout));
  h_ = transformer->register_module("h", std::make_shared<nn::ModuleList>());
  for (int64_t l = 0; l < c.n_layer; ++l) h_->push_back(std::make_shared<Block>(l, c, gen));
  ln_f_ = transformer->register_module("ln_f", gpt2_layer_norm(c));
  // Registered after `transformer`, so the shared tensor is listed as transformer.wte.weight.
  lm_head_weight_ = register_module("lm_head", std::make_shared<TiedHead>(wte_->weight))->weight;
  init_weights(gen);
}

void GPT2::init_weights(Generator* gen) {
  NoGradGuard no_grad;
  // Every Linear and Embedding anywhere (the MLP factory's modules included), as nanoGPT's
  // self.apply(self._init_weights); μMoE layers and LayerNorms are neither.
  for (nn::Module* m : modules()) {
    if (auto* lin = dynamic_cast<nn::Linear*>(m)) {
      nn::init::normal_(lin->weight, 0.0, kInitStd, gen);
      if (lin->bias.defined()) nn::init::zeros_(lin->bias);
    } else if (auto* emb = dynamic_cast<nn::Embedding*>(m)) {
      nn::init::normal_(emb->weight, 0.0, kInitStd, gen);
    } else if (auto* ln = dynamic_cast<nn::LayerNorm*>(m)) {
      ln->reset_parameters();
    }
  }
  // GPT-2's scaled init of the projections into the residual stream: each block adds two.
  const double std = kInitStd / std::sqrt(2.0 * double(config_.n_layer));
  const std::string suffix = "c_proj.weight";
  for (auto& [name, p] : named_parameters()) {
    if (name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
      nn::init::normal_(p, 0.0, std, gen);
  }
}

std::shared_ptr<nn::UnaryModule> GPT2::mlp(int64_t layer) const {
  MU_CHECK(layer >= 0 && layer < config_.n_layer, "GPT2::mlp: layer ", layer, " out of range (", config_.n_layer,
           " layers)");
  return h_->at<Block>(size_t(layer))->mlp;
}

Tensor GPT2::embed(const Tensor& tokens, int64_t first_position) {
  const int64_t T = tokens.size(1);
  const Tensor pos =
      arange(double(first_position), double(first_position + T), 1.0, TensorOptions(kInt64).device(tokens.device()));
  // (B, T, C) + (T, C): every sequence gets the same position vectors.
  return drop_->forward(wte_->forward(tokens) + wpe_->forward(pos));
}

Tensor GPT2::features(const Tensor& idx) {
  MU_CHECK(idx.defined() && idx.dim() == 2 && idx.dtype() == kInt64, "GPT2: expected idx of shape (B, T), int64, got ",
           idx.defined() ? idx.describe() : std::string("an undefined tensor"));
  const int64_t T = idx.size(1);
  MU_CHECK(T >= 1, "GPT2: the sequence is empty (T = 0)");
  MU_CHECK(T <= config_.block_size, "GPT2: cannot forward a sequence of length T = ", T,
           ", the block size (context) is only block_size = ", config_.block_size);
  Tensor x = embed(idx, 0);
  for (size_t l = 0; l < h_->size(); ++l) {
    std::shared_ptr<Block> block = h_->at<Block>(l);
    x = config_.recompute ? autograd::checkpoint_module(block, x, detail::str("GPT2: block ", l)) : block->forward(x);
  }
  return ln_f_->forward(x);
}

void GPT2::set_gelu_recompute(bool on) {
  config_.gelu_recompute = on;
  for (int64_t i = 0; i < config_.n_layer; ++i)
    if (auto dense = std::dynamic_pointer_cast<DenseMLP>(mlp(i))) dense->gelu_recompute = on;
}

// Under autocast the tied weight is cast before it is transposed: a dense copy.
Tensor GPT2::forward(const Tensor& idx) {
  return features(idx).matmul(autograd::autocast::to_low(lm_head_weight_).t());
}

GPT2::Output GPT2::forward(const Tensor& idx, const Tensor& targets) {
  MU_CHECK(targets.defined() && targets.dtype() == kInt64 && idx.defined() && targets.shape() == idx.shape(),
           "GPT2: targets must be int64 of idx's shape ", idx.defined() ? shape_str(idx.shape()) : "?", ", got ",
           targets.defined() ? targets.describe() : std::string("an undefined tensor"));
  Output out;
  const int64_t V = config_.vocab_size;
  const CrossEntropyOptions ignore_padding = CrossEntropyOptions().ignore_index(-1);
  if (config_.chunked_loss) {
    // The same loss without the logits (ops/loss.h).
    out.loss = linear_cross_entropy(features(idx), lm_head_weight_, Tensor(), targets, ignore_padding);
  } else {
    out.logits = forward(idx);
    // nanoGPT: F.cross_entropy(logits.view(-1, V), targets.view(-1), ignore_index=-1).
    out.loss = cross_entropy(out.logits.reshape({-1, V}), targets.reshape({-1}), ignore_padding);
  }
  // Sparse MoE MLPs (load balancing, entropy) regularise the loss they are trained with.
  for (int64_t i = 0; i < config_.n_layer; ++i)
    if (auto reg = std::dynamic_pointer_cast<nn::AuxiliaryLoss>(mlp(i)))
      if (Tensor a = reg->aux_loss(); a.defined()) out.aux_loss = out.aux_loss.defined() ? out.aux_loss + a : a;
  if (out.aux_loss.defined()) out.loss = out.loss + out.aux_loss.to(out.loss.dtype());
  return out;
}

bool GPT2::position_wise_mlps() const {
  if (!config_.mlp.position_wise) return false;
  // Switch's capacity drops a token by its rank among the batch's tokens of its expert.
  for (int64_t i = 0; i < config_.n_layer; ++i)
    if (auto moe = std::dynamic_pointer_cast<nn::SparseMoE>(mlp(i)); moe && moe->options().capacity_factor() > 0)
      return false;
  return true;
}

namespace {

// nanoGPT's choice of the next token of each sequence from its last logits (B, V):
// divided by the temperature, those below the row's k-th largest set to -inf (ties with
// it stay), softmax, one draw per row by inverse CDF (torch.multinomial with one sample).
// The softmax is the library's kernel, in float32 on the logits' device: vectorised, where
// an exp per element in double had cost 0.33 ms a row at GPT-2's 50257 tokens (a seventh
// of a cached step at gpt2-mini, a fifth at 8 sequences). The draw sums the probabilities
// in double.
std::vector<int64_t> sample_tokens(const Tensor& logits, double temperature, int64_t k, Generator& g) {
  const int64_t B = logits.size(0), V = logits.size(1);
  // Each row less its largest logit, then times 1 / temperature capped at float32's
  // largest value, so that a small temperature cannot make a NaN (softmax is unchanged by
  // the shift): every value is <= 0 and the largest 0, where a float32 1 / 1e-300 would be
  // inf (and the logits over it inf). 1e-300 is greedy decoding, as it was in double.
  const Tensor x = logits.to(kFloat32);
  const double inverse = std::min(1 / temperature, double(std::numeric_limits<float>::max()));
  Tensor scaled = (x - x.max(1).values.unsqueeze(1)) * inverse;
  if (k < V) scaled = masked_fill(scaled, lt(scaled, topk(scaled, k, 1).values.narrow(1, k - 1, 1)), -INFINITY);
  const std::vector<float> probs = softmax(scaled, 1).to_vector<float>();
  std::vector<int64_t> next(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    const float* p = probs.data() + b * V;
    double total = 0;
    for (int64_t j = 0; j < V; ++j) total += double(p[j]);
    // NaN or infinite logits anywhere in the row leave no finite distribution.
    if (!(std::isfinite(total) && total > 0)) {
      int64_t nan = 0, inf = 0;
      for (double v : logits.select(0, b).to_vector<double>()) nan += std::isnan(v), inf += std::isinf(v);
      MU_FAIL("GPT2::generate: the logits of sequence ", b, " are not finite (", nan, " NaN and ", inf,
              " infinite of ", V, ")");
    }
    const double u = g.uniform() * total;
    double acc = 0;
    int64_t pick = V - 1;
    for (int64_t j = 0; j < V; ++j) {
      acc += double(p[j]);
      // The first token whose cumulative mass passes u; zero-mass tokens are never picked.
      if (u < acc && p[j] > 0) {
        pick = j;
        break;
      }
    }
    // Rounding can leave u at the very top: take the last token with mass.
    if (pick == V - 1)
      while (pick > 0 && p[pick] == 0) --pick;
    next[size_t(b)] = pick;
  }
  return next;
}

}  // namespace

Tensor GPT2::generate(const Tensor& idx, int64_t max_new_tokens, double temperature, int64_t top_k,
                      Generator* gen, bool kv_cache) {
  MU_CHECK(idx.defined() && idx.dim() == 2 && idx.dtype() == kInt64 && idx.size(1) >= 1,
           "GPT2::generate: expected idx of shape (B, T) with T >= 1, int64, got ",
           idx.defined() ? idx.describe() : std::string("an undefined tensor"));
  MU_CHECK(max_new_tokens >= 0, "GPT2::generate: max_new_tokens must be >= 0, got ", max_new_tokens);
  MU_CHECK(temperature > 0 && std::isfinite(temperature),
           "GPT2::generate: temperature must be a finite number > 0, got ", temperature);
  MU_CHECK(top_k >= 0, "GPT2::generate: top_k must be >= 0 (0 keeps every token), got ", top_k);
  Generator& g = gen ? *gen : default_generator();
  NoGradGuard no_grad;
  const int64_t B = idx.size(0), V = config_.vocab_size, block = config_.block_size;
  const int64_t k = top_k == 0 ? V : std::min(top_k, V);
  // The cache gives the logits of the whole context's forward pass only where each
  // position's output depends on the positions up to it alone: in eval mode (no dropout,
  // no routing noise), with position-wise MLPs, and while the context fits the block (past
  // it, the window slides, every position's embedding changes, and the whole window is
  // forwarded again, as nanoGPT does every step).
  const bool use_cache = kv_cache && !is_training() && position_wise_mlps();
  std::vector<KVCache> caches;  // one per block; empty while not in use
  Tensor seq = idx;
  for (int64_t step = 0; step < max_new_tokens; ++step) {
    const int64_t T = seq.size(1);
    Tensor last;  // (B, C): the final LayerNorm's output at the last position
    if (use_cache && T <= block) {
      // The whole prompt first, then one new position a step.
      const int64_t from = caches.empty() ? 0 : T - 1;
      if (caches.empty()) caches.resize(h_->size());
      MU_CHECK(caches[0].len == from, "GPT2::generate: the cache holds ", caches[0].len, " positions, expected ", from);
      Tensor x = embed(seq.narrow(1, from, T - from), from);
      for (size_t l = 0; l < h_->size(); ++l) x = h_->at<Block>(l)->forward_cached(x, caches[l]);
      last = ln_f_->forward(x.select(1, x.size(1) - 1));
    } else {
      caches.clear();
      // nanoGPT: the context cropped to its last block_size tokens.
      Tensor cond = T <= block ? seq : seq.narrow(1, T - block, block);
      last = features(cond).select(1, cond.size(1) - 1);
    }
    // Only the last position's logits are needed: (B, V). Through linear, so that under
    // autocast the table itself is cast (and that cast kept for the next steps).
    const std::vector<int64_t> next = sample_tokens(linear(last, lm_head_weight_), temperature, k, g);
    seq = cat({seq, from_vector(next, {B, 1}).to(seq.device())}, 1);
  }
  return seq;
}

int64_t GPT2::count_mlp_parameters(const GPT2Config& c) {
  c.validate();
  MU_CHECK(bool(c.mlp.count), "GPT2::count_parameters: the MLP choice \"", c.mlp.name,
           "\" cannot be counted without building it (it has no MlpCounter); build the model and call "
           "num_parameters()");
  return checked_mul(c.n_layer, c.mlp.count(c), "GPT2::count_mlp_parameters");
}

int64_t GPT2::count_parameters(const GPT2Config& c) {
  const int64_t mlps = count_mlp_parameters(c);  // validates c
  Counter k{"GPT2::count_parameters"};
  const int64_t d = c.n_embd;
  // Token and position tables; the lm_head is the token table again and adds nothing.
  int64_t n = k.add(k.mul(c.vocab_size, d), k.mul(c.block_size, d));
  int64_t block = k.norm(d, c.bias);                             // ln_1
  block = k.add(block, k.linear(d, k.mul(3, d), c.bias));        // c_attn
  block = k.add(block, k.linear(d, d, c.bias));                  // attn.c_proj
  if (c.mlp.pre_norm) block = k.add(block, k.norm(d, c.bias));   // ln_2
  n = k.add(n, k.mul(c.n_layer, block));
  n = k.add(n, mlps);
  return k.add(n, k.norm(d, c.bias));                            // ln_f
}

std::string GPT2::extra_repr() const {
  const GPT2Config& c = config_;
  return detail::str("n_layer=", c.n_layer, ", n_head=", c.n_head, ", n_embd=", c.n_embd, ", block_size=",
                     c.block_size, ", vocab_size=", c.vocab_size, ", bias=", c.bias ? "true" : "false",
                     ", dropout=", c.dropout, ", mlp=", c.mlp.name);
}

}  // namespace mu::models
