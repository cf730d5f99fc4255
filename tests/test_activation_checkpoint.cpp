// Activation checkpointing (autograd/activation_checkpoint.h): a checkpointed region's
// gradients are those of the same region run plainly (the reference is the plain run), its
// saved activations are freed after the forward (counted from the shapes), random draws
// are replayed, and what cannot be replayed is refused with a message.
#include "autograd/activation_checkpoint.h"

#include <memory>
#include <stdexcept>
#include <string>
#include <thread>

#include "helpers.h"
#include "models/gpt2.h"
#include "models/mlp_mixer.h"
#include "tensor/allocator.h"
#include "tiny_models.h"

using namespace mu;
using autograd::checkpoint;
using autograd::TensorList;

namespace {

// A pre-norm MLP block with dropout and a residual: x + drop(fc2(gelu(fc1(ln(x))))).
struct MlpBlock {
  std::shared_ptr<nn::LayerNorm> ln;
  std::shared_ptr<nn::Linear> fc1, fc2;
  std::shared_ptr<nn::Dropout> drop;

  MlpBlock(int64_t d, int64_t h, double p, Generator* gen = nullptr)
      : ln(std::make_shared<nn::LayerNorm>(nn::LayerNormOptions({d}))),
        fc1(std::make_shared<nn::Linear>(d, h)),
        fc2(std::make_shared<nn::Linear>(h, d)),
        drop(std::make_shared<nn::Dropout>(nn::DropoutOptions(p).generator(gen))) {}

  Tensor forward(const Tensor& x) const { return x + drop->forward(fc2->forward(gelu(fc1->forward(ln->forward(x))))); }
  std::vector<Tensor> parameters() const {
    std::vector<Tensor> out;
    for (const auto& m : std::vector<nn::Module*>{ln.get(), fc1.get(), fc2.get()})
      for (const Tensor& p : m->parameters()) out.push_back(p);
    return out;
  }
  void to(Device dev) {
    ln->to(dev);
    fc1->to(dev);
    fc2->to(dev);
  }
  void zero_grad() {
    ln->zero_grad();
    fc1->zero_grad();
    fc2->zero_grad();
  }
};

// n blocks d -> h -> d with dropout p, drawn after manual_seed(seed), on `dev`.
std::vector<MlpBlock> make_blocks(int n, int64_t d, int64_t h, double p, Device dev, uint64_t seed) {
  manual_seed(seed);
  std::vector<MlpBlock> blocks;
  for (int i = 0; i < n; ++i) blocks.emplace_back(d, h, p);
  for (MlpBlock& b : blocks) b.to(dev);
  return blocks;
}

// The gradients of x and of every parameter after one backward of sum(out * w), where
// out is the stack of `blocks` applied to x, each block checkpointed or not.
struct Grads {
  Tensor out;
  std::vector<Tensor> grads;
};
Grads run_stack(std::vector<MlpBlock>& blocks, const Tensor& x0, const Tensor& w, bool checkpointed) {
  for (MlpBlock& b : blocks) b.zero_grad();
  Tensor x = x0.detach().requires_grad_();
  Tensor h = x;
  for (MlpBlock& b : blocks)
    h = checkpointed ? checkpoint([&b](const Tensor& t) { return b.forward(t); }, h) : b.forward(h);
  sum(h * w).backward();
  Grads g{h.detach(), {x.grad()}};
  for (MlpBlock& b : blocks)
    for (const Tensor& p : b.parameters()) g.grads.push_back(p.grad());
  return g;
}

// Equal element for element on the CPU; on a CUDA device within float32 rounding, since
// a kernel may sum in an order that differs from run to run (atomics).
void check_same(const Tensor& got, const Tensor& want, Device dev) {
  REQUIRE(got.defined());
  REQUIRE(want.defined());
  REQUIRE(got.shape() == want.shape());
  if (dev.is_cpu())
    CHECK(max_abs_diff(got, want) == 0.0);
  else
    CHECK(max_abs_diff(got, want) <= 1e-6 * (1.0 + max_abs_diff(want, zeros_like(want))));
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("a checkpointed stack has the plain stack's output and gradients, dropout included") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    std::vector<MlpBlock> blocks = make_blocks(3, 16, 48, 0.25, dev, 11);
    const Tensor x = randn({4, 5, 16}).to(dev), w = randn({4, 5, 16}).to(dev);

    manual_seed(5);
    const Grads plain = run_stack(blocks, x, w, false);
    const std::string state_after_plain = default_generator().state();
    manual_seed(5);
    const Grads ckpt = run_stack(blocks, x, w, true);
    check_same(ckpt.out, plain.out, dev);
    REQUIRE(ckpt.grads.size() == plain.grads.size());
    for (size_t i = 0; i < plain.grads.size(); ++i) {
      INFO("gradient " << i);
      check_same(ckpt.grads[i], plain.grads[i], dev);
    }
    // The replay put the generator back: it ends where the plain run's forward left it.
    CHECK(default_generator().state() == state_after_plain);
  }
}

