// MLP-Mixer (Tolstikhin et al. 2021) with plain MLP or μMoE mixing blocks, as in the
// μMoE paper's Mixer experiments (Section 4.3, Tables 3 and 4, appendix F):
//
//   x = PatchEmbed(image)                               (B, T, D), T = (S/p)², D = width
//   for each block:
//     x = x + DropPath(TokenMix(LN(x)ᵀ)ᵀ)                mixes along the patch axis T
//     x = x + DropPath(ChannelMix(LN(x)))                mixes along the channel axis D
//   logits = Head(mean over T of LN(x))
//
// PatchEmbed is the stride-p convolution with p×p kernels, computed as the image cut
// into patches (each flattened in (channel, row, column) order, a Conv2d weight's
// layout) and one Linear(C·p·p, D). A mixing block is MLP: Linear(d, h), GELU (exact),
// Linear(h, d), or a μMoE block nn::MuMoE with two layers d -> h -> d that share one
// coefficient vector, batch-norm gating (no affine) and entmax-1.5 (appendix F).
//
//   models::MlpMixer net(models::mixer_fmnist());
//   Tensor logits = net.forward(images);   // images (B, 1, 28, 28) or (B, 784)
#pragma once
#include <memory>
#include <vector>

#include "nn/drop_path.h"
#include "nn/linear.h"
#include "nn/module.h"
#include "nn/mumoe_block.h"
#include "nn/norm.h"

namespace mu::models {

// What a token- or channel-mixing block is.
enum class MixerMlp {
  MLP,      // Linear, GELU, Linear (with biases)
  CPMuMoE,  // nn::MuMoE, CP factorization, rank int(cp_rank_ratio · d)
  TRMuMoE,  // nn::MuMoE, tensor ring, ranks (4, 4, int(tr_rank_ratio · d))
  DenseMoE  // nn::MuMoE with the unfactorized weight tensor (Table 4's "dense MoE")
};
const char* to_string(MixerMlp kind);

// Every field is checked by validate(), which the model's constructor and the static
// counts call. "d" in the rank rules is the input (= output) dimension of the block the
// rule sizes: the number of patches T for a token-mixing block, the width D for a
// channel-mixing block. That reading reproduces Table 4's counts (17.7M CP, 17.4M TR for
// S-16: ranks 147 and 384 for CP, (4, 4, 37) and (4, 4, 97) for TR).
struct MixerConfig {
  int64_t image_size = 224;   // square images, image_size × image_size
  int64_t channels = 3;
  int64_t patch_size = 16;    // must divide image_size
  int64_t width = 512;        // D, the hidden (channel) dimension
  int64_t token_mlp = 256;    // hidden width of the token-mixing blocks
  int64_t channel_mlp = 2048; // hidden width of the channel-mixing blocks
  int64_t depth = 8;          // number of Mixer blocks
  int64_t num_classes = 1000;
  // Stochastic depth: block i (0-based) drops its two branches with probability
  // stochastic_depth · i / (depth - 1), rising linearly from 0 at the first block to the
  // full rate at the last (Huang et al.'s linear decay rule, as timm's Mixer).
  double stochastic_depth = 0.0;
  MixerMlp token_block = MixerMlp::MLP;
  MixerMlp channel_block = MixerMlp::MLP;
  // μMoE blocks: experts N, gate normalisation, rank rules (see above).
  int64_t experts = 64;
  // Further expert levels of every μMoE block (N_2, ..., N_E: a hierarchical μMoE, the
  // paper's Table 9 uses {2}); empty: one level of `experts`. TR blocks take rank 4 around
  // each further level (as the paper's hierarchical counts), the last rank by the rule.
  std::vector<int64_t> expert_levels;
  // The gates of those further levels drawn from N(0, further_gate_std²) (0: zeros, the
  // paper's, under which those levels never learn: nn::MuMoEOptions::further_gate_std).
  double further_gate_std = 0.0;
  nn::GateNorm gate_norm = nn::GateNorm::BatchNorm;
  double cp_rank_ratio = 0.75;
  double tr_rank_ratio = 0.19;
  // A LayerNorm (with affine) inside each μMoE block on the layers' input, after the
  // block's own LN: torch_reference.py's GPT-style MuMoEBlock has one; the paper's Mixer
  // block does not.
  bool moe_input_norm = false;
  double ln_eps = 1e-5;  // every LayerNorm (torch's default, as torch_reference.py)
  // The generator of the drop-path draws (null: the global one); not owned.
  Generator* generator = nullptr;
  // Activation checkpointing (autograd/activation_checkpoint.h): where a graph is recorded,
  // each block keeps only its input and recomputes the rest in the backward pass (less
  // memory, one more forward of the blocks per step, the same results). Not part of the
  // model (no count or checkpoint depends on it).
  bool recompute = false;
  // A plain channel-mixing MLP (Linear, GELU, Linear) keeps its first Linear's output
  // rather than the GELU's, and its second Linear's backward computes the GELU again
  // (ops/linalg.h, gelu_linear): the same numbers, one (B, T, channel_mlp) activation less
  // held per block, the widest of a block, for one more GELU forward per block in the
  // backward. μMoE and token-mixing blocks are not affected. Not part of the model.
  bool gelu_recompute = false;

