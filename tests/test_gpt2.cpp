// GPT-2 (models/gpt2.h): configuration checks, parameter counts (by hand-written formulas
// and against PyTorch's counts of torch_reference.py's models), nanoGPT's names and
// initialisation, the tied lm_head, causality, the loss, the MLP factory, and the Hugging
// Face safetensors loader on files written here (generate: test_gpt2_generate.cpp).
#include <filesystem>
#include <set>
#include <unistd.h>

#include "helpers.h"
#include "tensor/allocator.h"
#include "models/gpt2.h"
#include "tiny_models.h"

using namespace mu;
using models::GPT2;
using models::GPT2Config;
namespace mlp = models::mlp;
namespace fs = std::filesystem;

namespace {

Tensor tokens(int64_t B, int64_t T, int64_t V, uint64_t seed) {
  Generator g(seed);
  return randint(0, V, {B, T}, TensorOptions(kInt64), &g);
}

// The PyTorch-style mean cross-entropy of logits (N, V) and targets (N), by loops in double.
double brute_cross_entropy(const Tensor& logits, const Tensor& targets) {
  const int64_t N = logits.size(0), V = logits.size(1);
  std::vector<double> l = logits.to_vector<double>();
  std::vector<int64_t> t = targets.to_vector<int64_t>();
  double total = 0;
  for (int64_t n = 0; n < N; ++n) {
    double mx = -1e300, s = 0;
    for (int64_t v = 0; v < V; ++v) mx = std::max(mx, l[size_t(n * V + v)]);
    for (int64_t v = 0; v < V; ++v) s += std::exp(l[size_t(n * V + v)] - mx);
    total += std::log(s) + mx - l[size_t(n * V + t[size_t(n)])];
  }
  return total / double(N);
}

// Every parameter's gradient of model a within tol of model b's (both built alike).
void check_same_grads(const GPT2& a, const GPT2& b, double tol) {
  auto pa = a.named_parameters(), pb = b.named_parameters();
  REQUIRE(pa.size() == pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    INFO(pa[i].first);
    CHECK(max_abs_diff(pa[i].second.grad(), pb[i].second.grad()) <= tol);
  }
}

}  // namespace

TEST_CASE("GPT2Config presets") {
  GPT2Config g = GPT2Config::gpt2_124m();
  CHECK(g.n_layer == 12);
  CHECK(g.n_head == 12);
  CHECK(g.n_embd == 768);
  CHECK(g.block_size == 1024);
  CHECK(g.vocab_size == 50257);
  CHECK(g.bias);
  CHECK(g.mlp.name == "dense");
  GPT2Config m = GPT2Config::gpt2_mini();  // torch_reference.py's gpt2-mini
  CHECK(m.n_layer == 4);
  CHECK(m.n_head == 4);
  CHECK(m.n_embd == 256);
  CHECK(m.block_size == 128);
  CHECK(m.vocab_size == 50257);
  CHECK(m.bias);
  CHECK(m.dropout == 0.0);
}