TEST_CASE("a region's saved activations are freed after the forward and recomputed in the backward") {
  // CPU: the host allocator counts the bytes live tensors hold.
  const int64_t B = 64, d = 128, h = 512, depth = 4;
  std::vector<MlpBlock> blocks = make_blocks(int(depth), d, h, 0.0, Device::cpu(), 3);
  const Tensor x0 = randn({B, d});
  auto held_after_forward = [&](bool checkpointed) {
    Tensor x = x0.detach().requires_grad_();
    const int64_t before = cpu_allocator::stats().allocated_bytes;
    Tensor y = x;
    for (MlpBlock& b : blocks)
      y = checkpointed ? checkpoint([&b](const Tensor& t) { return b.forward(t); }, y) : b.forward(y);
    const int64_t held = cpu_allocator::stats().allocated_bytes - before;
    sum(y).backward();
    return held;
  };
  const int64_t plain = held_after_forward(false), ckpt = held_after_forward(true);
  // Inside each block the plain forward keeps what its ops save: fc1's output (gelu's
  // input) and gelu's output (fc2's input), B·h floats each, and layer_norm's output
  // (fc1's input), B·d; checkpointed, none of them (the block's input and output are
  // kept either way, as are layer_norm's per-row statistics, 2·B floats a block).
  const int64_t freed = depth * (2 * B * h + B * d) * int64_t(sizeof(float));
  MESSAGE("bytes held after the forward: plain " << plain << ", checkpointed " << ckpt << ", the saved activations "
          << freed);
  CHECK(plain - ckpt >= freed);
  CHECK(plain - ckpt <= freed + depth * 2 * B * int64_t(sizeof(float)) + 4096);
}

TEST_CASE("gradcheck through checkpoint: two inputs, two outputs") {
  Tensor a = rnd({3, 4}, 1).requires_grad_(), b = rnd({4, 2}, 2).requires_grad_();
  auto region = [](const TensorList& in) {
    Tensor p = matmul(tanh(in[0]), in[1]);
    return TensorList{sigmoid(p) * p, exp(in[1] * 0.5)};
  };
  auto r = autograd::gradcheck(
      [&](const TensorList& in) {
        TensorList out = checkpoint(region, in);
        return sum(out[0]) + sum(out[1] * out[1]);
      },
      {a, b});
  CHECK_MESSAGE(r.ok, r.message);
}

TEST_CASE("a region's own generator is replayed, and must outlive the backward") {
  manual_seed(2);
  auto gen = std::make_unique<Generator>(77);
  std::vector<MlpBlock> blocks;
  blocks.emplace_back(8, 24, 0.5, gen.get());
  const Tensor x = randn({6, 8}), w = randn({6, 8});
  gen->manual_seed(9);
  const Grads plain = run_stack(blocks, x, w, false);
  const std::string after_plain = gen->state();
  gen->manual_seed(9);
  const Grads ckpt = run_stack(blocks, x, w, true);
  for (size_t i = 0; i < plain.grads.size(); ++i) check_same(ckpt.grads[i], plain.grads[i], Device::cpu());
  CHECK(gen->state() == after_plain);

  // Destroyed between the forward and the backward: refused, naming the reason.
  Tensor xr = x.detach().requires_grad_();
  Tensor y = checkpoint([&](const Tensor& t) { return blocks[0].forward(t); }, xr);
  gen.reset();
  const std::string msg = message_of([&] { sum(y * w).backward(); });
  CHECK(msg.find("generator that has been destroyed") != std::string::npos);
}

