// μMoE layers, the MuMoE block and expert analysis, in float64:
// - every factorized layer equals the DenseMoE built from its materialised tensor, on
//   random shapes, ranks, 1-4 expert levels, with and without bias, (B, T, I) inputs;
// - expert_weight equals the slice of materialize() and a plain-loop reconstruction
//   from the factors (CP, TR/TT, Tucker, Hadamard);
// - gradcheck of every factor, the input and the coefficients;
// - the expert-matrix rank bounds of the paper's appendix D.1;
// - the block against a hand-composed pass, its initial (uniform) coefficients, batch-norm
//   gating in train and eval mode;
// - counterfactual passes against zeroed materialised tensors, the re-writing term of
//   Eq. 5, and coefficient statistics over a constructed dataset.
#include <algorithm>
#include <cmath>
#include <random>

#include "helpers.h"
#include "nn/entmax.h"
#include "nn/expert_analysis.h"
#include "nn/mumoe_block.h"

using namespace mu;
using autograd::TensorList;
using nn::MoEKind;

namespace {

// max |a - b| / max |b|: the relative error of `got` against `want`.
double rel_err(const Tensor& got, const Tensor& want) {
  double scale = 0;
  for (double v : want.to_vector<double>()) scale = std::max(scale, std::abs(v));
  return max_abs_diff(got, want) / std::max(scale, 1e-300);
}

// Overwrites every parameter of m with N(0, 1) values times `scale`, outside any graph.
void randomize(nn::Module& m, double scale = 1.0) {
  NoGradGuard g;
  for (Tensor p : m.parameters()) p.copy_(randn(p.shape(), p.dtype()) * scale);
}

// Positive coefficients (..., N) summing to 1, like a gating output.
Tensor random_coefficients(const Shape& lead, int64_t n) {
  Shape s = lead;
  s.push_back(n);
  return softmax(randn(s, kFloat64), -1);
}

std::vector<Tensor> random_coefficients(const Shape& lead, const std::vector<int64_t>& experts) {
  std::vector<Tensor> a;
  for (int64_t n : experts) a.push_back(random_coefficients(lead, n));
  return a;
}

// A layer of `kind` with random ranks in [1, max_rank] (rng-driven), in float64.
std::shared_ptr<nn::MuMoELayer> make_layer(MoEKind kind, const nn::MoEShape& s, std::mt19937& rng, int64_t max_rank = 4) {
  std::uniform_int_distribution<int64_t> rank(1, max_rank);
  const size_t E = s.experts.size();
  std::vector<int64_t> r;
  std::shared_ptr<nn::MuMoELayer> l;
  switch (kind) {
    case MoEKind::CP: l = std::make_shared<nn::CPMuMoE>(s, rank(rng) + 1); break;
    case MoEKind::TR:
      for (size_t k = 0; k < E + 2; ++k) r.push_back(rank(rng));
      l = std::make_shared<nn::TRMuMoE>(s, r);
      break;
    case MoEKind::TT:
      for (size_t k = 0; k < E + 1; ++k) r.push_back(rank(rng));
      l = std::make_shared<nn::TTMuMoE>(s, r);
      break;
    case MoEKind::Tucker:
      for (size_t k = 0; k < E + 2; ++k) r.push_back(rank(rng));
      l = std::make_shared<nn::TuckerMuMoE>(s, r);
      break;
    case MoEKind::Hadamard: l = std::make_shared<nn::HadamardMoE>(s); break;
    case MoEKind::Dense: l = std::make_shared<nn::DenseMoE>(s); break;
  }
  l->to(kFloat64);
  return l;
}

const MoEKind kFactorized[] = {MoEKind::CP, MoEKind::TR, MoEKind::TT, MoEKind::Tucker, MoEKind::Hadamard};

// The named factor's values, row-major, with its shape.
struct Values {
  std::vector<double> v;
  Shape shape;
  // Element at a multi-index, by row-major strides.
  double at(std::initializer_list<int64_t> idx) const {
    int64_t off = 0;
    size_t d = 0;
    for (int64_t i : idx) off = off * shape[d++] + i;
    return v[size_t(off)];
  }
};

Values factor(const nn::MuMoELayer& l, const std::string& name) {
  for (const auto& f : l.factors())
    if (f.name == name) return {f.param.to_vector<double>(), f.param.shape()};
  FAIL("no factor named " << name);
  return {};
}

// Expert `n`'s (I+1) x O matrix from the factors, with plain loops, per variant's definition.
std::vector<double> brute_expert(MoEKind kind, const nn::MuMoELayer& l, const std::vector<int64_t>& n) {
  const nn::MoEShape& s = l.moe_shape();
  const int64_t I = s.in_rows(), O = s.out, E = s.levels();
  std::vector<double> w(size_t(I * O), 0.0);
  if (kind == MoEKind::CP) {
    // w[i, o] = Σ_r Π_e U_e[n_e, r] · U_in[i, r] · U_out[o, r]
    Values uin = factor(l, "U_in"), uout = factor(l, "U_out");
    const int64_t R = uin.shape[1];
    std::vector<Values> ue;
    for (int64_t e = 0; e < E; ++e) ue.push_back(factor(l, "U" + std::to_string(e + 1)));
    for (int64_t i = 0; i < I; ++i)
      for (int64_t o = 0; o < O; ++o)
        for (int64_t r = 0; r < R; ++r) {
          double p = uin.at({i, r}) * uout.at({o, r});
          for (int64_t e = 0; e < E; ++e) p *= ue[size_t(e)].at({n[size_t(e)], r});
          w[size_t(i * O + o)] += p;
        }
  } else if (kind == MoEKind::TR || kind == MoEKind::TT) {
    // w[i, o] = tr(U_1[:, n_1, :] ⋯ U_E[:, n_E, :] U_in[:, i, :] U_out[:, o, :])
    std::vector<Values> cores;
    for (int64_t e = 0; e < E; ++e) cores.push_back(factor(l, "U" + std::to_string(e + 1)));
    Values uin = factor(l, "U_in"), uout = factor(l, "U_out");
    // Slice (r, ·) of a core at middle index m as a dense matrix.
    auto slice = [](const Values& c, int64_t m) {
      std::vector<std::vector<double>> M(size_t(c.shape[0]), std::vector<double>(size_t(c.shape[2])));
      for (int64_t a = 0; a < c.shape[0]; ++a)
        for (int64_t b = 0; b < c.shape[2]; ++b) M[size_t(a)][size_t(b)] = c.at({a, m, b});
      return M;
    };
    auto matmul = [](const std::vector<std::vector<double>>& A, const std::vector<std::vector<double>>& B) {
      std::vector<std::vector<double>> C(A.size(), std::vector<double>(B[0].size(), 0.0));
      for (size_t a = 0; a < A.size(); ++a)
        for (size_t k = 0; k < B.size(); ++k)
          for (size_t b = 0; b < B[0].size(); ++b) C[a][b] += A[a][k] * B[k][b];
      return C;
    };
    auto chain = slice(cores[0], n[0]);
    for (int64_t e = 1; e < E; ++e) chain = matmul(chain, slice(cores[size_t(e)], n[size_t(e)]));
    for (int64_t i = 0; i < I; ++i)
      for (int64_t o = 0; o < O; ++o) {
        auto m = matmul(matmul(chain, slice(uin, i)), slice(uout, o));
        double tr = 0;
        for (size_t d = 0; d < m.size(); ++d) tr += m[d][d];
        w[size_t(i * O + o)] = tr;
      }
  } else if (kind == MoEKind::Tucker) {
    // w[i, o] = Σ core[ro, ri, rn_1.., rn_E] U_out[o, ro] U_in[i, ri] Π_e U_e[n_e, rn_e]
    Values core = factor(l, "core"), uin = factor(l, "U_in"), uout = factor(l, "U_out");
    std::vector<Values> ue;
    for (int64_t e = 0; e < E; ++e) ue.push_back(factor(l, "U" + std::to_string(e + 1)));
    const int64_t RO = core.shape[0], RI = core.shape[1];
    int64_t RN = 1;  // number of (rn_1, ..., rn_E) tuples
    for (int64_t e = 0; e < E; ++e) RN *= core.shape[size_t(2 + e)];
    for (int64_t i = 0; i < I; ++i)
      for (int64_t o = 0; o < O; ++o)
        for (int64_t ro = 0; ro < RO; ++ro)
          for (int64_t ri = 0; ri < RI; ++ri)
            for (int64_t t = 0; t < RN; ++t) {
              // Decode t into (rn_1, ..., rn_E), the last fastest (the core's row-major order).
              double p = uout.at({o, ro}) * uin.at({i, ri});
              int64_t rest = t;
              for (int64_t e = E - 1; e >= 0; --e) {
                const int64_t re = rest % core.shape[size_t(2 + e)];
                rest /= core.shape[size_t(2 + e)];
                p *= ue[size_t(e)].at({n[size_t(e)], re});
              }
              w[size_t(i * O + o)] += p * core.v[size_t((ro * RI + ri) * RN + t)];
            }
  } else if (kind == MoEKind::Hadamard) {
    // w[i, o] = Π_e C_e[n_e, o] · D[i, o]
    Values d = factor(l, "D");
    std::vector<Values> c;
    for (int64_t e = 0; e < E; ++e) c.push_back(factor(l, "C" + std::to_string(e + 1)));
    for (int64_t i = 0; i < I; ++i)
      for (int64_t o = 0; o < O; ++o) {
        double p = d.at({i, o});
        for (int64_t e = 0; e < E; ++e) p *= c[size_t(e)].at({n[size_t(e)], o});
        w[size_t(i * O + o)] = p;
      }
  }
  return w;
}

// The slice W[n_1, ..., n_E, :, :] of a materialised tensor.
Tensor slice_of(const Tensor& w, const std::vector<int64_t>& n) {
  Tensor t = w;
  for (int64_t i : n) t = t.select(0, i);
  return t;
}

// Every multi-index (n_1, ..., n_E), row-major.
std::vector<std::vector<int64_t>> all_indices(const std::vector<int64_t>& experts) {
  std::vector<std::vector<int64_t>> out = {{}};
  for (int64_t N : experts) {
    std::vector<std::vector<int64_t>> next;
    for (const auto& p : out)
      for (int64_t n = 0; n < N; ++n) {
        next.push_back(p);
        next.back().push_back(n);
      }
    out = next;
  }
  return out;
}

// y[b, o] = Σ_{n, i} W[n, i, o] Π_e a_e[b, n_e] z'[b, i] with plain loops (z' = [z; 1] with bias).
std::vector<double> brute_dense_forward(const Tensor& w, const nn::MoEShape& s, const Tensor& z,
                                        const std::vector<Tensor>& a) {
  const int64_t I = s.in_rows(), O = s.out, B = z.numel() / s.in;
  std::vector<double> wv = w.to_vector<double>(), zv = z.to_vector<double>(), y(size_t(B * O), 0.0);
  std::vector<std::vector<double>> av;
  for (const Tensor& t : a) av.push_back(t.to_vector<double>());
  const auto idx = all_indices(s.experts);
  for (int64_t b = 0; b < B; ++b)
    for (size_t k = 0; k < idx.size(); ++k) {
      double c = 1;
      for (size_t e = 0; e < idx[k].size(); ++e) c *= av[e][size_t(b * s.experts[e] + idx[k][e])];
      for (int64_t i = 0; i < I; ++i) {
        const double zi = i < s.in ? zv[size_t(b * s.in + i)] : 1.0;
        for (int64_t o = 0; o < O; ++o) y[size_t(b * O + o)] += c * zi * wv[size_t((int64_t(k) * I + i) * O + o)];
      }
    }
  return y;
}

// gradcheck of the layer's forward pass w.r.t. z, every a_e and every factor, through
// forward_with (the factors passed as values).
void check_layer_grad(nn::MuMoELayer& l, const Tensor& z, const std::vector<Tensor>& a) {
  const auto& fs = l.factors();
  TensorList inputs = {z};
  for (const Tensor& t : a) inputs.push_back(t);
  for (const auto& f : fs) inputs.push_back(f.param.detach());
  const size_t E = a.size();
  auto fn = [&](const TensorList& in) {
    return l.forward_with(in[0], std::vector<Tensor>(in.begin() + 1, in.begin() + 1 + long(E)),
                          std::vector<Tensor>(in.begin() + 1 + long(E), in.end()));
  };
  // Every factor value must reach the pass: scaling any of them changes the output
  // (otherwise the check below could compare zero with zero).
  const Tensor y0 = fn(inputs);
  for (size_t k = 0; k < fs.size(); ++k) {
    TensorList scaled = inputs;
    scaled[1 + E + k] = inputs[1 + E + k] * 2.0;
    CHECK(max_abs_diff(fn(scaled), y0) > 1e-8);
  }
  // forward_with on the layer's own factors is forward.
  CHECK(max_abs_diff(l.forward(z, a), y0) == 0);
  auto r = autograd::gradcheck(fn, inputs);
  CHECK_MESSAGE(r.ok, r.message);
}

}  // namespace

