// GPT2::generate on every test device: nanoGPT's sampling loop (greedy and top-k against
// the logits of model.forward on the same context, the draws' frequencies against their
// softmax, non-finite logits refused), and its key-value cache, which must give the tokens
// of the cache-free loop and forward only the newest position while the context fits the
// block.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "helpers.h"
#include "models/gpt2.h"
#include "tiny_models.h"

using namespace mu;
using models::GPT2;
using models::GPT2Config;
namespace mlp = models::mlp;

namespace {

Tensor tokens(int64_t B, int64_t T, int64_t V, uint64_t seed) {
  Generator g(seed);
  return randint(0, V, {B, T}, TensorOptions(kInt64), &g);
}

// A position-wise MLP that writes down the (B, T) of every input it is given: which
// positions a generate step forwarded.
class RecordingMLP : public nn::UnaryModule {
 public:
  RecordingMLP(int64_t d, std::vector<Shape>* seen) : UnaryModule("RecordingMLP"), seen_(seen) {
    fc = register_module("fc", std::make_shared<nn::Linear>(d, d));
  }
  Tensor forward(const Tensor& x) override {
    seen_->push_back({x.size(0), x.size(1)});
    return gelu(fc->forward(x));
  }
  std::shared_ptr<nn::Linear> fc;

 private:
  std::vector<Shape>* seen_;
};

// The (B, T) each block-0 MLP call saw, from a model with RecordingMLPs (every layer
// records, so keep layer 0's calls: every n_layer-th entry).
std::vector<Shape> layer0(const std::vector<Shape>& seen, int64_t n_layer) {
  std::vector<Shape> r;
  for (size_t i = 0; i < seen.size(); i += size_t(n_layer)) r.push_back(seen[i]);
  return r;
}

}  // namespace

TEST_CASE("generate: nanoGPT's loop, deterministic for a seed") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    GPT2Config c = tiny_gpt2();
    manual_seed(8);
    GPT2 model(c);
    model.to(dev);
    model.eval();
    Tensor idx = tokens(2, 3, c.vocab_size, 9).to(dev);
    Generator g1(42), g2(42), g3(43);
    Tensor a = model.generate(idx, 12, 1.0, 0, &g1);  // 15 tokens: the context is cropped to 8
    Tensor b = model.generate(idx, 12, 1.0, 0, &g2);
    Tensor d = model.generate(idx, 12, 1.0, 0, &g3);
    CHECK(a.shape() == Shape{2, 15});
    CHECK(a.device() == dev);
    CHECK(a.to_vector<int64_t>() == b.to_vector<int64_t>());
    CHECK(a.to_vector<int64_t>() != d.to_vector<int64_t>());
    CHECK(max_abs_diff(a.narrow(1, 0, 3).cpu(), idx.cpu()) == 0.0);
    for (int64_t v : a.to_vector<int64_t>()) CHECK((v >= 0 && v < c.vocab_size));
    // top_k = 1 is greedy decoding: each new token is the argmax of the (cropped) context's
    // last logits, as model.forward computes them on the whole context.
    Tensor greedy = model.generate(idx, 10, 0.7, 1, &g1);
    for (int64_t t = 3; t < 13; ++t) {
      const int64_t start = std::max<int64_t>(0, t - c.block_size);
      Tensor last = model.forward(greedy.narrow(1, start, t - start)).select(1, t - start - 1);
      CHECK(argmax(last, 1).to_vector<int64_t>() == greedy.select(1, t).to_vector<int64_t>());
    }
    // A temperature of 1e-300 (logits divided by it overflow float32) decodes greedily.
    Generator g4(44);
    CHECK(model.generate(idx, 10, 1e-300, 0, &g4).to_vector<int64_t>() == greedy.to_vector<int64_t>());
    // top_k = 3: every sampled token is among the 3 largest logits.
    Tensor topk3 = model.generate(idx, 6, 2.0, 3, &g1);
    for (int64_t t = 3; t < 9; ++t) {
      const int64_t start = std::max<int64_t>(0, t - c.block_size);
      Tensor last = model.forward(topk3.narrow(1, start, t - start)).select(1, t - start - 1);
      for (int64_t bi = 0; bi < 2; ++bi) {
        std::vector<double> row = last.select(0, bi).to_vector<double>();
        const double chosen = row[size_t(topk3.cpu().at({bi, t}))];
        int64_t larger = 0;
        for (double v : row) larger += v > chosen;
        CHECK(larger < 3);
      }
    }
    CHECK(model.generate(idx, 0, 1.0).shape() == idx.shape());
    CHECK_THROWS_MU(model.generate(idx, 2, 0.0), "temperature must be a finite number > 0, got 0");
    CHECK_THROWS_MU(model.generate(idx, 2, -1.0), "temperature must be a finite number > 0, got -1");
    CHECK_THROWS_MU(model.generate(idx, 2, std::nan("")), "temperature must be a finite number > 0, got nan");
    CHECK_THROWS_MU(model.generate(idx, 2, 1.0, -1), "top_k must be >= 0");
    CHECK_THROWS_MU(model.generate(idx, -1, 1.0), "max_new_tokens must be >= 0, got -1");
  }
}

