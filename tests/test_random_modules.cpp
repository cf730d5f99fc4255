// Gradients of whole layers and models with random configurations, in float64, on every
// device: μMoE blocks of every kind (1–3 expert levels, fused CP/TR, gate norms and
// activations, hidden layers, input norms), the sparse MoE layers (every selection, with
// their regularisers), product-key memories, top-K MLPs, tiny GPT-2s with each MLP choice
// and tiny MLP-Mixers with each block kind. For each draw the parameters are moved off
// their initialisation, L = Σ w_i y_i over the outputs (and the regulariser, where the layer
// has one) with random w, and the backward pass's derivative along random directions of
// the input and every parameter must equal the central difference of L
// (autograd::gradcheck with parameters and directions).
//
// The second case trains each drawn layer for two AdamW steps, saves a checkpoint, loads it
// into the same configuration built from other values and into another drawn configuration:
// the first continues bit for bit as the layer that never stopped; the second either takes
// it whole (a configuration of the same shapes) or refuses it and is left as it was.
//
// The third runs each draw in float32, under autocast and in float64 (see there); the
// fourth compares inference without a graph (eval(), NoGradGuard) with the recorded pass.
//
// What it adds to the per-layer gradient checks: configurations nobody wrote down (odd
// sizes, one expert, rank 1, a level of size 1, gating through batch norm in training),
// and every parameter at once rather than a few elements of a few.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>

#include "file_helpers.h"
#include "helpers.h"
#include "models/gpt2.h"
#include "models/mlp_mixer.h"

using namespace mu;