// ---------------------------------------------------------------- layer equivalences

TEST_CASE("factorized layers equal DenseMoE of their materialised tensor (E = 1..4, bias on/off)") {
  manual_seed(1);
  std::mt19937 rng(7);
  std::uniform_int_distribution<int64_t> dim(2, 6), experts(1, 3);
  for (MoEKind kind : kFactorized)
    for (int64_t E = 1; E <= 4; ++E)
      for (bool bias : {true, false})
        for (int trial = 0; trial < 2; ++trial) {
          nn::MoEShape s;
          s.in = dim(rng), s.out = dim(rng), s.bias = bias;
          for (int64_t e = 0; e < E; ++e) s.experts.push_back(experts(rng));
          auto l = make_layer(kind, s, rng);
          randomize(*l);
          INFO(nn::to_string(kind) << " " << l->extra_repr());
          Tensor z = randn({2, 3, s.in}, kFloat64);
          auto a = random_coefficients({2, 3}, s.experts);
          Tensor w = l->materialize();
          nn::DenseMoE dense(s, w);
          Tensor y = l->forward(z, a);
          CHECK(y.shape() == Shape{2, 3, s.out});
          CHECK(rel_err(y, dense.forward(z, a)) <= 1e-10);
          // The dense layer itself against the defining sum, once per configuration.
          Tensor brute = from_vector(brute_dense_forward(w, s, z, a), {2, 3, s.out});
          CHECK(rel_err(y, brute) <= 1e-10);
        }
}