TEST_CASE("GPT2Config: every field validated at construction and in the static count") {
  auto refused = [](GPT2Config c, const std::string& needle) {
    CHECK_THROWS_MU(GPT2(c), needle);
    CHECK_THROWS_MU(GPT2::count_parameters(c), needle);
  };
  GPT2Config c = tiny_gpt2();
  c.n_embd = 9;
  refused(c, "n_embd (9) must be divisible by n_head (2)");
  c = tiny_gpt2();
  c.n_layer = 0;
  refused(c, "n_layer must be positive, got 0");
  c = tiny_gpt2();
  c.n_head = -2;
  refused(c, "n_head must be positive, got -2");
  c = tiny_gpt2();
  c.n_embd = 0;
  refused(c, "n_embd must be positive, got 0");
  c = tiny_gpt2();
  c.block_size = -1;
  refused(c, "block_size must be positive, got -1");
  c = tiny_gpt2();
  c.vocab_size = 0;
  refused(c, "vocab_size must be positive, got 0");
  c = tiny_gpt2();
  c.dropout = 1.5;
  refused(c, "dropout must lie in [0, 1], got 1.5");
  c = tiny_gpt2();
  c.dropout = std::nan("");
  refused(c, "dropout must lie in [0, 1], got nan");
  c = tiny_gpt2();
  c.dropout = -0.1;
  refused(c, "dropout must lie in [0, 1]");
  c = tiny_gpt2();
  c.mlp.make = nullptr;
  refused(c, "has no factory");
  c = tiny_gpt2();
  c.vocab_size = int64_t(1) << 40;
  c.n_embd = int64_t(1) << 30;
  c.n_head = 1;
  refused(c, "vocab_size * n_embd");
  // The μMoE rules exist for 64 and 256 experts only.
  c = tiny_gpt2();
  c.mlp = mlp::cp_mumoe(32);
  refused(c, "for 64 or 256 experts only, got 32");
  c.mlp = mlp::tr_mumoe(100);
  refused(c, "for 64 or 256 experts only, got 100");
  // 0.78 * 1 truncates to rank 0.
  c = tiny_gpt2();
  c.n_embd = 1;
  c.n_head = 1;
  c.mlp = mlp::cp_mumoe(64);
  refused(c, "gives rank 0");
}

TEST_CASE("gpt2_124m has 124,439,808 parameters (static count; test_gpt2_124m builds it)") {
  const int64_t V = 50257, P = 1024, d = 768, L = 12;
  // Written out: embeddings, then per block ln_1, c_attn, c_proj, ln_2, c_fc, c_proj, then ln_f.
  const int64_t block = 2 * d + (d * 3 * d + 3 * d) + (d * d + d) + 2 * d + (d * 4 * d + 4 * d) + (4 * d * d + d);
  const int64_t by_hand = V * d + P * d + L * block + 2 * d;
  CHECK(by_hand == 124439808);
  CHECK(GPT2::count_parameters(GPT2Config::gpt2_124m()) == 124439808);
  CHECK(GPT2::count_mlp_parameters(GPT2Config::gpt2_124m()) == L * ((d * 4 * d + 4 * d) + (4 * d * d + d)));
}

TEST_CASE("GPT-2 μMoE MLP counts (Table 4) from the stated shapes") {
  const int64_t d = 768, L = 12, N = 256, H = 4 * d;
  GPT2Config cp = GPT2Config::gpt2_124m();
  cp.mlp = mlp::cp_mumoe(N);
  GPT2Config tr = GPT2Config::gpt2_124m();
  tr.mlp = mlp::tr_mumoe(N);
  CHECK(mlp::cp_rank(d, N) == 556);  // int(0.725 * 768) = int(556.8)
  CHECK(mlp::tr_rank(d, N) == 149);  // int(0.195 * 768) = int(149.76)
  CHECK(mlp::cp_rank(d, 64) == 599);  // int(599.04)
  CHECK(mlp::tr_rank(d, 64) == 153);  // int(153.6)
  // Per block: gating G (d, N), the input LayerNorm (2d), then the two layers with the
  // bias row: CP R (N + I + 1 + O); TR R1 N R2 + R2 (I + 1) R3 + R3 O R1 with (4, 4, R3).
  const int64_t R = 556, R3 = 149;
  const int64_t cp_block = d * N + 2 * d + R * (N + d + 1 + H) + R * (N + H + 1 + d);
  const int64_t tr_block = d * N + 2 * d + (4 * N * 4 + 4 * (d + 1) * R3 + R3 * H * 4) +
                           (4 * N * 4 + 4 * (H + 1) * R3 + R3 * d * 4);
  CHECK(L * cp_block == 57048096);  // Table 4: 57.0M
  CHECK(L * tr_block == 57417696);  // Table 4: 57.4M
  CHECK(GPT2::count_mlp_parameters(cp) == L * cp_block);
  CHECK(GPT2::count_mlp_parameters(tr) == L * tr_block);
  // The whole models: the MLP blocks replace MLP + ln_2.
  const int64_t dense_mlp_and_ln2 = (d * H + H) + (H * d + d) + 2 * d;
  CHECK(GPT2::count_parameters(cp) == 124439808 - L * dense_mlp_and_ln2 + L * cp_block);
  CHECK(GPT2::count_parameters(tr) == 124439808 - L * dense_mlp_and_ln2 + L * tr_block);
  // The dense (unfactorized) MoE with 256 experts: 14.5B.
  const int64_t dense_moe = L * N * ((d + 1) * H + (H + 1) * d);
  CHECK(dense_moe == 14507311104);
}

