// Whole training steps on cuda:0 against the CPU: GPT-2 and MLP-Mixer, dense and CPμMoE,
// five AdamW steps (with gradient clipping and dropout) from equal weights on equal
// data; and checkpoints saved on one device and resumed on the other. Skipped (exit 77,
// the reason printed) without a CUDA device.
//
// Tolerances: in float64 the two devices differ only in the order of their sums, ~1e-15
// relative per op, so five steps agree to 1e-9 (losses, relative) and 1e-8 (weights,
// absolute; AdamW moves each by at most lr per step). In float32 the same orders give
// ~1e-6 relative per op: losses within 1e-4. With bf16 autocast, products round to 8
// bits on both devices but not always to the same neighbour: losses within 1e-2.
#include <cmath>

#include "file_helpers.h"
#include "helpers.h"
#include "models/gpt2.h"
#include "models/mlp_mixer.h"
#include "optim/adamw.h"
#include "optim/checkpoint.h"
#include "optim/clip.h"

using namespace mu;

[[maybe_unused]] static const bool kHaveDevice = skip_without_cuda("the CUDA training tests");

namespace {

models::GPT2Config tiny_gpt2(bool cp) {
  models::GPT2Config c;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 32;
  c.block_size = 16;
  c.vocab_size = 61;
  c.dropout = 0.1;  // the counter-based masks are equal on both devices
  if (cp) c.mlp = models::mlp::cp_mumoe(8, 16);
  return c;
}

models::MixerConfig small_mixer(bool cp) {
  models::MixerConfig c = models::mixer_fmnist();
  c.width = 32;
  c.token_mlp = 16;
  c.channel_mlp = 64;
  c.depth = 2;
  c.experts = 8;
  c.mlp(cp ? models::MixerMlp::CPMuMoE : models::MixerMlp::MLP);
  return c;
}

// Weight tolerance after five AdamW steps at lr 1e-3 in float32: Adam divides each
// gradient by its own running magnitude, so a component whose gradient is near zero
// moves by up to lr per step in a direction that float32 rounding (reduction order, which
// differs between the devices) can flip; 1e-3 is one such step. The losses, compared at
// every step, carry the tighter check.
constexpr double kFloat32WeightTol = 1e-3;

// The largest |a - b| over every parameter of two models of one architecture.
double max_param_diff(nn::Module& a, nn::Module& b) {
  std::vector<Tensor> pa = a.parameters(), pb = b.parameters();
  REQUIRE(pa.size() == pb.size());
  double m = 0;
  for (size_t i = 0; i < pa.size(); ++i) m = std::max(m, max_abs_diff(pa[i].to(kFloat64), pb[i].to(kFloat64)));
  return m;
}

// Five steps of `loss_of` on the CPU model and on its copy on cuda:0, comparing the
// losses step by step and the weights at the end.
template <class Model, class Loss>
void five_steps(Model& cpu, Model& gpu, Loss loss_of, bool bf16, double loss_tol, double weight_tol) {
  gpu.to(Device::cuda());
  optim::AdamW oc(cpu.parameters(), optim::AdamWOptions(1e-3).weight_decay(0.1));
  optim::AdamW og(gpu.parameters(), optim::AdamWOptions(1e-3).weight_decay(0.1));
  for (int step = 0; step < 5; ++step) {
    INFO("step " << step);
    double l[2];
    int k = 0;
    for (auto [m, opt, dev] : {std::tuple{&cpu, &oc, Device::cpu()}, std::tuple{&gpu, &og, Device::cuda()}}) {
      manual_seed(uint64_t(100 + step));  // the same dropout seeds on both devices
      opt->zero_grad();
      Tensor loss;
      {
        AutocastGuard amp(kBFloat16, bf16);
        loss = loss_of(*m, dev, step);
      }
      loss.backward();
      optim::clip_grad_norm(m->parameters(), 1.0);
      opt->step();
      l[k++] = loss.item();
    }
    MESSAGE("step " << step << ": loss cpu " << l[0] << ", cuda " << l[1]);
    CHECK(std::fabs(l[0] - l[1]) <= loss_tol * std::fabs(l[0]));
  }
  const double d = max_param_diff(cpu, gpu);
  MESSAGE("largest weight difference after 5 steps: " << d);
  CHECK(d <= weight_tol);
}

}  // namespace

