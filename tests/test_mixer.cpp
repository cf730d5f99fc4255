// MLP-Mixer: configuration checks, parameter counts (static vs built, and the μMoE
// paper's Table 3 / Table 4 counts for Mixer-S/16 from formulas written out here),
// patch embedding against a brute-force strided convolution, input checks, drop path,
// and short training runs of every block kind.
#include <cmath>
#include <cstdio>
#include <string>

#include "helpers.h"
#include "models/mlp_mixer.h"
#include "nn/drop_path.h"
#include "tensor/allocator.h"
#include "tiny_models.h"

using namespace mu;
using models::MixerConfig;
using models::MixerMlp;
using models::MlpMixer;

namespace {

std::string rounded(int64_t n, double unit, int decimals, const char* suffix) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f%s", decimals, double(n) / unit, suffix);
  return buf;
}

// ---- independent counts: the shapes of the paper's blocks written out.
// MLP d -> h -> d with biases.
int64_t mlp_count(int64_t d, int64_t h) { return d * h + h + h * d + d; }
// Gating G (d, N) + two CP layers: R(N + (I+1) + O) each (bias folded into the input rows).
int64_t cp_count(int64_t d, int64_t h, int64_t N, int64_t R) {
  return d * N + R * (N + (d + 1) + h) + R * (N + (h + 1) + d);
}
// Gating + two TR layers with ranks (4, 4, R3): cores (4, N, 4), (4, I+1, R3), (R3, O, 4).
int64_t tr_count(int64_t d, int64_t h, int64_t N, int64_t R3) {
  auto layer = [&](int64_t i, int64_t o) { return 4 * N * 4 + 4 * (i + 1) * R3 + R3 * o * 4; };
  return d * N + layer(d, h) + layer(h, d);
}
// Gating + two materialised layers N (I+1) O.
int64_t dense_moe_count(int64_t d, int64_t h, int64_t N) { return d * N + N * (d + 1) * h + N * (h + 1) * d; }

}  // namespace

TEST_CASE("MixerConfig presets") {
  MixerConfig s = models::mixer_s16();
  CHECK(s.image_size == 224);
  CHECK(s.channels == 3);
  CHECK(s.patch_size == 16);
  CHECK(s.width == 512);
  CHECK(s.depth == 8);
  CHECK(s.token_mlp == 256);
  CHECK(s.channel_mlp == 2048);
  CHECK(s.num_classes == 1000);
  CHECK(s.tokens() == 196);
  CHECK(s.patch_dim() == 768);
  MixerConfig f = models::mixer_fmnist();
  CHECK(f.tokens() == 49);
  CHECK(f.patch_dim() == 16);
  // torch_reference.py's Mixer(): patch 4, d 128, depth 4, token 64, channel 512, 10 classes.
  CHECK(f.width == 128);
  CHECK(f.depth == 4);
  CHECK(f.token_mlp == 64);
  CHECK(f.channel_mlp == 512);
  CHECK(f.num_classes == 10);
  // The rank rules, d being the block's own dim (T for token mixing, D for channel mixing).
  CHECK(s.moe_options(MixerMlp::CPMuMoE, 196, 256).rank() == 147);
  CHECK(s.moe_options(MixerMlp::CPMuMoE, 512, 2048).rank() == 384);
  CHECK(s.moe_options(MixerMlp::TRMuMoE, 196, 256).ranks() == std::vector<int64_t>{4, 4, 37});
  CHECK(s.moe_options(MixerMlp::TRMuMoE, 512, 2048).ranks() == std::vector<int64_t>{4, 4, 97});
  CHECK(s.moe_options(MixerMlp::TRMuMoE, 512, 2048).gate_norm() == nn::GateNorm::BatchNorm);
  CHECK(s.moe_options(MixerMlp::TRMuMoE, 512, 2048).experts() == std::vector<int64_t>{64});
}

