// nn::TopKMLP and nn::PKM, the top-K and product-key approximations of a two-layer MLP:
// forward passes and gradients against per-token brute-force loops in double (the PKM
// reference scores all n_sub² values, so it also checks that the two-stage selection
// finds the exact top-K), gradcheck of the input and every parameter, option errors,
// parameter and FLOP counts, and a short fit of a random dense MLP.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "helpers.h"
#include "nn/nn.h"

using namespace mu;
using autograd::TensorList;

namespace {

// Indices of the k largest entries of s, largest first, by std::partial_sort.
std::vector<int64_t> top_indices(const std::vector<double>& s, int64_t k) {
  std::vector<int64_t> order(s.size());
  std::iota(order.begin(), order.end(), int64_t(0));
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [&](int64_t a, int64_t b) { return s[size_t(a)] > s[size_t(b)]; });
  order.resize(size_t(k));
  return order;
}

// How far the k-th largest entry of s lies above the (k+1)-th: a finite-difference step
// well below this cannot change which k entries are the largest.
double selection_gap(std::vector<double> s, int64_t k) {
  if (k >= int64_t(s.size())) return std::numeric_limits<double>::infinity();
  std::sort(s.begin(), s.end(), std::greater<double>());
  return s[size_t(k - 1)] - s[size_t(k)];
}

// A module built on the CPU from `options` with a generator seeded by `seed`, in float64,
// then moved to `dev`: the same weights on every device.
template <class M, class O>
std::shared_ptr<M> make_on(O options, uint64_t seed, Device dev) {
  Generator g(seed);
  auto m = std::make_shared<M>(options.generator(&g));
  m->to(kFloat64);
  m->to(dev);
  return m;
}

// ---------------------------------------------------------------- references

struct TopKRef {
  std::vector<double> y;                   // (tokens, d_model)
  std::vector<std::vector<double>> u;      // per token, the d_ff pre-activations
  std::vector<std::vector<int64_t>> kept;  // per token, the K kept units of ReLU(u)
  double margin = 0;  // smallest selection gap of u and |u| of a kept unit, over all tokens
};

// y = Σ_{i ∈ topK(ReLU(u))} ReLU(u_i) v_i + b2 with u = W1 x + b1, one token (row of x)
// at a time: the full hidden vector, its top K by partial_sort, the sum of their values.
TopKRef brute_topk_mlp(const nn::TopKMLP& m, const Tensor& x) {
  const int64_t D = m.options().d_model(), F = m.options().d_ff(), K = m.options().k();
  const int64_t T = x.numel() / D;
  std::vector<double> xv = x.to_vector<double>(), w1 = m.keys.to_vector<double>(), v = m.values.to_vector<double>();
  std::vector<double> b1 = m.key_bias.defined() ? m.key_bias.to_vector<double>() : std::vector<double>(size_t(F), 0.0);
  std::vector<double> b2 = m.bias.defined() ? m.bias.to_vector<double>() : std::vector<double>(size_t(D), 0.0);
  TopKRef r;
  r.y.assign(size_t(T * D), 0.0);
  r.margin = std::numeric_limits<double>::infinity();
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> u(static_cast<size_t>(F)), h(static_cast<size_t>(F));
    for (int64_t f = 0; f < F; ++f) {
      double s = b1[size_t(f)];
      for (int64_t d = 0; d < D; ++d) s += w1[size_t(f * D + d)] * xv[size_t(t * D + d)];
      u[size_t(f)] = s;
      h[size_t(f)] = std::max(s, 0.0);
    }
    std::vector<int64_t> kept = top_indices(h, K);
    for (int64_t o = 0; o < D; ++o) {
      double s = b2[size_t(o)];
      for (int64_t f : kept) s += h[size_t(f)] * v[size_t(f * D + o)];
      r.y[size_t(t * D + o)] = s;
    }
    r.margin = std::min(r.margin, selection_gap(u, K));
    for (int64_t f : top_indices(u, K)) r.margin = std::min(r.margin, std::abs(u[size_t(f)]));
    r.u.push_back(u);
    r.kept.push_back(kept);
  }
  return r;
}