TEST_CASE("gpt2-mini counts equal PyTorch's for torch_reference.py's three MLPs") {
  // sum(p.numel() for p in GPT(50257, 128, 4, 4, 256, mlp, 64).parameters()) in PyTorch 1.13.
  GPT2Config c = GPT2Config::gpt2_mini();
  CHECK(GPT2::count_parameters(c) == 16058112);
  c.mlp = mlp::cp_mumoe(64);
  CHECK(GPT2::count_parameters(c) == 16162616);
  c.mlp = mlp::tr_mumoe(64);
  CHECK(GPT2::count_parameters(c) == 16120160);
}

TEST_CASE("static counts equal built models' num_parameters") {
  for (bool bias : {true, false}) {
    for (int which = 0; which < 3; ++which) {
      GPT2Config c = tiny_gpt2(3);
      c.bias = bias;
      if (which == 1) c.mlp = mlp::cp_mumoe(64);
      if (which == 2) c.mlp = mlp::tr_mumoe(6, 3);
      INFO("bias " << bias << ", mlp " << c.mlp.name);
      GPT2 model(c);
      CHECK(model.num_parameters() == GPT2::count_parameters(c));
      int64_t mlps = 0;
      for (int64_t l = 0; l < c.n_layer; ++l) mlps += model.mlp(l)->num_parameters();
      CHECK(mlps == GPT2::count_mlp_parameters(c));
    }
  }
}

TEST_CASE("state-dict names follow nanoGPT's") {
  GPT2 model(tiny_gpt2(2));
  std::vector<std::string> names;
  for (auto& [name, t] : model.state_dict()) names.push_back(name);
  std::vector<std::string> want = {"transformer.wte.weight", "transformer.wpe.weight"};
  for (int l = 0; l < 2; ++l) {
    std::string h = "transformer.h." + std::to_string(l) + ".";
    for (const char* s : {"ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
                          "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
                          "mlp.c_proj.weight", "mlp.c_proj.bias"})
      want.push_back(h + s);
  }
  want.push_back("transformer.ln_f.weight");
  want.push_back("transformer.ln_f.bias");
  want.push_back("lm_head.weight");
  CHECK(names == want);
  // named_parameters lists the tied tensor once, under its first name.
  std::vector<std::string> pnames;
  for (auto& [name, t] : model.named_parameters()) pnames.push_back(name);
  want.pop_back();
  CHECK(pnames == want);

  // Without biases: no .bias entries at all; μMoE blocks: no ln_2, nn::MuMoE's names under mlp.
  GPT2Config c = tiny_gpt2(1);
  c.bias = false;
  c.mlp = mlp::cp_mumoe(64);
  GPT2 moe(c);
  std::set<std::string> got;
  for (auto& [name, t] : moe.state_dict()) got.insert(name);
  // (nn::MuMoE's input LayerNorm always has its bias.)
  for (const std::string& n : got)
    if (n.find("input_norm") == std::string::npos) CHECK(n.find(".bias") == std::string::npos);
  CHECK(got.count("transformer.h.0.ln_2.weight") == 0);
  for (const char* s : {"mlp.G1", "mlp.input_norm.weight", "mlp.layer1.U1", "mlp.layer1.U_in", "mlp.layer1.U_out",
                        "mlp.layer2.U1", "mlp.layer2.U_in", "mlp.layer2.U_out"})
    CHECK(got.count(std::string("transformer.h.0.") + s) == 1);
}

