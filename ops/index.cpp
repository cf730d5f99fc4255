// Indexing ops: gather/scatter_add along a dim, index_select and embedding, cumsum,
// sort and topk. Every index is checked before a kernel runs (a kernel may run on
// several threads, where an error cannot be thrown). Sort, topk and max(dim) compute
// only indices; their values are a gather, whose gradient is a scatter_add.
#include <algorithm>
#include <array>
#include <cmath>

#include "autograd/node.h"
#include "ops/compute_dtype.h"
#include "ops/kernels/index.h"
#include "ops/ops.h"
#include "ops/pointwise.h"

namespace mu {

using autograd::record;
using autograd::save;
using autograd::TensorList;

// ---------------------------------------------------------------- checks

static void require_int64_index(const Tensor& index, const char* op) {
  MU_CHECK(index.dtype() == kInt64, op, ": index must be an int64 tensor, got ", dtype_name(index.dtype()),
           " (convert it with .to(kInt64))");
}

// Every index must lie in [0, size); negative indices are refused, as in torch.gather.
static void check_bounds(const Tensor& index, int64_t size, int64_t dim, const char* op) {
  // Checked on the host before any kernel runs (a kernel cannot raise an error).
  Tensor ic = index.cpu().contiguous();
  const int64_t* p = ic.data_ptr<int64_t>();
  for (int64_t i = 0, n = ic.numel(); i < n; ++i)
    MU_CHECK(p[i] >= 0 && p[i] < size, op, ": index ", p[i], " is out of bounds for dimension ", dim, " with size ",
             size);
}

// A 0-dim tensor is treated as shape [1], so every op has a dim to work along.
static Tensor at_least_1d(const Tensor& t) { return t.dim() == 0 ? t.reshape({1}) : t; }

// sum(g) for the gradient sums of gather and index_select: a 16-bit g (autocast's bfloat16
// activations) is summed in float32 and the result rounded once, as the forward ops here do.
// (Not through those ops: their index checks would copy the index to the host again.)
template <class Sum>
static Tensor summed_in_compute_dtype(const Tensor& g, Sum&& sum) {
  if (is_compute_dtype(g.dtype())) return sum(g);
  return sum(in_compute_dtype(g)).to(g.dtype());
}

// ---------------------------------------------------------------- gather, scatter_add

// Zeros of `shape` with src scatter-added along dim at index (the gradient of a gather).
static Tensor scatter_add_into_zeros(const Shape& shape, int64_t dim, const Tensor& index, const Tensor& src) {
  return summed_in_compute_dtype(src, [&](const Tensor& s) {
    Tensor out = zeros(shape, TensorOptions(s.dtype()).device(s.device()));
    kernels::scatter_add(out.device(), out, dim, index, s);
    return out;
  });
}

// gather, its index bounds-checked when `check`.
static Tensor gather_impl(const Tensor& x, int64_t dim, const Tensor& index, bool check) {
  require_int64_index(index, "gather");
  MU_CHECK(index.device() == x.device(), "gather: index on ", index.device().str(), ", input on ", x.device().str());
  MU_CHECK(index.dim() == x.dim(), "gather: index has ", index.dim(), " dimensions (shape ", shape_str(index.shape()),
           ") but the input has ", x.dim(), " (shape ", shape_str(x.shape()), "); they must match");
  Tensor xv = at_least_1d(x), iv = at_least_1d(index);
  int64_t d = wrap_dim(dim, xv.dim(), "gather");
  for (int64_t k = 0; k < xv.dim(); ++k)
    MU_CHECK(k == d || iv.shape()[size_t(k)] <= xv.shape()[size_t(k)], "gather: index of shape ",
             shape_str(index.shape()), " is larger than the input of shape ", shape_str(x.shape()), " in dimension ", k,
             " (only dimension ", d, " may differ)");
  if (check) check_bounds(iv, xv.shape()[size_t(d)], d, "gather");
  Tensor y = empty(iv.shape(), TensorOptions(x.dtype()).device(x.device()));
  kernels::gather(x.device(), y, xv.detach(), d, iv);
  y = y.reshape(index.shape());
  return record("GatherBackward", y, {x}, [is = save(iv), sx = x.shape(), sxv = xv.shape(), d](const Tensor& g) -> TensorList {
    Tensor iv = is.get();
    return {scatter_add_into_zeros(sxv, d, iv, g.reshape(iv.shape())).reshape(sx)};
  });
}

Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) { return gather_impl(x, dim, index, true); }