struct PKMRef {
  std::vector<double> y;                    // (tokens, d_model)
  std::vector<std::vector<int64_t>> top;    // per (token, head), the full top-K, best first
  std::vector<std::vector<double>> alpha;   // per (token, head), their activations
  double margin = 0;  // smallest selection gap of the full scores (and |kept score| with ReLU)
};

// The memory without its shortcut: per token and head, all n_sub² scores
// u_a[i] + u_b[j] by the double loop, their top K by partial_sort, the activation over
// those K, and the weighted sum of the values.
PKMRef brute_pkm(const nn::PKM& m, const Tensor& x) {
  const nn::PKMOptions& o = m.options();
  const int64_t D = o.d_model(), half = D / 2, n = o.n_sub(), H = o.heads(), K = o.k();
  const int64_t T = x.numel() / D;
  std::vector<double> xv = x.to_vector<double>(), ka = m.sub_keys_a.to_vector<double>(),
                      kb = m.sub_keys_b.to_vector<double>(), v = m.values.to_vector<double>();
  PKMRef r;
  r.y.assign(size_t(T * D), 0.0);
  r.margin = std::numeric_limits<double>::infinity();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      std::vector<double> s(size_t(n * n));
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < n; ++j) {
          double acc = 0;
          for (int64_t d = 0; d < half; ++d) {
            acc += ka[size_t((h * n + i) * half + d)] * xv[size_t(t * D + d)];
            acc += kb[size_t((h * n + j) * half + d)] * xv[size_t(t * D + half + d)];
          }
          s[size_t(i * n + j)] = acc;
        }
      std::vector<int64_t> top = top_indices(s, K);
      std::vector<double> alpha(static_cast<size_t>(K));
      if (o.activation() == nn::PKMActivation::Softmax) {
        const double mx = s[size_t(top[0])];
        double z = 0;
        for (int64_t k = 0; k < K; ++k) z += alpha[size_t(k)] = std::exp(s[size_t(top[size_t(k)])] - mx);
        for (double& a : alpha) a /= z;
      } else {
        for (int64_t k = 0; k < K; ++k) {
          alpha[size_t(k)] = std::max(s[size_t(top[size_t(k)])], 0.0);
          r.margin = std::min(r.margin, std::abs(s[size_t(top[size_t(k)])]));
        }
      }
      for (int64_t k = 0; k < K; ++k)
        for (int64_t c = 0; c < D; ++c)
          r.y[size_t(t * D + c)] += alpha[size_t(k)] * v[size_t(top[size_t(k)] * D + c)];
      r.margin = std::min(r.margin, selection_gap(s, K));
      r.top.push_back(top);
      r.alpha.push_back(alpha);
    }
  return r;
}


}  // namespace

// ---------------------------------------------------------------- TopKMLP