TEST_CASE("a parameter changed in place between the forward and the backward is reported") {
  manual_seed(4);
  nn::Linear lin(6, 6);
  Tensor x = randn({3, 6}).requires_grad_();
  Tensor y = checkpoint([&](const Tensor& t) { return tanh(lin.forward(t)); }, x);
  {
    NoGradGuard ng;
    lin.weight.mul_(2.0);
  }
  const std::string msg = message_of([&] { sum(y).backward(); });
  INFO(msg);
  CHECK(msg.find("modified by an in-place operation between the forward and the backward") != std::string::npos);
  CHECK(msg.find("version") != std::string::npos);
}

TEST_CASE("regions on two threads at once: each thread's regions and draws are its own") {
  // Each thread trains its own stack with its own dropout generator, checkpointed, while
  // the other does the same; each must get what it gets alone and plainly.
  auto stack = [](Generator* gen) {
    manual_seed(6);  // the same weights on both threads (manual_seed is global: drawn before they start)
    std::vector<MlpBlock> blocks;
    for (int i = 0; i < 2; ++i) blocks.emplace_back(12, 24, 0.3, gen);
    return blocks;
  };
  Generator g1(1), g2(2);
  std::vector<MlpBlock> s1 = stack(&g1), s2 = stack(&g2);
  manual_seed(7);
  const Tensor x = randn({5, 12}), w = randn({5, 12});
  auto run = [&](std::vector<MlpBlock>& s, Generator& g, uint64_t seed, bool checkpointed) {
    g.manual_seed(seed);
    return run_stack(s, x, w, checkpointed);
  };
  const Grads plain1 = run(s1, g1, 11, false), plain2 = run(s2, g2, 22, false);
  Grads c1, c2;
  for (int round = 0; round < 20; ++round) {
    std::thread t1([&] { c1 = run(s1, g1, 11, true); });
    std::thread t2([&] { c2 = run(s2, g2, 22, true); });
    t1.join();
    t2.join();
    for (size_t i = 0; i < plain1.grads.size(); ++i) {
      check_same(c1.grads[i], plain1.grads[i], Device::cpu());
      check_same(c2.grads[i], plain2.grads[i], Device::cpu());
    }
  }
}

TEST_CASE("an input changed in place that no op of the region saved is reported") {
  Tensor x = rnd({4, 3}, 7);  // no gradient wanted for x itself: a plain tensor the region reads
  Tensor w = rnd({4, 3}, 8).requires_grad_();
  Tensor y = checkpoint([](const TensorList& in) { return TensorList{tanh(in[0] * 2.0 + in[1])}; }, {x, w})[0];
  x.add_(1.0);  // x * 2.0 saves nothing; the recomputation would read the new x
  const std::string msg = message_of([&] { sum(y).backward(); });
  INFO(msg);
  CHECK(msg.find("input 0 of the region") != std::string::npos);
  CHECK(msg.find("version 0, now 1") != std::string::npos);
}