TEST_CASE("expert_weight equals the materialised slice and a plain-loop reconstruction from the factors") {
  manual_seed(2);
  std::mt19937 rng(11);
  std::uniform_int_distribution<int64_t> dim(2, 5), experts(1, 3);
  for (MoEKind kind : kFactorized)
    for (int64_t E = 1; E <= 3; ++E)
      for (bool bias : {true, false}) {
        nn::MoEShape s;
        s.in = dim(rng), s.out = dim(rng), s.bias = bias;
        for (int64_t e = 0; e < E; ++e) s.experts.push_back(experts(rng));
        auto l = make_layer(kind, s, rng);
        randomize(*l);
        INFO(nn::to_string(kind) << " " << l->extra_repr());
        Tensor w = l->materialize();
        CHECK(w.requires_grad() == true);  // built from parameters: differentiable
        for (const auto& n : all_indices(s.experts)) {
          Tensor we = l->expert_weight(n);
          REQUIRE(we.shape() == Shape{s.in_rows(), s.out});
          CHECK(rel_err(we, slice_of(w, n)) <= 1e-12);
          CHECK(rel_err(we, from_vector(brute_expert(kind, *l, n), {s.in_rows(), s.out})) <= 1e-12);
        }
      }
}

TEST_CASE("the initialisation replicates one matrix along the second and later expert modes") {
  // Appendix F.2: σ = 0 on further modes, so every expert of level 2 shares level 1's matrices.
  manual_seed(3);
  std::mt19937 rng(3);
  nn::MoEShape s{4, 3, {3, 2}, true};
  for (MoEKind kind : {MoEKind::CP, MoEKind::TR, MoEKind::Hadamard}) {
    auto l = make_layer(kind, s, rng);
    INFO(nn::to_string(kind));
    for (int64_t n1 = 0; n1 < 3; ++n1) CHECK(max_abs_diff(l->expert_weight({n1, 0}), l->expert_weight({n1, 1})) == 0.0);
    // The first level has noise: its experts differ.
    CHECK(max_abs_diff(l->expert_weight({0, 0}), l->expert_weight({1, 0})) > 1e-6);
  }
}

TEST_CASE("gradcheck of every factor, the input and the coefficients") {
  manual_seed(4);
  std::mt19937 rng(5);
  for (MoEKind kind : kFactorized)
    for (int64_t E = 1; E <= 3; ++E) {
      // E = 3 for CP and TR only (the others follow the same skeleton and are checked at E <= 2).
      if (E == 3 && kind != MoEKind::CP && kind != MoEKind::TR) continue;
      nn::MoEShape s;
      s.in = 3, s.out = 2, s.bias = E != 2;
      for (int64_t e = 0; e < E; ++e) s.experts.push_back(e == 0 ? 3 : 2);
      auto l = make_layer(kind, s, rng, 2);
      randomize(*l, 0.7);
      INFO(nn::to_string(kind) << " " << l->extra_repr());
      check_layer_grad(*l, randn({2, 2, s.in}, kFloat64), random_coefficients({2, 2}, s.experts));
    }
  // DenseMoE too: the reference the others are compared with. Up to N_1 N_2 = 4 inputs it
  // contracts the coefficients first (its own order), more take the planner's.
  nn::MoEShape s{3, 2, {2, 2}, true};
  auto d = make_layer(MoEKind::Dense, s, rng);
  check_layer_grad(*d, randn({3, s.in}, kFloat64), random_coefficients({3}, s.experts));
  check_layer_grad(*d, randn({5, s.in}, kFloat64), random_coefficients({5}, s.experts));
}

TEST_CASE("counterfactual layer passes equal zeroing slices of the materialised tensor") {
  manual_seed(5);
  std::mt19937 rng(9);
  nn::MoEShape s{4, 3, {3, 2}, true};
  for (MoEKind kind : kFactorized) {
    auto l = make_layer(kind, s, rng);
    randomize(*l);
    Tensor z = randn({2, 2, 4}, kFloat64);
    auto a = random_coefficients({2, 2}, s.experts);
    Tensor w;
    {
      NoGradGuard g;
      w = l->materialize();
    }
    INFO(nn::to_string(kind));
    for (int64_t level = 0; level < 2; ++level)
      for (int64_t n = 0; n < s.experts[size_t(level)]; ++n) {
        Tensor wz = w.clone();
        wz.select(level, n).zero_();
        CHECK(rel_err(l->forward_without_expert(z, a, level, n), nn::DenseMoE(s, wz).forward(z, a)) <= 1e-10);
      }
    for (const auto& idx : all_indices(s.experts)) {
      Tensor wz = w.clone();
      slice_of(wz, idx).zero_();
      CHECK(rel_err(l->forward_without_combination(z, a, idx), nn::DenseMoE(s, wz).forward(z, a)) <= 1e-10);
    }
  }
}

// ---------------------------------------------------------------- rank bounds (appendix D.1)

TEST_CASE("expert matrix ranks obey the bounds of appendix D.1 and reach them on random layers") {
  using tensor_algebra::matrix_rank;
  manual_seed(6);
  // Checks every expert of l: rank <= bound, and == bound (random factors are generic).
  auto check_ranks = [](nn::MuMoELayer& l, int64_t bound) {
    const nn::MoEShape& s = l.moe_shape();
    // The configurations are chosen so the bound is below min(I+1, O): it is really tested.
    REQUIRE(bound < std::min(s.in_rows(), s.out));
    for (const auto& n : all_indices(s.experts)) {
      int64_t r = matrix_rank(l.expert_weight(n).detach());
      CHECK(r <= bound);
      CHECK(r == bound);
    }
  };
  SUBCASE("CP: rank(W_n) <= min(I+1, O, R)") {
    for (int64_t R : {2, 3, 5}) {
      nn::CPMuMoE l({8, 9, {3}, true}, R);
      l.to(kFloat64);
      check_ranks(l, R);
      randomize(l);
      check_ranks(l, R);
    }
    nn::CPMuMoE h({7, 8, {2, 3, 2}, false}, 4);  // hierarchical: the same bound
    h.to(kFloat64);
    randomize(h);
    check_ranks(h, 4);
  }
  SUBCASE("TR: rank(W_n) <= min(R_{E+2} · min(R_1..R_{E+1}), I+1, O)") {
    struct Case { std::vector<int64_t> experts, ranks; int64_t bound; };
    const Case cases[] = {
        {{3}, {2, 3, 2}, 4},        // E = 1: R_3 · min(R_1, R_2) = 2 · 2
        {{3}, {3, 1, 3}, 3},        // min(R_1, R_2) = 1
        {{2}, {1, 4, 5}, 5},        // R_1 = 1 (a tensor train): R_3
        {{2, 2}, {3, 2, 3, 2}, 4},  // E = 2: R_4 · min(R_1, R_2, R_3)
        {{2, 3, 2}, {2, 3, 3, 2, 3}, 6},
    };
    for (const Case& c : cases) {
      nn::TRMuMoE l({11, 12, c.experts, true}, c.ranks);
      l.to(kFloat64);
      INFO("ranks " << shape_str(c.ranks));
      randomize(l);
      check_ranks(l, c.bound);
    }
    // The paper's init (diagonal expert slices): still within the bound.
    nn::TRMuMoE init({11, 12, {3}, true}, {2, 3, 2});
    init.to(kFloat64);
    for (int64_t n = 0; n < 3; ++n) CHECK(matrix_rank(init.expert_weight({n}).detach()) <= 4);
    nn::TTMuMoE tt({11, 12, {3, 2}, true}, {3, 2, 3});  // R_1 = 1: bound R_4 · 1 = 3
    tt.to(kFloat64);
    randomize(tt);
    check_ranks(tt, 3);
  }
  SUBCASE("Tucker: rank(W_n) <= min(min(I+1, R_I), min(R_I, R_O · R_N), min(O, R_O))") {
    struct Case { std::vector<int64_t> experts, ranks; int64_t bound; };
    const Case cases[] = {
        {{3}, {2, 3, 5}, 3},     // R_I = 3 binds
        {{3}, {3, 6, 2}, 2},     // R_O = 2 binds
        {{2, 2}, {2, 1, 4, 4}, 4},
    };
    for (const Case& c : cases) {
      nn::TuckerMuMoE l({9, 10, c.experts, true}, c.ranks);
      l.to(kFloat64);
      INFO("ranks " << shape_str(c.ranks));
      randomize(l);
      check_ranks(l, c.bound);
    }
  }
  SUBCASE("Hadamard: W_n = D diag(c_n) keeps the rank of D, full on random layers") {
    nn::HadamardMoE l({4, 6, {3}, true});
    l.to(kFloat64);
    randomize(l);
    for (int64_t n = 0; n < 3; ++n) CHECK(matrix_rank(l.expert_weight({n}).detach()) == 5);
  }
}