Tensor detail::gather_in_range(const Tensor& x, int64_t dim, const Tensor& index) {
  return gather_impl(x, dim, index, false);
}

Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src) {
  const char* op = "scatter_add";
  require_int64_index(index, op);
  detail::require_same(x, src, op);
  MU_CHECK(index.device() == x.device(), op, ": index on ", index.device().str(), ", input on ", x.device().str());
  MU_CHECK(index.dim() == x.dim() && src.dim() == x.dim(), op, ": input, index and src must have the same number of ",
           "dimensions, got shapes ", shape_str(x.shape()), ", ", shape_str(index.shape()), " and ",
           shape_str(src.shape()));
  Tensor xv = at_least_1d(x), iv = at_least_1d(index), sv = at_least_1d(src);
  int64_t d = wrap_dim(dim, xv.dim(), op);
  for (int64_t k = 0; k < xv.dim(); ++k) {
    int64_t ik = iv.shape()[size_t(k)];
    MU_CHECK(ik <= sv.shape()[size_t(k)], op, ": index of shape ", shape_str(index.shape()),
             " is larger than src of shape ", shape_str(src.shape()), " in dimension ", k);
    MU_CHECK(k == d || ik <= xv.shape()[size_t(k)], op, ": index of shape ", shape_str(index.shape()),
             " is larger than the input of shape ", shape_str(x.shape()), " in dimension ", k, " (only dimension ", d,
             " may differ)");
  }
  check_bounds(iv, xv.shape()[size_t(d)], d, op);
  MU_CHECK(x.dtype() != kBool, op, ": expected a number dtype, got bool (convert with .to(kInt64))");
  // A storage dtype sums in its compute dtype (float32, or int64, whose wrap-around the
  // narrowing repeats) and is rounded back once.
  if (!is_compute_dtype(x.dtype()))
    return scatter_add(in_compute_dtype(x), dim, index, in_compute_dtype(src)).to(x.dtype());
  Tensor out = xv.detach().clone();
  kernels::scatter_add(out.device(), out, d, iv, sv.detach());
  out = out.reshape(x.shape());
  return record("ScatterAddBackward", out, {x, src},
                [is = save(iv), ss = src.shape(), ssv = sv.shape(), d](const Tensor& g) -> TensorList {
    Tensor iv = is.get();
    // src's gradient is g gathered at index; src elements beyond index's extent were
    // never added, so theirs is zero.
    Tensor gs = empty(iv.shape(), TensorOptions(g.dtype()).device(g.device()));
    kernels::gather(g.device(), gs, at_least_1d(g), d, iv);
    if (gs.shape() != ssv) {
      Tensor full_gs = zeros(ssv, TensorOptions(g.dtype()).device(g.device()));
      Tensor corner = full_gs;
      for (int64_t k = 0; k < int64_t(ssv.size()); ++k) corner = corner.narrow(k, 0, gs.shape()[size_t(k)]);
      corner.copy_(gs);
      gs = full_gs;
    }
    return {g, gs.reshape(ss)};
  });
}

// ---------------------------------------------------------------- index_select, embedding


