// Kernels of sparsemax, entmax15 and entmax_bisect (their ops are in nn/entmax.cpp).
// Every line is worked in double whatever the dtype.
#pragma once
#include "ops/dispatch.h"
#include "tensor/tensor.h"

namespace mu::kernels {

enum class EntmaxKind { Sparsemax, Entmax15, Bisect };

// y = the kind's mapping of every line of the dense (outer, n, inner) x along the middle
// axis; alpha and n_iter are read by Bisect only. A line holding NaN or +inf, or only
// -inf, gives NaN throughout.
MU_DECLARE_KERNEL(entmax_forward, void(const Tensor& y, const Tensor& x, int64_t outer, int64_t n, int64_t inner,
                                       EntmaxKind kind, double alpha, int n_iter));
// The gradient shared by all three: with q = y^e on the support (y > 0) and 0 off it,
// dx = q g - q (Σ q g) / (Σ q), e = 2 - α (0 for sparsemax, 0.5 for entmax15).
MU_DECLARE_KERNEL(entmax_backward, void(const Tensor& dx, const Tensor& g, const Tensor& y, int64_t outer, int64_t n,
                                        int64_t inner, double e));

}  // namespace mu::kernels
