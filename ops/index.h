// Indexing ops: int64 indices, bounds-checked with the offending value in the message.
#pragma once
#include "ops/reduce.h"
#include "tensor/tensor.h"

namespace mu {

// out[i][j][k] = x[index[i][j][k]][j][k] for dim 0 (torch.gather).
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);
// out = x with out[index[i][j]][j] += src[i][j] for dim 0 (torch.scatter_add).
Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src);
// Slices of x at `index` (1-D) along dim.
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);
// x with the slices of src added at `index` (1-D, src.size(dim) entries) along dim:
// out[..., index[j], ...] += src[..., j, ...] (torch.index_add); repeated indices add up.
// Deterministic. Differentiable in x and src.
Tensor index_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src);
// Rows of weight (V, D) picked by ids of any shape: result ids.shape + [D].
Tensor embedding(const Tensor& weight, const Tensor& ids);
Tensor cumsum(const Tensor& x, int64_t dim);
// Sorted values (differentiable) and their indices along dim; stable.
ValuesIndices sort(const Tensor& x, int64_t dim = -1, bool descending = false);
// The k largest (or smallest) along dim, ordered, as torch.topk.
ValuesIndices topk(const Tensor& x, int64_t k, int64_t dim = -1, bool largest = true);

namespace detail {
// gather, index_select and index_add without the bounds check, for an index known to be
// in range: made by the library's own kernels (sort, topk, max and min along a dim) or
// built on the host from values already checked there (a sparse MoE's routing). The check
// copies the index to the host, on CUDA a synchronisation per call (each sampling step's
// topk; several per sparse-MoE layer). The other checks (dtype, devices, shapes) stay.
// An index out of range here reads or writes out of bounds: not for a user's index.
Tensor gather_in_range(const Tensor& x, int64_t dim, const Tensor& index);
Tensor index_select_in_range(const Tensor& x, int64_t dim, const Tensor& index);
Tensor index_add_in_range(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src);
}  // namespace detail

}  // namespace mu