namespace {

struct Rng {
  std::mt19937_64 e;
  explicit Rng(uint64_t seed) : e(seed) {}
  int ri(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(e); }
  bool coin() { return ri(0, 1) == 1; }
};

// One drawn layer or model: what it is (for the failure message), the module, its input
// (float64, differentiated too; or int64 token ids) and its forward pass, which returns the
// tensors L weights (the output, and a regulariser when the layer has one).
struct Built {
  std::string what;
  std::shared_ptr<nn::Module> module;
  Tensor input;
  std::function<std::vector<Tensor>(const Tensor&)> forward;
};

using Maker = std::function<Built(Rng&, Generator&)>;

std::string str(const std::vector<int64_t>& v) { return shape_str(v); }

// A batch of 1–3 leading dims of 1–4 tokens each, then `features`.
Shape tokens(Rng& r, int64_t features) {
  Shape s;
  for (int d = r.ri(1, 2); d-- > 0;) s.push_back(r.ri(1, 4));
  s.push_back(features);
  return s;
}

Built mumoe_block(Rng& r, Generator& g) {
  static const nn::MoEKind kinds[] = {nn::MoEKind::CP,     nn::MoEKind::TR,       nn::MoEKind::TT,
                                      nn::MoEKind::Tucker, nn::MoEKind::Hadamard, nn::MoEKind::Dense};
  static const char* names[] = {"CP", "TR", "TT", "Tucker", "Hadamard", "Dense"};
  const int k = r.ri(0, 5);
  const int64_t in = r.ri(1, 7), out = r.ri(1, 6);
  std::vector<int64_t> experts;
  for (int l = r.ri(1, 3); l-- > 0;) experts.push_back(r.ri(1, 4));
  nn::MuMoEOptions o(in, out);
  o.experts(experts).kind(kinds[k]).gate_norm(nn::GateNorm(r.ri(0, 2))).activation(nn::GateActivation(r.ri(0, 2)));
  o.bias(r.coin()).further_gate_std(0.3).generator(&g);
  std::string what = std::string(names[k]) + " μMoE " + std::to_string(in) + "→" + std::to_string(out) +
                     ", experts " + str(experts);
  if (k <= 2) {
    o.rank(r.ri(1, 5));
    what += ", rank " + std::to_string(o.rank());
  }
  if (k == 3) {
    std::vector<int64_t> ranks;
    for (size_t e = 0; e < experts.size() + 2; ++e) ranks.push_back(r.ri(1, 3));
    o.ranks(ranks);
    what += ", ranks " + str(ranks);
  }
  if (r.coin()) o.fused_cp(true), what += ", fused CP";
  if (r.coin()) o.fused_tr(true), what += ", fused TR";
  if (r.ri(0, 3) == 0) o.hidden(r.ri(1, 4)), what += ", hidden " + std::to_string(o.hidden());
  if (r.ri(0, 3) == 0) o.input_norm(true), what += ", input norm";
  what += std::string(", gate norm ") + nn::to_string(o.gate_norm()) + ", " + nn::to_string(o.activation());
  auto m = std::make_shared<nn::MuMoE>(o);
  return {what, m, randn(tokens(r, in), kFloat64, &g), [m](const Tensor& x) { return std::vector<Tensor>{m->forward(x)}; }};
}

Built sparse_moe(Rng& r, Generator& g) {
  static const nn::Selection selections[] = {nn::Selection::Sigmoid, nn::Selection::Softmax,
                                             nn::Selection::SoftmaxRenorm, nn::Selection::Switch,
                                             nn::Selection::NoisyTopK, nn::Selection::SBase};
  const int s = r.ri(0, 5);
  const int64_t d = r.ri(1, 6), n = r.ri(1, 5), size = r.ri(1, 4);
  nn::SparseMoEOptions o(d, n, size);
  o.selection(selections[s]).k(r.ri(1, int(n))).entropy_weight(r.coin() ? 0.1 : 0.0).balance_weight(0.05 * r.ri(0, 1));
  o.init(r.coin() ? nn::ExpertInit::Dense : nn::ExpertInit::PerExpert).generator(&g);
  if (selections[s] == nn::Selection::Switch && r.coin()) o.capacity_factor(1.0 + 0.5 * r.ri(0, 2));
  const std::string what = std::string("sparse MoE ") + nn::to_string(selections[s]) + ", d " + std::to_string(d) +
                           ", " + std::to_string(n) + " experts of " + std::to_string(size) + ", K " +
                           std::to_string(o.k()) + ", capacity " + std::to_string(o.capacity_factor());
  auto m = std::make_shared<nn::SparseMoE>(o);
  // The gating noise is drawn anew each call: every forward pass restarts its stream, so
  // that the difference quotient sees the same noise as the backward pass.
  return {what, m, randn(tokens(r, d), kFloat64, &g), [m](const Tensor& x) {
            m->manual_seed_routing(5);
            std::vector<Tensor> out{m->forward(x)};
            if (m->aux_loss().defined()) out.push_back(m->aux_loss());
            return out;
          }};
}

Built pkm(Rng& r, Generator& g) {
  const int64_t d = 2 * r.ri(1, 3), n_sub = r.ri(1, 4);
  nn::PKMOptions o(d, n_sub);
  o.heads(r.ri(1, 2)).k(r.ri(1, int(n_sub))).activation(r.coin() ? nn::PKMActivation::ReLU : nn::PKMActivation::Softmax);
  o.generator(&g);
  const std::string what = "PKM d " + std::to_string(d) + ", n_sub " + std::to_string(n_sub) + ", heads " +
                           std::to_string(o.heads()) + ", K " + std::to_string(o.k()) + ", " + nn::to_string(o.activation());
  auto m = std::make_shared<nn::PKM>(o);
  return {what, m, randn(tokens(r, d), kFloat64, &g), [m](const Tensor& x) { return std::vector<Tensor>{m->forward(x)}; }};
}

Built topk_mlp(Rng& r, Generator& g) {
  const int64_t d = r.ri(1, 5), ff = r.ri(1, 8);
  nn::TopKMLPOptions o(d, ff);
  o.k(r.ri(1, int(ff))).bias(r.coin()).generator(&g);
  const std::string what = "top-K MLP d " + std::to_string(d) + ", d_ff " + std::to_string(ff) + ", K " + std::to_string(o.k());
  auto m = std::make_shared<nn::TopKMLP>(o);
  return {what, m, randn(tokens(r, d), kFloat64, &g), [m](const Tensor& x) { return std::vector<Tensor>{m->forward(x)}; }};
}

Built gpt2(Rng& r, Generator& g) {
  models::GPT2Config c;
  c.n_layer = r.ri(1, 2);
  c.n_head = r.ri(1, 2);
  c.n_embd = c.n_head * r.ri(1, 3) * 2;
  c.block_size = 8;
  c.vocab_size = r.ri(2, 11);
  c.bias = r.coin();
  std::string mlp;
  switch (r.ri(0, 5)) {
    case 0: c.mlp = models::mlp::dense(); mlp = "dense"; break;
    case 1: c.mlp = models::mlp::cp_mumoe(r.ri(1, 4), r.ri(1, 4)); mlp = "CPμMoE"; break;
    case 2: c.mlp = models::mlp::tr_mumoe(r.ri(1, 4), r.ri(1, 3)); mlp = "TRμMoE"; break;
    case 3: {
      const int n = r.ri(1, 4);
      c.mlp = models::mlp::sigma_moe(n, r.ri(1, 3), r.ri(1, n), 0.0, 0.01);
      mlp = "σ-MoE";
      break;
    }
    case 4: c.mlp = models::mlp::topk_mlp(r.ri(1, int(4 * c.n_embd))); mlp = "top-K"; break;
    default: c.mlp = models::mlp::pkm(r.ri(1, 3), 1, 1); mlp = "PKM"; break;
  }
  c.recompute = r.coin();  // every block checkpointed (autograd/activation_checkpoint.h)
  c.chunked_loss = r.coin();  // the head and loss through linear_cross_entropy (ops/loss.h)
  c.gelu_recompute = r.coin();  // a dense MLP's c_proj through gelu_linear (ops/linalg.h)
  const std::string what = "GPT-2 " + std::to_string(c.n_layer) + " layers, " + std::to_string(c.n_head) +
                           " heads, n_embd " + std::to_string(c.n_embd) + ", vocab " + std::to_string(c.vocab_size) +
                           ", bias " + std::to_string(c.bias) + ", MLP " + mlp + (c.recompute ? ", recompute" : "") +
                           (c.chunked_loss ? ", chunked loss" : "") + (c.gelu_recompute ? ", GELU recompute" : "");
  auto m = std::make_shared<models::GPT2>(c, &g);
  const int64_t b = r.ri(1, 2), t = r.ri(1, 8);
  Tensor idx = randint(0, c.vocab_size, {b, t}, TensorOptions(kInt64), &g);
  // Targets with now and then an ignored position (-1), but never all of them: the mean
  // over no position is NaN (as in PyTorch), which no difference quotient can check.
  Tensor targets = randint(r.coin() ? -1 : 0, c.vocab_size, {b, t}, TensorOptions(kInt64), &g);
  targets.set({0, 0}, double(r.ri(0, int(c.vocab_size) - 1)));
  return {what, m, idx, [m, targets](const Tensor& x) {
            models::GPT2::Output o = m->forward(x, targets.to(x.device()));
            // A chunked loss leaves the logits out: they come from a forward of their own.
            return std::vector<Tensor>{o.logits.defined() ? o.logits : m->forward(x), o.loss};
          }};
}

Built mixer(Rng& r, Generator& g) {
  static const models::MixerMlp kinds[] = {models::MixerMlp::MLP, models::MixerMlp::CPMuMoE,
                                           models::MixerMlp::TRMuMoE, models::MixerMlp::DenseMoE};
  models::MixerConfig c;
  c.patch_size = r.ri(1, 2);
  c.image_size = c.patch_size * r.ri(1, 3);
  c.channels = r.ri(1, 2);
  c.width = r.ri(2, 6);
  c.token_mlp = r.ri(1, 4);
  c.channel_mlp = r.ri(1, 6);
  c.depth = r.ri(1, 2);
  c.num_classes = r.ri(1, 4);
  c.token_block = kinds[r.ri(0, 3)];
  c.channel_block = kinds[r.ri(0, 3)];
  c.experts = r.ri(1, 4);
  c.further_gate_std = 0.3;
  c.moe_input_norm = r.coin();
  c.cp_rank_ratio = c.tr_rank_ratio = 1.0;  // the paper's ratios give rank 0 at these widths
  c.recompute = r.coin();
  c.gelu_recompute = r.coin();  // a plain channel MLP's second Linear through gelu_linear
  const std::string what = "Mixer " + std::to_string(c.image_size) + "², patch " + std::to_string(c.patch_size) +
                           ", " + std::to_string(c.channels) + " channels, width " + std::to_string(c.width) +
                           ", depth " + std::to_string(c.depth) + ", token " + models::to_string(c.token_block) +
                           ", channel " + models::to_string(c.channel_block) + ", " + std::to_string(c.experts) +
                           " experts" + (c.recompute ? ", recompute" : "") + (c.gelu_recompute ? ", GELU recompute" : "");
  // The model draws from the global generator: seed it from this draw.
  manual_seed(uint64_t(r.ri(0, 1 << 30)));
  auto m = std::make_shared<models::MlpMixer>(c);
  Tensor x = randn({r.ri(1, 3), c.channels, c.image_size, c.image_size}, kFloat64, &g);
  return {what, m, x, [m](const Tensor& x) { return std::vector<Tensor>{m->forward(x)}; }};
}

struct Kind {
  const char* name;
  Maker make;
  int draws;
};

// MUMOE_RANDOM_KIND=NAME keeps the kinds whose name contains NAME (e.g. GPT-2), and
// MUMOE_RANDOM_DRAW=I the autocast case's draw I alone, its errors printed: to run one
// failing draw again by itself.
const std::vector<Kind>& kinds() {
  static const std::vector<Kind> k = [] {
    const std::vector<Kind> all = {{"μMoE block", mumoe_block, 300}, {"sparse MoE", sparse_moe, 200},
                                   {"PKM", pkm, 100},                {"top-K MLP", topk_mlp, 100},
                                   {"GPT-2", gpt2, 100},             {"MLP-Mixer", mixer, 100}};
    const char* only = std::getenv("MUMOE_RANDOM_KIND");
    if (!only) return all;
    std::vector<Kind> kept;
    for (const Kind& kind : all)
      if (std::string(kind.name).find(only) != std::string::npos) kept.push_back(kind);
    if (kept.empty()) {  // else every case would pass having checked nothing
      std::fprintf(stderr, "MUMOE_RANDOM_KIND=%s matches no kind\n", only);
      std::exit(2);
    }
    return kept;
  }();
  return k;
}

int only_draw() {
  const char* v = std::getenv("MUMOE_RANDOM_DRAW");
  return v ? std::atoi(v) : -1;
}

// Checks one draw; false when the layer refuses the draw's input with a mu::Error (batch
// norm in training over one value per channel, as torch), which is not checked further.
bool check_draw(const Kind& kind, uint64_t seed, Device dev) {
  Rng r(seed);
  Generator g(seed);
  Built b;
  try {
    b = kind.make(r, g);
  } catch (const mu::Error& e) {
    FAIL_CHECK(kind.name << " draw " << seed << " was refused: " << e.what());
    return true;
  }
  INFO(b.what << " (draw seed " << seed << ")");
  nn::Module& m = *b.module;
  m.to(kFloat64);
  m.to(dev);
  if (r.ri(0, 3) == 0) m.eval();  // else training: batch statistics, the sparse layers' training routing
  std::vector<Tensor> params = m.parameters();
  {
    // Off the initialisation (zero gates, unit norms), so each parameter's gradient has a
    // character of its own.
    NoGradGuard ng;
    for (Tensor& p : params) p.add_(randn(p.shape(), kFloat64, &g).to(dev) * 0.3);
  }
  Tensor x = b.input.to(dev);
  try {
    NoGradGuard ng;
    b.forward(x);
  } catch (const mu::Error&) {
    return false;
  }
  // The outputs (and the regulariser) as one vector, which gradcheck projects on random
  // weights; the input (when float) and every parameter moved along random directions.
  auto fn = [&](const autograd::TensorList& in) {
    std::vector<Tensor> outs = b.forward(in[0]);
    for (Tensor& o : outs) o = o.flatten();
    return cat(outs, 0);
  };
  // A kink of the layer (a top-K or a routing decision that changes, relu or entmax at
  // the edge of its support) can spoil one step size; a wrong gradient spoils all three.
  std::string first;
  for (double eps : {1e-6, 1e-4, 1e-8}) {
    autograd::GradcheckOptions o;
    o.eps = eps;
    o.directions = 2;
    o.seed = seed;
    const autograd::GradcheckResult res = autograd::gradcheck(fn, {x}, params, o);
    if (res.ok) return true;
    if (first.empty()) first = res.message;
  }
  FAIL_CHECK(first);
  return true;
}

}  // namespace