// index_select, with the op named in errors (embedding reports itself), its index
// bounds-checked when `check`.
static Tensor index_select_as(const Tensor& x, int64_t dim, const Tensor& index, const char* op, bool check = true) {
  require_int64_index(index, op);
  MU_CHECK(index.device() == x.device(), op, ": index on ", index.device().str(), ", input on ", x.device().str());
  MU_CHECK(index.dim() <= 1, op, ": index must be 1-D, got shape ", shape_str(index.shape()));
  Tensor xv = at_least_1d(x);
  int64_t d = wrap_dim(dim, xv.dim(), op);
  int64_t n = xv.shape()[size_t(d)], m = index.numel();
  if (check) check_bounds(index, n, d, op);
  auto [outer, n_d, inner] = line_geometry(xv.shape(), d);
  Shape out_shape = xv.shape();
  out_shape[size_t(d)] = m;
  Tensor xc = xv.detach().contiguous(), ic = index.contiguous();
  Tensor y = empty(out_shape, TensorOptions(x.dtype()).device(x.device()));
  kernels::index_select(x.device(), y, xc, ic, outer, n, m, inner);
  if (x.dim() == 0) y = y.reshape(index.dim() == 0 ? Shape{} : Shape{m});  // torch keeps a scalar a scalar
  return record("IndexSelectBackward", y, {x},
                [is = save(ic), sx = x.shape(), sxv = xv.shape(), outer, inner, n, m](const Tensor& g) -> TensorList {
    return {summed_in_compute_dtype(g, [&](const Tensor& gw) {
              Tensor gc = gw.contiguous(), grad = zeros(sxv, TensorOptions(gc.dtype()).device(gc.device()));
              kernels::index_add_rows(gc.device(), grad, gc, is.get(), outer, n, m, inner);
              return grad;
            }).reshape(sx)};
  });
}

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  return index_select_as(x, dim, index, "index_select");
}

Tensor detail::index_select_in_range(const Tensor& x, int64_t dim, const Tensor& index) {
  return index_select_as(x, dim, index, "index_select", false);
}

// index_add, its index bounds-checked when `check`.
static Tensor index_add_impl(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src, bool check) {
  const char* op = "index_add";
  require_int64_index(index, op);
  MU_CHECK(index.device() == x.device() && src.device() == x.device(), op, ": x on ", x.device().str(), ", index on ",
           index.device().str(), ", src on ", src.device().str());
  MU_CHECK(src.dtype() == x.dtype(), op, ": src has dtype ", dtype_name(src.dtype()), ", x has ", dtype_name(x.dtype()));
  MU_CHECK(index.dim() <= 1, op, ": index must be 1-D, got shape ", shape_str(index.shape()));
  Tensor xv = at_least_1d(x), sv = at_least_1d(src);
  const int64_t d = wrap_dim(dim, xv.dim(), op);
  Shape want = xv.shape();
  want[size_t(d)] = index.numel();
  MU_CHECK(sv.shape() == want, op, ": src must have shape ", shape_str(want), " (x's with dimension ", d, " of size ",
           index.numel(), ", the index length), got ", shape_str(src.shape()));
  const int64_t n = xv.shape()[size_t(d)], m = index.numel();
  if (check) check_bounds(index, n, d, op);
  MU_CHECK(x.is_floating_point(), op, ": needs a floating-point tensor, got ", dtype_name(x.dtype()));
  // The 16-bit floats add in float32 and are rounded back once (the index checked above).
  if (!is_compute_dtype(x.dtype()))
    return index_add_impl(in_compute_dtype(x), dim, index, in_compute_dtype(src), false).to(x.dtype());
  auto [outer, n_d, inner] = line_geometry(xv.shape(), d);
  Tensor ic = index.contiguous();
  Tensor y = xv.detach().contiguous().clone();
  kernels::index_add_rows(x.device(), y, sv.detach().contiguous(), ic, outer, n, m, inner);
  y = y.reshape(x.shape());
  return record("IndexAddBackward", y, {x, src}, [is = save(ic), d, ss = src.shape()](const Tensor& g) -> TensorList {
    // x's gradient is g; src's is g read back at the index (checked by the forward).
    return {g, index_select_as(g, d, is.get(), "index_add", false).reshape(ss)};
  });
}

Tensor index_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src) {
  return index_add_impl(x, dim, index, src, true);
}

Tensor detail::index_add_in_range(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src) {
  return index_add_impl(x, dim, index, src, false);
}

Tensor embedding(const Tensor& weight, const Tensor& ids) {
  require_int64_index(ids, "embedding");
  MU_CHECK(weight.dim() == 2, "embedding: weight must be 2-D (num_embeddings, dim), got shape ",
           shape_str(weight.shape()));
  Shape out_shape = ids.shape();
  out_shape.push_back(weight.shape()[1]);
  // Rows of weight: index_select along dim 0, whose gradient adds rows back in order.
  return index_select_as(weight, 0, ids.reshape({-1}), "embedding").reshape(out_shape);
}

