#include "models/mlp_mixer.h"

#include <cmath>

#include "autograd/activation_checkpoint.h"
#include "nn/activation.h"
#include "ops/ops.h"
#include "tensor/checked.h"
#include "tensor/option_checks.h"

namespace mu::models {

const char* to_string(MixerMlp kind) {
  switch (kind) {
    case MixerMlp::MLP: return "MLP";
    case MixerMlp::CPMuMoE: return "CPMuMoE";
    case MixerMlp::TRMuMoE: return "TRMuMoE";
    case MixerMlp::DenseMoE: return "DenseMoE";
  }
  return "?";
}

namespace {

constexpr const char* kKinds = "MLP, CPMuMoE, TRMuMoE, DenseMoE";

void check_positive(const char* what, int64_t v) {
  MU_CHECK(v > 0, "MixerConfig: ", what, " must be positive, got ", v);
}

// int(ratio · d) as Python's int() of a non-negative float: truncation.
int64_t rank_rule(double ratio, int64_t d) { return int64_t(std::floor(ratio * double(d))); }

// The smallest ratio of six decimals that rank_rule takes to rank 1 or more for dim d
// (1/d rounded up, so that the printed value itself works).
double least_ratio(int64_t d) { return std::ceil(1e6 / double(d)) / 1e6; }

}  // namespace

void MixerConfig::validate() const {
  check_positive("image_size", image_size);
  check_positive("channels", channels);
  check_positive("patch_size", patch_size);
  check_positive("width", width);
  check_positive("token_mlp", token_mlp);
  check_positive("channel_mlp", channel_mlp);
  check_positive("depth", depth);
  check_positive("num_classes", num_classes);
  MU_CHECK(image_size % patch_size == 0, "MixerConfig: image_size ", image_size, " is not divisible by patch_size ",
           patch_size);
  // Sizes the model multiplies together must fit in int64 (the patch dim, the token count).
  checked_mul(checked_mul(channels, patch_size, "MixerConfig: patch dim"), patch_size, "MixerConfig: patch dim");
  checked_mul(grid(), grid(), "MixerConfig: tokens");
  check_unit_interval("MixerConfig", "stochastic_depth", stochastic_depth);
  check_enum("MixerConfig", "token_block", token_block, MixerMlp::DenseMoE, "MixerMlp", kKinds);
  check_enum("MixerConfig", "channel_block", channel_block, MixerMlp::DenseMoE, "MixerMlp", kKinds);
  check_eps("MixerConfig: ln_eps", ln_eps);
  const bool moe = token_block != MixerMlp::MLP || channel_block != MixerMlp::MLP;
  if (!moe) return;
  check_positive("experts", experts);
  for (size_t e = 0; e < expert_levels.size(); ++e)
    MU_CHECK(expert_levels[e] > 0, "MixerConfig: expert_levels[", e, "] must be positive, got ", expert_levels[e]);
  check_enum("MixerConfig", "gate_norm", gate_norm, nn::GateNorm::LayerNorm, "GateNorm", "None, BatchNorm, LayerNorm");
  // The ratios only matter for the kinds that use them; a NaN or a ratio giving rank 0
  // for the smaller of the two block dims is refused there.
  for (auto [kind, d] : {std::pair{token_block, tokens()}, std::pair{channel_block, width}}) {
    if (kind == MixerMlp::CPMuMoE) {
      MU_CHECK(std::isfinite(cp_rank_ratio) && cp_rank_ratio > 0, "MixerConfig: cp_rank_ratio must be a positive ",
               "finite number, got ", cp_rank_ratio);
      MU_CHECK(rank_rule(cp_rank_ratio, d) >= 1, "MixerConfig: cp_rank_ratio ", cp_rank_ratio, " gives CP rank 0 for a ",
               "block of dim ", d, " (the rank is floor(ratio x dim): a ratio of at least ", least_ratio(d), " is needed)");
    }
    if (kind == MixerMlp::TRMuMoE) {
      MU_CHECK(std::isfinite(tr_rank_ratio) && tr_rank_ratio > 0, "MixerConfig: tr_rank_ratio must be a positive ",
               "finite number, got ", tr_rank_ratio);
      MU_CHECK(rank_rule(tr_rank_ratio, d) >= 1, "MixerConfig: tr_rank_ratio ", tr_rank_ratio, " gives TR rank 0 for a ",
               "block of dim ", d, " (the rank is floor(ratio x dim): a ratio of at least ", least_ratio(d), " is needed)");
    }
  }
}

double MixerConfig::drop_path_rate(int64_t block) const {
  MU_CHECK(block >= 0 && block < depth, "MixerConfig::drop_path_rate: block ", block, " out of range (depth ", depth, ")");
  return depth == 1 ? stochastic_depth : stochastic_depth * double(block) / double(depth - 1);
}

nn::MuMoEOptions MixerConfig::moe_options(MixerMlp kind, int64_t d, int64_t h) const {
  nn::MuMoEOptions o(d, d);
  std::vector<int64_t> levels = {experts};
  levels.insert(levels.end(), expert_levels.begin(), expert_levels.end());
  o.hidden(h).experts(levels).gate_norm(gate_norm).input_norm(moe_input_norm).further_gate_std(further_gate_std);
  std::vector<int64_t> tr_ranks(levels.size() + 1, 4);  // R_1 .. R_{E+1}
  tr_ranks.push_back(rank_rule(tr_rank_ratio, d));
  switch (kind) {
    case MixerMlp::CPMuMoE: o.kind(nn::MoEKind::CP).rank(rank_rule(cp_rank_ratio, d)); break;
    case MixerMlp::TRMuMoE: o.kind(nn::MoEKind::TR).ranks(tr_ranks); break;
    case MixerMlp::DenseMoE: o.kind(nn::MoEKind::Dense); break;
    case MixerMlp::MLP: MU_FAIL("MixerConfig::moe_options: an MLP block is not a μMoE block");
  }
  return o;
}

MixerConfig mixer_s16(MixerMlp kind) {
  MixerConfig c;  // the defaults are S/16's
  c.mlp(kind);
  return c;
}

MixerConfig mixer_fmnist() {
  MixerConfig c;
  c.image_size = 28;
  c.channels = 1;
  c.patch_size = 4;
  c.width = 128;
  c.token_mlp = 64;
  c.channel_mlp = 512;
  c.depth = 4;
  c.num_classes = 10;
  return c;
}

// ---------------------------------------------------------------- mixing blocks

namespace {

std::shared_ptr<nn::UnaryModule> make_mixing(const MixerConfig& c, MixerMlp kind, int64_t d, int64_t h) {
  if (kind == MixerMlp::MLP)
    return std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::UnaryModule>>{
        std::make_shared<nn::Linear>(d, h), std::make_shared<nn::GELU>("none"), std::make_shared<nn::Linear>(h, d)});
  return std::make_shared<nn::MuMoE>(c.moe_options(kind, d, h));
}

}  // namespace