// ---------------------------------------------------------------- the block

namespace {

// LayerNorm without affine over the last dim, by its formula.
Tensor plain_layer_norm(const Tensor& x, double eps) {
  Tensor c = x - mean(x, {-1}, true);
  return c / sqrt(mean(c * c, {-1}, true) + eps);
}

Tensor activate(nn::GateActivation act, const Tensor& l) {
  switch (act) {
    case nn::GateActivation::Entmax15: return nn::entmax15(l, -1);
    case nn::GateActivation::Softmax: return softmax(l, -1);
    case nn::GateActivation::Sparsemax: return nn::sparsemax(l, -1);
  }
  return Tensor();
}

nn::MuMoEOptions small_options(MoEKind kind, std::vector<int64_t> experts) {
  nn::MuMoEOptions o(5, 4);
  o.experts(experts).kind(kind);
  const int64_t E = int64_t(experts.size());
  if (kind == MoEKind::CP) o.rank(6);
  if (kind == MoEKind::TR) o.ranks(std::vector<int64_t>(size_t(E + 2), 2));
  if (kind == MoEKind::TT) o.rank(3);
  if (kind == MoEKind::Tucker) o.ranks(std::vector<int64_t>(size_t(E + 2), 3));
  return o;
}

const MoEKind kAllKinds[] = {MoEKind::CP, MoEKind::TR, MoEKind::TT, MoEKind::Tucker, MoEKind::Hadamard, MoEKind::Dense};

}  // namespace

TEST_CASE("MuMoE block: forward equals the hand-composed pass, for every kind, one and two layers") {
  manual_seed(10);
  for (MoEKind kind : kAllKinds)
    for (int64_t hidden : {0, 7})
      for (auto act : {nn::GateActivation::Entmax15, nn::GateActivation::Softmax, nn::GateActivation::Sparsemax}) {
        auto o = small_options(kind, {3, 2});
        o.hidden(hidden).activation(act).gate_norm(nn::GateNorm::LayerNorm).input_norm(true);
        nn::MuMoE block(o);
        block.to(kFloat64);
        randomize(block);
        INFO(block.extra_repr());
        Tensor x = randn({2, 3, 5}, kFloat64);
        Tensor y = block.forward(x);
        // a_e = φ(LN(x G_e)), from the raw input; the layers see LN_affine(x).
        std::vector<Tensor> a;
        for (int64_t e = 0; e < 2; ++e) a.push_back(activate(act, plain_layer_norm(x.matmul(block.gate(e)), 1e-5)));
        auto ln = nn::find(block.named_parameters(), "input_norm.weight");
        auto lb = nn::find(block.named_parameters(), "input_norm.bias");
        REQUIRE((ln.defined() && lb.defined()));
        Tensor z = plain_layer_norm(x, 1e-5) * ln + lb;
        Tensor ref = block.layer(0)->forward(z, a);
        if (hidden > 0) ref = block.layer(1)->forward(gelu(ref), a);
        CHECK(y.shape() == Shape{2, 3, 4});
        CHECK(rel_err(y, ref) <= 1e-12);
        CHECK(block.num_layers() == (hidden > 0 ? 2 : 1));
        if (hidden > 0) CHECK(block.layer(0)->moe_shape().out == hidden);
        // The last coefficients: detached copies, one per level, equal to a.
        REQUIRE(block.last_coefficients().size() == 2);
        for (int64_t e = 0; e < 2; ++e) {
          CHECK_FALSE(block.last_coefficients()[size_t(e)].requires_grad());
          CHECK(max_abs_diff(block.last_coefficients()[size_t(e)], a[size_t(e)]) <= 1e-15);
        }
      }
}

TEST_CASE("MuMoE block: zero gating gives uniform coefficients 1/N_e at initialisation") {
  manual_seed(11);
  for (auto norm : {nn::GateNorm::None, nn::GateNorm::LayerNorm, nn::GateNorm::BatchNorm})
    for (auto act : {nn::GateActivation::Entmax15, nn::GateActivation::Softmax, nn::GateActivation::Sparsemax}) {
      auto o = small_options(MoEKind::CP, {4, 3});
      o.gate_norm(norm).activation(act);
      nn::MuMoE block(o);
      block.to(kFloat64);
      INFO(block.extra_repr());
      for (int64_t e = 0; e < 2; ++e) CHECK(block.gate(e).abs().sum().item() == 0.0);
      Tensor x = randn({3, 2, 5}, kFloat64);
      Tensor y = block.forward(x);
      const auto& a = block.last_coefficients();
      for (int64_t e = 0; e < 2; ++e) {
        const double want = 1.0 / double(o.experts()[size_t(e)]);
        for (double v : a[size_t(e)].to_vector<double>()) CHECK(std::abs(v - want) <= 1e-15);
      }
      // And the output is the layer applied with those uniform coefficients.
      std::vector<Tensor> u = {full({3, 2, 4}, 0.25, kFloat64), full({3, 2, 3}, 1.0 / 3.0, kFloat64)};
      CHECK(rel_err(y, block.layer(0)->forward(x, u)) <= 1e-12);
    }
}

