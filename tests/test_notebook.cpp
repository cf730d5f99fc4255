// The MxD "model form" notebook (../shared/papers/mxd-model-form-notebook.txt) as a test:
// its model form and four equivalences (experiments/mxd_model_form.h), each side computed
// its own way and compared in float64.
#include <cmath>

#include "experiments/mxd_model_form.h"
#include "helpers.h"

using namespace mu;
using namespace mu::tensor_algebra;
using mxd::ModelForm;

namespace {

const double kTol = 1e-12;

}  // namespace

TEST_CASE("notebook (i): the Khatri-Rao parameterisation of the mode-3 unfolding is W") {
  ModelForm f;
  CHECK(max_abs_diff(f.khatri_rao_kolda_bader(), f.W) < kTol);
  CHECK(max_abs_diff(f.khatri_rao_tensorly(), f.W) < kTol);
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
  Tensor y_moden = f.mode_n_output();
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
    Tensor Wn = f.expert(n);  // D · diag(C[n]), diag built by loops
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