TEST_CASE("TopKMLP equals the brute-force top-K of the full hidden vector, token by token") {
  struct Case {
    int64_t d_model, d_ff, k;
    bool bias;
    Shape x;
  };
  // K = d_ff keeps every unit (the dense MLP); K = 1 keeps one; a 1-D input is one token.
  const std::vector<Case> cases = {
      {6, 10, 3, true, {2, 3, 6}}, {5, 7, 7, false, {4, 5}}, {4, 9, 1, true, {4}}, {8, 16, 5, true, {3, 2, 2, 8}}};
  for (const Case& c : cases) {
    INFO("d_model " << c.d_model << ", d_ff " << c.d_ff << ", k " << c.k << ", bias " << c.bias);
    Tensor y_cpu;
    for (Device dev : test_devices()) {
      INFO(dev.str());
      auto m = make_on<nn::TopKMLP>(nn::TopKMLPOptions(c.d_model, c.d_ff).k(c.k).bias(c.bias), 7, dev);
      Tensor x = rnd(c.x, 11).to(dev);
      Tensor y = m->forward(x);
      TopKRef ref = brute_topk_mlp(*m, x);
      check_close(y.cpu(), c.x, ref.y, 1e-10);
      // The kept units are the K largest pre-activations, largest first.
      Shape idx_shape(c.x.begin(), c.x.end() - 1);
      idx_shape.push_back(c.k);
      REQUIRE(m->last_indices().shape() == idx_shape);
      std::vector<int64_t> idx = m->last_indices().to_vector<int64_t>();
      for (size_t t = 0; t < ref.u.size(); ++t)
        for (int64_t k = 0; k < c.k; ++k)
          CHECK(idx[t * size_t(c.k) + size_t(k)] == top_indices(ref.u[t], c.k)[size_t(k)]);
      if (dev.is_cpu()) y_cpu = y.cpu();
      else CHECK(max_abs_diff(y.cpu(), y_cpu) < 1e-12);
    }
  }
}

TEST_CASE("TopKMLP gradients reach the kept units alone, as summed by hand") {
  const int64_t D = 6, F = 12, K = 2, T = 5;
  for (Device dev : test_devices()) {
    INFO(dev.str());
    auto m = make_on<nn::TopKMLP>(nn::TopKMLPOptions(D, F).k(K), 21, dev);
    Tensor x = rnd({T, D}, 22).to(dev);
    Tensor g = rnd({T, D}, 23);
    m->forward(x).backward(g.to(dev));
    TopKRef ref = brute_topk_mlp(*m, x);
    // dL/dv_f = Σ_t [f kept at t] ReLU(u_tf) g_t; dL/db1_f = Σ_t [f kept, u_tf > 0] g_t · v_f.
    std::vector<double> gv = g.to_vector<double>(), v = m->values.to_vector<double>();
    std::vector<double> want_v(size_t(F * D), 0.0), want_b1(size_t(F), 0.0);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t f : ref.kept[size_t(t)]) {
        const double u = ref.u[size_t(t)][size_t(f)];
        if (u <= 0) continue;
        for (int64_t o = 0; o < D; ++o) {
          want_v[size_t(f * D + o)] += u * gv[size_t(t * D + o)];
          want_b1[size_t(f)] += gv[size_t(t * D + o)] * v[size_t(f * D + o)];
        }
      }
    check_close(m->values.grad().cpu(), {F, D}, want_v, 1e-10);
    check_close(m->key_bias.grad().cpu(), {F}, want_b1, 1e-10);
    // At most T·K = 10 of the 12 units were kept: the others' keys have zero gradient.
    std::vector<double> gk = m->keys.grad().to_vector<double>();
    int64_t untouched = 0;
    for (int64_t f = 0; f < F; ++f) {
      if (want_b1[size_t(f)] != 0) continue;
      ++untouched;
      for (int64_t d = 0; d < D; ++d) CHECK(gk[size_t(f * D + d)] == 0.0);
    }
    CHECK(untouched >= F - T * K);
  }
}

TEST_CASE("gradcheck: TopKMLP w.r.t. the input, keys, values and both biases") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    for (bool bias : {true, false}) {
      INFO("bias " << bias);
      auto m = make_on<nn::TopKMLP>(nn::TopKMLPOptions(4, 8).k(3).bias(bias), 31, dev);
      Tensor x = rnd({2, 3, 4}, 32).to(dev);
      // Checked, not assumed: the selection and the ReLU stay put under the step (1e-6).
      REQUIRE(brute_topk_mlp(*m, x).margin > 1e-3);
      if (bias) check_module_grad(*m, x, {&m->keys, &m->key_bias, &m->values, &m->bias});
      else check_module_grad(*m, x, {&m->keys, &m->values});
    }
  }
}

