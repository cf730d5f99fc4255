// einsum with PyTorch semantics, a contraction-order planner, and pairwise execution
// as permute + reshape + batched GEMM.
//
//   einsum("bij,bjk->bik", {a, b})          explicit output
//   einsum("ij,jk", {a, b})                 implicit: letters seen once, sorted
//   einsum("...ij,...jk->...ik", {a, b})    ellipsis, broadcast like matmul's batch dims
//   einsum("ii->i", {a})                    a letter repeated in one operand: diagonal
//   einsum("b t n1, n1 r -> b t r", {a, u}) einops style: space-separated axis names
//
// A spec whose terms contain spaces between names is read einops style (each name a
// whitespace-separated token); otherwise every character is an axis and spaces are
// ignored. Gradients follow the contraction plan backwards: each pairwise step's
// operand gets the contraction of that step's output gradient with its partner, so the
// forward pass's intermediates are reused rather than recomputed.
#pragma once
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace mu {

Tensor einsum(const std::string& spec, const std::vector<Tensor>& operands);

// The contraction order chosen for a spec and shapes, like opt_einsum's contract_path.
struct EinsumPath {
  // Each step contracts two entries of the current operand list (i < j); the result is
  // appended at the end of the list and both inputs removed (opt_einsum's convention).
  std::vector<std::pair<int, int>> steps;
  // Multiply-adds of the whole evaluation (each counts as one FLOP), including the
  // reduction of letters that only one operand holds.
  double flops = 0;
  // Elements of the largest intermediate tensor (operands and output excluded).
  double largest_intermediate = 0;
  // Multiply-adds of evaluating the spec as one nested loop over all letters.
  double naive_flops = 0;
  bool exhaustive = false;  // true when the order is the cheapest there is (<= 12 operands)
  std::string str() const;
};

EinsumPath einsum_path(const std::string& spec, const std::vector<Shape>& shapes);

}  // namespace mu