TEST_CASE("μMoE MLPs draw their factors from the model's generator too") {
  for (models::MlpChoice choice : {mlp::cp_mumoe(4, 3), mlp::tr_mumoe(4, 3)}) {
    GPT2Config c = tiny_gpt2();
    c.mlp = choice;
    // The global stream differs between the two builds; the model's generator does not.
    manual_seed(1);
    Generator g1(9);
    GPT2 a(c, &g1);
    manual_seed(2);
    Generator g2(9);
    GPT2 b(c, &g2);
    auto pa = a.state_dict(), pb = b.state_dict();
    REQUIRE(pa.size() == pb.size());
    for (size_t i = 0; i < pa.size(); ++i) {
      INFO(choice.name << " " << pa[i].first);
      CHECK(max_abs_diff(pa[i].second, pb[i].second) == 0.0);
    }
  }
}

TEST_CASE("nanoGPT initialisation, drawn from the given generator") {
  GPT2Config c;
  c.n_layer = 4;
  c.n_head = 4;
  c.n_embd = 64;
  c.block_size = 64;
  c.vocab_size = 500;
  Generator g1(7), g2(7);
  GPT2 a(c, &g1), b(c, &g2);
  auto pa = a.state_dict(), pb = b.state_dict();
  REQUIRE(pa.size() == pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    INFO(pa[i].first);
    CHECK(max_abs_diff(pa[i].second, pb[i].second) == 0.0);
  }
  auto stddev = [](const Tensor& t) {
    std::vector<double> v = t.to_vector<double>();
    double m = 0, s = 0;
    for (double x : v) m += x;
    m /= double(v.size());
    for (double x : v) s += (x - m) * (x - m);
    return std::sqrt(s / double(v.size()));
  };
  const double proj = 0.02 / std::sqrt(2.0 * 4);
  for (auto& [name, t] : pa) {
    INFO(name);
    const bool is_bias = name.size() > 5 && name.substr(name.size() - 5) == ".bias";
    if (name.find("ln_") != std::string::npos && !is_bias) {
      CHECK(t.to_vector<double>() == std::vector<double>(size_t(t.numel()), 1.0));
    } else if (is_bias) {
      CHECK(t.to_vector<double>() == std::vector<double>(size_t(t.numel()), 0.0));
    } else if (name.find("c_proj.weight") != std::string::npos) {
      CHECK(std::abs(stddev(t) - proj) < 0.1 * proj);
    } else {
      CHECK(std::abs(stddev(t) - 0.02) < 0.1 * 0.02);
    }
  }
  // The μMoE blocks keep their own initialisation: G zeros, CP expert factor around 1.
  c.mlp = mlp::cp_mumoe(64);
  GPT2 moe(c, &g1);
  Tensor G = nn::find(moe.state_dict(), "transformer.h.0.mlp.G1");
  CHECK(G.abs().sum().item() == 0.0);
  Tensor U1 = nn::find(moe.state_dict(), "transformer.h.0.mlp.layer1.U1");
  CHECK(std::abs(U1.mean().item() - 1.0) < 0.1);
}