TEST_CASE("MuMoE block: batch-norm gating normalises over all leading positions; train vs eval") {
  manual_seed(12);
  auto o = small_options(MoEKind::TR, {3});
  o.gate_norm(nn::GateNorm::BatchNorm).hidden(6);
  nn::MuMoE block(o);
  block.to(kFloat64);
  randomize(block);
  Tensor x = randn({4, 3, 5}, kFloat64) + 0.5;
  // Training: the statistics of the 12 positions' logits, biased variance.
  Tensor logits = x.reshape({12, 5}).matmul(block.gate(0));
  Tensor mu_b = mean(logits, {0});
  Tensor var_b = mean((logits - mu_b) * (logits - mu_b), {0});
  Tensor a_train = nn::entmax15((logits - mu_b) / sqrt(var_b + 1e-5), -1).reshape({4, 3, 3});
  Tensor y_train = block.forward(x);
  Tensor ref = block.layer(1)->forward(gelu(block.layer(0)->forward(x, {a_train})), {a_train});
  CHECK(rel_err(y_train, ref) <= 1e-12);
  // (B, T, C) and the same positions as (B·T, C) give the same training-mode output.
  CHECK(rel_err(block.forward(x.reshape({12, 5})), y_train.reshape({12, 4})) <= 1e-12);
  // The running statistics moved by momentum 0.1 (twice: two training passes on the same positions).
  Tensor rm = nn::find(block.named_buffers(), "gate_norm1.running_mean");
  Tensor rv = nn::find(block.named_buffers(), "gate_norm1.running_var");
  REQUIRE((rm.defined() && rv.defined()));
  Tensor unbiased = var_b * (12.0 / 11.0);
  Tensor rm_want = mu_b * 0.1 * 0.9 + mu_b * 0.1;
  Tensor rv_want = (ones({3}, kFloat64) * 0.9 + unbiased * 0.1) * 0.9 + unbiased * 0.1;
  CHECK(max_abs_diff(rm, rm_want) <= 1e-12);
  CHECK(max_abs_diff(rv, rv_want) <= 1e-12);
  // Eval: the running statistics normalise, and nothing moves.
  block.eval();
  const Tensor rm_before = rm.clone();
  Tensor y_eval = block.forward(x);
  Tensor a_eval = nn::entmax15((logits - rm_want) / sqrt(rv_want + 1e-5), -1).reshape({4, 3, 3});
  Tensor ref_eval = block.layer(1)->forward(gelu(block.layer(0)->forward(x, {a_eval})), {a_eval});
  CHECK(rel_err(y_eval, ref_eval) <= 1e-12);
  CHECK(max_abs_diff(y_eval, y_train) > 1e-3);
  CHECK(max_abs_diff(rm, rm_before) == 0.0);
  // One position alone: fine in eval, refused in training (no batch statistics).
  CHECK(block.forward(x.select(0, 0).select(0, 0)).shape() == Shape{4});
  block.train();
  CHECK_THROWS_MU(block.forward(randn({1, 5}, kFloat64)), "more than 1 value");
}

TEST_CASE("MuMoE block: gradcheck w.r.t. the input, through gating and both layers") {
  manual_seed(13);
  for (auto norm : {nn::GateNorm::LayerNorm, nn::GateNorm::BatchNorm}) {
    auto o = small_options(MoEKind::CP, {3, 2});
    o.hidden(4).gate_norm(norm).activation(nn::GateActivation::Softmax).input_norm(true);
    nn::MuMoE block(o);
    block.to(kFloat64);
    randomize(block, 0.5);
    auto fn = [&](const TensorList& in) { return block.forward(in[0]); };
    CHECK_GRAD(fn, TensorList{randn({3, 2, 5}, kFloat64)});
  }
}

TEST_CASE("MuMoE block: gradients reach the gating matrices and every factor") {
  manual_seed(14);
  auto o = small_options(MoEKind::TR, {3});
  o.hidden(4).gate_norm(nn::GateNorm::LayerNorm).input_norm(true);
  nn::MuMoE block(o);
  block.to(kFloat64);
  randomize(block, 0.5);
  Tensor y = block.forward(randn({6, 5}, kFloat64));
  (y * y).sum().backward();
  for (const auto& [name, p] : block.named_parameters()) {
    INFO(name);
    REQUIRE(p.grad().defined());
    CHECK(p.grad().abs().sum().item() > 0);
  }
}

TEST_CASE("MuMoE options: errors name the problem") {
  CHECK_THROWS_MU(nn::MuMoE(nn::MuMoEOptions(4, 3).experts({8})), "needs .rank(R)");
  CHECK_THROWS_MU(nn::MuMoE(nn::MuMoEOptions(4, 3).rank(2)), "set the experts");
  CHECK_THROWS_MU(nn::MuMoE(nn::MuMoEOptions(4, 3).experts({8, 2}).kind(MoEKind::TR).ranks({4, 4, 8})), "needs 4 ranks");
  CHECK_THROWS_MU(nn::MuMoE(nn::MuMoEOptions(4, 3).experts({8}).kind(MoEKind::Tucker)), "Tucker block");
  CHECK_THROWS_MU(nn::MuMoE(nn::MuMoEOptions(4, 3).experts({8}).rank(2).hidden(-1)), "hidden");
  CHECK_THROWS_MU(nn::MuMoE(nn::MuMoEOptions(4, 3).experts({8}).rank(2).gelu_approximate("erf")), "gelu_approximate");
  nn::MuMoE block(nn::MuMoEOptions(4, 3).experts({8}).rank(2));
  CHECK_THROWS_MU(block.forward(randn({2, 5})), "expected input (..., 4)");
  CHECK_THROWS_MU(block.layer(1), "layer 1 out of range (1 layer; 0-based: layer(0) is \"layer1\" in the state dict)");
  CHECK_THROWS_MU(block.gate(1), "level 1 out of range (1 level; 0-based: gate(0) is the parameter \"G1\")");
  CHECK_THROWS_MU(nn::MuMoE(nn::MuMoEOptions(4, 3).experts({8, 0}).rank(2)), "level 1 (N_2, gate G2) has 0 experts");
  // The 0-based accessors and the 1-based state-dict names point at the same tensors.
  nn::MuMoE two(nn::MuMoEOptions(4, 3).experts({8, 2}).rank(2).hidden(5));
  const auto params = two.named_parameters();
  auto named = [&](const std::string& n) {
    for (const auto& [k, v] : params)
      if (k == n) return v;
    FAIL("no parameter " << n);
    return Tensor();
  };
  CHECK(two.gate(0).is_same(named("G1")));
  CHECK(two.gate(1).is_same(named("G2")));
  CHECK(two.layer(0)->factors()[0].param.is_same(named("layer1.U1")));
  CHECK(two.layer(1)->factors()[1].param.is_same(named("layer2.U2")));
  // TR with only .rank(): the other ranks are 4.
  nn::MuMoE tr(nn::MuMoEOptions(4, 3).experts({8, 2}).kind(MoEKind::TR).rank(5));
  auto trl = std::dynamic_pointer_cast<nn::TRMuMoE>(tr.layer(0));
  REQUIRE(trl != nullptr);
  CHECK(trl->ranks() == std::vector<int64_t>{4, 4, 4, 5});
}