TEST_CASE("MixerConfig refuses bad settings, in the constructor and the static counts") {
  auto refused = [](MixerConfig c, const std::string& needle) {
    CHECK_THROWS_MU(MlpMixer{c}, needle);
    CHECK_THROWS_MU(MlpMixer::count_parameters(c), needle);
    CHECK_THROWS_MU(MlpMixer::count_mlp_parameters(c), needle);
  };
  MixerConfig c = tiny_mixer();
  c.patch_size = 3;
  refused(c, "image_size 8 is not divisible by patch_size 3");
  c = tiny_mixer(); c.width = 0;
  refused(c, "width must be positive, got 0");
  c = tiny_mixer(); c.channels = -1;
  refused(c, "channels must be positive, got -1");
  c = tiny_mixer(); c.depth = 0;
  refused(c, "depth must be positive");
  c = tiny_mixer(); c.num_classes = 0;
  refused(c, "num_classes must be positive");
  c = tiny_mixer(); c.image_size = 0;
  refused(c, "image_size must be positive");
  c = tiny_mixer(); c.token_mlp = -5;
  refused(c, "token_mlp must be positive, got -5");
  c = tiny_mixer(); c.stochastic_depth = 1.5;
  refused(c, "stochastic_depth must lie in [0, 1], got 1.5");
  c = tiny_mixer(); c.stochastic_depth = std::nan("");
  refused(c, "stochastic_depth must lie in [0, 1]");
  c = tiny_mixer(); c.ln_eps = -1;
  refused(c, "eps must be a finite non-negative number");
  c = tiny_mixer(); c.token_block = static_cast<MixerMlp>(9);
  refused(c, "token_block 9 is not a MixerMlp");
  c = tiny_mixer(MixerMlp::CPMuMoE); c.experts = 0;
  refused(c, "experts must be positive, got 0");
  c = tiny_mixer(MixerMlp::CPMuMoE); c.expert_levels = {2, 0};
  refused(c, "expert_levels[1] must be positive, got 0");
  c = tiny_mixer(MixerMlp::CPMuMoE); c.cp_rank_ratio = std::nan("");
  refused(c, "cp_rank_ratio must be a positive finite number");
  c = tiny_mixer(MixerMlp::TRMuMoE); c.tr_rank_ratio = 0.01;
  refused(c, "tr_rank_ratio 0.01 gives TR rank 0 for a block of dim");
  // The ratio an error asks for is taken: the token block's 16 first (1/16), then the
  // channel block's 12 (1/12, rounded up so that 12 times it reaches 1), then accepted.
  for (MixerMlp kind : {MixerMlp::CPMuMoE, MixerMlp::TRMuMoE}) {
    c = tiny_mixer(kind);
    double& ratio = kind == MixerMlp::CPMuMoE ? c.cp_rank_ratio : c.tr_rank_ratio;
    ratio = 0.01;
    std::vector<int64_t> dims;
    for (int tries = 0; tries < 3; ++tries) {
      try {
        c.validate();
        break;
      } catch (const Error& e) {
        const std::string m = e.what(), at = "a ratio of at least ", dim = "for a block of dim ";
        REQUIRE(m.find(at) != std::string::npos);
        dims.push_back(std::stoll(m.substr(m.find(dim) + dim.size())));
        ratio = std::stod(m.substr(m.find(at) + at.size()));
      }
    }
    CHECK(dims == std::vector<int64_t>{16, 12});
    CHECK(ratio == 0.083334);
    CHECK_NOTHROW(MlpMixer{c});
  }
  c = tiny_mixer(MixerMlp::TRMuMoE); c.gate_norm = static_cast<nn::GateNorm>(7);
  refused(c, "gate_norm 7 is not a GateNorm");
  // Sizes whose products leave int64.
  c = tiny_mixer(); c.channels = int64_t(1) << 40; c.patch_size = 1 << 20; c.image_size = 1 << 20;
  refused(c, "does not fit in int64");
  c = tiny_mixer(); c.width = int64_t(1) << 40; c.channel_mlp = int64_t(1) << 40;
  CHECK_THROWS_MU(MlpMixer::count_parameters(c), "does not fit in int64");
  // Unused ratios do not matter for MLP blocks.
  c = tiny_mixer(); c.cp_rank_ratio = std::nan("");
  CHECK_NOTHROW(MlpMixer::count_parameters(c));
}