// ---------------------------------------------------------------- PKM

TEST_CASE("PKM equals the brute-force memory over all n_sub² scores; the two-stage top-K is the full top-K") {
  struct Case {
    int64_t d_model, n_sub, heads, k;
    nn::PKMActivation act;
    Shape x;
  };
  using A = nn::PKMActivation;
  // K² < n_sub² except in the third case (K = n_sub: every pair is a candidate).
  const std::vector<Case> cases = {{8, 6, 1, 3, A::ReLU, {2, 5, 8}},
                                   {6, 5, 3, 2, A::Softmax, {7, 6}},
                                   {4, 4, 2, 4, A::ReLU, {3, 4}},
                                   {10, 9, 2, 3, A::Softmax, {10}},
                                   {12, 16, 4, 5, A::ReLU, {4, 6, 12}}};
  for (const Case& c : cases) {
    INFO("d_model " << c.d_model << ", n_sub " << c.n_sub << ", heads " << c.heads << ", k " << c.k << ", "
                    << std::string(nn::to_string(c.act)));
    Tensor y_cpu;
    for (Device dev : test_devices()) {
      INFO(dev.str());
      auto m = make_on<nn::PKM>(nn::PKMOptions(c.d_model, c.n_sub).heads(c.heads).k(c.k).activation(c.act), 41, dev);
      CHECK(m->n_values() == c.n_sub * c.n_sub);
      Tensor x = rnd(c.x, 42).to(dev);
      Tensor y = m->forward(x);
      PKMRef ref = brute_pkm(*m, x);
      check_close(y.cpu(), c.x, ref.y, 1e-10);
      Shape idx_shape(c.x.begin(), c.x.end() - 1);
      idx_shape.push_back(c.heads);
      idx_shape.push_back(c.k);
      REQUIRE(m->last_indices().shape() == idx_shape);
      // Index for index, in order: the values the memory read are the K best of all n_sub².
      std::vector<int64_t> idx = m->last_indices().to_vector<int64_t>();
      REQUIRE(idx.size() == ref.top.size() * size_t(c.k));
      for (size_t th = 0; th < ref.top.size(); ++th)
        for (int64_t k = 0; k < c.k; ++k) {
          INFO("token·head " << th << ", rank " << k);
          CHECK(idx[th * size_t(c.k) + size_t(k)] == ref.top[th][size_t(k)]);
        }
      if (dev.is_cpu()) y_cpu = y.cpu();
      else CHECK(max_abs_diff(y.cpu(), y_cpu) < 1e-12);
    }
  }
}

TEST_CASE("PKM value gradients are the activations times the output gradient, on the selected rows alone") {
  const int64_t D = 8, n = 5, H = 2, K = 3, T = 4;
  for (nn::PKMActivation act : {nn::PKMActivation::ReLU, nn::PKMActivation::Softmax}) {
    INFO(std::string(nn::to_string(act)));
    for (Device dev : test_devices()) {
      INFO(dev.str());
      auto m = make_on<nn::PKM>(nn::PKMOptions(D, n).heads(H).k(K).activation(act), 51, dev);
      Tensor x = rnd({T, D}, 52).to(dev);
      Tensor g = rnd({T, D}, 53);
      m->forward(x).backward(g.to(dev));
      PKMRef ref = brute_pkm(*m, x);
      // dL/dV_e = Σ_{t,h} [e selected] α_the g_t.
      std::vector<double> gv = g.to_vector<double>(), want(size_t(n * n * D), 0.0);
      std::vector<bool> selected(size_t(n * n), false);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t k = 0; k < K; ++k) {
            const int64_t e = ref.top[size_t(t * H + h)][size_t(k)];
            selected[size_t(e)] = true;
            for (int64_t c = 0; c < D; ++c)
              want[size_t(e * D + c)] += ref.alpha[size_t(t * H + h)][size_t(k)] * gv[size_t(t * D + c)];
          }
      check_close(m->values.grad().cpu(), {n * n, D}, want, 1e-10);
      // T·H·K = 24 reads of 25 rows: at least one row was never read and stays exactly zero.
      std::vector<double> got = m->values.grad().to_vector<double>();
      CHECK(std::count(selected.begin(), selected.end(), false) >= 1);
      for (int64_t e = 0; e < n * n; ++e)
        if (!selected[size_t(e)])
          for (int64_t c = 0; c < D; ++c) CHECK(got[size_t(e * D + c)] == 0.0);
    }
  }
}