TEST_CASE("a function that does not repeat itself is refused") {
  Tensor x = rnd({5, 3}, 6).requires_grad_();
  SUBCASE("another shape the second time") {
    int calls = 0;
    Tensor y = checkpoint([&](const Tensor& t) { return tanh(++calls == 1 ? t : t.slice(0, 0, 2)); }, x);
    const std::string msg = message_of([&] { sum(y).backward(); });
    INFO(msg);
    CHECK(msg.find("saved tensor 0 of the recomputed region") != std::string::npos);
    CHECK(msg.find("[2, 3]") != std::string::npos);
    CHECK(msg.find("[5, 3]") != std::string::npos);
  }
  SUBCASE("fewer saves the second time, with a draw: the failed recomputation leaves nothing behind") {
    int calls = 0;
    Tensor y = checkpoint(
        [&](const Tensor& t) { return dropout(++calls == 1 ? tanh(tanh(t)) : tanh(t), 0.5, true); }, x);
    const std::string drawn = default_generator().state();
    const std::string msg = message_of([&] { sum(y).backward(); });
    INFO(msg);
    // tanh saves its output, dropout's product x · mask both operands: 1 + 1 + 2, then 1 + 2.
    CHECK(msg.find("saved 3 tensors for backward, its forward saved 4") != std::string::npos);
    // The generator, grad mode, autocast and the recomputing flag are as they were.
    CHECK(default_generator().state() == drawn);
    CHECK(autograd::is_grad_enabled());
    CHECK_FALSE(autograd::is_autocast_enabled());
    CHECK_FALSE(autograd::recomputing());
  }
  SUBCASE("more saves the second time") {
    int calls = 0;
    Tensor y = checkpoint([&](const Tensor& t) { return ++calls == 1 ? tanh(t) : tanh(tanh(t)); }, x);
    const std::string msg = message_of([&] { sum(y).backward(); });
    INFO(msg);
    CHECK(msg.find("saved more tensors for backward than its forward did (1)") != std::string::npos);
  }
}

TEST_CASE("nested regions, batch norm's running statistics, retain_graph and no-grad mode") {
  SUBCASE("a region inside a region is part of it") {
    std::vector<MlpBlock> blocks = make_blocks(2, 8, 16, 0.3, Device::cpu(), 8);
    const Tensor x = randn({5, 8}), w = randn({5, 8});
    manual_seed(1);
    const Grads plain = run_stack(blocks, x, w, false);
    for (MlpBlock& b : blocks) b.zero_grad();
    manual_seed(1);
    Tensor xr = x.detach().requires_grad_();
    Tensor y = checkpoint(
        [&](const Tensor& t) {
          Tensor u = checkpoint([&](const Tensor& s) { return blocks[0].forward(s); }, t);
          return blocks[1].forward(u);
        },
        xr);
    sum(y * w).backward();
    check_same(xr.grad(), plain.grads[0], Device::cpu());
    size_t i = 1;
    for (MlpBlock& b : blocks)
      for (const Tensor& p : b.parameters()) check_same(p.grad(), plain.grads[i++], Device::cpu());
  }
  SUBCASE("batch norm counts the batch once and keeps the plain run's statistics") {
    manual_seed(9);
    auto bn_plain = std::make_shared<nn::BatchNorm1d>(4), bn_ckpt = std::make_shared<nn::BatchNorm1d>(4);
    const Tensor x = randn({10, 4}) * 3.0 + 1.0;
    Tensor xp = x.detach().requires_grad_(), xc = x.detach().requires_grad_();
    sum(tanh(bn_plain->forward(xp))).backward();
    Tensor y = checkpoint([&](const Tensor& t) { return tanh(bn_ckpt->forward(t)); }, xc);
    sum(y).backward();
    CHECK(bn_ckpt->num_batches_tracked.item() == 1.0);
    check_same(bn_ckpt->running_mean, bn_plain->running_mean, Device::cpu());
    check_same(bn_ckpt->running_var, bn_plain->running_var, Device::cpu());
    check_same(xc.grad(), xp.grad(), Device::cpu());
  }
  SUBCASE("retain_graph: a second backward adds the same gradients again") {
    Tensor x = rnd({4, 3}, 3).requires_grad_();
    Tensor y = checkpoint([](const Tensor& t) { return tanh(t * t); }, x);
    sum(y).backward(Tensor(), true);
    const Tensor once = x.grad().clone();
    sum(y).backward();
    check_same(x.grad(), once * 2.0, Device::cpu());
    // and the plain derivative: 2 t (1 - tanh(t²)²)
    check_same(once, x.detach() * 2.0 * (1.0 - tanh(x.detach() * x.detach()) * tanh(x.detach() * x.detach())),
               Device::cpu());
  }
  SUBCASE("without grad mode the function simply runs") {
    Tensor x = rnd({4, 3}, 4).requires_grad_();
    NoGradGuard ng;
    Tensor y = checkpoint([](const Tensor& t) { return tanh(t); }, x);
    CHECK_FALSE(y.requires_grad());
    check_same(y, tanh(x.detach()), Device::cpu());
  }
}