MixerBlock::MixerBlock(const MixerConfig& c, int64_t index) : UnaryModule("MixerBlock") {
  ln1 = register_module("ln1", std::make_shared<nn::LayerNorm>(nn::LayerNormOptions({c.width}).eps(c.ln_eps)));
  token_mix = register_module("token_mix", make_mixing(c, c.token_block, c.tokens(), c.token_mlp));
  ln2 = register_module("ln2", std::make_shared<nn::LayerNorm>(nn::LayerNormOptions({c.width}).eps(c.ln_eps)));
  channel_mix = register_module("channel_mix", make_mixing(c, c.channel_block, c.width, c.channel_mlp));
  // One module serves both branches: each call draws its own per-sample mask.
  drop_path = register_module(
      "drop_path", std::make_shared<nn::DropPath>(nn::DropPathOptions(c.drop_path_rate(index)).generator(c.generator)));
  gelu_recompute = c.gelu_recompute;
}

// A mixing block's Sequential of (Linear, activation, Linear), or null for anything else
// (a μMoE block, or a module a user put in its place).
static const nn::Sequential* plain_mlp(const std::shared_ptr<nn::UnaryModule>& m) {
  const auto* seq = dynamic_cast<const nn::Sequential*>(m.get());
  if (seq == nullptr || seq->size() != 3 || !std::dynamic_pointer_cast<nn::Linear>((*seq)[0]) ||
      !std::dynamic_pointer_cast<nn::Linear>((*seq)[2]))
    return nullptr;
  return seq;
}