TEST_CASE("forward: shapes, the loss and T > block_size") {
  GPT2Config c = tiny_gpt2();
  manual_seed(3);
  GPT2 model(c);
  Tensor idx = tokens(3, 5, c.vocab_size, 1), tgt = tokens(3, 5, c.vocab_size, 2);
  Tensor logits = model.forward(idx);
  CHECK(logits.shape() == Shape{3, 5, 11});
  auto out = model.forward(idx, tgt);
  CHECK(out.logits.shape() == Shape{3, 5, 11});
  CHECK(out.loss.dim() == 0);
  CHECK(max_abs_diff(out.logits, logits) == 0.0);
  CHECK(std::abs(out.loss.item() - brute_cross_entropy(logits.reshape({15, 11}), tgt.reshape({15}))) < 1e-5);
  // Targets of -1 are ignored, as nanoGPT's ignore_index=-1.
  Tensor masked = tgt.clone();
  masked.set({0, 0}, -1);
  auto out2 = model.forward(idx, masked);
  CHECK(std::abs(out2.loss.item() - brute_cross_entropy(logits.reshape({15, 11}).narrow(0, 1, 14),
                                                        tgt.reshape({15}).narrow(0, 1, 14))) < 1e-5);
  // The block size is the longest context.
  CHECK_THROWS_MU(model.forward(tokens(1, 9, 11, 3)), "T = 9");
  CHECK_THROWS_MU(model.forward(tokens(1, 9, 11, 3)), "block_size = 8");
  CHECK_THROWS_MU(model.forward(zeros({2, 3})), "int64");
  CHECK_THROWS_MU(model.forward(zeros({3}, kInt64)), "(B, T)");
  CHECK_THROWS_MU(model.forward(idx, tokens(3, 4, 11, 2)), "targets must be int64 of idx's shape [3, 5]");
  CHECK_THROWS_MU(model.forward(full({1, 2}, 11, kInt64)), "11");
}

TEST_CASE("dropout: active in training mode only") {
  GPT2Config c = tiny_gpt2();
  GPT2Config d = c;
  d.dropout = 0.3;
  Generator g1(12), g2(12);
  GPT2 plain(c, &g1), dropped(d, &g2);  // same weights: dropout adds no parameters
  Tensor idx = tokens(2, 6, c.vocab_size, 13);
  Tensor want = plain.forward(idx);
  Tensor a = dropped.forward(idx), b = dropped.forward(idx);
  CHECK(max_abs_diff(a, b) > 1e-4);
  CHECK(max_abs_diff(a, want) > 1e-4);
  dropped.eval();
  CHECK(max_abs_diff(dropped.forward(idx), want) == 0.0);
}

TEST_CASE("causal: later tokens do not change earlier logits") {
  for (int which = 0; which < 2; ++which) {
    GPT2Config c = tiny_gpt2();
    if (which == 1) c.mlp = mlp::cp_mumoe(64);
    INFO(c.mlp.name);
    manual_seed(4);
    GPT2 model(c);
    if (which == 1) {
      // Non-zero gating, so that the experts' coefficients depend on the token.
      NoGradGuard ng;
      for (int64_t l = 0; l < c.n_layer; ++l)
        for (auto& [n, p] : model.mlp(l)->named_parameters())
          if (n == "G1") p.copy_(randn(p.shape()));
    }
    Tensor idx = tokens(2, 7, c.vocab_size, 5);
    Tensor a = model.forward(idx);
    Tensor changed = idx.clone();
    changed.set({0, 4}, std::fmod(idx.at({0, 4}) + 1, 11));
    changed.set({1, 6}, std::fmod(idx.at({1, 6}) + 3, 11));
    Tensor b = model.forward(changed);
    CHECK(max_abs_diff(a.narrow(1, 0, 4), b.narrow(1, 0, 4)) == 0.0);
    CHECK(max_abs_diff(a.select(0, 1).narrow(0, 0, 6), b.select(0, 1).narrow(0, 0, 6)) == 0.0);
    // ... while the changed position itself moves.
    CHECK(max_abs_diff(a.select(0, 0).select(0, 4), b.select(0, 0).select(0, 4)) > 1e-6);
  }
}

