// Sparse MoE layers (nn/sparse_moe.h): each selection kind against a per-token loop on
// the host, gradients with the routing held fixed, the regularisers by hand, expert
// dropout, the capacity, S-BASE's balancing and the routing statistics.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "helpers.h"
#include "models/gpt2.h"
#include "nn/sparse_moe.h"

using namespace mu;
using nn::Selection;

namespace {

std::vector<double> host(const Tensor& t) { return t.detach().cpu().to(kFloat64).contiguous().to_vector<double>(); }

const Selection kAll[] = {Selection::Sigmoid, Selection::Softmax, Selection::SoftmaxRenorm,
                          Selection::Switch,  Selection::NoisyTopK, Selection::SBase};

// A small layer in float64 on `dev`, its noise weights made non-zero so they matter.
std::shared_ptr<nn::SparseMoE> small(Selection s, Device dev, int64_t k = 2, double dropout = 0, double capacity = 0,
                                     uint64_t seed = 3, double hidden_dropout = 0) {
  Generator g(seed);
  auto o = nn::SparseMoEOptions(8, 6, 5).k(k).selection(s).generator(&g).expert_dropout(dropout).capacity_factor(capacity)
               .hidden_dropout(hidden_dropout);
  auto m = std::make_shared<nn::SparseMoE>(o);
  if (s == Selection::NoisyTopK) {
    NoGradGuard ng;
    m->noise_w.copy_(randn(m->noise_w.shape(), {}, &g) * 0.5);
  }
  m->to(kFloat64);
  m->to(dev);
  return m;
}

// z = x W (host, row-major x (T, d), W (d, N)).
std::vector<double> logits(const std::vector<double>& x, const std::vector<double>& w, int64_t T, int64_t d, int64_t N) {
  std::vector<double> z(size_t(T * N), 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t e = 0; e < N; ++e)
      for (int64_t i = 0; i < d; ++i) z[size_t(t * N + e)] += x[size_t(t * d + i)] * w[size_t(i * N + e)];
  return z;
}

// The layer's output for a fixed routing, one token and one chosen expert at a time.
std::vector<double> reference(const nn::SparseMoE& m, const std::vector<double>& x, int64_t T, const nn::Routing& r) {
  const nn::SparseMoEOptions& o = m.options();
  const int64_t d = o.d_model(), N = o.experts(), G = o.expert_size(), K = o.k();
  const std::vector<double> z = logits(x, host(m.selector), T, d, N), w1 = host(m.w1), w2 = host(m.w2);
  std::vector<double> noisy;
  if (r.noise.defined()) {
    const std::vector<double> zn = logits(x, host(m.noise_w), T, d, N), eps = host(r.noise);
    noisy.resize(z.size());
    for (size_t i = 0; i < z.size(); ++i) noisy[i] = z[i] + eps[i] * std::log1p(std::exp(zn[i]));
  }
  const std::vector<double> keep = r.keep.defined() ? host(r.keep) : std::vector<double>(z.size(), 1.0);
  const std::vector<double> hidden_keep =
      r.hidden_keep.defined() ? host(r.hidden_keep) : std::vector<double>(size_t(T * K * G), 1.0);
  std::vector<double> y(size_t(T * d), 0.0);
  for (int64_t t = 0; t < T; ++t) {
    const double* zt = &z[size_t(t * N)];
    double zmax = *std::max_element(zt, zt + N), denom = 0;
    for (int64_t e = 0; e < N; ++e) denom += std::exp(zt[e] - zmax);
    // Each chosen expert's weight before any renormalisation.
    std::vector<double> wk(size_t(K), 0.0);
    for (int64_t k = 0; k < K; ++k) {
      const int64_t e = r.experts[size_t(t * K + k)];
      if (e < 0) continue;
      switch (o.selection()) {
        case Selection::Sigmoid:
        case Selection::SBase: wk[size_t(k)] = keep[size_t(t * N + e)] / (1 + std::exp(-zt[e])); break;
        case Selection::Softmax:
        case Selection::SoftmaxRenorm:
        case Selection::Switch: wk[size_t(k)] = keep[size_t(t * N + e)] * std::exp(zt[e] - zmax) / denom; break;
        case Selection::NoisyTopK: wk[size_t(k)] = noisy.empty() ? zt[e] : noisy[size_t(t * N + e)]; break;
      }
    }
    if (o.selection() == Selection::NoisyTopK) {  // softmax over the K chosen
      double mx = *std::max_element(wk.begin(), wk.end()), s = 0;
      for (double& v : wk) s += (v = std::exp(v - mx));
      for (double& v : wk) v /= s;
    }
    if (o.selection() == Selection::SoftmaxRenorm) {
      double s = std::accumulate(wk.begin(), wk.end(), 0.0);
      for (double& v : wk) v /= s;
    }
    for (int64_t k = 0; k < K; ++k) {
      const int64_t e = r.experts[size_t(t * K + k)];
      if (e < 0) continue;
      std::vector<double> h(size_t(G), 0.0);
      for (int64_t g = 0; g < G; ++g) {
        for (int64_t i = 0; i < d; ++i) h[size_t(g)] += x[size_t(t * d + i)] * w1[size_t((e * d + i) * G + g)];
        h[size_t(g)] = std::max(h[size_t(g)], 0.0) * hidden_keep[size_t((t * K + k) * G + g)];
      }
      for (int64_t j = 0; j < d; ++j) {
        double out = 0;
        for (int64_t g = 0; g < G; ++g) out += h[size_t(g)] * w2[size_t((e * G + g) * d + j)];
        y[size_t(t * d + j)] += wk[size_t(k)] * out;
      }
    }
  }
  return y;
}

double max_diff(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

}  // namespace

TEST_CASE("every selection kind equals a per-token loop over its chosen experts (training and evaluation)") {
  for (Device dev : test_devices())
    for (Selection s : kAll)
      for (bool training : {false, true}) {
        INFO(dev.str() << " " << std::string(nn::to_string(s)) << (training ? " training" : " eval"));
        const double dropout =
            training && (s == Selection::Sigmoid || s == Selection::SBase || s == Selection::SoftmaxRenorm) ? 0.3 : 0.0;
        // Hidden (standard) dropout on the kinds without expert dropout.
        const double hidden = training && dropout == 0 ? 0.4 : 0.0;
        auto m = small(s, dev, 2, dropout, 0, 3, hidden);
        m->train(training);
        manual_seed(9);
        Tensor x = on(randn({13, 8}, kFloat64), dev);
        nn::Routing r = m->route(x);
        CHECK(r.experts.size() == 26);
        CHECK(r.hidden_keep.defined() == (hidden > 0));
        Tensor y = m->forward_routed(x, r);
        CHECK(y.device() == dev);
        CHECK(max_diff(host(y), reference(*m, host(x), 13, r)) <= 1e-12);
        if (!training && s != Selection::NoisyTopK) {
          // Evaluation routes by plain top-K of the selection score (monotone in the logits).
          const std::vector<double> z = logits(host(x), host(m->selector), 13, 8, 6);
          for (int64_t t = 0; t < 13; ++t) {
            std::vector<int64_t> order(6);
            std::iota(order.begin(), order.end(), 0);
            std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return z[size_t(t * 6 + a)] > z[size_t(t * 6 + b)]; });
            std::vector<int64_t> want(order.begin(), order.begin() + 2), got(r.experts.begin() + t * 2, r.experts.begin() + t * 2 + 2);
            std::sort(want.begin(), want.end());
            std::sort(got.begin(), got.end());
            CHECK(got == want);
          }
        }
        // forward() is route() then forward_routed(), on any leading shape.
        if (!training) CHECK(max_diff(host(m->forward(x.reshape({13, 1, 8})).reshape({13, 8})), host(y)) <= 1e-12);
      }
}