// 4000 rows of one context give 4000 independent draws of the next token: their
// frequencies must follow softmax(logits / temperature) from model.forward (in float64),
// over the whole vocabulary and over the top 3 renormalised (none outside them), each
// within 4.5 standard deviations of a binomial count (plus one draw).
TEST_CASE("generate: the drawn tokens follow the softmax of the logits, with and without top-k") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    GPT2Config c = tiny_gpt2();
    manual_seed(5);
    GPT2 model(c);
    model.to(dev);
    model.eval();
    const int64_t n = 4000, V = c.vocab_size;
    const Tensor context = tokens(1, 4, V, 3);
    // Sharpen the logits so that the probabilities are far from uniform.
    const double temperature = 0.05;
    const std::vector<double> logits =
        model.forward(context.to(dev)).select(1, 3).select(0, 0).to_vector<double>();
    for (int64_t k : {int64_t(0), int64_t(3)}) {
      INFO("top_k " << k);
      std::vector<double> p(static_cast<size_t>(V), 0.0);
      std::vector<int64_t> order(static_cast<size_t>(V));
      for (int64_t j = 0; j < V; ++j) order[size_t(j)] = j;
      std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return logits[size_t(a)] > logits[size_t(b)]; });
      const int64_t kept = k == 0 ? V : k;
      double total = 0;
      for (int64_t r = 0; r < kept; ++r) {
        const int64_t j = order[size_t(r)];
        total += p[size_t(j)] = std::exp((logits[size_t(j)] - logits[size_t(order[0])]) / temperature);
      }
      for (double& v : p) v /= total;
      Generator g(11);
      const std::vector<int64_t> drawn =
          model.generate(context.expand({n, 4}).contiguous().to(dev), 1, temperature, k, &g).select(1, 4).to_vector<int64_t>();
      std::vector<int64_t> count(static_cast<size_t>(V), 0);
      for (int64_t t : drawn) ++count[size_t(t)];
      int64_t spread = 0;  // tokens drawn with a probability of at least 5%
      for (int64_t j = 0; j < V; ++j) {
        const double pj = p[size_t(j)], sd = std::sqrt(n * pj * (1 - pj));
        INFO("token " << j << ": " << count[size_t(j)] << " draws, probability " << pj);
        CHECK(std::abs(double(count[size_t(j)]) - n * pj) <= 4.5 * sd + 1);
        spread += pj >= 0.05;
      }
      CHECK(spread >= 2);  // the check says something: more than one likely token
    }
  }
}

// Logits that are not numbers stop generate with the sequence named, rather than a draw
// from a distribution that is not one.
TEST_CASE("generate: NaN logits are an error naming the sequence") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    GPT2Config c = tiny_gpt2();
    manual_seed(6);
    GPT2 model(c);
    model.to(dev);
    model.eval();
    for (auto& [name, t] : model.named_parameters())
      if (name.find("ln_f.weight") != std::string::npos) {
        NoGradGuard no_grad;
        t.fill_(std::nan(""));
      }
    for (bool cache : {false, true})
      CHECK_THROWS_MU(model.generate(tokens(2, 3, c.vocab_size, 1).to(dev), 2, 1.0, 0, nullptr, cache),
                      "the logits of sequence 0 are not finite (11 NaN and 0 infinite of 11)");
  }
}