TEST_CASE("gradcheck: PKM w.r.t. the input, both sub-key sets and the values (softmax and ReLU)") {
  for (nn::PKMActivation act : {nn::PKMActivation::ReLU, nn::PKMActivation::Softmax}) {
    INFO(std::string(nn::to_string(act)));
    for (Device dev : test_devices()) {
      INFO(dev.str());
      auto m = make_on<nn::PKM>(nn::PKMOptions(6, 4).heads(2).k(2).activation(act), 61, dev);
      Tensor x = rnd({3, 6}, 62).to(dev);
      // The output depends only on each head's full top-K set (which values, and the ReLU's
      // side of zero): the gap checked here keeps both fixed under the step (1e-6), even
      // where a half's own top-K would swap its K-th and (K+1)-th sub-keys.
      REQUIRE(brute_pkm(*m, x).margin > 1e-3);
      check_module_grad(*m, x, {&m->sub_keys_a, &m->sub_keys_b, &m->values});
    }
  }
}

// ---------------------------------------------------------------- options, counts

TEST_CASE("TopKMLP and PKM options: errors name the problem and the values") {
  CHECK_THROWS_MU(nn::TopKMLP(nn::TopKMLPOptions(8, 6).k(7)), "k = 7 exceeds d_ff = 6");
  CHECK_THROWS_MU(nn::TopKMLP(nn::TopKMLPOptions(8, 6)), "k must be at least 1, got k = 0");
  CHECK_THROWS_MU(nn::TopKMLP(nn::TopKMLPOptions(0, 6).k(1)), "d_model and d_ff must be positive, got d_model = 0");
  CHECK_THROWS_MU(nn::TopKMLP::count_parameters(nn::TopKMLPOptions(8, 6).k(9)), "k = 9 exceeds d_ff = 6");

  CHECK_THROWS_MU(nn::PKM(nn::PKMOptions(7, 4).k(2)), "d_model must be even, got d_model = 7");
  CHECK_THROWS_MU(nn::PKM(nn::PKMOptions(8, 4).k(5)), "k = 5 exceeds n_sub = 4");
  CHECK_THROWS_MU(nn::PKM(nn::PKMOptions(8, 4).k(2).heads(0)), "heads must be at least 1, got heads = 0");
  CHECK_THROWS_MU(nn::PKM(nn::PKMOptions(8, 4)), "k must be at least 1, got k = 0");
  CHECK_THROWS_MU(nn::PKM(nn::PKMOptions(8, 0).k(1)), "n_sub (sub-keys per half) must be positive, got n_sub = 0");
  CHECK_THROWS_MU(nn::PKM(nn::PKMOptions(8, 4).k(2).activation(static_cast<nn::PKMActivation>(5))),
                  "activation 5 is not a PKMActivation");
  // A table of (2^32)² rows cannot even be counted: refused before anything is allocated.
  CHECK_THROWS_MU(nn::PKM::count_parameters(nn::PKMOptions(8, int64_t(1) << 32).k(1)), "does not fit in int64");
  CHECK_THROWS_MU(nn::PKM::count_parameters(nn::PKMOptions(9, 4).k(2)), "d_model must be even, got d_model = 9");

  // A forward pass with the wrong feature count names both shapes.
  nn::TopKMLP mlp(nn::TopKMLPOptions(8, 6).k(2));
  CHECK_THROWS_MU(mlp.forward(zeros({3, 5})), "TopKMLP: expected input (..., 8)");
  nn::PKM pkm(nn::PKMOptions(8, 4).k(2));
  CHECK_THROWS_MU(pkm.forward(zeros({3, 6})), "PKM: expected input (..., 8)");
}