TEST_CASE("under the paper's initialisation a second level stays inert unless its gate is perturbed") {
  // Level 1's expert slices start identical (σ = 0) and its gate at zero: its coefficients
  // are uniform, the loss depends on them only through their sum (entmax's Jacobian sends
  // a constant vector to zero), and its experts get identical updates, so neither changes.
  // With small random gate values its experts get updates scaled by different coefficients,
  // drift apart, and the gate's gradient follows.
  for (bool perturb : {false, true})
    for (MoEKind kind : {MoEKind::CP, MoEKind::TR}) {
      CAPTURE(perturb);
      manual_seed(21);
      nn::MuMoE block(nn::MuMoEOptions(6, 3).experts({5, 3}).kind(kind).rank(4).gate_norm(nn::GateNorm::BatchNorm)
                          .further_gate_std(perturb ? 0.01 : 0.0));
      block.to(kFloat64);  // in float32, rounding alone breaks the tie slowly
      optim::SGD opt(block.parameters(), optim::SGDOptions(0.1));
      const Tensor x = randn({16, 6}, kFloat64);
      double g0 = 0, g1 = 0;
      for (int step = 0; step < 3; ++step) {
        opt.zero_grad();
        Tensor y = block.forward(x);
        (y * y).sum().backward();
        g0 = block.gate(0).grad().abs().max().item();
        g1 = block.gate(1).grad().abs().max().item();
        opt.step();
      }
      CHECK(g0 > 1e-3);  // level 0's experts differ from the start
      CHECK(block.gate(0).abs().max().item() > 0);   // level 0's gate has moved,
      if (!perturb) CHECK(block.gate(1).abs().max().item() < 1e-12);  // level 1's has not
      if (perturb) CHECK(g1 > 1e-4 * g0);
      else CHECK(g1 < 1e-8 * g0);  // zero up to rounding
    }
}

TEST_CASE("further_gate_std draws the gates past level 0 after the factors, from the options' generator") {
  auto o = [] { return nn::MuMoEOptions(6, 3).experts({5, 3, 2}).kind(MoEKind::CP).rank(4); };
  Generator g1(8), g2(8);
  nn::MuMoE plain(o().generator(&g1)), drawn(o().generator(&g2).further_gate_std(0.5));
  // The factors are the same draws; gate 0 stays zero; gates 1 and 2 hold 30 samples of
  // N(0, 0.5²), whose standard deviation lies in a loose band around 0.5.
  for (int64_t l = 0; l < plain.num_layers(); ++l)
    for (size_t f = 0; f < plain.layer(l)->factors().size(); ++f)
      CHECK(max_abs_diff(plain.layer(l)->factors()[f].param, drawn.layer(l)->factors()[f].param) == 0.0);
  CHECK(drawn.gate(0).abs().max().item() == 0.0);
  const Tensor both = cat({drawn.gate(1).flatten(), drawn.gate(2).flatten()}, 0);
  const double sd = mu::std(both).item();
  CHECK(sd > 0.3);
  CHECK(sd < 0.7);
  CHECK(drawn.str().find("further_gate_std=0.5") != std::string::npos);
  CHECK_THROWS_MU(nn::MuMoE(o().further_gate_std(-1)), "further_gate_std must be a finite non-negative number, got -1");
}

TEST_CASE("rank conventions of TR, TT and Tucker with two expert levels, as the README states them") {
  // Two levels (N_1 = 8, N_2 = 2), in = 4 (+1 bias row), out = 3.
  auto base = [] { return nn::MuMoEOptions(4, 3).experts({8, 2}).gate_norm(nn::GateNorm::None); };
  auto shapes = [](const nn::MuMoE& b) {
    std::vector<Shape> s;
    for (const auto& f : b.layer(0)->factors()) s.push_back(f.param.shape());
    return s;
  };
  // TR: E + 2 = 4 ranks (R_1, R_2, R_3, R_4); cores U_1 (R_1, N_1, R_2), U_2 (R_2, N_2, R_3),
  // U_in (R_3, I+1, R_4), U_out (R_4, O, R_1): R_1 closes the ring.
  nn::MuMoE tr(base().kind(MoEKind::TR).ranks({2, 3, 5, 7}));
  CHECK(shapes(tr) == std::vector<Shape>{{2, 8, 3}, {3, 2, 5}, {5, 5, 7}, {7, 3, 2}});
  // .rank(R) alone: R_4 = R, the others 4.
  CHECK(shapes(nn::MuMoE(base().kind(MoEKind::TR).rank(6))) ==
        std::vector<Shape>{{4, 8, 4}, {4, 2, 4}, {4, 5, 6}, {6, 3, 4}});
  // TT: E + 1 = 3 ranks (R_2, R_3, R_4), the ring closed by R_1 = 1.
  CHECK(shapes(nn::MuMoE(base().kind(MoEKind::TT).ranks({3, 5, 7}))) ==
        std::vector<Shape>{{1, 8, 3}, {3, 2, 5}, {5, 5, 7}, {7, 3, 1}});
  CHECK(shapes(nn::MuMoE(base().kind(MoEKind::TT).rank(6))) ==
        std::vector<Shape>{{1, 8, 4}, {4, 2, 4}, {4, 5, 6}, {6, 3, 1}});
  // Tucker: E + 2 = 4 ranks (R_N1, R_N2, R_I, R_O); core (R_O, R_I, R_N1, R_N2) and one
  // factor per mode.
  CHECK(shapes(nn::MuMoE(base().kind(MoEKind::Tucker).ranks({2, 3, 5, 7}))) ==
        std::vector<Shape>{{7, 5, 2, 3}, {8, 2}, {2, 3}, {5, 5}, {3, 7}});

  CHECK_THROWS_MU(nn::MuMoE(base().kind(MoEKind::TR).rank(6).ranks({2, 3, 5, 7})),
                  "set .rank(R) or .ranks({...}), not both (got rank 6 and ranks [2, 3, 5, 7])");
  CHECK_THROWS_MU(nn::MuMoE(base().kind(MoEKind::TT).ranks({2, 3, 5, 7})), "TT block with 2 levels needs 3 ranks");
  CHECK_THROWS_MU(nn::MuMoE(base().kind(MoEKind::Tucker).rank(6)), "set .ranks({R_N1, ..., R_NE, R_I, R_O}) (4 entries)");
  CHECK_THROWS_MU(nn::MuMoE(base().kind(MoEKind::CP).ranks({6})), "a CP block has one rank");
  CHECK_THROWS_MU(nn::MuMoE(base().kind(MoEKind::Hadamard).rank(6)), "a Hadamard block has no ranks");
}

// ---------------------------------------------------------------- expert analysis

namespace {

// The block's pass with both layers replaced by DenseMoE layers holding the given tensors.
Tensor dense_block_pass(nn::MuMoE& block, const Tensor& x, const std::vector<Tensor>& weights) {
  std::vector<Tensor> a = block.coefficients(x);
  Tensor y = nn::DenseMoE(block.layer(0)->moe_shape(), weights[0]).forward(block.layer_input(x), a);
  if (block.num_layers() > 1) y = nn::DenseMoE(block.layer(1)->moe_shape(), weights[1]).forward(gelu(y), a);
  return y;
}

std::vector<Tensor> materialized(nn::MuMoE& block) {
  NoGradGuard g;
  std::vector<Tensor> w;
  for (int64_t l = 0; l < block.num_layers(); ++l) w.push_back(block.layer(l)->materialize());
  return w;
}

}  // namespace