TEST_CASE("GPT-2 training steps on cuda:0 match the CPU's (dense and CPμMoE; float64, float32, bf16 autocast)") {
  for (bool cp : {false, true}) {
    for (const std::string mode : {"float64", "float32", "bf16"}) {
      INFO(std::string(cp ? "CPμMoE " : "dense ") << mode);
      Generator g1(5), g2(5), data(6);
      models::GPT2 cpu(tiny_gpt2(cp), &g1), gpu(tiny_gpt2(cp), &g2);
      if (mode == "float64") {
        cpu.to(kFloat64);
        gpu.to(kFloat64);
      }
      const Tensor idx = randint(0, 61, {4, 5, 16}, TensorOptions(kInt64), &data);
      const Tensor tgt = randint(0, 61, {4, 5, 16}, TensorOptions(kInt64), &data);
      auto loss_of = [&](models::GPT2& m, Device dev, int step) {
        return m.forward(idx.select(1, step).to(dev), tgt.select(1, step).to(dev)).loss;
      };
      const double loss_tol = mode == "float64" ? 1e-9 : mode == "float32" ? 1e-4 : 1e-2;
      const double weight_tol = mode == "float64" ? 1e-8 : mode == "float32" ? kFloat32WeightTol : 5e-3;
      five_steps(cpu, gpu, loss_of, mode == "bf16", loss_tol, weight_tol);
    }
  }
}

TEST_CASE("MLP-Mixer training steps on cuda:0 match the CPU's (dense and CPμMoE; float64 and float32)") {
  for (bool cp : {false, true}) {
    for (const std::string mode : {"float64", "float32"}) {
      INFO(std::string(cp ? "CPμMoE " : "dense ") << mode);
      manual_seed(7);
      models::MlpMixer cpu(small_mixer(cp));
      manual_seed(7);
      models::MlpMixer gpu(small_mixer(cp));
      const DType dt = mode == "float64" ? kFloat64 : kFloat32;
      cpu.to(dt);
      gpu.to(dt);
      Generator data(8);
      const Tensor images = randn({5, 16, 1, 28, 28}, TensorOptions(dt), &data);
      const Tensor labels = randint(0, 10, {5, 16}, TensorOptions(kInt64), &data);
      auto loss_of = [&](models::MlpMixer& m, Device dev, int step) {
        return cross_entropy(m.forward(images.select(0, step).to(dev)), labels.select(0, step).to(dev));
      };
      five_steps(cpu, gpu, loss_of, false, mode == "float64" ? 1e-9 : 1e-4, mode == "float64" ? 1e-8 : kFloat32WeightTol);
    }
  }
}

TEST_CASE("a checkpoint saved on cuda:0 resumes on the CPU, and the reverse, to the same next step") {
  TempDir dir("cuda_checkpoint");
  for (Device first : {Device::cuda(), Device::cpu()}) {
    const Device second = first.is_cuda() ? Device::cpu() : Device::cuda();
    INFO("saved on " << first.str() << ", resumed on " << second.str());
    Generator g(3), data(4);
    models::GPT2 a(tiny_gpt2(true), &g);
    a.to(kFloat64);
    a.to(first);
    optim::AdamW oa(a.parameters(), optim::AdamWOptions(1e-3));
    const Tensor idx = randint(0, 61, {3, 2, 16}, TensorOptions(kInt64), &data);
    auto step = [&](models::GPT2& m, optim::AdamW& o, Device dev, int s) {
      manual_seed(uint64_t(50 + s));
      o.zero_grad();
      Tensor loss = m.forward(idx.select(1, s).to(dev), idx.select(1, s).to(dev)).loss;
      loss.backward();
      o.step();
      return loss.item();
    };
    step(a, oa, first, 0);
    const std::string path = dir.file("ckpt_" + first.str().substr(0, 3) + ".safetensors");
    optim::save_checkpoint(path, a, oa, 1);
    Generator g2(99);  // other weights: the checkpoint must overwrite them all
    models::GPT2 b(tiny_gpt2(true), &g2);
    b.to(kFloat64);
    b.to(second);
    optim::AdamW ob(b.parameters(), optim::AdamWOptions(1e-3));
    CHECK(optim::load_checkpoint(path, b, ob) == 1);
    for (const Tensor& p : b.parameters()) CHECK(p.device() == second);
    CHECK(max_param_diff(a, b) == 0.0);
    // The next step from the restored moments lands on the same weights.
    const double la = step(a, oa, first, 1), lb = step(b, ob, second, 1);
    CHECK(std::fabs(la - lb) <= 1e-9 * std::fabs(la));
    CHECK(max_param_diff(a, b) <= 1e-8);
  }
}
