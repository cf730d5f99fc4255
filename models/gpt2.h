// GPT-2 as nanoGPT builds it (token + position embeddings, n_layer pre-LN blocks of
// causal self-attention and an MLP, a final LayerNorm and an lm_head tied to the token
// embedding), with the MLP of every block chosen through one factory interface: the
// dense MLP of GPT-2, the CPμMoE / TRμMoE blocks of the μMoE paper (section 4.3), or any
// nn::UnaryModule from (..., n_embd) to (..., n_embd).
//
//   models::GPT2Config cfg = models::GPT2Config::gpt2_124m();
//   cfg.mlp = models::mlp::cp_mumoe(256);                 // rank int(0.725 d) by the paper's rule
//   Generator gen(1337);
//   models::GPT2 model(cfg, &gen);
//   auto [logits, loss] = model.forward(idx, targets);    // idx, targets (B, T) int64
//
// Parameter names follow nanoGPT's state dict: transformer.wte.weight, transformer.wpe.weight,
// transformer.h.<i>.{ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj}.{weight, bias},
// transformer.ln_f.{weight, bias}, lm_head.weight (the same tensor as transformer.wte.weight:
// parameters() lists it once, state_dict() under both names). A μMoE MLP's tensors sit under
// transformer.h.<i>.mlp. with nn::MuMoE's own names (G1, input_norm.*, layer1.U1, ...).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "nn/activation.h"
#include "nn/embedding.h"
#include "nn/linear.h"
#include "nn/module.h"
#include "nn/mumoe_block.h"
#include "nn/pkm.h"
#include "nn/sparse_moe.h"
#include "nn/topk_mlp.h"
#include "tensor/random.h"