TEST_CASE("static counts equal the built models' num_parameters()") {
  for (MixerMlp kind : {MixerMlp::MLP, MixerMlp::CPMuMoE, MixerMlp::TRMuMoE, MixerMlp::DenseMoE}) {
    const std::string kind_name = models::to_string(kind);
    CAPTURE(kind_name);
    MixerConfig c = tiny_mixer(kind);
    MlpMixer m(c);
    CHECK(m.num_parameters() == MlpMixer::count_parameters(c));
    // Written out: embed, 2 LNs per block, mixing MLPs, final LN, head.
    const int64_t T = c.tokens(), D = c.width, N = c.experts;
    auto mix = [&](int64_t d, int64_t h) {
      switch (kind) {
        case MixerMlp::MLP: return mlp_count(d, h);
        case MixerMlp::CPMuMoE: return cp_count(d, h, N, int64_t(0.75 * double(d)));
        case MixerMlp::TRMuMoE: return tr_count(d, h, N, int64_t(0.19 * double(d)));
        case MixerMlp::DenseMoE: return dense_moe_count(d, h, N);
      }
      return int64_t(0);
    };
    const int64_t want = (c.patch_dim() * D + D) + c.depth * (4 * D + mix(T, c.token_mlp) + mix(D, c.channel_mlp)) +
                         2 * D + (D * c.num_classes + c.num_classes);
    CHECK(MlpMixer::count_parameters(c) == want);
  }
  // Mixed kinds (torch_reference.py's mixer-fmnist-cpmumoe: dense token mixing, CP channel
  // mixing with LN gating and an input LayerNorm in the block).
  MixerConfig f = models::mixer_fmnist();
  f.channel_block = MixerMlp::CPMuMoE;
  f.gate_norm = nn::GateNorm::LayerNorm;
  f.moe_input_norm = true;
  MlpMixer fm(f);
  CHECK(fm.num_parameters() == MlpMixer::count_parameters(f));
  // What torch_reference.py's Mixer(mlp='cpmumoe') reports (sum of p.numel(), PyTorch 1.13).
  CHECK(MlpMixer::count_parameters(f) == 606542);
  CHECK(MlpMixer::count_parameters(f) ==
        (16 * 128 + 128) + 4 * (4 * 128 + mlp_count(49, 64) + cp_count(128, 512, 64, 96) + 2 * 128) + 2 * 128 +
            (128 * 10 + 10));
  // The dense mixer-fmnist model (torch_reference.py reports 'params' for it).
  MixerConfig d = models::mixer_fmnist();
  CHECK(MlpMixer(d).num_parameters() == MlpMixer::count_parameters(d));
  CHECK(MlpMixer::count_parameters(d) == 558158);  // torch_reference.py's Mixer() (mixer-fmnist)
  CHECK(MlpMixer::count_parameters(d) ==
        (16 * 128 + 128) + 4 * (4 * 128 + mlp_count(49, 64) + mlp_count(128, 512)) + 2 * 128 + (128 * 10 + 10));
}

TEST_CASE("hierarchical μMoE blocks (expert_levels): counts written out, and the model trains") {
  for (MixerMlp kind : {MixerMlp::CPMuMoE, MixerMlp::TRMuMoE}) {
    const std::string kind_name = models::to_string(kind);
    CAPTURE(kind_name);
    MixerConfig c = tiny_mixer(kind);
    c.expert_levels = {2};
    const int64_t T = c.tokens(), D = c.width, N1 = c.experts, N2 = 2;
    // Gating per level (d N_1 + d N_2), then two layers with both expert factors.
    auto mix = [&](int64_t d, int64_t h) {
      if (kind == MixerMlp::CPMuMoE) {
        const int64_t R = int64_t(0.75 * double(d));
        return d * (N1 + N2) + R * (N1 + N2 + (d + 1) + h) + R * (N1 + N2 + (h + 1) + d);
      }
      const int64_t R = int64_t(0.19 * double(d));  // ranks (4, 4, 4, R)
      auto layer = [&](int64_t i, int64_t o) { return 4 * N1 * 4 + 4 * N2 * 4 + 4 * (i + 1) * R + R * o * 4; };
      return d * (N1 + N2) + layer(d, h) + layer(h, d);
    };
    const int64_t want = (c.patch_dim() * D + D) + c.depth * (4 * D + mix(T, c.token_mlp) + mix(D, c.channel_mlp)) +
                         2 * D + (D * c.num_classes + c.num_classes);
    CHECK(MlpMixer::count_parameters(c) == want);
    manual_seed(3);
    MlpMixer m(c);
    CHECK(m.num_parameters() == want);
    auto moe = std::dynamic_pointer_cast<nn::MuMoE>(m.block(0)->channel_mix);
    REQUIRE(moe != nullptr);
    CHECK(moe->options().experts() == std::vector<int64_t>{N1, N2});
    // A few AdamW steps on one batch lower the loss.
    Tensor x = rand({8, 2, 8, 8}), y = from_vector(std::vector<int64_t>{0, 1, 2, 3, 4, 0, 1, 2}, {8});
    optim::AdamW opt(m.parameters(), optim::AdamWOptions(3e-3));
    const double first = cross_entropy(m(x), y).item();
    for (int step = 0; step < 30; ++step) {
      Tensor loss = cross_entropy(m(x), y);
      opt.zero_grad();
      loss.backward();
      opt.step();
    }
    CHECK(cross_entropy(m(x), y).item() < 0.5 * first);
  }
}