// ---------------------------------------------------------------- cumsum



// cumsum from the start (or, reversed, from the end); each is the other's gradient.
static Tensor cumsum_dir(const Tensor& x, int64_t dim, bool reverse) {
  const char* op = "cumsum";
  // As torch: bools and the narrow integers sum as int64 (and stay int64); the 16-bit
  // floats sum in float32 and round back, element by element.
  if (x.dtype() == kBool) return cumsum_dir(x.to(kInt64), dim, reverse);
  if (!is_compute_dtype(x.dtype())) {
    const Tensor y = cumsum_dir(in_compute_dtype(x), dim, reverse);
    return is_floating(x.dtype()) ? y.to(x.dtype()) : y;
  }
  Tensor xv = at_least_1d(x);
  int64_t d = wrap_dim(dim, x.dim(), op);  // x's own count in the message: a 0-dim x takes 0 and -1
  auto [outer, n_d, inner] = line_geometry(xv.shape(), d);
  Tensor xc = xv.detach().contiguous(), y = empty_like(xc);
  kernels::cumsum(x.device(), y, xc, outer, xv.shape()[size_t(d)], inner, reverse);
  y = y.reshape(x.shape());
  return record(reverse ? "ReverseCumsumBackward" : "CumsumBackward", y, {x},
                [d, reverse](const Tensor& g) -> TensorList { return {cumsum_dir(g, d, !reverse)}; });
}

Tensor cumsum(const Tensor& x, int64_t dim) { return cumsum_dir(x, dim, false); }

// ---------------------------------------------------------------- sort, topk



// The first k positions along dim in sorted order, and their values gathered from x.
static ValuesIndices sorted_prefix(const Tensor& x, int64_t dim, int64_t k, bool descending, const char* op) {
  MU_CHECK(x.dtype() != kBool, op, ": expected a number dtype, got bool (convert with .to(kInt64))");
  // The 16-bit floats and narrow integers are ordered as their exact widening (float32,
  // int64); the values are narrowed back, exactly.
  if (!is_compute_dtype(x.dtype())) {
    ValuesIndices w = sorted_prefix(in_compute_dtype(x), dim, k, descending, op);
    return {w.values.to(x.dtype()), w.indices};
  }
  Tensor xv = at_least_1d(x);
  int64_t d = wrap_dim(dim, x.dim(), op);  // x's own count in the message: a 0-dim x takes 0 and -1
  int64_t n = xv.shape()[size_t(d)];
  MU_CHECK(k >= 0 && k <= n, op, ": k = ", k, " is out of range for dimension ", d, " of size ", n);
  auto [outer, n_d, inner] = line_geometry(xv.shape(), d);
  Shape idx_shape = xv.shape();
  idx_shape[size_t(d)] = k;
  Tensor xc = xv.detach().contiguous(), idx = empty(idx_shape, TensorOptions(kInt64).device(x.device()));
  kernels::sort_indices(x.device(), idx, xc, outer, n, inner, k, descending);
  Tensor values = detail::gather_in_range(xv, d, idx);  // positions in [0, n) by construction
  // A 0-dim x gives 0-dim results, but for k = 0: nothing, of shape [0].
  if (x.dim() == 0 && k == 1) return {values.reshape({}), idx.reshape({})};
  return {values, idx};
}

ValuesIndices sort(const Tensor& x, int64_t dim, bool descending) {
  int64_t n = x.dim() == 0 ? 1 : x.shape()[size_t(wrap_dim(dim, x.dim(), "sort"))];
  return sorted_prefix(x, dim, n, descending, "sort");
}

ValuesIndices topk(const Tensor& x, int64_t k, int64_t dim, bool largest) {
  return sorted_prefix(x, dim, k, largest, "topk");
}

ValuesIndices Tensor::topk(int64_t k, int64_t dim, bool largest) const { return mu::topk(*this, k, dim, largest); }
Tensor Tensor::index_select(int64_t dim, const Tensor& index) const { return mu::index_select(*this, dim, index); }

}  // namespace mu
