// Parity of GPT-2 (models/gpt2.h) with PyTorch (tests/parity/torch_gpt2.py, run through
// Debian's /usr/bin/python3), in float32, dropout 0:
//  - tiny GPT-2s with the dense, CPμMoE and TRμMoE MLPs are exported (state dict and the
//    batches of ten steps) and rebuilt in PyTorch from those weights; the logits, the loss and the
//    gradient of every parameter on the first batch agree to 1e-4 relative
//    (parity::rel_error: max |ours - torch| / max |torch|), and so do the losses of 10
//    AdamW steps with nanoGPT's decay split (betas (0.9, 0.95), weight decay 0.1);
//  - a random GPT-2 written by PyTorch in the Hugging Face layout loads through
//    load_hf_gpt2_safetensors and gives PyTorch's logits.
#include <fstream>

#include "models/gpt2.h"
#include "parity_io.h"

using namespace mu;
using models::GPT2;
using models::GPT2Config;
namespace fs = std::filesystem;

namespace {

constexpr int kSteps = 10;
constexpr double kTol = 1e-4;
constexpr double kLr = 3e-3;
constexpr double kWeightDecay = 0.1;

struct Case {
  std::string name, mlp;  // mlp: dense, cp, tr
  int64_t experts = 0, rank = 0;
};

GPT2Config config_of(const Case& k) {
  GPT2Config c;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 16;
  c.block_size = 8;
  c.vocab_size = 37;
  c.bias = true;
  c.dropout = 0.0;
  if (k.mlp == "cp") c.mlp = models::mlp::cp_mumoe(k.experts, k.rank);
  if (k.mlp == "tr") c.mlp = models::mlp::tr_mumoe(k.experts, k.rank);
  return c;
}

std::string manifest_line(const Case& k, const std::string& mode, const GPT2Config& c) {
  return detail::str(k.name, ' ', mode, " n_layer=", c.n_layer, " n_head=", c.n_head, " n_embd=", c.n_embd,
                     " block_size=", c.block_size, " vocab=", c.vocab_size, " bias=", c.bias ? 1 : 0, " mlp=", k.mlp,
                     " experts=", k.experts, " rank=", k.rank, " steps=", kSteps, " lr=", kLr, " wd=", kWeightDecay,
                     '\n');
}

// What this side computed for one training case.
struct Ours {
  Tensor logits, loss;
  std::vector<std::pair<std::string, Tensor>> grads, finals;
  std::vector<double> losses;
};

Ours run_ours(GPT2& model, const Tensor& idx, const Tensor& tgt) {
  Ours o;
  auto out = model.forward(idx.select(0, 0), tgt.select(0, 0));
  out.loss.backward();
  o.logits = out.logits.detach();
  o.loss = out.loss.detach();
  for (auto& [name, p] : model.named_parameters()) {
    REQUIRE_MESSAGE(p.grad().defined(), name << " got no gradient");
    o.grads.emplace_back(name, p.grad().clone());
  }
  model.zero_grad();
  optim::AdamW opt(optim::decay_groups(model, kWeightDecay), optim::AdamWOptions(kLr).betas(0.9, 0.95));
  for (int s = 0; s < kSteps; ++s) {
    opt.zero_grad();
    Tensor loss = model.forward(idx.select(0, s), tgt.select(0, s)).loss;
    loss.backward();
    o.losses.push_back(loss.item());
    opt.step();
  }
  for (auto& [name, p] : model.named_parameters()) o.finals.emplace_back(name, p.detach().clone());
  return o;
}

}  // namespace

