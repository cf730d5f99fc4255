// MLP-Mixer parity with PyTorch (tests/parity/torch_mixer.py): small Mixers with plain
// MLP blocks, with TRμMoE and with CPμMoE blocks (batch-norm gating, entmax-1.5), and in
// torch_reference.py's mixer-fmnist-cpmumoe layout (LayerNorm gating, input LayerNorm),
// exported and rebuilt from the weights in PyTorch, compared in float32: logits, loss,
// the gradient of every parameter, and the losses of 10 AdamW steps.
// Stochastic depth is 0 here (it is random); tests/test_mixer.cpp checks it.
#include <fstream>

#include "helpers.h"
#include "models/mlp_mixer.h"
#include "parity_io.h"

using namespace mu;
using models::MixerConfig;
using models::MixerMlp;

namespace {

constexpr double kTol = 1e-4;
constexpr int kSteps = 10;
constexpr double kLr = 1e-3, kWd = 1e-4;

void run_case(MixerMlp token, MixerMlp channel, const std::string& tag, bool ln_gating = false) {
  MixerConfig c;
  c.image_size = 8;
  c.channels = 2;
  c.patch_size = 2;  // 16 tokens
  c.width = 24;
  c.token_mlp = 20;
  c.channel_mlp = 40;
  c.depth = 2;
  c.num_classes = 5;
  c.experts = 8;
  c.token_block = token;
  c.channel_block = channel;
  if (ln_gating) {
    // torch_reference.py's mixer-fmnist-cpmumoe block: LayerNorm gating and an input LayerNorm.
    c.gate_norm = nn::GateNorm::LayerNorm;
    c.moe_input_norm = true;
  }
  manual_seed(21);
  models::MlpMixer model(c);
  // The gates start at zero (every expert equal); random ones give the gating work to do.
  {
    autograd::NoGradGuard g;
    for (auto& [name, t] : model.named_parameters())
      if (name.size() > 3 && name.compare(name.size() - 3, 3, ".G1") == 0) t.set_data(randn(t.shape()) * 0.5);
  }
  const int64_t B = 12;
  Tensor images = randn({B, 2, 8, 8});
  Tensor labels = randint(0, 5, {B});

  std::filesystem::path dir = parity::make_temp_dir("mixer_" + tag);
  {
    std::ofstream cfg(dir / "config.txt");
    cfg << "image 8\nchannels 2\npatch 2\nwidth 24\ndepth 2\nclasses 5\n"
        << "token_block " << models::to_string(c.token_block) << "\nchannel_block " << models::to_string(c.channel_block)
        << "\ngate_norm " << nn::to_string(c.gate_norm) << "\ninput_norm " << (c.moe_input_norm ? 1 : 0)
        << "\nsteps " << kSteps << "\nlr " << kLr << "\nwd " << kWd << "\nln_eps " << c.ln_eps << "\n";
    std::ofstream params(dir / "params.txt");
    for (auto& [name, t] : model.named_parameters()) {
      params << name << ' ' << parity::shape_arg(t) << '\n';
      parity::write_raw(dir / ("p." + name + ".bin"), t);
    }
    parity::write_raw(dir / "images.bin", images);
    parity::write_raw(dir / "labels.bin", labels);
  }
  parity::run_torch_script("torch_mixer.py", dir);

  Tensor logits = model.forward(images);
  Tensor loss = cross_entropy(logits, labels);
  loss.backward();
  const double e_logits = parity::rel_error(logits, parity::read_float(dir / "logits.bin", {B, 5}));
  const double e_loss = parity::rel_error(loss.reshape({1}), parity::read_float(dir / "loss.bin", {1}));
  CHECK(e_logits <= kTol);
  CHECK(e_loss <= kTol);
  // The largest gradient entry over all parameters: the scale for gradients that are zero
  // in exact arithmetic. The token-mixing MLP's output bias is one: it shifts all D
  // channels of a patch alike, which every LayerNorm downstream removes, so both sides
  // hold round-off there (~1e-9) and a relative error means nothing.
  double scale = 0;
  for (auto& [name, t] : model.named_parameters()) scale = std::max(scale, mu::max(t.grad().abs()).item());
  double worst_grad = 0;
  std::string worst_name;
  for (auto& [name, t] : model.named_parameters()) {
    CAPTURE(name);
    REQUIRE(t.grad().defined());
    Tensor ref = parity::read_float(dir / ("g." + name + ".bin"), t.shape());
    const double ref_max = mu::max(ref.abs()).item();
    if (ref_max < 1e-6 * scale) {
      // Zero in exact arithmetic: ours must be round-off too.
      CHECK(mu::max(t.grad().abs()).item() < 1e-6 * scale);
      MESSAGE(tag << ": " << name << " has a zero gradient in exact arithmetic: max |ours| "
                  << mu::max(t.grad().abs()).item() << ", max |torch| " << ref_max << ", largest gradient " << scale);
      continue;
    }
    const double e = parity::rel_error(t.grad(), ref);
    CHECK(e <= kTol);
    if (e >= worst_grad) worst_grad = e, worst_name = name;
  }
  model.zero_grad();

  optim::AdamW opt(model.parameters(), optim::AdamWOptions(kLr).weight_decay(kWd));
  std::vector<double> ours;
  for (int s = 0; s < kSteps; ++s) {
    opt.zero_grad();
    Tensor l = cross_entropy(model.forward(images), labels);
    l.backward();
    opt.step();
    ours.push_back(l.item());
  }
  auto ref = parity::read_float(dir / "losses.bin", {kSteps}).to_vector<double>();
  double worst_step = 0;
  for (int s = 0; s < kSteps; ++s) {
    CAPTURE(s);
    const double e = std::abs(ours[size_t(s)] - ref[size_t(s)]) / std::abs(ref[size_t(s)]);
    CHECK(e <= kTol);
    worst_step = std::max(worst_step, e);
  }
  MESSAGE(tag << ": rel. error logits " << e_logits << ", loss " << e_loss << ", worst gradient " << worst_grad << " ("
              << worst_name << "), worst of " << kSteps << " AdamW losses " << worst_step << " (loss " << ours.front()
              << " -> " << ours.back() << ")");
  std::filesystem::remove_all(dir);
}

}  // namespace

TEST_CASE("Mixer with MLP blocks matches PyTorch") { run_case(MixerMlp::MLP, MixerMlp::MLP, "mlp"); }
TEST_CASE("Mixer with TRμMoE blocks (batch-norm gating) matches PyTorch") {
  run_case(MixerMlp::TRMuMoE, MixerMlp::TRMuMoE, "tr");
}
TEST_CASE("Mixer with CPμMoE blocks (batch-norm gating) matches PyTorch") {
  run_case(MixerMlp::CPMuMoE, MixerMlp::CPMuMoE, "cp");
}
TEST_CASE("Mixer in torch_reference.py's cpmumoe layout (MLP token mixing, LN-gated CPμMoE channel mixing)") {
  run_case(MixerMlp::MLP, MixerMlp::CPMuMoE, "ref_cp", /*ln_gating=*/true);
}