TEST_CASE("gradients of the output and the regulariser pass gradcheck with the routing held fixed") {
  for (Device dev : test_devices())
    for (Selection s : kAll) {
      INFO(dev.str() << " " << std::string(nn::to_string(s)));
      auto m = small(s, dev, 2, s == Selection::Sigmoid ? 0.2 : 0.0, 0, 3, s == Selection::Softmax ? 0.3 : 0.0);
      m->train(true);
      manual_seed(10);
      Tensor x = on(randn({7, 8}, kFloat64), dev);
      nn::SparseMoEOptions o = m->options();
      o.entropy_weight(0.5);  // every kind gets a regulariser to check
      const nn::Routing r = m->route(x);
      const bool noisy = s == Selection::NoisyTopK;
      auto weights = [&](const autograd::TensorList& in) {
        return nn::SparseMoEWeights{in[1], noisy ? in[4] : Tensor(), in[2], in[3]};
      };
      autograd::TensorList inputs = {x, m->selector.detach(), m->w1.detach(), m->w2.detach()};
      if (noisy) inputs.push_back(m->noise_w.detach());
      CHECK_GRAD([&](const autograd::TensorList& in) { return nn::SparseMoE::apply(o, in[0], r, weights(in)).y; },
                 inputs);
      CHECK_GRAD([&](const autograd::TensorList& in) { return nn::SparseMoE::apply(o, in[0], r, weights(in)).aux; },
                 inputs);
    }
}