TEST_CASE("the tied lm_head shares storage and gets the summed gradient") {
  GPT2Config c = tiny_gpt2();
  manual_seed(5);
  GPT2 model(c);
  CHECK(model.lm_head_weight().is_same(model.wte()->weight));
  CHECK(nn::find(model.state_dict(), "lm_head.weight").is_same(model.wte()->weight));
  {
    NoGradGuard ng;
    model.wte()->weight.set({3, 2}, 0.75);
  }
  CHECK(model.lm_head_weight().at({3, 2}) == 0.75);
  Tensor idx = tokens(2, 6, c.vocab_size, 6), tgt = tokens(2, 6, c.vocab_size, 7);
  model.forward(idx, tgt).loss.backward();
  Tensor total = model.wte()->weight.grad().clone();
  // The two uses separately: the head through a copy W2, the embedding through wte.
  model.zero_grad();
  Tensor W2 = model.wte()->weight.detach().clone().requires_grad_();
  Tensor logits = model.features(idx).matmul(W2.t());
  cross_entropy(logits.reshape({-1, c.vocab_size}), tgt.reshape({-1})).backward();
  Tensor head = W2.grad(), emb = model.wte()->weight.grad();
  CHECK(head.abs().sum().item() > 0);
  CHECK(emb.abs().sum().item() > 0);
  CHECK(max_abs_diff(total, head + emb) < 1e-6);
}

TEST_CASE("chunked_loss: the loss and every gradient of the logits' path, without the logits") {
  for (bool cp : {false, true}) {
    GPT2Config c = tiny_gpt2();
    if (cp) c.mlp = mlp::cp_mumoe(64);
    INFO(c.mlp.name);
    GPT2Config chunked_config = c;
    chunked_config.chunked_loss = true;
    Generator g1(21), g2(21);
    GPT2 plain(c, &g1), chunked(chunked_config, &g2);
    Tensor idx = tokens(3, 7, c.vocab_size, 22), tgt = tokens(3, 7, c.vocab_size, 23);
    tgt.set({1, 3}, -1);  // ignored, as nanoGPT's -1
    auto a = plain.forward(idx, tgt), b = chunked.forward(idx, tgt);
    CHECK(!b.logits.defined());
    CHECK(std::abs(a.loss.item() - b.loss.item()) < 1e-6);
    a.loss.backward();
    b.loss.backward();
    // The tied token table among them: its gradient sums the head's and the embedding's.
    check_same_grads(plain, chunked, 1e-6);
    // Evaluation (no graph) gives the same loss too.
    NoGradGuard no_grad;
    CHECK(std::abs(plain.forward(idx, tgt).loss.item() - chunked.forward(idx, tgt).loss.item()) < 1e-6);
  }
}

TEST_CASE("gelu_recompute: the dense MLP's numbers bit for bit, one activation less held") {
  GPT2Config c = tiny_gpt2();
  c.dropout = 0.1;  // the dropout after c_proj draws the same masks either way
  GPT2Config r = c;
  r.gelu_recompute = true;
  Generator g1(31), g2(31);
  GPT2 plain(c, &g1), recomputing(r, &g2);
  // 4 x 8 tokens: the GELU's output is 4096 bytes a block, a size the allocator does not round.
  Tensor idx = tokens(4, 8, c.vocab_size, 32), tgt = tokens(4, 8, c.vocab_size, 33);
  manual_seed(34);
  const int64_t base = cpu_allocator::stats().allocated_bytes;
  auto a = plain.forward(idx, tgt);
  const int64_t held_plain = cpu_allocator::stats().allocated_bytes - base;
  manual_seed(34);
  const int64_t base2 = cpu_allocator::stats().allocated_bytes;
  auto b = recomputing.forward(idx, tgt);
  const int64_t held_recomputing = cpu_allocator::stats().allocated_bytes - base2;
  // One GELU output per block: (4 x 8 tokens, 4 n_embd) float32.
  CHECK(held_plain - held_recomputing == c.n_layer * 4 * 8 * 4 * c.n_embd * 4);
  CHECK(a.loss.item() == b.loss.item());
  a.loss.backward();
  b.loss.backward();
  check_same_grads(plain, recomputing, 0.0);
  // Turned off again at run time: the GELU's output is held once more.
  recomputing.set_gelu_recompute(false);
  const int64_t base3 = cpu_allocator::stats().allocated_bytes;
  manual_seed(34);
  auto d = recomputing.forward(idx, tgt);
  CHECK(cpu_allocator::stats().allocated_bytes - base3 == held_plain);
}