TEST_CASE("a region recorded under autocast is recomputed under it") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    std::vector<MlpBlock> blocks = make_blocks(2, 16, 32, 0.1, dev, 12);
    const Tensor x = randn({3, 7, 16}).to(dev), w = randn({3, 7, 16}).to(dev);
    auto run = [&](bool checkpointed) {
      manual_seed(21);
      Tensor y, xr = x.detach().requires_grad_();
      {
        AutocastGuard amp;
        Tensor h = xr;
        for (MlpBlock& b : blocks)
          h = checkpointed ? checkpoint([&b](const Tensor& t) { return b.forward(t); }, h) : b.forward(h);
        y = sum(h.to(kFloat32) * w);
      }
      for (MlpBlock& b : blocks) b.zero_grad();
      y.backward();  // outside the scope: the recomputation must not run in float32
      std::vector<Tensor> g{xr.grad()};
      for (MlpBlock& b : blocks)
        for (const Tensor& p : b.parameters()) g.push_back(p.grad());
      return g;
    };
    const std::vector<Tensor> plain = run(false), ckpt = run(true);
    for (size_t i = 0; i < plain.size(); ++i) {
      INFO("gradient " << i);
      check_same(ckpt[i], plain[i], dev);
    }
  }
}

TEST_CASE("custom autograd::Function ops inside a region") {
  struct Cube : autograd::Function<Cube> {
    static Tensor forward(autograd::AutogradContext* ctx, const Tensor& x) {
      ctx->save_for_backward({x});
      return x * x * x;
    }
    static TensorList backward(autograd::AutogradContext* ctx, const TensorList& g) {
      Tensor x = ctx->get_saved_variables()[0];
      return {g[0] * x * x * 3.0};
    }
  };
  Tensor x = rnd({6}, 5).requires_grad_();
  Tensor y = checkpoint([](const Tensor& t) { return Cube::apply(tanh(t)); }, x);
  sum(y).backward();
  // d/dx tanh(x)³ = 3 tanh(x)² (1 - tanh(x)²)
  const Tensor th = tanh(x.detach());
  CHECK(max_abs_diff(x.grad(), th * th * 3.0 * (1.0 - th * th)) <= 1e-15);
}

// Whole models: GPT2Config::recompute and MixerConfig::recompute checkpoint every block.
// Two models built alike from one seed, one recomputing, take the same training step.
namespace {

// The loss, every parameter's gradient, and every buffer (batch norm's statistics).
struct Step {
  double loss;
  std::vector<std::pair<std::string, Tensor>> grads, buffers;
};
Step step_of(nn::Module& m, const std::function<Tensor()>& loss_fn) {
  m.zero_grad();
  manual_seed(31);  // the dropout and drop-path draws
  Tensor loss = loss_fn();
  loss.backward();
  Step s{loss.item(), {}, {}};
  for (const auto& [name, p] : m.named_parameters()) s.grads.emplace_back(name, p.grad());
  for (const auto& [name, b] : m.named_buffers()) s.buffers.emplace_back(name, b.clone());
  return s;
}
void check_same_step(const Step& ckpt, const Step& plain, Device dev) {
  if (dev.is_cpu())
    CHECK(ckpt.loss == plain.loss);
  else
    CHECK(std::abs(ckpt.loss - plain.loss) <= 1e-6 * (1 + std::abs(plain.loss)));
  REQUIRE(ckpt.grads.size() == plain.grads.size());
  for (size_t i = 0; i < plain.grads.size(); ++i) {
    INFO(plain.grads[i].first);
    CHECK(ckpt.grads[i].first == plain.grads[i].first);
    if (!plain.grads[i].second.defined()) {
      CHECK_FALSE(ckpt.grads[i].second.defined());
      continue;
    }
    check_same(ckpt.grads[i].second, plain.grads[i].second, dev);
  }
  REQUIRE(ckpt.buffers.size() == plain.buffers.size());
  for (size_t i = 0; i < plain.buffers.size(); ++i) {
    INFO(plain.buffers[i].first);
    check_same(ckpt.buffers[i].second, plain.buffers[i].second, dev);
  }
}

// tiny_gpt2 (tiny_models.h) with the given MLP.
models::GPT2Config small_gpt2(const models::MlpChoice& mlp) {
  models::GPT2Config c = tiny_gpt2();
  c.mlp = mlp;
  return c;
}

}  // namespace