TEST_CASE("the regularisers equal their hand-computed values") {
  // 4 tokens, 2 experts; x and W_s chosen so the logits are known: z_t = (a_t, 0).
  const std::vector<double> a = {1.0, -0.5, 2.0, 0.25};
  for (Device dev : test_devices()) {
    INFO(dev.str());
    Tensor x = on(from_vector<double>({a[0], 0, a[1], 0, a[2], 0, a[3], 0}, {4, 2}), dev);
    auto layer = [&](Selection s, double entropy, double balance) {
      Generator g(1);
      auto m = std::make_shared<nn::SparseMoE>(
          nn::SparseMoEOptions(2, 2, 3).k(1).selection(s).entropy_weight(entropy).balance_weight(balance).generator(&g));
      m->to(kFloat64);
      {
        NoGradGuard ng;
        m->selector.copy_(from_vector<double>({1, 0, 0, 0}, {2, 2}));  // z = (x_0, 0)
      }
      m->to(dev);
      m->eval();
      (void)m->forward(x);
      return m;
    };
    // p_e = mean_t softmax(z_t)_e; expert 0's probability is σ(a_t).
    double p0 = 0;
    for (double v : a) p0 += 1 / (1 + std::exp(-v)) / 4;
    const double p1 = 1 - p0;
    // σ-MoE's entropy term γ Σ p log p.
    CHECK(layer(Selection::Sigmoid, 0.7, 0)->aux_loss().item() ==
          doctest::Approx(0.7 * (p0 * std::log(p0) + p1 * std::log(p1))).epsilon(1e-12));
    // Switch: N Σ f_e P_e; the first choice is expert 0 where a_t > 0 (3 of 4 tokens).
    CHECK(layer(Selection::Switch, 0, 0.01)->aux_loss().item() ==
          doctest::Approx(0.01 * 2 * (0.75 * p0 + 0.25 * p1)).epsilon(1e-12));
    // Noisy top-1 in evaluation: each token's weight is softmax over one logit, 1, so the
    // importance is the token count per expert (3, 1): CV² = var / mean² = 1 / 4.
    CHECK(layer(Selection::NoisyTopK, 0, 0.1)->aux_loss().item() == doctest::Approx(0.1 * 0.25).epsilon(1e-12));
    // No regulariser asked: none.
    CHECK_FALSE(layer(Selection::Softmax, 0, 0)->aux_loss().defined());
  }
}

TEST_CASE("expert dropout: reproducible under a seed, different for another, off in evaluation") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(4);
    Tensor x = on(randn({50, 8}, kFloat64), dev);
    auto run = [&](uint64_t seed, bool training) {
      Generator g(seed);
      auto m = std::make_shared<nn::SparseMoE>(
          nn::sigma_moe_options(8, 6, 5, 2, 0.5).generator(&g));
      m->to(kFloat64);
      m->to(dev);
      m->train(training);
      nn::Routing r = m->route(x);
      return std::make_pair(r, host(m->forward_routed(x, r)));
    };
    auto [r1, y1] = run(7, true);
    auto [r2, y2] = run(7, true);
    auto [r3, y3] = run(8, true);
    REQUIRE(r1.keep.defined());
    CHECK(host(r1.keep) == host(r2.keep));
    CHECK(y1 == y2);
    CHECK(host(r1.keep) != host(r3.keep));
    // About half of the (token, expert) scores dropped: 5 standard deviations of 300 draws.
    const std::vector<double> k = host(r1.keep);
    const double kept = std::accumulate(k.begin(), k.end(), 0.0) / double(k.size());
    CHECK(std::fabs(kept - 0.5) < 5 * std::sqrt(0.25 / double(k.size())));
    // A dropped expert is never chosen while enough others survive.
    for (int64_t t = 0; t < 50; ++t)
      for (int64_t j = 0; j < 2; ++j) {
        const int64_t e = r1.experts[size_t(t * 2 + j)];
        if (e >= 0) CHECK(k[size_t(t * 6 + e)] == 1.0);
      }
    auto [r4, y4] = run(7, false);
    CHECK_FALSE(r4.keep.defined());
  }
}