TEST_CASE("an empty batch gives an empty output and empty indices") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    auto mlp = make_on<nn::TopKMLP>(nn::TopKMLPOptions(6, 8).k(3), 81, dev);
    Tensor y = mlp->forward(zeros({2, 0, 6}, kFloat64).to(dev));
    CHECK(y.shape() == Shape{2, 0, 6});
    CHECK(mlp->last_indices().shape() == Shape{2, 0, 3});
    auto pkm = make_on<nn::PKM>(nn::PKMOptions(6, 4).heads(2).k(3), 82, dev);
    y = pkm->forward(zeros({0, 6}, kFloat64).to(dev));
    CHECK(y.shape() == Shape{0, 6});
    CHECK(pkm->last_indices().shape() == Shape{0, 2, 3});
  }
}

TEST_CASE("parameter and FLOP counts, worked out by hand") {
  // The σ-MoE paper's WikiText-103 small sizes: d_model 412, d_ff 2053; a PKM of 62
  // sub-keys per half (3844 values, App. A.3) with 4 heads of K = 32.
  nn::TopKMLPOptions to(412, 2053);
  to.k(128);
  CHECK(nn::TopKMLP::count_parameters(to) == 2 * 2053 * 412 + 2053 + 412);
  CHECK(nn::TopKMLP::count_parameters(nn::TopKMLPOptions(412, 2053).k(128).bias(false)) == 2 * 2053 * 412);
  nn::TopKMLP mlp(to);
  CHECK(mlp.num_parameters() == nn::TopKMLP::count_parameters(to));
  CHECK(mlp.flops_per_token() == 412 * 2053 + 128 * 412);

  nn::PKMOptions po(412, 62);
  po.heads(4).k(32);
  CHECK(po.n_values() == 3844);
  CHECK(nn::PKM::count_parameters(po) == 2 * 4 * 62 * 206 + 3844 * 412);
  nn::PKM pkm(po);
  CHECK(pkm.n_values() == 3844);
  CHECK(pkm.num_parameters() == nn::PKM::count_parameters(po));
  CHECK(pkm.flops_per_token() == 4 * 62 * 412 + 4 * 32 * 412);
  CHECK(pkm.values.shape() == Shape{3844, 412});
  CHECK(pkm.sub_keys_a.shape() == Shape{4, 62, 206});
}

TEST_CASE("initialisation: the stated distributions, drawn from the given generator") {
  // TopKMLP: keys and b1 within ±1/sqrt(d_model), values and b2 within ±1/sqrt(d_ff).
  Generator g1(5), g2(5);
  nn::TopKMLP a(nn::TopKMLPOptions(64, 256).k(8).generator(&g1)), b(nn::TopKMLPOptions(64, 256).k(8).generator(&g2));
  CHECK(max_abs_diff(a.keys, b.keys) == 0.0);  // same seed, same weights
  CHECK(max_abs_diff(a.values, b.values) == 0.0);
  auto max_abs = [](const Tensor& t) {
    double m = 0;
    for (double v : t.to_vector<double>()) m = std::max(m, std::abs(v));
    return m;
  };
  CHECK(max_abs(a.keys) <= 1 / std::sqrt(64.0));
  CHECK(max_abs(a.keys) > 0.95 / std::sqrt(64.0));
  CHECK(max_abs(a.values) <= 1 / std::sqrt(256.0));
  CHECK(max_abs(a.bias) <= 1 / std::sqrt(256.0));
  // PKM: sub-keys N(0, 1/d_model), values N(0, 1/(K·heads)); sample std within 5%.
  Generator g3(6);
  nn::PKM p(nn::PKMOptions(64, 32).heads(2).k(8).generator(&g3));
  auto sample_std = [](const Tensor& t) {
    std::vector<double> v = t.to_vector<double>();
    double s = 0;
    for (double e : v) s += e * e;
    return std::sqrt(s / double(v.size()));
  };
  CHECK(std::abs(sample_std(p.sub_keys_a) / (1 / std::sqrt(64.0)) - 1) < 0.05);
  CHECK(std::abs(sample_std(p.sub_keys_b) / (1 / std::sqrt(64.0)) - 1) < 0.05);
  CHECK(std::abs(sample_std(p.values) / (1 / std::sqrt(16.0)) - 1) < 0.05);
}