TEST_CASE("Mixer-S/16: Table 3 (whole model) and Table 4 (all 8 blocks' MLPs) counts") {
  const int64_t T = 196, D = 512, DT = 256, DC = 2048, N = 64, depth = 8;
  // Everything outside the mixing MLPs: embed 768 -> 512, 2 LNs per block, final LN, head.
  const int64_t rest = (768 * D + D) + depth * 4 * D + 2 * D + (D * 1000 + 1000);
  const int64_t mlp = depth * (mlp_count(T, DT) + mlp_count(D, DC));
  const int64_t cp = depth * (cp_count(T, DT, N, 147) + cp_count(D, DC, N, 384));
  const int64_t tr = depth * (tr_count(T, DT, N, 37) + tr_count(D, DC, N, 97));
  const int64_t dense = depth * (dense_moe_count(T, DT, N) + dense_moe_count(D, DC, N));

  CHECK(MlpMixer::count_mlp_parameters(models::mixer_s16(MixerMlp::MLP)) == mlp);
  CHECK(MlpMixer::count_mlp_parameters(models::mixer_s16(MixerMlp::CPMuMoE)) == cp);
  CHECK(MlpMixer::count_mlp_parameters(models::mixer_s16(MixerMlp::TRMuMoE)) == tr);
  CHECK(MlpMixer::count_mlp_parameters(models::mixer_s16(MixerMlp::DenseMoE)) == dense);
  const int64_t m_mlp = MlpMixer::count_parameters(models::mixer_s16(MixerMlp::MLP));
  const int64_t m_cp = MlpMixer::count_parameters(models::mixer_s16(MixerMlp::CPMuMoE));
  const int64_t m_tr = MlpMixer::count_parameters(models::mixer_s16(MixerMlp::TRMuMoE));
  const int64_t m_dense = MlpMixer::count_parameters(models::mixer_s16(MixerMlp::DenseMoE));
  CHECK(m_mlp == rest + mlp);
  CHECK(m_cp == rest + cp);
  CHECK(m_tr == rest + tr);
  CHECK(m_dense == rest + dense);
  MESSAGE("Mixer-S/16 whole model: MLP " << m_mlp << " (Table 3: 18.5M), CPμMoE " << m_cp << " (18.6M), TRμMoE "
                                         << m_tr << " (18.3M); dense MoE " << m_dense);
  MESSAGE("Mixer-S/16 MLPs of all 8 blocks: dense MoE " << dense << " (Table 4: 1.13B), CPμMoE " << cp
                                                         << " (17.7M), TRμMoE " << tr << " (17.4M); plain MLPs " << mlp);
  // The printed tables, rounded as printed: every count agrees.
  CHECK(rounded(m_mlp, 1e6, 1, "M") == "18.5M");
  CHECK(rounded(m_cp, 1e6, 1, "M") == "18.6M");
  CHECK(rounded(m_tr, 1e6, 1, "M") == "18.3M");
  CHECK(rounded(dense, 1e9, 2, "B") == "1.13B");
  CHECK(rounded(cp, 1e6, 1, "M") == "17.7M");
  CHECK(rounded(tr, 1e6, 1, "M") == "17.4M");
  // The exact values (from the formulas above), pinned so a change shows.
  CHECK(m_mlp == 18528264);
  CHECK(m_cp == 18630616);
  CHECK(m_tr == 18290792);
  CHECK(cp == 17706480);
  CHECK(tr == 17366656);
  CHECK(dense == 1127026688);
}