TEST_CASE("random layers and models: the gradient along a random direction matches the central difference") {
  for (Device dev : test_devices()) {
    INFO("on " << dev.str());
    for (const Kind& kind : kinds()) {
      std::printf("%s on %s: %d draws\n", kind.name, dev.str().c_str(), kind.draws);
      std::fflush(stdout);
      int checked = 0;
      for (int i = 0; i < kind.draws; ++i) checked += check_draw(kind, uint64_t(7919 * i + 3), dev);
      INFO(kind.name);
      CHECK(checked >= kind.draws * 3 / 4);  // the refusals stay the exception
    }
  }
}

namespace {

// Every tensor of a state dict, copied to the host.
nn::StateDict snapshot(const nn::StateDict& sd) {
  nn::StateDict out;
  for (const auto& [name, t] : sd) out.emplace_back(name, t.detach().cpu().clone());
  return out;
}

void require_identical(const nn::StateDict& a, const nn::StateDict& b, const char* what) {
  REQUIRE_MESSAGE(a.size() == b.size(), what << ": " << a.size() << " entries against " << b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO(what << ": " << a[i].first);
    REQUIRE(a[i].first == b[i].first);
    REQUIRE(a[i].second.shape() == b[i].second.shape());
    REQUIRE(a[i].second.dtype() == b[i].second.dtype());
    if (a[i].second.numel() == 0) continue;
    CHECK(max_abs_diff(a[i].second.cpu().to(kFloat64), b[i].second.cpu().to(kFloat64)) == 0.0);
  }
}

// Draw `seed` of `kind` in float32 on dev, its parameters moved off their initialisation
// (N(0, 0.3²) added from the draw's generator), and its input there (floats as float32).
struct DrawnFloat32 {
  Built b;
  Tensor x;
};
DrawnFloat32 draw_float32(const Kind& kind, uint64_t seed, Device dev) {
  Rng r(seed);
  Generator g(seed);
  DrawnFloat32 d{kind.make(r, g), Tensor()};
  d.b.module->to(dev);
  {
    NoGradGuard ng;
    for (Tensor& p : d.b.module->parameters()) p.add_(randn(p.shape(), kFloat32, &g).to(dev) * 0.3);
  }
  d.x = is_floating(d.b.input.dtype()) ? d.b.input.to(kFloat32).to(dev) : d.b.input.to(dev);
  return d;
}

// A drawn layer in float32 on dev with its AdamW and a fixed objective Σ w·outputs.
struct Trained {
  Built b;
  Tensor x;
  std::unique_ptr<optim::AdamW> opt;
  std::vector<Tensor> weights;  // one per output, on dev