// ---------------------------------------------------------------- training

TEST_CASE("training: AdamW fits a random dense two-layer MLP with either approximation") {
  const int64_t D = 16, F_teacher = 64, N = 256, steps = 60;
  // The teacher y = W2 ReLU(W1 x) with outputs of order one, on N(0, 1) inputs.
  manual_seed(71);
  Tensor x = randn({N, D});
  Tensor w1 = randn({F_teacher, D}) / std::sqrt(double(D)), w2 = randn({D, F_teacher}) * std::sqrt(2.0 / F_teacher);
  Tensor target = matmul(relu(matmul(x, w1.t())), w2.t());
  // The loss of predicting zero: a fit must end well below it, not merely below its own start.
  const double zero_loss = mse_loss(zeros({N, D}), target).item<double>();

  // Full-batch steps; returns the losses before the first step and after the last.
  auto fit = [&](nn::UnaryModule& m, Device dev) {
    optim::AdamW opt(m.parameters(), optim::AdamWOptions(1e-2).weight_decay(0.0));
    Tensor xd = x.to(dev), td = target.to(dev);
    double first = 0, last = 0;
    for (int64_t s = 0; s <= steps; ++s) {
      Tensor loss = mse_loss(m.forward(xd), td);
      const double l = loss.item<double>();
      if (s == 0) first = l;
      last = l;
      if (s == steps) break;
      opt.zero_grad();
      loss.backward();
      opt.step();
    }
    return std::pair<double, double>{first, last};
  };
  double mlp_cpu = 0, pkm_cpu = 0;
  for (Device dev : test_devices()) {
    INFO(dev.str() << ", predicting zero: loss " << zero_loss);
    Generator g1(72), g2(73);
    nn::TopKMLP mlp(nn::TopKMLPOptions(D, 64).k(16).generator(&g1));
    mlp.to(dev);
    auto [m0, m1] = fit(mlp, dev);
    INFO("TopKMLP loss " << m0 << " -> " << m1);
    // Measured on the CPU: 0.858 -> 0.057 (a factor 15); required: a factor 8.
    CHECK(m1 < m0 / 8);
    CHECK(m1 < zero_loss / 8);
    nn::PKM pkm(nn::PKMOptions(D, 8).heads(2).k(4).generator(&g2));
    pkm.to(dev);
    auto [p0, p1] = fit(pkm, dev);
    INFO("PKM loss " << p0 << " -> " << p1);
    // Measured on the CPU: 3.38 -> 0.37 (a factor 9; the memory starts louder than the
    // teacher); required: a factor 5, and below 3/5 of the zero predictor's loss.
    CHECK(p1 < p0 / 5);
    CHECK(p1 < zero_loss * 0.6);
    // The same seeds on another device: the same fit up to float32 rounding, which may
    // move a near-tied selection now and then, hence the loose tolerance.
    if (dev.is_cpu()) {
      mlp_cpu = m1;
      pkm_cpu = p1;
    } else {
      CHECK(std::abs(m1 / mlp_cpu - 1) < 0.05);
      CHECK(std::abs(p1 / pkm_cpu - 1) < 0.05);
    }
  }
}