TEST_CASE("any UnaryModule plugs in through the MLP factory") {
  GPT2Config c = tiny_gpt2();
  int64_t calls = 0;
  c.mlp = mlp::custom(
      "relu-mlp",
      [&calls](int64_t, const GPT2Config& cfg, Generator*) -> std::shared_ptr<nn::UnaryModule> {
        ++calls;
        return std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::UnaryModule>>{
            std::make_shared<nn::Linear>(cfg.n_embd, 2 * cfg.n_embd), std::make_shared<nn::ReLU>(),
            std::make_shared<nn::Linear>(2 * cfg.n_embd, cfg.n_embd)});
      });
  GPT2 model(c);
  CHECK(calls == 2);
  const int64_t d = 8;
  CHECK(model.mlp(0)->num_parameters() == d * 2 * d + 2 * d + 2 * d * d + d);
  // Its Linears get nanoGPT's N(0, 0.02) like every Linear.
  auto seq = std::dynamic_pointer_cast<nn::Sequential>(model.mlp(1));
  REQUIRE(seq);
  CHECK(seq->at<nn::Linear>(2)->bias.abs().sum().item() == 0.0);
  CHECK(model.forward(tokens(2, 3, 11, 1)).shape() == Shape{2, 3, 11});
  // No counter: the static count refuses, naming the choice.
  CHECK_THROWS_MU(GPT2::count_parameters(c), "\"relu-mlp\" cannot be counted without building it");
  // A module with the wrong output width is refused at forward time.
  c.mlp = mlp::custom("narrow", [](int64_t, const GPT2Config& cfg, Generator*) -> std::shared_ptr<nn::UnaryModule> {
    return std::make_shared<nn::Linear>(cfg.n_embd, 3);
  });
  GPT2 bad(c);
  CHECK_THROWS_MU(bad.forward(tokens(1, 2, 11, 1)), "\"Linear\" must map [1, 2, 8] to the same shape");
}