TEST_CASE("Mixer-S/16 models build with the counted number of parameters") {
  for (MixerMlp kind : {MixerMlp::MLP, MixerMlp::CPMuMoE, MixerMlp::TRMuMoE}) {
    const std::string kind_name = models::to_string(kind);
    CAPTURE(kind_name);
    MlpMixer m(models::mixer_s16(kind));
    CHECK(m.num_parameters() == MlpMixer::count_parameters(models::mixer_s16(kind)));
  }
}

TEST_CASE("patch embedding is the stride-p convolution") {
  manual_seed(3);
  MixerConfig c = tiny_mixer();
  MlpMixer m(c);
  const int64_t B = 2, C = 2, S = 8, p = 2, g = 4, D = 12;
  Tensor img = randn({B, C, S, S});
  Tensor ours = m.embed->forward(m.patchify(img));
  REQUIRE(ours.shape() == Shape{B, g * g, D});
  // Conv2d with weight W (D, C, p, p) = embed.weight reshaped, bias b, stride p.
  auto w = m.embed->weight.to_vector<double>(), bias = m.embed->bias.to_vector<double>(), x = img.to_vector<double>();
  std::vector<double> want;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t gy = 0; gy < g; ++gy)
      for (int64_t gx = 0; gx < g; ++gx)
        for (int64_t o = 0; o < D; ++o) {
          double s = bias[size_t(o)];
          for (int64_t ch = 0; ch < C; ++ch)
            for (int64_t ky = 0; ky < p; ++ky)
              for (int64_t kx = 0; kx < p; ++kx)
                s += w[size_t(flat({D, C, p, p}, {o, ch, ky, kx}))] *
                     x[size_t(flat({B, C, S, S}, {b, ch, gy * p + ky, gx * p + kx}))];
          want.push_back(s);
        }
  check_close(ours, want, 1e-5);
}

TEST_CASE("forward: image layouts, shapes and input errors") {
  manual_seed(4);
  MixerConfig c = models::mixer_fmnist();
  c.depth = 1;
  MlpMixer m(c);
  m.eval();
  Tensor img = rand({3, 1, 28, 28});
  Tensor a = m.forward(img);
  CHECK(a.shape() == Shape{3, 10});
  CHECK(max_abs_diff(a, m.forward(img.reshape({3, 784}))) == 0);
  CHECK(max_abs_diff(a, m.forward(img.reshape({3, 28, 28}))) == 0);
  CHECK_THROWS_MU(m.forward(rand({3, 1, 32, 32})), "expected 28x28 images, got 32x32");
  CHECK_THROWS_MU(m.forward(rand({3, 3, 28, 28})), "expected 1 channels, got 3");
  CHECK_THROWS_MU(m.forward(rand({3, 700})), "C·S·S = 1·28·28 = 784 values per row");
  CHECK_THROWS_MU(m.forward(zeros({3, 1, 28, 28}, kInt64)), "images must be floating point, got int64");
  CHECK_THROWS_MU(m.forward(rand({1, 3, 1, 28, 28})), "expected images (B, 1, 28, 28)");
  CHECK_THROWS_MU(m.forward(Tensor()), "undefined");
  MixerConfig rgb = tiny_mixer();
  MlpMixer m2(rgb);
  CHECK_THROWS_MU(m2.forward(rand({2, 8, 8})), "(B, H, W) images need channels = 1, the model has 2 channels");
  // Float64 models run on float64 images.
  m.to(kFloat64);
  CHECK(m.forward(img.to(kFloat64)).dtype() == kFloat64);
}

