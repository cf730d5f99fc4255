// What the class-index losses of ops/loss.cpp and ops/linear_cross_entropy.cpp share:
// reading and checking the targets, the class weights and the reduction. Internal to ops/.
#pragma once
#include <string>
#include <vector>

#include "ops/loss.h"

namespace mu::loss_detail {

// An input (C), (N, C) or (N, C, d1, ...) seen as (outer, C, inner) lines along the class
// dim, the loss shape, and the Mean denominator.
struct ClassTargets {
  int64_t outer = 1, classes = 0, inner = 1;
  Shape loss_shape;         // the target's: (), (N) or (N, d1, ...)
  double weight_sum = 0;    // sum of w[t] over the targets not ignored
  std::vector<int64_t> t;   // the targets, read to the host once
  std::vector<double> w;    // the class weights (empty: all ones)
};

// " (at position 3)" for (N) targets, " (at position [1, 0, 2])" for (N, d1, ...), nothing
// for a single () target.
std::string position(const Shape& shape, int64_t flat);

// A class weight (undefined: none) must be (classes), of `dtype`, on `device`.
void check_weight(const char* op, DType dtype, Device device, const Tensor& weight, int64_t classes);

// Reads target (int64, ct.loss_shape) and weight to the host into ct (whose classes and
// loss_shape are set): each target must lie in [0, classes) or equal ignore_index, and
// the mu::Error names the value and its position. Sums w[t] over the targets not ignored.
void read_class_targets(const char* op, const Tensor& target, const Tensor& weight, int64_t ignore_index,
                        ClassTargets& ct);

// Checks input against an int64 class-index target (dtype, device, shape) and reads it.
ClassTargets check_class_targets(const char* op, const Tensor& input, const Tensor& target, const Tensor& weight,
                                 int64_t ignore_index);

// Class weights of a class-index loss are constants (PyTorch implements no gradient
// for them): refuse one that asks for a gradient rather than leave it silently at none.
void refuse_weight_grad(const char* op, const Tensor& weight);

// Every loss checks its reduction on entry, before reading any operand.
void check_reduction(const char* op, Reduction r);

// The per-position losses kept (None), summed (Sum) or summed and divided by
// mean_denominator (Mean: NaN when it is 0, as in PyTorch).
Tensor reduce(const Tensor& per, Reduction r, double mean_denominator);

}  // namespace mu::loss_detail
