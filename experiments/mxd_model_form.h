// The MxD "model form" notebook (../shared/papers/mxd-model-form-notebook.txt) in float64
// with its sizes: a Hadamard-factorised expert tensor W (N x H x O) with
// W[n, h, :] = C[n] ∗ D[h] and the layer output y = (Cᵀa) ∗ (Dᵀz), and the notebook's four
// equivalences, each measured as the largest absolute difference of its two sides:
//   (i)   the Khatri–Rao parameterisation of the mode-3 unfolding is W;
//   (ii)  the factorised output equals the explicit per-expert sum Σ_n a_n W[n]ᵀ z;
//   (iii) the mode-n product form W ×₁ a ×₂ z equals both;
//   (iv)  every expert W_n = D · diag(C[n]) has full rank, and Σ_n a_n W_nᵀ z is y again.
// Shared by tests/test_notebook.cpp (which bounds the differences) and
// experiments/repro_mxd_notebook.cpp (which prints them).
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "mumoe.h"
#include "ops/einsum.h"
#include "ops/tensor_algebra.h"

namespace mu::mxd {

// The notebook's sizes and variables: input (H) 16, output (O) 64, 32 experts (N).
struct ModelForm {
  static constexpr int64_t H = 16, O = 64, N = 32;
  Tensor C, D, G, E, x, z, a;
  Tensor W;  // built elementwise by loops

  explicit ModelForm(uint64_t seed = 42) {
    manual_seed(seed);
    C = randn({N, O}, kFloat64);  // one O-vector per expert
    D = randn({H, O}, kFloat64);  // one O-vector per input unit
    G = randn({H, N}, kFloat64);  // gating: any linear map
    E = randn({H, H}, kFloat64);  // stand-in encoder
    x = randn({H}, kFloat64);
    z = gelu(matmul(E.t(), x));        // hidden units
    a = softmax(matmul(G.t(), z), 0);  // expert coefficients
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

  // W ×₁ a ×₂ z (modes 0 and 1 here), as tensorly's multi_mode_dot(W, [a, z], modes=[0, 1]).
  Tensor mode_n_output() const { return tensor_algebra::multi_mode_product(W, {a, z}, {0, 1}); }

  // Kolda–Bader orders the columns of the mode-3 unfolding W_(3) (O x N·H) with the first
  // remaining mode fastest: column n + h·N. khatri_rao puts its first matrix's row index
  // slowest (row h·N + n for khatri_rao({D, C})), so in this convention W_(3) = (D ⊙ C)ᵀ.
  // The notebook writes (C ⊙ D)ᵀ because tensorly's fold is C-ordered (last remaining mode
  // fastest, column n·H + h).
  Tensor khatri_rao_kolda_bader() const {
    return tensor_algebra::fold(tensor_algebra::khatri_rao({D, C}).t(), 2, {N, H, O});
  }
  // tensorly's reading, spelled out: (C ⊙ D)ᵀ is W's C-order mode-3 unfolding.
  Tensor khatri_rao_tensorly() const {
    return tensor_algebra::khatri_rao({C, D}).t().reshape({O, N, H}).permute({1, 2, 0});
  }

  // The n-th expert, D · diag(C[n]) (H x O), with diag built by loops.
  Tensor expert(int64_t n) const {
    const std::vector<double> cn = C.select(0, n).to_vector<double>();
    std::vector<double> diag(size_t(O * O), 0.0);
    for (int64_t o = 0; o < O; ++o) diag[size_t(o * O + o)] = cn[size_t(o)];
    return mm(D, from_vector(diag, {O, O}, kFloat64));
  }
};

}  // namespace mu::mxd