TEST_CASE("Hugging Face layout loader: files written here") {
  GPT2Config c = tiny_gpt2(2);
  manual_seed(10);
  GPT2 src(c);
  fs::path dir = fs::temp_directory_path() / ("mumoe_gpt2_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  // The HF layout: no "transformer." prefix, Conv1D weights (in, out), mask buffers.
  auto hf_tensors = [&](const std::string& prefix) {
    std::vector<std::pair<std::string, Tensor>> out;
    for (auto& [name, t] : src.state_dict()) {
      if (name == "lm_head.weight") continue;
      std::string key = prefix + name.substr(12);
      const bool conv = name.find("c_attn.weight") != std::string::npos || name.find("c_proj.weight") != std::string::npos ||
                        name.find("c_fc.weight") != std::string::npos;
      out.emplace_back(key, conv ? t.t().contiguous() : t);
    }
    out.emplace_back(prefix + "h.0.attn.bias", ones({1, 1, 8, 8}));
    out.emplace_back(prefix + "h.1.attn.masked_bias", scalar_tensor(-1e4));
    return out;
  };
  Tensor idx = tokens(2, 5, c.vocab_size, 11);
  Tensor want = src.forward(idx);
  for (std::string prefix : {"", "transformer."}) {
    INFO("prefix '" << prefix << "'");
    fs::path p = dir / "model.safetensors";
    save_safetensors(p.string(), hf_tensors(prefix));
    manual_seed(99);
    GPT2 dst(c);
    models::load_hf_gpt2_safetensors(dst, p.string());
    CHECK(max_abs_diff(dst.forward(idx), want) == 0.0);
  }
  // float64 files load into the float32 model.
  {
    auto t = hf_tensors("");
    for (auto& [k, v] : t) v = v.to(kFloat64);
    save_safetensors((dir / "f64.safetensors").string(), t);
    GPT2 dst(c);
    models::load_hf_gpt2_safetensors(dst, (dir / "f64.safetensors").string());
    CHECK(max_abs_diff(dst.forward(idx), want) < 1e-6);
  }
  GPT2 dst(c);
  Tensor before = dst.forward(idx);
  auto write_and_load = [&](std::vector<std::pair<std::string, Tensor>> t) {
    save_safetensors((dir / "bad.safetensors").string(), t);
    models::load_hf_gpt2_safetensors(dst, (dir / "bad.safetensors").string());
  };
  auto t = hf_tensors("");
  t.erase(t.begin() + 3);  // h.0.ln_1.bias
  CHECK_THROWS_MU(write_and_load(t), "missing 1 key for a GPT-2 with n_layer = 2: h.0.ln_1.bias");
  t = hf_tensors("");
  t.emplace_back("h.2.ln_1.weight", ones({8}));
  CHECK_THROWS_MU(write_and_load(t), "unexpected 1 key for a GPT-2 with n_layer = 2: h.2.ln_1.weight");
  t = hf_tensors("");
  for (auto& [k, v] : t)
    if (k == "h.1.mlp.c_fc.weight") v = v.t().contiguous();  // (out, in): not the Conv1D layout
  CHECK_THROWS_MU(write_and_load(t), "h.1.mlp.c_fc.weight has shape [32, 8], expected [8, 32] (a Conv1D weight");
  t = hf_tensors("");
  for (auto& [k, v] : t)
    if (k == "wte.weight") v = zeros({12, 8});
  CHECK_THROWS_MU(write_and_load(t), "wte.weight has shape [12, 8], expected [11, 8]");
  t = hf_tensors("");
  t.emplace_back("lm_head.weight", zeros({11, 8}));
  CHECK_THROWS_MU(write_and_load(t), "lm_head.weight differs from wte.weight");
  // Refused files leave the model as it was.
  CHECK(max_abs_diff(dst.forward(idx), before) == 0.0);
  // μMoE models cannot take GPT-2 weights.
  GPT2Config m = c;
  m.mlp = mlp::cp_mumoe(64);
  GPT2 moe(m);
  CHECK_THROWS_MU(models::load_hf_gpt2_safetensors(moe, (dir / "model.safetensors").string()),
                  "this model (MLP \"cp_mumoe-64\") has no tensor transformer.h.0.ln_2.weight");
  // A custom MLP with GPT-2's tensors and one more: the extra one is named.
  GPT2Config x = c;
  x.mlp = mlp::custom("gated", [](int64_t, const GPT2Config& cfg, Generator*) -> std::shared_ptr<nn::UnaryModule> {
    struct Gated : nn::UnaryModule {
      std::shared_ptr<nn::Linear> c_fc, c_proj;
      Tensor gain;
      explicit Gated(int64_t d) : UnaryModule("Gated") {
        c_fc = register_module("c_fc", std::make_shared<nn::Linear>(d, 4 * d));
        c_proj = register_module("c_proj", std::make_shared<nn::Linear>(4 * d, d));
        gain = register_parameter("gain", ones({d}));
      }
      Tensor forward(const Tensor& v) override { return c_proj->forward(gelu(c_fc->forward(v))) * gain; }
    };
    return std::make_shared<Gated>(cfg.n_embd);
  });
  GPT2 gated(x);
  CHECK_THROWS_MU(models::load_hf_gpt2_safetensors(gated, (dir / "model.safetensors").string()),
                  "no values for 2 of this model's tensors (MLP \"gated\"): transformer.h.0.mlp.gain, "
                  "transformer.h.1.mlp.gain");
  CHECK_THROWS_MU(models::load_hf_gpt2_safetensors(dst, (dir / "nothing.safetensors").string()),
                  "nothing.safetensors");
  fs::remove_all(dir);
}
