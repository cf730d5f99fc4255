// Kernels of the indexing ops (ops/index.cpp). Indices are int64 and already checked
// to lie in range: a kernel may run on many threads, where no error can be raised.
#pragma once
#include "ops/dispatch.h"
#include "tensor/tensor.h"

namespace mu::kernels {

// out[..j..] = x[..index[..j..]..] along dim; out has index's shape; any strides.
MU_DECLARE_KERNEL(gather, void(const Tensor& out, const Tensor& x, int64_t dim, const Tensor& index));
// out[..index[..j..]..] += src[..j..] along dim, in place; any strides. Deterministic:
// the additions into one element run in a fixed order.
MU_DECLARE_KERNEL(scatter_add, void(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src));
// x dense (outer, n, inner), out dense (outer, m, inner), index dense (m):
// out[o, j, :] = x[o, index[j], :].
MU_DECLARE_KERNEL(index_select, void(const Tensor& out, const Tensor& x, const Tensor& index, int64_t outer, int64_t n,
                                     int64_t m, int64_t inner));
// The reverse, the gradient of index_select and embedding: grad (outer, n, inner),
// zeroed, gets grad[o, index[j], :] += g[o, j, :] (a scatter-add of rows; no one-hot).
// Deterministic, whatever the thread count.
MU_DECLARE_KERNEL(index_add_rows, void(const Tensor& grad, const Tensor& g, const Tensor& index, int64_t outer,
                                       int64_t n, int64_t m, int64_t inner));
// Running sums along the middle axis of the dense (outer, n, inner) x; from the end
// when `reverse`. float32 sums are carried in double.
MU_DECLARE_KERNEL(cumsum, void(const Tensor& out, const Tensor& x, int64_t outer, int64_t n, int64_t inner,
                               bool reverse));
// For every line of the dense (outer, n, inner) x along the middle axis, the positions
// of its first k elements in sorted order (NaN above every number, ties by position:
// stable), written to the int64 idx (outer, k, inner).
MU_DECLARE_KERNEL(sort_indices, void(const Tensor& idx, const Tensor& x, int64_t outer, int64_t n, int64_t inner,
                                     int64_t k, bool descending));

}  // namespace mu::kernels