TEST_CASE("hidden dropout: zero or 1 / (1 - p) per hidden unit, the expected share dropped, off in evaluation") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(5);
    Tensor x = on(randn({60, 8}, kFloat64), dev);
    const double p = 0.25;
    auto m = small(Selection::Softmax, dev, 2, 0, 0, 3, p);
    m->train(true);
    const nn::Routing r = m->route(x);
    REQUIRE(r.hidden_keep.defined());
    CHECK(r.hidden_keep.shape() == Shape{120, 5});
    const std::vector<double> hk = host(r.hidden_keep);
    double dropped = 0;
    for (double v : hk) {
      CHECK((v == 0.0 || std::fabs(v - 1.0 / (1.0 - p)) < 1e-6));
      dropped += v == 0.0;
    }
    // 600 Bernoulli(p) draws: 5 standard deviations.
    CHECK(std::fabs(dropped / double(hk.size()) - p) < 5 * std::sqrt(p * (1 - p) / double(hk.size())));
    // The same routing on a layer without hidden dropout differs exactly by the mask.
    nn::Routing plain = r;
    plain.hidden_keep = Tensor();
    CHECK(max_diff(host(m->forward_routed(x, r)), reference(*m, host(x), 60, r)) <= 1e-12);
    CHECK(max_diff(host(m->forward_routed(x, plain)), reference(*m, host(x), 60, plain)) <= 1e-12);
    CHECK(max_diff(host(m->forward_routed(x, r)), host(m->forward_routed(x, plain))) > 1e-3);
    m->train(false);
    CHECK_FALSE(m->route(x).hidden_keep.defined());
    nn::Routing bad = r;
    bad.hidden_keep = r.hidden_keep.narrow(1, 0, 4);
    CHECK_THROWS_MU(m->forward_routed(x, bad), "hidden dropout mask has shape [120, 4], expected (120, 5)");
  }
}

TEST_CASE("Switch's capacity drops the later tokens of a full expert and counts them") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    Generator g(2);
    auto m = std::make_shared<nn::SparseMoE>(
        nn::SparseMoEOptions(4, 4, 3).k(1).selection(Selection::Switch).capacity_factor(1.0).generator(&g));
    m->to(kFloat64);
    {
      NoGradGuard ng;  // expert 0 attracts every token with x_0 > 0
      m->selector.copy_(from_vector<double>({5, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1}, {4, 4}));
    }
    m->to(dev);
    manual_seed(12);
    Tensor x = on(abs(randn({16, 4}, kFloat64)), dev);  // x_0 > 0: all prefer expert 0
    m->eval();
    Tensor y = m->forward(x);
    const nn::RoutingStats& st = m->routing_stats();
    // Capacity ceil(1.0 · 16 · 1 / 4) = 4: tokens 0..3 run on expert 0, the other 12 of
    // those whose first choice is expert 0 are dropped.
    nn::Routing r = m->route(x);
    int64_t first0 = 0;
    for (int64_t e : r.first_choice) first0 += e == 0;
    CHECK(st.tokens_per_expert[0] == 4);
    CHECK(st.dropped == first0 - 4);
    CHECK(st.assignments == 16 - st.dropped);
    // In token order, the first 4 tokens that chose expert 0 keep it; later ones are dropped.
    int64_t seen0 = 0;
    for (int64_t t = 0; t < 16; ++t)
      if (r.first_choice[size_t(t)] == 0) CHECK(r.experts[size_t(t)] == (seen0++ < 4 ? 0 : -1));
    // A dropped token's output is zero.
    const std::vector<double> yh = host(y);
    for (int64_t t = 0; t < 16; ++t)
      if (r.experts[size_t(t)] < 0)
        for (int64_t j = 0; j < 4; ++j) CHECK(yh[size_t(t * 4 + j)] == 0.0);
  }
}