// The token MLP of a plain block applied along dim 1 of x (B, T, D): W1 x_b, GELU, W2 h_b
// for each sample b, the biases added down the columns. The same function as the MLP on
// xᵀ, transposed back, without either transpose: the products read x as it lies and
// write (B, T, D) directly, and the residual add after it reads a dense tensor.
// Each bias goes with its product (matmul_row_bias: added as the product is stored).
static Tensor token_mlp_left(const nn::Sequential& mlp, const Tensor& x) {
  const auto fc1 = mlp.at<nn::Linear>(0), fc2 = mlp.at<nn::Linear>(2);
  auto layer = [](const nn::Linear& fc, const Tensor& in) {
    return fc.bias.defined() ? matmul_row_bias(fc.weight, in, fc.bias) : matmul(fc.weight, in);
  };
  Tensor h = layer(*fc1, x);  // (H, T) · (B, T, D) + b1 -> (B, H, D)
  h = mlp[1]->forward(h);
  return layer(*fc2, h);  // (T, H) · (B, H, D) + b2 -> (B, T, D)
}

Tensor MixerBlock::forward(const Tensor& x) {
  // Token mixing: each channel's column of T patch values is one "token" of the MLP.
  // A plain block's Sequential (Linear, activation, Linear) takes the left products; a
  // μMoE block, or a token_mix a user replaced with something else, the transposes.
  const nn::Sequential* plain = plain_mlp(token_mix);
  Tensor t = plain != nullptr ? token_mlp_left(*plain, ln1->forward(x))
                              : token_mix->forward(ln1->forward(x).transpose(1, 2)).transpose(1, 2);
  Tensor h = x + drop_path->forward(t);
  // Channel mixing; with gelu_recompute a plain MLP's second Linear keeps the first one's
  // output instead of the GELU's (gelu_linear: the same numbers).
  const nn::Sequential* channel = gelu_recompute ? plain_mlp(channel_mix) : nullptr;
  const auto gelu = channel != nullptr ? std::dynamic_pointer_cast<nn::GELU>((*channel)[1]) : nullptr;
  Tensor c;
  if (gelu != nullptr) {
    const auto fc1 = channel->at<nn::Linear>(0), fc2 = channel->at<nn::Linear>(2);
    c = gelu_linear(fc1->forward(ln2->forward(h)), fc2->weight, fc2->bias, gelu->options().approximate());
  } else {
    c = channel_mix->forward(ln2->forward(h));
  }
  return h + drop_path->forward(c);
}

// ---------------------------------------------------------------- the model

MlpMixer::MlpMixer(const MixerConfig& config) : UnaryModule("MlpMixer"), config_(config) {
  config_.validate();
  embed = register_module("embed", std::make_shared<nn::Linear>(config_.patch_dim(), config_.width));
  blocks = register_module("blocks", std::make_shared<nn::ModuleList>());
  for (int64_t i = 0; i < config_.depth; ++i) blocks->push_back(std::make_shared<MixerBlock>(config_, i));
  ln = register_module("ln", std::make_shared<nn::LayerNorm>(nn::LayerNormOptions({config_.width}).eps(config_.ln_eps)));
  head = register_module("head", std::make_shared<nn::Linear>(config_.width, config_.num_classes));
}

Tensor MlpMixer::patchify(const Tensor& images) const {
  const MixerConfig& c = config_;
  const int64_t S = c.image_size, C = c.channels, p = c.patch_size, g = c.grid();
  MU_CHECK(images.defined(), "MlpMixer: expected images, got an undefined tensor");
  MU_CHECK(images.is_floating_point(), "MlpMixer: images must be floating point, got ", dtype_name(images.dtype()));
  Tensor x = images;
  const int64_t pixels = checked_mul(checked_mul(C, S, "MlpMixer"), S, "MlpMixer");
  if (x.dim() == 2) {
    MU_CHECK(x.size(1) == pixels, "MlpMixer: flattened images must have C·S·S = ", C, "·", S, "·", S, " = ", pixels,
             " values per row, got shape ", shape_str(x.shape()));
    x = x.reshape({x.size(0), C, S, S});
  } else if (x.dim() == 3) {
    MU_CHECK(C == 1, "MlpMixer: (B, H, W) images need channels = 1, the model has ", C, " channels; pass (B, ", C,
             ", ", S, ", ", S, ")");
    x = x.unsqueeze(1);
  }
  MU_CHECK(x.dim() == 4, "MlpMixer: expected images (B, ", C, ", ", S, ", ", S, "), got shape ",
           shape_str(images.shape()));
  MU_CHECK(x.size(1) == C, "MlpMixer: expected ", C, " channels, got ", x.size(1), " (images of shape ",
           shape_str(images.shape()), ")");
  MU_CHECK(x.size(2) == S && x.size(3) == S, "MlpMixer: expected ", S, "x", S, " images, got ", x.size(2), "x", x.size(3),
           " (shape ", shape_str(images.shape()), ")");
  const int64_t B = x.size(0);
  // (B, C, g, p, g, p) -> (B, g, g, C, p, p): patch (gy, gx) holds its C·p·p pixels in the
  // order of a Conv2d weight (out, C, p, p), so embed is that convolution.
  return x.reshape({B, C, g, p, g, p}).permute({0, 2, 4, 1, 3, 5}).reshape({B, g * g, C * p * p});
}