TEST_CASE("token mixing acts along the patch axis, channel mixing along the channel axis") {
  // Everything but token mixing acts on each patch alone, and the head pools over the
  // patches: with the token-mixing branch zeroed (its last Linear 0) the logits do not
  // change when two patches of the image swap places. With token mixing they do.
  manual_seed(5);
  MixerConfig c = tiny_mixer();
  c.depth = 1;
  MlpMixer m(c);
  m.eval();
  Tensor img = randn({1, 2, 8, 8});
  // Swap the top-left and bottom-right 2×2 patches.
  Tensor swapped = img.clone();
  for (int64_t ch = 0; ch < 2; ++ch)
    for (int64_t y = 0; y < 2; ++y)
      for (int64_t x = 0; x < 2; ++x) {
        swapped.set({0, ch, y, x}, img.at({0, ch, 6 + y, 6 + x}));
        swapped.set({0, ch, 6 + y, 6 + x}, img.at({0, ch, y, x}));
      }
  CHECK(max_abs_diff(m.forward(img), m.forward(swapped)) > 1e-4);
  auto tok = std::dynamic_pointer_cast<nn::Sequential>(m.block(0)->token_mix);
  REQUIRE(tok != nullptr);
  {
    autograd::NoGradGuard g;
    tok->at<nn::Linear>(2)->weight.set_data(zeros({16, 10}));
    tok->at<nn::Linear>(2)->bias.set_data(zeros({16}));
  }
  CHECK(max_abs_diff(m.forward(img), m.forward(swapped)) < 1e-5);
}

TEST_CASE("DropPath: per-sample masks, expectation, eval identity, options") {
  Generator gen(11);
  nn::DropPath dp(nn::DropPathOptions(0.3).generator(&gen));
  const int64_t B = 20000;
  Tensor x = ones({B, 3, 2});
  Tensor y = dp.forward(x);
  auto v = y.to_vector<double>();
  int64_t dropped = 0;
  for (int64_t b = 0; b < B; ++b) {
    // One decision per sample: all 6 values equal, either 0 or 1/(1-p).
    const double first = v[size_t(b * 6)];
    bool same = true;
    for (int64_t k = 1; k < 6; ++k) same = same && v[size_t(b * 6 + k)] == first;
    CHECK_MESSAGE(same, "sample " << b);
    CHECK((first == 0.0 || std::abs(first - 1 / 0.7) < 1e-6));
    dropped += first == 0.0;
  }
  // Expectation preserved: mean ≈ 1 (the mask's std is sqrt(p/(1-p)) ≈ 0.65, so the mean
  // of 20000 has std 0.0046); the drop rate ≈ 0.3 (std 0.0032).
  CHECK(std::abs(y.mean().item() - 1.0) < 0.025);
  CHECK(std::abs(double(dropped) / B - 0.3) < 0.02);
  // Same seed, same mask.
  Generator g2(11);
  nn::DropPath dp2(nn::DropPathOptions(0.3).generator(&g2));
  CHECK(max_abs_diff(dp2.forward(x), y) == 0);
  // Eval: the identity (the very tensor).
  dp.eval();
  Tensor z = randn({4, 5});
  CHECK(dp.forward(z).is_same(z));
  // p = 0 is the identity in training; p = 1 drops every sample.
  nn::DropPath none(0.0);
  CHECK(none.forward(z).is_same(z));
  nn::DropPath all(1.0);
  CHECK(max_abs_diff(all.forward(z), zeros({4, 5})) == 0);
  CHECK_THROWS_MU(nn::DropPath(1.5), "DropPath: p must lie in [0, 1], got 1.5");
  CHECK_THROWS_MU(nn::DropPath(std::nan("")), "DropPath: p must lie in [0, 1]");
  CHECK_THROWS_MU(dp2.forward(zeros({3}, kInt64)), "needs a floating-point tensor, got int64");
  CHECK_THROWS_MU(dp2.forward(Tensor()), "DropPath: expected a tensor with a batch dim");
}