TEST_CASE("S-BASE balances the experts in training and routes by top-K in evaluation") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    Generator g(6);
    auto m = std::make_shared<nn::SparseMoE>(
        nn::SparseMoEOptions(4, 4, 3).k(1).selection(Selection::SBase).sinkhorn_iterations(20).generator(&g));
    m->to(kFloat64);
    {
      NoGradGuard ng;  // a strong preference for expert 0
      m->selector.copy_(from_vector<double>({3, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1}, {4, 4}));
    }
    m->to(dev);
    manual_seed(13);
    Tensor x = on(randn({64, 4}, kFloat64) + 0.5, dev);
    m->eval();
    (void)m->forward(x);
    const double cv_eval = m->routing_stats().load_cv;
    m->train();
    (void)m->forward(x);
    const nn::RoutingStats& st = m->routing_stats();
    // Sinkhorn's columns sum to T / N = 16; the assignment follows them closely.
    for (int64_t c : st.tokens_per_expert) CHECK(std::abs(c - 16) <= 6);
    CHECK(st.load_cv < cv_eval);
  }
}

TEST_CASE("routing statistics: counts, load CV and selection entropy match their definitions") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    auto m = small(Selection::Softmax, dev, 2);
    m->eval();
    manual_seed(14);
    Tensor x = on(randn({40, 8}, kFloat64), dev);
    (void)m->forward(x);
    const nn::RoutingStats& st = m->routing_stats();
    const nn::Routing r = m->route(x);
    std::vector<int64_t> counts(6, 0);
    for (int64_t e : r.experts) ++counts[size_t(e)];
    CHECK(st.tokens_per_expert == counts);
    CHECK(st.tokens == 40);
    CHECK(st.assignments == 80);
    CHECK(st.dropped == 0);
    double mu = 80.0 / 6, var = 0;
    for (int64_t c : counts) var += (double(c) - mu) * (double(c) - mu) / 6;
    CHECK(st.load_cv == doctest::Approx(std::sqrt(var) / mu).epsilon(1e-12));
    const std::vector<double> z = logits(host(x), host(m->selector), 40, 8, 6);
    std::vector<double> p(6, 0.0);
    for (int64_t t = 0; t < 40; ++t) {
      double mx = *std::max_element(&z[size_t(t * 6)], &z[size_t(t * 6)] + 6), s = 0;
      for (int64_t e = 0; e < 6; ++e) s += std::exp(z[size_t(t * 6 + e)] - mx);
      for (int64_t e = 0; e < 6; ++e) p[size_t(e)] += std::exp(z[size_t(t * 6 + e)] - mx) / s / 40;
    }
    double h = 0;
    for (double pe : p) h -= pe * std::log(pe);
    CHECK(st.selection_entropy == doctest::Approx(h).epsilon(1e-5));  // p is computed in float32
  }
}

TEST_CASE("σ-MoE's initialisation: dense-MLP deviations and selection rows of equal norm") {
  Generator g(21);
  nn::SigmaMoE m(nn::sigma_moe_options(64, 16, 32).n_layers(4).generator(&g));
  const double std1 = std::sqrt(2.0 / (64 * 4)), std2 = std::sqrt(2.0 / (16 * 32 * 4));
  auto rms = [](const Tensor& t) { return std::sqrt(mean(t * t).item()); };
  CHECK(rms(m.w1) == doctest::Approx(std1).epsilon(0.03));
  CHECK(rms(m.w2) == doctest::Approx(std2).epsilon(0.03));
  const std::vector<double> norms = host(sqrt(sum(m.selector * m.selector, {0})));
  for (double n : norms) CHECK(n == doctest::Approx(std1 * std::sqrt(64.0)).epsilon(1e-5));
  CHECK(nn::SparseMoE::count_parameters(m.options()) == m.num_parameters());
  CHECK(m.flops_per_token() == 4 * 2 * 64 * 32 + 64 * 16);
  CHECK(m.dense_flops_per_token() == 2 * 64 * 16 * 32);
}