  Trained(const Kind& kind, uint64_t seed, Device dev, double lr) {
    DrawnFloat32 d = draw_float32(kind, seed, dev);
    b = std::move(d.b);
    x = d.x;
    opt = std::make_unique<optim::AdamW>(b.module->parameters(), optim::AdamWOptions(lr).weight_decay(0.1));
  }
  // One step; false when the layer refuses the input (batch norm over one value).
  bool step(Device dev) {
    opt->zero_grad();
    std::vector<Tensor> outs;
    try {
      outs = b.forward(x);
    } catch (const mu::Error&) {
      return false;
    }
    if (weights.empty()) {
      Generator wg(99);
      for (const Tensor& o : outs) weights.push_back(randn(o.shape(), kFloat32, &wg).to(dev));
    }
    Tensor loss = zeros({}, TensorOptions(kFloat32).device(dev));
    for (size_t k = 0; k < outs.size(); ++k) loss = loss + (outs[k] * weights[k]).sum();
    loss.backward();
    opt->step();
    return true;
  }
};

}  // namespace

TEST_CASE("random layers and models: a checkpoint resumes bit for bit, and a mismatched one changes nothing") {
  TempDir dir("random_modules");
  for (Device dev : test_devices()) {
    INFO("on " << dev.str());
    for (const Kind& kind : kinds()) {
      std::printf("%s on %s: checkpoints of 20 draws\n", kind.name, dev.str().c_str());
      std::fflush(stdout);
      int resumed = 0, refused = 0, taken = 0;
      for (int i = 0; i < 20; ++i) {
        const uint64_t seed = uint64_t(7919 * i + 3);
        Trained a(kind, seed, dev, 1e-2);
        INFO(a.b.what << " (draw seed " << seed << ")");
        if (!a.step(dev) || !a.step(dev)) continue;
        const std::string path = dir.file("draw.safetensors");
        optim::save_checkpoint(path, *a.b.module, *a.opt, 2);
        const nn::StateDict saved_model = snapshot(a.b.module->state_dict()), saved_opt = snapshot(a.opt->state_dict());

        // The same configuration from other values, and an optimizer with another lr:
        // everything comes from the file.
        Trained same(kind, seed, dev, 5e-3);
        {
          NoGradGuard ng;
          for (Tensor& p : same.b.module->parameters()) p.add_(1.0);
        }
        REQUIRE(optim::load_checkpoint(path, *same.b.module, *same.opt) == 2);
        REQUIRE(a.step(dev));
        REQUIRE(same.step(dev));
        require_identical(snapshot(a.b.module->state_dict()), snapshot(same.b.module->state_dict()), "model");
        require_identical(snapshot(a.opt->state_dict()), snapshot(same.opt->state_dict()), "optimizer");
        ++resumed;
        if (!dev.is_cpu()) {  // saved on the device, loaded on the CPU: the same values
          Trained host(kind, seed, Device::cpu(), 5e-3);
          REQUIRE(optim::load_checkpoint(path, *host.b.module, *host.opt) == 2);
          require_identical(saved_model, snapshot(host.b.module->state_dict()), "on the CPU: model");
          require_identical(saved_opt, snapshot(host.opt->state_dict()), "on the CPU: optimizer");
        }

        // Another configuration of the same kind.
        Trained other(kind, seed + 1, dev, 5e-3);
        if (!other.step(dev)) continue;
        const nn::StateDict model_before = snapshot(other.b.module->state_dict());
        const nn::StateDict opt_before = snapshot(other.opt->state_dict());
        bool loaded = true;
        try {
          optim::load_checkpoint(path, *other.b.module, *other.opt);
        } catch (const mu::Error& e) {
          loaded = false;
          INFO("refused with: " << e.what());
          CHECK(std::string(e.what()).find(path) != std::string::npos);  // the message names the file
        }
        if (loaded) {
          ++taken;
          require_identical(saved_model, snapshot(other.b.module->state_dict()), "taken: model");
          require_identical(saved_opt, snapshot(other.opt->state_dict()), "taken: optimizer");
        } else {
          ++refused;
          require_identical(model_before, snapshot(other.b.module->state_dict()), "refused: model");
          require_identical(opt_before, snapshot(other.opt->state_dict()), "refused: optimizer");
        }
      }
      std::printf("  %d resumed; another configuration: %d refused, %d taken\n", resumed, refused, taken);
      CHECK(resumed >= 15);
    }
  }
}