TEST_CASE("expert analysis: counterfactual block passes equal zeroed materialised tensors in both layers") {
  manual_seed(20);
  for (MoEKind kind : {MoEKind::CP, MoEKind::TR, MoEKind::Tucker, MoEKind::Hadamard, MoEKind::Dense})
    for (int64_t hidden : {0, 6}) {
      auto o = small_options(kind, {3, 2});
      o.hidden(hidden).gate_norm(nn::GateNorm::BatchNorm).input_norm(true);
      nn::MuMoE block(o);
      block.to(kFloat64);
      randomize(block);
      Tensor x = randn({4, 2, 5}, kFloat64);
      block.forward(x);  // moves the running statistics away from (0, 1)
      block.eval();
      INFO(block.extra_repr());
      const auto w = materialized(block);
      // The untouched tensors reproduce the block itself.
      CHECK(rel_err(dense_block_pass(block, x, w), block.forward(x)) <= 1e-10);
      for (int64_t level = 0; level < 2; ++level)
        for (int64_t n = 0; n < o.experts()[size_t(level)]; ++n) {
          std::vector<Tensor> wz;
          for (const Tensor& t : w) {
            wz.push_back(t.clone());
            wz.back().select(level, n).zero_();
          }
          Tensor got = nn::forward_without_expert(block, x, level, n);
          CHECK(rel_err(got, dense_block_pass(block, x, wz)) <= 1e-10);
          CHECK(max_abs_diff(got, block.forward(x)) > 1e-8);  // the expert mattered
        }
      for (const auto& idx : all_indices(o.experts())) {
        std::vector<Tensor> wz;
        for (const Tensor& t : w) {
          wz.push_back(t.clone());
          slice_of(wz.back(), idx).zero_();
        }
        CHECK(rel_err(nn::forward_without_combination(block, x, idx), dense_block_pass(block, x, wz)) <= 1e-10);
      }
    }
}

TEST_CASE("random μMoE blocks equal the pass through their materialised tensors, and so do their counterfactuals") {
  // Every kind with 1-3 levels of 1-4 experts, random ranks, the fused CP / TR paths,
  // hidden layers, every gate norm and activation, input norms, biases: the factorized block
  // against DenseMoE layers holding its materialised tensors, and one random expert and one
  // random combination removed, against the same tensors with that slice zeroed.
  manual_seed(22);
  std::mt19937 rng(23);
  auto ri = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int draw = 0; draw < 80; ++draw) {
    const MoEKind kind = kAllKinds[ri(0, 5)];
    std::vector<int64_t> experts;
    for (int l = ri(1, 3); l-- > 0;) experts.push_back(ri(1, 4));
    const int64_t E = int64_t(experts.size());
    nn::MuMoEOptions o(ri(1, 6), ri(1, 5));
    o.experts(experts).kind(kind).bias(ri(0, 1)).gate_norm(nn::GateNorm(ri(0, 2)))
        .activation(nn::GateActivation(ri(0, 2))).input_norm(ri(0, 1)).further_gate_std(0.3);
    if (kind == MoEKind::CP || kind == MoEKind::TT) o.rank(ri(1, 5));
    if (kind == MoEKind::TR || kind == MoEKind::Tucker) {
      std::vector<int64_t> ranks;
      for (int64_t e = 0; e < E + 2; ++e) ranks.push_back(ri(1, 3));
      o.ranks(ranks);
    }
    if (ri(0, 1)) o.hidden(ri(1, 4));
    o.fused_cp(ri(0, 1)).fused_tr(ri(0, 1));
    nn::MuMoE block(o);
    block.to(kFloat64);
    randomize(block, 0.7);
    INFO("draw " << draw << ": " << block.extra_repr() << ", gate norm " << nn::to_string(o.gate_norm()) << ", "
                 << nn::to_string(o.activation()));
    Tensor x = randn({2, 3, o.in()}, kFloat64);
    block.forward(x);  // batch-norm gating: running statistics away from (0, 1)
    block.eval();
    const auto w = materialized(block);
    CHECK(rel_err(dense_block_pass(block, x, w), block.forward(x)) <= 1e-10);
    const int64_t level = ri(0, int(E) - 1), n = ri(0, int(experts[size_t(level)]) - 1);
    std::vector<int64_t> idx;
    for (int64_t e : experts) idx.push_back(ri(0, int(e) - 1));
    std::vector<Tensor> w_expert, w_combination;
    for (const Tensor& t : w) {
      w_expert.push_back(t.clone());
      w_expert.back().select(level, n).zero_();
      w_combination.push_back(t.clone());
      slice_of(w_combination.back(), idx).zero_();
    }
    // Relative to the whole output: removing the only expert (every level of size 1) leaves
    // zeros, which the factorized pass reaches up to rounding.
    const double scale = std::max(1e-300, amax(abs(block.forward(x)), {0, 1, 2}).item());
    CHECK(max_abs_diff(nn::forward_without_expert(block, x, level, n), dense_block_pass(block, x, w_expert)) <=
          1e-10 * scale);
    CHECK(max_abs_diff(nn::forward_without_combination(block, x, idx), dense_block_pass(block, x, w_combination)) <=
          1e-10 * scale);
  }
}

TEST_CASE("expert analysis: the re-writing term of Eq. 5 against a hand computation") {
  manual_seed(21);
  SUBCASE("one level") {
    auto o = small_options(MoEKind::CP, {4});
    o.gate_norm(nn::GateNorm::LayerNorm).activation(nn::GateActivation::Softmax);
    nn::MuMoE block(o);
    block.to(kFloat64);
    randomize(block);
    Tensor x = randn({5, 5}, kFloat64);
    // The target subpopulation: inputs 1 and 3.
    Tensor mask = tensor({0, 1, 0, 1, 0});
    std::vector<Tensor> a = block.coefficients(x);
    std::vector<double> av = a[0].to_vector<double>();
    std::vector<double> abar(4, 0.0);
    for (int64_t n = 0; n < 4; ++n) abar[size_t(n)] = (av[size_t(4 + n)] + av[size_t(12 + n)]) / 2;
    Tensor mean_a = nn::mean_coefficients(a, mask);
    CHECK(max_abs_diff(mean_a, from_vector(abar, {4})) <= 1e-15);
    // y_o = aᵀ W_{::o} z + λ āᵀa on heads 0 and 2, λ = N = 4 by default.
    Tensor y0 = block.forward(x);
    Tensor y = nn::forward_with_rewrite(block, x, mean_a, {0, 2});
    std::vector<double> want = y0.to_vector<double>();
    for (int64_t b = 0; b < 5; ++b) {
      double dot = 0;
      for (int64_t n = 0; n < 4; ++n) dot += abar[size_t(n)] * av[size_t(b * 4 + n)];
      want[size_t(b * 4 + 0)] += 4 * dot;
      want[size_t(b * 4 + 2)] += 4 * dot;
    }
    CHECK(max_abs_diff(y, from_vector(want, {5, 4})) <= 1e-12);
    // A negative λ moves the heads the other way.
    Tensor yn = nn::forward_with_rewrite(block, x, mean_a, {1}, -2.0);
    CHECK(max_abs_diff(yn.select(1, 1), y0.select(1, 1) - nn::rewrite_term(a, mean_a, 2.0)) <= 1e-12);
    CHECK(max_abs_diff(yn.select(1, 0), y0.select(1, 0)) == 0.0);
    CHECK_THROWS_MU(nn::forward_with_rewrite(block, x, mean_a, {4}), "out of range");
    CHECK_THROWS_MU(nn::mean_coefficients(a, zeros({5})), "selects no position");
  }
  SUBCASE("two levels: ā is the mean outer product of the coefficients") {
    std::vector<Tensor> a = random_coefficients({3, 2}, {3, 2});
    Tensor m = nn::mean_coefficients(a);
    std::vector<double> a1 = a[0].to_vector<double>(), a2 = a[1].to_vector<double>();
    std::vector<double> want(6, 0.0);
    for (int64_t p = 0; p < 6; ++p)
      for (int64_t i = 0; i < 3; ++i)
        for (int64_t j = 0; j < 2; ++j) want[size_t(i * 2 + j)] += a1[size_t(p * 3 + i)] * a2[size_t(p * 2 + j)] / 6;
    CHECK(max_abs_diff(m, from_vector(want, {3, 2})) <= 1e-15);
    Tensor t = nn::rewrite_term(a, m, 6.0);
    REQUIRE(t.shape() == Shape{3, 2});
    std::vector<double> tv = t.to_vector<double>();
    for (int64_t p = 0; p < 6; ++p) {
      double s = 0;
      for (int64_t i = 0; i < 3; ++i)
        for (int64_t j = 0; j < 2; ++j) s += want[size_t(i * 2 + j)] * a1[size_t(p * 3 + i)] * a2[size_t(p * 2 + j)];
      CHECK(std::abs(tv[size_t(p)] - 6 * s) <= 1e-14);
    }
  }
}