TEST_CASE("bad options are refused with messages naming them") {
  CHECK_THROWS_MU(nn::SparseMoE(nn::SparseMoEOptions(8, 4, 4).k(5)), "k must be between 1 and experts = 4, got 5");
  CHECK_THROWS_MU(nn::SparseMoE(nn::SparseMoEOptions(0, 4, 4)), "d_model must be positive, got 0");
  CHECK_THROWS_MU(nn::SparseMoE(nn::SparseMoEOptions(8, 4, 4).expert_dropout(1.0)), "expert_dropout must be in [0, 1), got 1");
  CHECK_THROWS_MU(nn::SparseMoE(nn::SparseMoEOptions(8, 4, 4).hidden_dropout(-0.1)),
                  "hidden_dropout must be in [0, 1), got -0.1");
  CHECK_THROWS_MU(nn::SparseMoE(nn::SparseMoEOptions(8, 4, 4).selection(Selection::Switch).expert_dropout(0.1)),
                  "expert_dropout applies to the sigmoid, softmax, softmax-renorm and s-base selections, not switch");
  CHECK_THROWS_MU(nn::SparseMoE(nn::SparseMoEOptions(8, 4, 4).capacity_factor(1.5)),
                  "capacity_factor applies to the switch selection, not sigmoid");
  CHECK_THROWS_MU(nn::SigmaMoE(nn::SparseMoEOptions(8, 4, 4).selection(Selection::Switch)),
                  "SigmaMoE: the selection must be sigmoid, got switch");
  nn::SparseMoE m(nn::SparseMoEOptions(8, 4, 4));
  CHECK_THROWS_MU(m.forward(randn({3, 7})), "SparseMoE: expected input with last dim 8");
  nn::Routing r = m.route(randn({3, 8}));
  CHECK_THROWS_MU(m.forward_routed(randn({4, 8}), r), "the routing is for 3 tokens x 4 experts");
}

TEST_CASE("GPT-2 takes every MLP approximation through its MLP choices: counts match, a step runs") {
  for (const models::MlpChoice& choice :
       {models::mlp::topk_mlp(16), models::mlp::pkm(8, 2, 4), models::mlp::pkm(8, 1, 4, nn::PKMActivation::Softmax),
        models::mlp::sigma_moe(4, 32, 2), models::mlp::sparse_moe("switch", [](const models::GPT2Config& c) {
          return nn::SparseMoEOptions(c.n_embd, 4, 32).k(1).selection(Selection::Switch).capacity_factor(1.25);
        })}) {
    INFO(choice.name);
    models::GPT2Config c;
    c.n_layer = 2;
    c.n_head = 2;
    c.n_embd = 32;
    c.block_size = 8;
    c.vocab_size = 19;
    c.mlp = choice;
    Generator g(3);
    models::GPT2 model(c, &g);
    CHECK(models::GPT2::count_parameters(c) == model.num_parameters());
    const Tensor idx = randint(0, 19, {2, 8}, TensorOptions(kInt64), &g);
    auto out = model.forward(idx, idx);
    CHECK(std::isfinite(out.loss.item()));
    out.loss.backward();
    for (const Tensor& p : model.parameters()) CHECK(p.grad().defined());
  }
}

TEST_CASE("a small GPT-2 with σ-MoE MLPs: counted parameters, the regulariser in the loss, and the loss falls") {
  models::GPT2Config c;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 32;
  c.block_size = 16;
  c.vocab_size = 29;
  c.dropout = 0.0;
  c.mlp = models::mlp::sigma_moe(8, 16, 2, 0.1, 0.01);
  Generator g(31);
  models::GPT2 model(c, &g);
  CHECK(models::GPT2::count_parameters(c) == model.num_parameters());
  REQUIRE(std::dynamic_pointer_cast<nn::SigmaMoE>(model.mlp(0)) != nullptr);
  // A fixed batch of a repeating pattern: next token = (token + 3) mod 29.
  std::vector<int64_t> seq(4 * 17);
  for (int64_t b = 0; b < 4; ++b)
    for (int64_t t = 0; t < 17; ++t) seq[size_t(b * 17 + t)] = (5 * b + 3 * t) % 29;
  const Tensor all = from_vector(seq, {4, 17});
  const Tensor idx = all.narrow(1, 0, 16).contiguous(), tgt = all.narrow(1, 1, 16).contiguous();
  optim::AdamW opt(model.parameters(), optim::AdamWOptions(3e-3));
  double first = 0, last = 0;
  for (int step = 0; step < 60; ++step) {
    opt.zero_grad();
    auto out = model.forward(idx, tgt);
    REQUIRE(out.aux_loss.defined());
    // The loss is the cross-entropy plus the MLPs' entropy regularisers.
    const double ce = cross_entropy(out.logits.reshape({-1, 29}), tgt.reshape({-1})).item();
    CHECK(out.loss.item() == doctest::Approx(ce + out.aux_loss.item()).epsilon(1e-5));
    out.loss.backward();
    opt.step();
    if (step == 0) first = ce;
    last = ce;
  }
  MESSAGE("σ-MoE GPT-2 cross-entropy: " << first << " -> " << last);
  CHECK(first > 3.0);        // about log 29 = 3.37 at the start
  CHECK(last < 0.3 * first);  // the pattern is learnt
}