Tensor MlpMixer::features(const Tensor& images) {
  Tensor x = embed->forward(patchify(images));
  for (size_t i = 0; i < blocks->size(); ++i) {
    std::shared_ptr<MixerBlock> block = blocks->at<MixerBlock>(i);
    x = config_.recompute ? autograd::checkpoint_module(block, x, detail::str("MlpMixer: block ", i))
                          : block->forward(x);
  }
  return x;
}

Tensor MlpMixer::forward(const Tensor& images) {
  // Global average pooling over the patches, then the classifier.
  return head->forward(ln->forward(features(images)).mean({1}));
}

void MlpMixer::set_gelu_recompute(bool on) {
  config_.gelu_recompute = on;
  for (size_t i = 0; i < blocks->size(); ++i) blocks->at<MixerBlock>(i)->gelu_recompute = on;
}

std::shared_ptr<MixerBlock> MlpMixer::block(int64_t i) const {
  MU_CHECK(i >= 0 && i < config_.depth, "MlpMixer::block: block ", i, " out of range (depth ", config_.depth, ")");
  return blocks->at<MixerBlock>(size_t(i));
}

std::string MlpMixer::extra_repr() const {
  const MixerConfig& c = config_;
  return detail::str("image=", c.image_size, "x", c.image_size, "x", c.channels, ", patch=", c.patch_size,
                     ", width=", c.width, ", depth=", c.depth, ", token_mlp=", c.token_mlp, " (", to_string(c.token_block),
                     "), channel_mlp=", c.channel_mlp, " (", to_string(c.channel_block), "), classes=", c.num_classes,
                     ", stochastic_depth=", c.stochastic_depth);
}

// ---------------------------------------------------------------- counts

int64_t MlpMixer::count_mixing_parameters(const MixerConfig& c, MixerMlp kind, int64_t d, int64_t h) {
  const char* what = "MlpMixer::count_parameters";
  c.validate();
  if (kind != MixerMlp::MLP) return nn::MuMoE::count_parameters(c.moe_options(kind, d, h));
  // Linear(d, h) and Linear(h, d), each with a bias.
  const int64_t l1 = checked_add(checked_mul(d, h, what), h, what);
  const int64_t l2 = checked_add(checked_mul(h, d, what), d, what);
  return checked_add(l1, l2, what);
}

int64_t MlpMixer::count_mlp_parameters(const MixerConfig& c) {
  const char* what = "MlpMixer::count_mlp_parameters";
  c.validate();
  const int64_t per_block = checked_add(count_mixing_parameters(c, c.token_block, c.tokens(), c.token_mlp),
                                        count_mixing_parameters(c, c.channel_block, c.width, c.channel_mlp), what);
  return checked_mul(c.depth, per_block, what);
}

int64_t MlpMixer::count_parameters(const MixerConfig& c) {
  const char* what = "MlpMixer::count_parameters";
  c.validate();
  const int64_t D = c.width;
  // Patch embedding: (C·p·p) -> D with bias.
  int64_t n = checked_add(checked_mul(c.patch_dim(), D, what), D, what);
  // Two LayerNorms (weight and bias) per block, then the mixing MLPs.
  n = checked_add(n, checked_mul(c.depth, checked_mul(4, D, what), what), what);
  n = checked_add(n, count_mlp_parameters(c), what);
  // Final LayerNorm and the classifier D -> classes with bias.
  n = checked_add(n, checked_mul(2, D, what), what);
  return checked_add(n, checked_add(checked_mul(D, c.num_classes, what), c.num_classes, what), what);
}

}  // namespace mu::models