namespace mu::models {

struct GPT2Config;

// Builds the MLP of block `layer` (0-based) for a configuration: a module (..., n_embd) ->
// (..., n_embd). The one interface every MLP choice goes through. `gen` is the generator
// the model was built with (null: the global one), for whatever the MLP draws itself.
using MlpFactory =
    std::function<std::shared_ptr<nn::UnaryModule>(int64_t layer, const GPT2Config&, Generator* gen)>;
// Parameters of one block's MLP from the configuration alone (nothing allocated).
using MlpCounter = std::function<int64_t(const GPT2Config&)>;

// An MLP choice: the factory, plus what the model needs to know without building it.
struct MlpChoice {
  std::string name;
  MlpFactory make;
  // Parameters of one MLP, for GPT2::count_parameters; null when the choice cannot say
  // (a custom module): then only a built model can be counted.
  MlpCounter count;
  // True: the block feeds ln_2(x) to the MLP (GPT-2). False: the block has no ln_2 and
  // the MLP receives the residual stream x itself, because it normalises its own input.
  bool pre_norm = true;
  // True: in eval mode the MLP maps each position on its own (no batch statistics, no
  // capacity shared by the tokens), so generate() may run it on the newest position alone
  // (GPT2::generate's key-value cache). False, the default for a custom module: generate()
  // forwards the whole context every step.
  bool position_wise = false;
};

namespace mlp {

// GPT-2's MLP: c_fc d -> 4d, GELU (tanh approximation), c_proj 4d -> d, dropout.
MlpChoice dense();
// The μMoE MLP block of the paper with `experts` experts: y = L2(GELU(L1(LN(x), a)), a),
// L1: d -> 4d and L2: 4d -> d sharing a = entmax15(LN(x G)), LN gating, an input LayerNorm
// with affine parameters, a per-expert bias row when the config has biases. rank 0 takes the
// paper's rule (cp_rank / tr_rank), which is defined for 64 and 256 experts only.
MlpChoice cp_mumoe(int64_t experts, int64_t rank = 0);
// TR ranks (4, 4, last_rank).
MlpChoice tr_mumoe(int64_t experts, int64_t last_rank = 0);
// A sparse MoE of nn/sparse_moe.h in ln_2's wake, as the dense MLP (pre_norm true): the
// options for a configuration (their d_model must be n_embd; n_layers and the generator
// are filled in from the model). Its regulariser is added to the training loss.
MlpChoice sparse_moe(std::string name, std::function<nn::SparseMoEOptions(const GPT2Config&)> options);
// σ-MoE (sigmoid selection, K of `experts` experts of size `expert_size`, expert dropout,
// entropy regularisation, the dense-MLP initialisation).
MlpChoice sigma_moe(int64_t experts, int64_t expert_size, int64_t k = 4, double expert_dropout = 0.0,
                    double entropy_weight = 0.001);
// The top-K activation MLP (nn/topk_mlp.h): d -> 4d, ReLU keeping the K largest units per
// token, 4d -> d; biases as the config says.
MlpChoice topk_mlp(int64_t k);
// A product-key memory (nn/pkm.h) of n_sub² values, `heads` heads, K kept per head.
MlpChoice pkm(int64_t n_sub, int64_t heads, int64_t k, nn::PKMActivation activation = nn::PKMActivation::ReLU);
// Any module through the same factory; `count` may be null (see MlpChoice::count);
// `position_wise` as MlpChoice::position_wise says.
MlpChoice custom(std::string name, MlpFactory make, bool pre_norm = true, MlpCounter count = nullptr,
                 bool position_wise = false);

// The paper's ranks for the GPT-2 μMoE blocks (PAPERS.md, "Blocks used in the models"):
// CP int(0.78 d) for N = 64, int(0.725 d) for N = 256; TR last rank int(0.2 d) for N = 64,
// int(0.195 d) for N = 256. Other expert counts are refused (give the rank explicitly).
int64_t cp_rank(int64_t n_embd, int64_t experts);
int64_t tr_rank(int64_t n_embd, int64_t experts);
// The options of the μMoE MLP block for a configuration (kind CP or TR, rank resolved).
nn::MuMoEOptions mumoe_options(const GPT2Config& cfg, nn::MoEKind kind, int64_t experts, int64_t rank);

}  // namespace mlp

struct GPT2Config {
  int64_t n_layer = 12;
  int64_t n_head = 12;
  int64_t n_embd = 768;
  int64_t block_size = 1024;  // the longest context
  int64_t vocab_size = 50257;
  bool bias = true;           // biases in the Linears and LayerNorms (nanoGPT's `bias`)
  double dropout = 0.0;       // embedding, attention, residual and MLP dropout
  // Activation checkpointing (autograd/activation_checkpoint.h): where a graph is recorded,
  // each block keeps only its input and recomputes the rest in the backward pass (less
  // memory, one more forward of the blocks per step, the same results). Not part of the
  // model (no count or checkpoint depends on it).
  bool recompute = false;
  // forward(idx, targets) takes the lm_head and the loss as one chunked op (ops/loss.h,
  // linear_cross_entropy): the (B, T, vocab_size) logits and their gradient are never
  // held, and Output::logits is left undefined (forward(idx) still gives them). The same
  // loss and gradients up to float rounding. Not part of the model either.
  bool chunked_loss = false;
  // The dense MLP keeps c_fc's output and not the GELU's for c_proj's backward, which
  // computes the GELU again (ops/linalg.h, gelu_linear; llm.c's recompute of GELU): one
  // (B, T, 4 n_embd) activation less per block for one more GELU pass, the same numbers.
  // Other MLP choices ignore it. Not part of the model either.
  bool gelu_recompute = false;
  MlpChoice mlp = mlp::dense();

  // GPT-2 small: 12 layers, 12 heads, 768 wide, context 1024, vocabulary 50257, biases.
  static GPT2Config gpt2_124m();
  // The gpt2-mini workload of torch_reference.py: 4 layers, 4 heads, 256 wide, context 128,
  // vocabulary 50257, biases, no dropout.
  static GPT2Config gpt2_mini();

  // Refuses, naming the field and its value, any setting no model can be built from.
  void validate() const;
};

class GPT2 : public nn::Module {
 public:
  // Builds the model and initialises it as nanoGPT does, drawing from `gen` (the global
  // generator when null); μMoE MLPs keep their own initialisation (nn/mumoe_layer.h).
  explicit GPT2(const GPT2Config& config, Generator* gen = nullptr);

  // idx (B, T) int64 with T <= block_size -> logits (B, T, vocab_size).
  Tensor forward(const Tensor& idx);
  // The final LayerNorm's output (B, T, n_embd), what the lm_head reads.
  Tensor features(const Tensor& idx);
  struct Output {
    Tensor logits;  // (B, T, vocab_size); undefined with chunked_loss
    Tensor loss;    // mean cross-entropy over the B*T positions (targets of -1 ignored, as nanoGPT),
                    // plus aux_loss when defined
    Tensor aux_loss;  // the sum of the MLPs' regularisers (nn::AuxiliaryLoss); undefined when none
  };
  Output forward(const Tensor& idx, const Tensor& targets);