TEST_CASE("generate: the key-value cache samples the cache-free loop's tokens, for every MLP choice") {
  // Sampled at temperature 1 over the whole vocabulary, so that a logit off by more than
  // rounding moves some draw to another token. 14 new tokens from 3 with a block of 8: the
  // cache serves the first 6 steps, then the window slides.
  const std::vector<models::MlpChoice> choices = {
      mlp::dense(), mlp::cp_mumoe(4, 6), mlp::tr_mumoe(4, 3), mlp::sigma_moe(4, 4, 2), mlp::topk_mlp(5),
      mlp::pkm(3, 2, 2),
      // Capacity for a quarter of the tokens: the full context drops tokens the single new
      // position would keep, so that MLP is not position-wise and the cache must not run.
      mlp::sparse_moe("switch-capacity", [](const GPT2Config& c) {
        return nn::SparseMoEOptions(c.n_embd, 4, 4).k(1).selection(nn::Selection::Switch).capacity_factor(0.25);
      })};
  for (Device dev : test_devices()) {
    for (const models::MlpChoice& choice : choices) {
      INFO(dev.str(), " ", choice.name);
      GPT2Config c = tiny_gpt2();
      c.vocab_size = 23;
      c.mlp = choice;
      Generator init(5);
      GPT2 model(c, &init);
      model.to(dev);
      model.eval();
      const Tensor idx = tokens(3, 3, c.vocab_size, 11).to(dev);
      Generator g1(7), g2(7);
      const Tensor cached = model.generate(idx, 14, 1.0, 0, &g1, /*kv_cache=*/true);
      const Tensor plain = model.generate(idx, 14, 1.0, 0, &g2, /*kv_cache=*/false);
      CHECK(cached.to_vector<int64_t>() == plain.to_vector<int64_t>());
    }
  }
}

TEST_CASE("generate: with the cache, a step forwards the newest position alone while the context fits") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    std::vector<Shape> seen;
    auto recording = [&seen](bool position_wise) {
      return mlp::custom(
          "recording",
          [&seen](int64_t, const GPT2Config& cfg, Generator*) -> std::shared_ptr<nn::UnaryModule> {
            return std::make_shared<RecordingMLP>(cfg.n_embd, &seen);
          },
          true, nullptr, position_wise);
    };
    GPT2Config c = tiny_gpt2();
    c.mlp = recording(true);
    manual_seed(4);
    GPT2 model(c);
    model.to(dev);
    model.eval();
    const Tensor idx = tokens(2, 3, c.vocab_size, 1).to(dev);
    Generator g1(9), g2(9);
    // 8 steps from 3 tokens, block 8: the prompt (T = 3), then positions 3 to 7 one at a
    // time, then the window of the last 8 tokens, twice.
    const std::vector<Shape> cached = {{2, 3}, {2, 1}, {2, 1}, {2, 1}, {2, 1}, {2, 1}, {2, 8}, {2, 8}};
    const std::vector<Shape> whole = {{2, 3}, {2, 4}, {2, 5}, {2, 6}, {2, 7}, {2, 8}, {2, 8}, {2, 8}};
    const Tensor a = model.generate(idx, 8, 1.0, 0, &g1);
    CHECK(layer0(seen, c.n_layer) == cached);
    seen.clear();
    const Tensor b = model.generate(idx, 8, 1.0, 0, &g2, /*kv_cache=*/false);
    CHECK(layer0(seen, c.n_layer) == whole);
    CHECK(a.to_vector<int64_t>() == b.to_vector<int64_t>());
    // Training mode (dropout, routing noise): the whole context every step.
    seen.clear();
    model.train();
    model.generate(idx, 8, 1.0, 0, &g1);
    CHECK(layer0(seen, c.n_layer) == whole);
    // A custom MLP is not taken for position-wise unless its choice says so.
    GPT2Config c2 = tiny_gpt2();
    c2.mlp = recording(false);
    GPT2 other(c2);
    other.to(dev);
    other.eval();
    seen.clear();
    other.generate(idx, 8, 1.0, 0, &g1);
    CHECK(layer0(seen, c2.n_layer) == whole);
    // A prompt longer than the block: the window from the start, no cache.
    seen.clear();
    model.eval();
    model.generate(tokens(1, 10, c.vocab_size, 2).to(dev), 2, 1.0, 0, &g1);
    CHECK(layer0(seen, c.n_layer) == std::vector<Shape>{{1, 8}, {1, 8}});
  }
}
