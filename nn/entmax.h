// Sparse probability maps along one dim, as in the entmax package (Peters, Niculae and
// Martins 2019), used as μMoE gating activations. Each maps a line of scores z onto the
// probability simplex; unlike softmax (mu::softmax, ops/nn_functional.h) the result is
// exactly zero on the entries below a threshold τ:
//
//   sparsemax(z)        = argmin_{p ∈ Δ} ||p - z||²  = max(z - τ, 0)
//   entmax15(z)         = max(z/2 - τ, 0)²                       (α = 1.5, exact, by sorting)
//   entmax_bisect(z, α) = max((α-1) z - τ, 0)^(1/(α-1))          (any α > 1, τ by bisection)
//
// entmax_bisect with α = 2 is sparsemax, with α = 1.5 entmax15, and tends to softmax as
// α → 1. Outputs sum to 1 up to rounding. Backward is the exact vector-Jacobian product:
// with q = p^(2-α) on the support (p > 0) and 0 off it, dz = q g - q (Σ q g) / (Σ q).
//
//   Tensor gate = nn::entmax15(logits);          // along the last dim
//   Tensor p = nn::entmax_bisect(scores, 1.25, 0);
//
// float32 and float64, CPU, any dim; a line holding a NaN or +inf gives NaN on that line.
#pragma once
#include "tensor/tensor.h"

namespace mu::nn {

Tensor sparsemax(const Tensor& x, int64_t dim = -1);
Tensor entmax15(const Tensor& x, int64_t dim = -1);
// τ is bisected n_iter times inside a bracket of width < 1, then p is rescaled to sum to
// exactly 1 (the package's ensure_sum_one). alpha must be finite and > 1.
Tensor entmax_bisect(const Tensor& x, double alpha, int64_t dim = -1, int n_iter = 50);

}  // namespace mu::nn