TEST_CASE("expert analysis: top-k inputs and per-class means on a constructed dataset") {
  manual_seed(22);
  // Gating G = identity, softmax, no norm: input x = s·e_c gives expert c the coefficient
  // e^s / (e^s + 2), larger for larger s, and the other two 1 / (e^s + 2) each.
  auto o = nn::MuMoEOptions(3, 2).experts({3}).rank(2).gate_norm(nn::GateNorm::None)
               .activation(nn::GateActivation::Softmax);
  nn::MuMoE block(o);
  block.to(kFloat64);
  {
    NoGradGuard g;
    Tensor g0 = block.gate(0);  // a handle to the parameter itself
    g0.copy_(eye(3, 3, kFloat64));
  }
  // 12 inputs: index i has class i % 3 and scale s_i = 1 + (7 i mod 12) / 4 (all distinct).
  std::vector<int64_t> cls(12);
  std::vector<double> scale(12);
  for (int64_t i = 0; i < 12; ++i) cls[size_t(i)] = i % 3, scale[size_t(i)] = 1.0 + double((7 * i) % 12) / 4.0;
  nn::CoefficientCollector stats({3}, 2, 3);
  // Two batches of 6 inputs each.
  for (int64_t start : {0, 6}) {
    std::vector<double> xv(18, 0.0);
    std::vector<int64_t> idx, lab;
    for (int64_t b = 0; b < 6; ++b) {
      const int64_t i = start + b;
      xv[size_t(b * 3 + cls[size_t(i)])] = scale[size_t(i)];
      idx.push_back(i);
      lab.push_back(cls[size_t(i)]);
    }
    stats.add(block, from_vector(xv, {6, 3}), from_vector(idx, {6}), from_vector(lab, {6}));
  }
  CHECK(stats.inputs_seen() == 12);
  CHECK(stats.class_counts() == std::vector<int64_t>{4, 4, 4});
  for (int64_t c = 0; c < 3; ++c) {
    // Expert c's top 2: the two class-c inputs with the largest scales.
    std::vector<int64_t> members;
    for (int64_t i = 0; i < 12; ++i)
      if (cls[size_t(i)] == c) members.push_back(i);
    std::sort(members.begin(), members.end(), [&](int64_t p, int64_t q) { return scale[size_t(p)] > scale[size_t(q)]; });
    auto top = stats.top_k(0, c);
    REQUIRE(top.size() == 2);
    for (size_t k = 0; k < 2; ++k) {
      const double s = scale[size_t(members[k])];
      CHECK(top[k].index == members[k]);
      CHECK(top[k].position == 0);
      CHECK(std::abs(top[k].coefficient - std::exp(s) / (std::exp(s) + 2)) <= 1e-14);
    }
  }
  // Per-class means: expert c averages e^s/(e^s+2) over its class, others 1/(e^s+2).
  Tensor m = stats.class_means(0);
  REQUIRE(m.shape() == Shape{3, 3});
  for (int64_t c = 0; c < 3; ++c)
    for (int64_t n = 0; n < 3; ++n) {
      double want = 0;
      for (int64_t i = 0; i < 12; ++i)
        if (cls[size_t(i)] == c) {
          const double es = std::exp(scale[size_t(i)]);
          want += (n == c ? es : 1.0) / (es + 2) / 4;
        }
      CHECK(std::abs(m.at({c, n}) - want) <= 1e-14);
    }
}

TEST_CASE("expert analysis: token positions, entmax zeros, and classes without inputs") {
  // Hand-made (B, T, N) coefficients: expert 1 fires only at (input 7, token 2) and (input 5, token 0).
  std::vector<double> v(2 * 3 * 2, 0.0);
  auto at = [&](int64_t b, int64_t t, int64_t n) -> double& { return v[size_t((b * 3 + t) * 2 + n)]; };
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t t = 0; t < 3; ++t) at(b, t, 0) = 1.0;
  at(0, 2, 0) = 0.25, at(0, 2, 1) = 0.75;
  at(1, 0, 0) = 0.5, at(1, 0, 1) = 0.5;
  nn::CoefficientCollector stats({2}, 3, 3);
  stats.add({from_vector(v, {2, 3, 2})}, tensor({7, 5}), tensor({2, 0}));
  auto top = stats.top_k(0, 1);
  REQUIRE(top.size() == 2);  // zero coefficients are not activations
  CHECK((top[0].index == 7 && top[0].position == 2 && top[0].coefficient == 0.75));
  CHECK((top[1].index == 5 && top[1].position == 0 && top[1].coefficient == 0.5));
  // Expert 0: six positions with coefficients 1, 1, .25, .5, 1, 1; the top 3 are the 1s of
  // the lowest dataset index first (input 5: tokens 1 and 2), then input 7 token 0.
  auto top0 = stats.top_k(0, 0);
  REQUIRE(top0.size() == 3);
  CHECK((top0[0].index == 5 && top0[0].position == 1));
  CHECK((top0[1].index == 5 && top0[1].position == 2));
  CHECK((top0[2].index == 7 && top0[2].position == 0));
  Tensor m = stats.class_means(0);
  CHECK(std::abs(m.at({2, 1}) - 0.75 / 3) <= 1e-15);  // class 2 = input 7, mean over its 3 tokens
  CHECK(std::abs(m.at({0, 0}) - 2.5 / 3) <= 1e-15);
  CHECK(std::isnan(m.at({1, 0})));  // class 1 had no inputs
  CHECK_THROWS_MU(stats.add({from_vector(v, {2, 3, 2})}, tensor({7, 5}), tensor({2, 3})), "out of range");
  CHECK_THROWS_MU(stats.add({from_vector(v, {2, 3, 2})}, tensor({7, 5})), "labels");
}