  // nanoGPT's sampling loop: max_new_tokens times, crop the context to its last block_size
  // tokens, take the last position's logits / temperature, keep the top_k largest (0: all),
  // sample from the softmax with `gen` (global when null) and append. Runs without
  // recording a graph; the caller picks the mode (eval() for no dropout), as in nanoGPT.
  // idx (B, T) int64, T >= 1 -> (B, T + max_new_tokens).
  // kv_cache: in eval mode, with position-wise MLPs (MlpChoice::position_wise), each block
  // keeps the keys and values of the positions so far, and a step forwards the newest token
  // alone (a (1, T) attention row and one position's MLPs instead of the whole context):
  // the same logits to rounding, while the context fits block_size. Past it the window
  // slides, every position's embedding changes, and each step forwards the whole window
  // again, as without the cache. The cache costs 2 n_layer B block_size n_embd values.
  Tensor generate(const Tensor& idx, int64_t max_new_tokens, double temperature = 1.0, int64_t top_k = 0,
                  Generator* gen = nullptr, bool kv_cache = true);

  // num_parameters() of a model built from `config`, from shapes alone (nothing allocated);
  // the tied lm_head counted once, position embeddings included (as nanoGPT's
  // get_num_params(non_embedding=False)).
  static int64_t count_parameters(const GPT2Config& config);
  // Parameters of the n_layer MLP modules alone (ln_2 not included).
  static int64_t count_mlp_parameters(const GPT2Config& config);

  // nanoGPT's _init_weights: every nn::Linear and nn::Embedding anywhere in the model gets
  // N(0, 0.02) weights and zero biases, then every parameter named ...c_proj.weight gets
  // N(0, 0.02 / sqrt(2 n_layer)). LayerNorms 1 and 0. Other modules keep their values.
  void init_weights(Generator* gen = nullptr);

  const GPT2Config& config() const { return config_; }
  // Turns activation checkpointing of the blocks on or off (GPT2Config::recompute).
  void set_recompute(bool on) { config_.recompute = on; }
  // Turns the chunked lm_head and loss on or off (GPT2Config::chunked_loss).
  void set_chunked_loss(bool on) { config_.chunked_loss = on; }
  // Turns the dense MLPs' GELU recompute on or off (GPT2Config::gelu_recompute).
  void set_gelu_recompute(bool on);
  std::shared_ptr<nn::Embedding> wte() const { return wte_; }
  std::shared_ptr<nn::Embedding> wpe() const { return wpe_; }
  // Block i's MLP module (as built by the config's factory).
  std::shared_ptr<nn::UnaryModule> mlp(int64_t layer) const;
  // The lm_head weight: the same tensor as wte()->weight.
  const Tensor& lm_head_weight() const { return lm_head_weight_; }

  std::string extra_repr() const override;

 private:
  // MlpChoice::position_wise, and no Switch capacity among the built MLPs.
  bool position_wise_mlps() const;
  // Token plus position embeddings (and the embedding dropout) of tokens (B, T) standing
  // at positions [first_position, first_position + T).
  Tensor embed(const Tensor& tokens, int64_t first_position);

  GPT2Config config_;
  std::shared_ptr<nn::Embedding> wte_, wpe_;
  std::shared_ptr<nn::Dropout> drop_;
  std::shared_ptr<nn::ModuleList> h_;
  std::shared_ptr<nn::UnaryModule> ln_f_;
  Tensor lm_head_weight_;
};

// Loads GPT-2 weights in the Hugging Face layout (a `model.safetensors` of GPT2Model or
// GPT2LMHeadModel) into a model with GPT-2's blocks (ln_2 and an MLP of c_fc and c_proj,
// as the dense choice builds) whose config matches the file:
//  - keys wte.weight, wpe.weight, h.<i>.ln_1.weight, h.<i>.attn.c_attn.weight, ...,
//    ln_f.bias, each with or without a "transformer." prefix;
//  - the Conv1D weights (attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj) are stored
//    (in, out) and are transposed into Linear's (out, in);
//  - the attention buffers h.<i>.attn.bias and h.<i>.attn.masked_bias are ignored;
//  - an lm_head.weight, if present, must equal wte.weight (the model ties them).
// Any dtype the file holds is converted to the model's. Missing or unexpected keys and
// wrong shapes are refused, naming the key(s) and both shapes; the model is unchanged then.
void load_hf_gpt2_safetensors(GPT2& model, const std::string& path);

}  // namespace mu::models
