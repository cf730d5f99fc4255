// Multilinear algebra for factorised layers: mode-n products, unfolding and folding,
// Khatri–Rao and Kronecker products, reconstruction of CP / tensor-ring / tensor-train /
// Tucker tensors from their factors, and the numerical rank of a matrix.
//
// Everything except singular_values and matrix_rank is composed of differentiable ops
// (permute/reshape views, broadcasting mul, matmul), so gradients reach every factor.
//
// Conventions (Kolda & Bader, "Tensor Decompositions and Applications", 2009), with
// modes counted from 0:
//   - X ×ₙ M with M of shape (J, I_n): (X ×ₙ M)[…, j, …] = Σ_k M[j, k] · X[…, k, …]
//     (the size I_n of mode n becomes J); unfold(X ×ₙ M, n) = M · unfold(X, n).
//   - unfold(X, n) has shape (I_n, Π_{k≠n} I_k); element X[i_0, …, i_{N-1}] sits at
//     row i_n, column j = Σ_{k≠n} i_k · J_k with J_k = Π_{m<k, m≠n} I_m: the FIRST of the
//     remaining indices varies fastest. tensorly's unfold uses the opposite (C-order)
//     convention, where the LAST remaining index varies fastest; the two differ by a
//     permutation of the columns, and identities such as X_(1) = A (C ⊙ B)ᵀ (here) read
//     X_(1) = A (B ⊙ C)ᵀ there.
//   - khatri_rao({A, B}) with A (I × R), B (J × R) is (I·J × R) with row i·J + j: the
//     first matrix's index varies slowest (as tensorly and Kolda–Bader's ⊙).
#pragma once
#include <optional>
#include <vector>

#include "tensor/tensor.h"

namespace mu::tensor_algebra {

// ---- unfolding

// Mode-n unfolding (matricisation) in the Kolda–Bader ordering above; a view when the
// layout allows, else a copy.
Tensor unfold(const Tensor& x, int64_t mode);
// Inverse of unfold: the (I_n × Π_{k≠n} I_k) matrix m back into a tensor of `shape`.
Tensor fold(const Tensor& m, int64_t mode, const Shape& shape);

// ---- mode-n products

// X ×ₙ M, M of shape (J, I_n): mode n of the result has size J.
Tensor mode_n_product(const Tensor& x, const Tensor& m, int64_t mode);
// X ×ₙ v, v of shape (I_n): mode n is contracted away (the result has one mode fewer).
Tensor mode_n_product_vec(const Tensor& x, const Tensor& v, int64_t mode);
// X ×_{modes[0]} F_0 ×_{modes[1]} F_1 …, each F_k a matrix (mode_n_product) or a vector
// (mode_n_product_vec); modes name modes of the original X and must be distinct. An empty
// `modes` means 0, 1, …, factors.size()-1. As tensorly's multi_mode_dot.
Tensor multi_mode_product(const Tensor& x, const std::vector<Tensor>& factors, const std::vector<int64_t>& modes = {});

// ---- products of matrices

// Column-wise Kronecker product of matrices with equal column counts R:
// (Π_k I_k × R), the first matrix's row index slowest.
Tensor khatri_rao(const std::vector<Tensor>& matrices);
// Kronecker product, as torch.kron: the operands are given equal rank by leading 1s, and
// result[i·B_0 + j, k·B_1 + l, …] = a[i, k, …] · b[j, l, …].
Tensor kron(const Tensor& a, const Tensor& b);

// ---- reconstruction from factors

// CP: X = Σ_r w_r · a_r^(0) ∘ a_r^(1) ∘ …, factors U_k of shape (I_k × R); no weights
// means all ones. Shape (I_0, …, I_{N-1}).
Tensor cp_to_tensor(const std::vector<Tensor>& factors, const Tensor& weights = Tensor());
// Tensor ring: cores U_k of shape (R_k, I_k, R_{k+1}) with R_N = R_0 (the ring closes);
// X[i_0, …, i_{N-1}] = trace(U_0[:, i_0, :] · U_1[:, i_1, :] · … · U_{N-1}[:, i_{N-1}, :]).
Tensor tr_to_tensor(const std::vector<Tensor>& cores);
// Tensor train: a tensor ring whose boundary ranks are 1 (U_0 is (1, I_0, R_1) and
// U_{N-1} is (R_{N-1}, I_{N-1}, 1)).
Tensor tt_to_tensor(const std::vector<Tensor>& cores);
// Tucker: core ×_0 U_0 ×_1 U_1 …, U_k of shape (I_k × R_k), core of shape (R_0, R_1, …).
Tensor tucker_to_tensor(const Tensor& core, const std::vector<Tensor>& factors);

// ---- numerical rank (float64, on the CPU; not differentiable)

// Singular values of a 2-D matrix (m × n), min(m, n) of them in descending order, as a
// float64 tensor; computed by one-sided Jacobi rotations in double precision.
Tensor singular_values(const Tensor& m);
// Number of singular values greater than `tol`; by default tol = σ_max · max(m, n) · ε
// with ε the float64 machine epsilon (numpy.linalg.matrix_rank, torch.linalg.matrix_rank).
int64_t matrix_rank(const Tensor& m, std::optional<double> tol = std::nullopt);

}  // namespace mu::tensor_algebra
