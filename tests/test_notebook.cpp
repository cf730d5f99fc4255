// The MxD "model form" notebook (../shared/papers/mxd-model-form-notebook.txt) as a test,
// in float64 with its sizes: a Hadamard-factorised expert tensor W (N x H x O) with
// W[n, h, :] = C[n] ∗ D[h] and the layer output y = (Cᵀa) ∗ (Dᵀz). Its four equivalences:
//   (i)   the Khatri–Rao parameterisation of the mode-3 unfolding is W;
//   (ii)  the factorised output equals the explicit per-expert sum Σ_n a_n W[n]ᵀ z;
//   (iii) the mode-n product form W ×₁ a ×₂ z equals both;
//   (iv)  every expert W_n = D · diag(C[n]) has full rank, and Σ_n a_n W_nᵀ z is y again.
#include <cmath>

#include "helpers.h"
#include "ops/einsum.h"
#include "ops/tensor_algebra.h"

using namespace mu;
using namespace mu::tensor_algebra;

namespace {

// The notebook's sizes and variables: input (H) 16, output (O) 64, 32 experts (N).
struct ModelForm {
  static constexpr int64_t H = 16, O = 64, N = 32;
  Tensor C, D, G, E, x, z, a;
  Tensor W;  // built elementwise by loops

  ModelForm() {
    manual_seed(42);
    C = randn({N, O}, kFloat64);  // one O-vector per expert
    D = randn({H, O}, kFloat64);  // one O-vector per input unit
    G = randn({H, N}, kFloat64);  // gating: any linear map
    E = randn({H, H}, kFloat64);  // stand-in encoder
    x = randn({H}, kFloat64);
    z = gelu(matmul(E.t(), x));         // hidden units
    a = softmax(matmul(G.t(), z), 0);   // expert coefficients
    const std::vector<double> c = C.to_vector<double>(), d = D.to_vector<double>();
    std::vector<double> w(size_t(N * H * O));
    for (int64_t n = 0; n < N; ++n)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t o = 0; o < O; ++o) w[size_t((n * H + h) * O + o)] = c[size_t(n * O + o)] * d[size_t(h * O + o)];
    W = from_vector(w, {N, H, O}, kFloat64);
  }

  // y_mod = Σ_n a_n W[n]ᵀ z, summed by explicit loops.
  Tensor explicit_output() const {
    const std::vector<double> w = W.to_vector<double>(), av = a.to_vector<double>(), zv = z.to_vector<double>();
    std::vector<double> y(size_t(O), 0.0);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t o = 0; o < O; ++o) y[size_t(o)] += av[size_t(n)] * w[size_t((n * H + h) * O + o)] * zv[size_t(h)];
    return from_vector(y, {O}, kFloat64);
  }

  // The factorised forward pass of Lemma 2.
  Tensor factorised_output() const { return matmul(C.t(), a) * matmul(D.t(), z); }
};

const double kTol = 1e-12;

}  // namespace

TEST_CASE("notebook (i): the Khatri-Rao parameterisation of the mode-3 unfolding is W") {
  ModelForm f;
  // Kolda–Bader orders the columns of the mode-3 unfolding W_(3) (O x N·H) with the first
  // remaining mode fastest: column n + h·N. khatri_rao puts its first matrix's row index
  // slowest (row h·N + n for khatri_rao({D, C})), so in this convention
  // W_(3) = (D ⊙ C)ᵀ. The notebook writes (C ⊙ D)ᵀ because tensorly's fold is C-ordered
  // (last remaining mode fastest, column n·H + h).
  Tensor W_kr = fold(khatri_rao({f.D, f.C}).t(), 2, {ModelForm::N, ModelForm::H, ModelForm::O});
  CHECK(max_abs_diff(W_kr, f.W) < kTol);
  // tensorly's reading, spelled out: (C ⊙ D)ᵀ is W's C-order mode-3 unfolding, so reshaping
  // its columns as (n, h) and moving mode 3 back gives W too.
  Tensor W_c = khatri_rao({f.C, f.D}).t().reshape({ModelForm::O, ModelForm::N, ModelForm::H}).permute({1, 2, 0});
  CHECK(max_abs_diff(W_c, f.W) < kTol);
  // Mixing the conventions does not give W: the factor order matters.
  CHECK(max_abs_diff(fold(khatri_rao({f.C, f.D}).t(), 2, f.W.shape()), f.W) > 0.1);
}

TEST_CASE("notebook (ii): the factorised output equals the explicit sum over experts") {
  ModelForm f;
  Tensor y = f.factorised_output(), y_mod = f.explicit_output();
  CHECK(y.shape() == Shape{ModelForm::O});
  CHECK(max_abs_diff(y, y_mod) < kTol);
}

TEST_CASE("notebook (iii): the mode-n product form equals both") {
  ModelForm f;
  // W ×₁ a ×₂ z (modes 0 and 1 here), as tensorly's multi_mode_dot(W, [a, z], modes=[0, 1]).
  Tensor y_moden = multi_mode_product(f.W, {f.a, f.z}, {0, 1});
  CHECK(y_moden.shape() == Shape{ModelForm::O});
  CHECK(max_abs_diff(y_moden, f.factorised_output()) < kTol);
  CHECK(max_abs_diff(y_moden, f.explicit_output()) < kTol);
  // The same contraction written as an einsum, the way μMoE layers state it.
  CHECK(max_abs_diff(einsum("nho,n,h->o", {f.W, f.a, f.z}), y_moden) < kTol);
}

TEST_CASE("notebook (iv): every expert has full rank and their weighted sum is y") {
  ModelForm f;
  const int64_t H = ModelForm::H, O = ModelForm::O, N = ModelForm::N;
  Tensor y_rank = zeros({O}, kFloat64);
  double normalised_rank_sum = 0;
  for (int64_t n = 0; n < N; ++n) {
    // diag(C[n]) built by loops, then the n-th expert W_n = D · diag(C[n]) (H x O).
    const std::vector<double> cn = f.C.select(0, n).to_vector<double>();
    std::vector<double> diag(size_t(O * O), 0.0);
    for (int64_t o = 0; o < O; ++o) diag[size_t(o * O + o)] = cn[size_t(o)];
    Tensor Wn = mm(f.D, from_vector(diag, {O, O}, kFloat64));
    // It is the n-th slice of W.
    CHECK(max_abs_diff(Wn, f.W.select(0, n)) < kTol);
    const int64_t rank = matrix_rank(Wn);
    CHECK(rank == std::min(H, O));
    normalised_rank_sum += double(rank) / double(std::min(H, O));
    y_rank = y_rank + matmul(Wn.t(), f.z) * f.a.select(0, n);
  }
  // No structural low-rankness: the mean normalised rank is exactly 1.
  CHECK(normalised_rank_sum / double(N) == 1.0);
  CHECK(max_abs_diff(y_rank, f.explicit_output()) < kTol);
}