namespace {

double norm_of(const std::vector<Tensor>& ts) {
  double s = 0;
  for (const Tensor& t : ts)
    if (t.defined())
      for (double v : t.detach().cpu().to(kFloat64).to_vector<double>()) s += v * v;
  return std::sqrt(s);
}

double norm_of_difference(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  std::vector<Tensor> d;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].defined()) d.push_back(a[i].detach().cpu().to(kFloat64) - b[i].detach().cpu().to(kFloat64));
  return norm_of(d);
}

}  // namespace

// Each draw runs in float32, under autocast and in float64: float32 must stay within its
// precision of float64, and autocast must run whatever float32 runs (every op's backward
// included), give float32 gradients to exactly the parameters float32 does, and stay
// within bfloat16's precision of float64 as scaled by the draw's conditioning (below).
// The per-op autocast suites check each op's precision.
TEST_CASE("random layers and models in float32 and under autocast: near float64; autocast runs what float32 runs, with float32 gradients") {
  for (Device dev : test_devices()) {
    INFO("on " << dev.str());
    for (const Kind& kind : kinds()) {
      std::printf("%s on %s: autocast, 20 draws\n", kind.name, dev.str().c_str());
      std::fflush(stdout);
      int compared = 0;
      for (int i = 0; i < 20; ++i) {
        if (only_draw() >= 0 && i != only_draw()) continue;
        const uint64_t seed = uint64_t(7919 * i + 3);
        auto [b, x] = draw_float32(kind, seed, dev);
        INFO(b.what << " (draw seed " << seed << ")");
        std::vector<Tensor> params = b.module->parameters();
        auto run = [&](bool amp, std::vector<Tensor>& outs, std::vector<Tensor>& grads) {
          for (Tensor& p : params) p.zero_grad();
          AutocastGuard guard(kBFloat16, amp);
          outs = b.forward(x);
          Generator wg(99);
          Tensor loss = zeros({}, TensorOptions(kFloat32).device(dev));
          for (const Tensor& o : outs) loss = loss + (o * randn(o.shape(), kFloat32, &wg).to(dev)).sum();
          loss.backward();
          grads.clear();
          for (const Tensor& p : params) grads.push_back(p.grad());
        };
        std::vector<Tensor> outs32, grads32, outs16, grads16;
        try {
          run(false, outs32, grads32);
        } catch (const mu::Error&) {
          continue;  // refused in float32 too (batch norm over one value)
        }
        try {
          run(true, outs16, grads16);
        } catch (const mu::Error& e) {
          FAIL_CHECK("float32 runs, autocast raises: " << e.what());
          continue;
        }
        ++compared;
        REQUIRE(outs16.size() == outs32.size());
        for (size_t k = 0; k < outs16.size(); ++k) REQUIRE(outs16[k].shape() == outs32[k].shape());
        for (size_t j = 0; j < params.size(); ++j) {
          INFO("parameter " << j << " " << params[j].describe());
          REQUIRE(grads16[j].defined() == grads32[j].defined());
          if (grads16[j].defined()) CHECK(grads16[j].dtype() == kFloat32);
        }
        // float64, for the conditioning of the draw
        b.module->to(kFloat64);
        std::vector<Tensor> outs64, grads64;
        {
          Tensor x64 = is_floating(x.dtype()) ? x.to(kFloat64) : x;
          for (Tensor& p : params) p.zero_grad();
          outs64 = b.forward(x64);
          Generator wg(99);
          Tensor loss = zeros({}, TensorOptions(kFloat64).device(dev));
          for (const Tensor& o : outs64) loss = loss + (o * randn(o.shape(), kFloat32, &wg).to(dev).to(kFloat64)).sum();
          loss.backward();
          for (const Tensor& p : params) grads64.push_back(p.grad());
        }
        b.module->to(kFloat32);
        // Errors relative to float64: bfloat16's 8 significant bits against float32's 24
        // make the same computation's rounding error 2^16 times larger, times whatever the
        // draw amplifies it by, which float32's own error shows. Allowed: 16 times that
        // (measured, gradients: at most 4.5 on the CPU, 7.6 on the emulated CUDA device; outputs
        // 2.4), from a floor of float32's precision.
        auto rel = [](const std::vector<Tensor>& a, const std::vector<Tensor>& ref) {
          return norm_of_difference(a, ref) / (norm_of(ref) + 1e-30);
        };
        const double y32 = rel(outs32, outs64), g32 = rel(grads32, grads64);
        if (only_draw() >= 0)
          std::printf("%s: float32 %.3g %.3g, autocast %.3g %.3g (outputs, gradients against float64)\n",
                      b.what.c_str(), y32, g32, rel(outs16, outs64), rel(grads16, grads64));
        // float32 itself, whose kernels (SIMD lines, GEMM micro-kernels, fused attention)
        // float64 does not reach: measured over every draw at most 1.4e-6 (outputs) and
        // 3.5e-5 (gradients, a Mixer) on the CPU and the emulated CUDA device. The vector
        // GELU derivative with its x φ(x) term 0.2% too large gives gradients 5.7e-4 and
        // 1.5e-3 off in two draws.
        CHECK(y32 <= 5e-4);
        CHECK(g32 <= 5e-4);
        CHECK(rel(outs16, outs64) <= 16 * 65536 * std::max(y32, 1e-7));
        CHECK(rel(grads16, grads64) <= 16 * 65536 * std::max(g32, 1e-7));
      }
      INFO(kind.name);
      CHECK(compared >= (only_draw() >= 0 ? 0 : 15));
    }
  }
}