TEST_CASE("GPT-2 with recompute takes the plain model's step: dense, CPμMoE and σ-MoE MLPs, with dropout") {
  for (Device dev : test_devices()) {
    for (const models::MlpChoice& mlp : {models::mlp::dense(), models::mlp::cp_mumoe(8, 12),
                                         models::mlp::sigma_moe(8, 4, 2, 0.25)}) {
      INFO(dev.str() << " " << mlp.name);
      models::GPT2Config c = small_gpt2(mlp);
      c.dropout = 0.2;
      Generator g1(40), g2(40);
      models::GPT2 plain(c, &g1);
      c.recompute = true;
      models::GPT2 ckpt(c, &g2);
      plain.to(dev);
      ckpt.to(dev);
      Generator data(3);
      const Tensor idx = randint(0, 11, {3, 8}, TensorOptions(kInt64), &data).to(dev);
      const Tensor tgt = randint(0, 11, {3, 8}, TensorOptions(kInt64), &data).to(dev);
      const Step a = step_of(plain, [&] { return plain.forward(idx, tgt).loss; });
      const Step b = step_of(ckpt, [&] { return ckpt.forward(idx, tgt).loss; });
      check_same_step(b, a, dev);
    }
  }
}

TEST_CASE("an MLP-Mixer with recompute takes the plain model's step: batch-norm gated CPμMoE, stochastic depth") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    models::MixerConfig c = tiny_mixer();
    c.depth = 3;
    c.stochastic_depth = 0.4;
    c.channel_block = models::MixerMlp::CPMuMoE;
    manual_seed(17);
    models::MlpMixer plain(c);
    c.recompute = true;
    models::MlpMixer ckpt(c);
    ckpt.load_state_dict(plain.state_dict());
    plain.to(dev);
    ckpt.to(dev);
    manual_seed(18);
    const Tensor images = randn({6, 2, 8, 8}).to(dev);
    const Tensor labels = randint(0, 5, {6}, TensorOptions(kInt64)).to(dev);
    const Step a = step_of(plain, [&] { return cross_entropy(plain.forward(images), labels); });
    const Step b = step_of(ckpt, [&] { return cross_entropy(ckpt.forward(images), labels); });
    check_same_step(b, a, dev);
    // The step counted its batch once in every batch norm.
    for (const auto& [name, t] : b.buffers)
      if (name.find("num_batches_tracked") != std::string::npos) CHECK(t.item() == 1.0);
  }
}

TEST_CASE("a recomputing model holds its blocks weakly: no cycle through a sparse MoE's aux_loss()") {
  models::GPT2Config c = small_gpt2(models::mlp::sigma_moe(8, 4, 2));
  c.recompute = true;
  Generator data(5);
  const Tensor idx = randint(0, 11, {2, 8}, TensorOptions(kInt64), &data);
  const Tensor tgt = randint(0, 11, {2, 8}, TensorOptions(kInt64), &data);
  SUBCASE("a forward whose backward never runs: the model and its graph are freed with the model") {
    auto model = std::make_shared<models::GPT2>(c);
    std::weak_ptr<nn::UnaryModule> mlp = model->mlp(1);
    model->forward(idx, tgt);  // the MLP's aux_loss() now holds the region's graph
    model.reset();
    CHECK(mlp.expired());
  }
  SUBCASE("a model destroyed before the backward: the recomputation says so") {
    auto model = std::make_shared<models::GPT2>(c);
    Tensor loss = model->forward(idx, tgt).loss;
    model.reset();
    const std::string msg = message_of([&] { loss.backward(); });
    INFO(msg);
    CHECK(msg.find("GPT2: block 1 was destroyed before the backward pass could recompute it") != std::string::npos);
  }
}