TEST_CASE("stochastic depth in the model: linear rates, eval deterministic, training random") {
  MixerConfig c = tiny_mixer();
  c.depth = 3;
  c.stochastic_depth = 0.5;
  CHECK(c.drop_path_rate(0) == 0.0);
  CHECK(c.drop_path_rate(1) == 0.25);
  CHECK(c.drop_path_rate(2) == 0.5);
  CHECK_THROWS_MU(c.drop_path_rate(3), "block 3 out of range (depth 3)");
  Generator gen(1);
  c.generator = &gen;
  manual_seed(6);
  MlpMixer m(c);
  CHECK(m.block(2)->drop_path->options().p() == 0.5);
  Tensor img = randn({16, 2, 8, 8});
  Tensor t1 = m.forward(img), t2 = m.forward(img);
  CHECK(max_abs_diff(t1, t2) > 1e-6);  // different masks
  gen.manual_seed(1);
  CHECK(max_abs_diff(m.forward(img), t1) == 0);  // the same masks again
  m.eval();
  CHECK(max_abs_diff(m.forward(img), m.forward(img)) == 0);
}

TEST_CASE("gelu_recompute: the plain channel MLPs' numbers bit for bit, one activation less held per block") {
  MixerConfig c = tiny_mixer();
  c.stochastic_depth = 0.3;  // the drop-path draws must come out the same either way
  MixerConfig r = c;
  r.gelu_recompute = true;
  Generator g1(5), g2(5);
  c.generator = &g1;
  r.generator = &g2;
  manual_seed(12);
  MlpMixer plain(c);
  manual_seed(12);
  MlpMixer recomputing(r);
  // 4 images of 16 patches: a channel MLP's GELU output is 4 x 16 x 20 floats, 5120 bytes,
  // a size the allocator does not round.
  Tensor img = randn({4, 2, 8, 8});
  Tensor y = tensor({0, 1, 2, 3}).to(kInt64);
  auto held = [&](MlpMixer& m, Tensor& loss) {
    const int64_t base = cpu_allocator::stats().allocated_bytes;
    loss = cross_entropy(m.forward(img), y);
    return cpu_allocator::stats().allocated_bytes - base;
  };
  Tensor a, b;
  const int64_t held_plain = held(plain, a), held_recomputing = held(recomputing, b);
  CHECK(held_plain - held_recomputing == c.depth * 4 * c.tokens() * c.channel_mlp * 4);
  CHECK(a.item() == b.item());
  a.backward();
  b.backward();
  auto pa = plain.named_parameters(), pb = recomputing.named_parameters();
  REQUIRE(pa.size() == pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    INFO(pa[i].first);
    CHECK(max_abs_diff(pa[i].second.grad(), pb[i].second.grad()) == 0.0);
  }
  // Turned off at run time: the GELU's output is held again.
  recomputing.set_gelu_recompute(false);
  Tensor d;
  CHECK(held(recomputing, d) == held_plain);
  // μMoE channel blocks are not plain MLPs: the flag changes nothing there.
  MixerConfig m = tiny_mixer(MixerMlp::CPMuMoE);
  MixerConfig mr = m;
  mr.gelu_recompute = true;
  manual_seed(13);
  MlpMixer moe(m);
  manual_seed(13);
  MlpMixer moe_r(mr);
  moe.eval();
  moe_r.eval();
  CHECK(max_abs_diff(moe.forward(img), moe_r.forward(img)) == 0.0);
}

TEST_CASE("short training runs lower the loss on a fixed batch (every block kind)") {
  for (MixerMlp kind : {MixerMlp::MLP, MixerMlp::CPMuMoE, MixerMlp::TRMuMoE}) {
    const std::string kind_name = models::to_string(kind);
    CAPTURE(kind_name);
    manual_seed(7);
    MixerConfig c = tiny_mixer(kind);
    c.stochastic_depth = 0.1;
    MlpMixer m(c);
    Tensor img = randn({16, 2, 8, 8});
    Tensor y = randint(0, 5, {16});
    optim::AdamW opt(m.parameters(), optim::AdamWOptions(3e-3).weight_decay(0));
    double first = 0, last = 0;
    for (int step = 0; step < 60; ++step) {
      opt.zero_grad();
      Tensor loss = cross_entropy(m.forward(img), y);
      loss.backward();
      opt.step();
      if (step == 0) first = loss.item();
      last = loss.item();
    }
    MESSAGE(kind_name << ": loss " << first << " -> " << last);
    CHECK(last < 0.5 * first);
  }
}