  // Both mixing blocks of one kind.
  MixerConfig& mlp(MixerMlp kind) { token_block = channel_block = kind; return *this; }

  int64_t grid() const { return image_size / patch_size; }    // patches per side
  int64_t tokens() const { return grid() * grid(); }          // T
  int64_t patch_dim() const { return channels * patch_size * patch_size; }
  // The drop-path rate of block i.
  double drop_path_rate(int64_t block) const;
  // The options of the μMoE block of `kind` mixing d features through h hidden ones.
  nn::MuMoEOptions moe_options(MixerMlp kind, int64_t d, int64_t h) const;
  // Refuses, naming the field and its value, any setting no model can be built from.
  void validate() const;
};

// Mixer-S/16 (Tolstikhin et al. Table 1; the μMoE paper's Table 3 model): 224×224×3,
// patch 16, width 512, 8 blocks, token MLP 256, channel MLP 2048, 1000 classes.
MixerConfig mixer_s16(MixerMlp kind = MixerMlp::MLP);
// torch_reference.py's `mixer-fmnist`: 28×28×1, patch 4 (49 tokens), width 128, 4 blocks,
// token MLP 64, channel MLP 512, 10 classes, plain MLP blocks.
MixerConfig mixer_fmnist();

// One Mixer block: x (B, T, D) -> (B, T, D).
class MixerBlock : public nn::UnaryModule {
 public:
  MixerBlock(const MixerConfig& config, int64_t index);
  Tensor forward(const Tensor& x) override;

  std::shared_ptr<nn::LayerNorm> ln1, ln2;
  std::shared_ptr<nn::UnaryModule> token_mix, channel_mix;  // nn::Sequential or nn::MuMoE
  std::shared_ptr<nn::DropPath> drop_path;
  bool gelu_recompute = false;  // MixerConfig::gelu_recompute, and MlpMixer::set_gelu_recompute
};

class MlpMixer : public nn::UnaryModule {
 public:
  explicit MlpMixer(const MixerConfig& config);

  // images (B, C, S, S), or (B, C·S·S) flattened row-major (as data::load_fashion_mnist
  // gives), or (B, S, S) when C = 1; floating point. Returns logits (B, num_classes).
  Tensor forward(const Tensor& images) override;
  // (B, C, S, S) -> (B, T, C·p·p): the patches, each flattened in (c, row, col) order.
  Tensor patchify(const Tensor& images) const;
  // The block stack's output before the final LayerNorm: (B, T, D).
  Tensor features(const Tensor& images);

  const MixerConfig& config() const { return config_; }
  // Turns activation checkpointing of the blocks on or off (MixerConfig::recompute).
  void set_recompute(bool on) { config_.recompute = on; }
  // Turns the plain channel MLPs' GELU recompute on or off (MixerConfig::gelu_recompute).
  void set_gelu_recompute(bool on);
  std::shared_ptr<MixerBlock> block(int64_t i) const;
  std::string extra_repr() const override;

  // num_parameters() of a model built from `config`, from shapes alone (nothing allocated).
  static int64_t count_parameters(const MixerConfig& config);
  // The parameters of all depth blocks' token- and channel-mixing MLPs (Table 4's count).
  static int64_t count_mlp_parameters(const MixerConfig& config);
  // One mixing block of `kind` over d features with h hidden ones.
  static int64_t count_mixing_parameters(const MixerConfig& config, MixerMlp kind, int64_t d, int64_t h);

  std::shared_ptr<nn::Linear> embed;
  std::shared_ptr<nn::ModuleList> blocks;
  std::shared_ptr<nn::LayerNorm> ln;
  std::shared_ptr<nn::Linear> head;

 private:
  MixerConfig config_;
};

}  // namespace mu::models