TEST_CASE("GPT-2 (dense, CPμMoE, TRμMoE MLPs) matches PyTorch: logits, loss, gradients, 10 AdamW steps") {
  const std::vector<Case> cases = {{"dense", "dense"}, {"cp", "cp", 8, 12}, {"tr", "tr", 8, 5}};
  fs::path dir = parity::make_temp_dir("gpt2");
  std::ofstream manifest(dir / "manifest.txt");
  std::vector<Ours> ours;
  for (const Case& k : cases) {
    GPT2Config c = config_of(k);
    Generator gen(100 + ours.size());
    manual_seed(200 + ours.size());  // the μMoE factors draw from the global generator
    GPT2 model(c, &gen);
    if (k.mlp != "dense") {
      // Gating weights away from their zero init, so that entmax picks sparse, token-dependent
      // experts and the gradient through the gating is exercised.
      NoGradGuard ng;
      for (int64_t l = 0; l < c.n_layer; ++l)
        for (auto& [n, p] : model.mlp(l)->named_parameters())
          if (n == "G1") p.copy_(randn(p.shape(), {}, &gen) * 0.7);
    }
    // Two batches of (B, T) = (3, 8), alternating over the ten steps, so that the loss
    // falls as the model fits them; target -1 (ignored) at one position.
    Tensor two_idx = randint(0, c.vocab_size, {2, 3, 8}, TensorOptions(kInt64), &gen);
    Tensor two_tgt = randint(0, c.vocab_size, {2, 3, 8}, TensorOptions(kInt64), &gen);
    two_tgt.set({0, 1, 2}, -1);
    std::vector<Tensor> pick_idx, pick_tgt;
    for (int s = 0; s < kSteps; ++s) {
      pick_idx.push_back(two_idx.select(0, s % 2));
      pick_tgt.push_back(two_tgt.select(0, s % 2));
    }
    Tensor idx = stack(pick_idx), tgt = stack(pick_tgt);
    save_safetensors((dir / (k.name + ".weights.safetensors")).string(), model.state_dict());
    save_safetensors((dir / (k.name + ".inputs.safetensors")).string(), {{"idx", idx}, {"targets", tgt}});
    manifest << manifest_line(k, "train", c);
    ours.push_back(run_ours(model, idx, tgt));
  }
  manifest.close();
  parity::run_torch_script("torch_gpt2.py", dir);

  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& k = cases[i];
    const Ours& o = ours[i];
    INFO("case " << k.name);
    SafetensorsFile ref = load_safetensors((dir / (k.name + ".torch.safetensors")).string());
    const double e_logits = parity::rel_error(o.logits, ref.get("logits"));
    const double e_loss = parity::rel_error(o.loss, ref.get("loss"));
    CHECK(e_logits <= kTol);
    CHECK(e_loss <= kTol);
    double worst_grad = 0;
    std::string worst_name;
    for (auto& [name, g] : o.grads) {
      INFO("gradient of " << name);
      REQUIRE(ref.contains("grad." + name));
      const double e = parity::rel_error(g, ref.get("grad." + name));
      CHECK(e <= kTol);
      if (e >= worst_grad) worst_grad = e, worst_name = name;
    }
    // Every parameter PyTorch has, we have (the names are the same on both sides).
    int64_t torch_grads = 0;
    for (auto& [name, t] : ref.tensors) torch_grads += name.rfind("grad.", 0) == 0;
    CHECK(torch_grads == int64_t(o.grads.size()));
    std::vector<double> tl = ref.get("losses").to_vector<double>();
    REQUIRE(tl.size() == size_t(kSteps));
    double worst_step = 0;
    for (int s = 0; s < kSteps; ++s) {
      const double e = std::abs(o.losses[size_t(s)] - tl[size_t(s)]) / std::abs(tl[size_t(s)]);
      INFO("step " << s << ": ours " << o.losses[size_t(s)] << ", torch " << tl[size_t(s)]);
      CHECK(e <= kTol);
      worst_step = std::max(worst_step, e);
    }
    // The losses must have moved, or the steps compared nothing (steps 0 and 8 see the same batch).
    CHECK(tl[8] < tl[0] - 0.05);
    double worst_final = 0;
    for (auto& [name, p] : o.finals) worst_final = std::max(worst_final, parity::rel_error(p, ref.get("final." + name)));
    MESSAGE(k.name << ": logits " << e_logits << ", loss " << e_loss << ", worst gradient " << worst_grad << " ("
                   << worst_name << "), losses over " << kSteps << " AdamW steps " << worst_step << " (loss "
                   << tl.front() << " -> " << tl.back() << "), parameters after the steps " << worst_final);
  }
  fs::remove_all(dir);
}

TEST_CASE("a GPT-2 written by PyTorch in the Hugging Face layout loads and gives PyTorch's logits") {
  Case k{"hf", "dense"};
  GPT2Config c;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 16;
  c.block_size = 12;
  c.vocab_size = 29;
  fs::path dir = parity::make_temp_dir("gpt2_hf");
  Generator gen(5);
  Tensor idx = randint(0, c.vocab_size, {2, 10}, TensorOptions(kInt64), &gen);
  save_safetensors((dir / "hf.inputs.safetensors").string(), {{"idx", idx}});
  {
    std::ofstream manifest(dir / "manifest.txt");
    manifest << manifest_line(k, "hf", c);
  }
  parity::run_torch_script("torch_gpt2.py", dir);
  GPT2 model(c);
  models::load_hf_gpt2_safetensors(model, (dir / "hf.model.safetensors").string());
  Tensor want = load_safetensors((dir / "hf.torch.safetensors").string()).get("logits");
  const double e = parity::rel_error(model.forward(idx), want);
  MESSAGE("Hugging Face layout: logits rel error " << e);
  CHECK(e <= 1e-5);
  // The file really has the buffers and Conv1D layout the loader handles.
  SafetensorsFile f = load_safetensors((dir / "hf.model.safetensors").string());
  CHECK(f.contains("h.0.attn.bias"));
  CHECK(f.contains("h.1.attn.masked_bias"));
  CHECK(f.get("h.0.mlp.c_fc.weight").shape() == Shape{16, 64});
  fs::remove_all(dir);
}