// Inference as users run it (eval(), no graph recorded) gives what the recorded pass gives:
// no layer takes another path, or keeps state from one, when grad mode is off.
TEST_CASE("random layers and models: a pass without a graph equals the recorded pass") {
  for (Device dev : test_devices()) {
    INFO("on " << dev.str());
    for (const Kind& kind : kinds()) {
      int compared = 0;
      for (int i = 0; i < 20; ++i) {
        const uint64_t seed = uint64_t(7919 * i + 5);
        auto [b, x] = draw_float32(kind, seed, dev);
        INFO(b.what << " (draw seed " << seed << ")");
        try {
          b.forward(x);  // training: moves batch-norm statistics off their start
        } catch (const mu::Error&) {
          continue;  // refused (batch norm over one value per channel)
        }
        b.module->eval();
        const std::vector<Tensor> recorded = b.forward(x);
        std::vector<Tensor> plain;
        {
          NoGradGuard ng;
          plain = b.forward(x);
        }
        REQUIRE(plain.size() == recorded.size());
        for (size_t k = 0; k < plain.size(); ++k) {
          REQUIRE(plain[k].shape() == recorded[k].shape());
          CHECK(!plain[k].requires_grad());
          // The CPU's kernels are deterministic: the same bits. A GPU's atomic sums may add in
          // another order: float32 rounding of the output's size.
          const double size = recorded[k].numel() ? amax(abs(recorded[k].detach()), {}).item() : 0.0;
          CHECK(max_abs_diff(plain[k].detach(), recorded[k].detach()) <= (dev.is_cpu() ? 0.0 : 1e-6 * std::max(1.0, size)));
        }
        ++compared;
      }
      INFO(kind.name);
      CHECK(compared >= 15);
    }
  }
}
