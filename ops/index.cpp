// Indexing ops: gather/scatter_add along a dim, index_select and embedding, cumsum,
// sort and topk. Every index is checked before a kernel runs (a kernel may run on
// several threads, where an error cannot be thrown). Sort, topk and max(dim) compute
// only indices; their values are a gather, whose gradient is a scatter_add.
#include <algorithm>
#include <array>
#include <cmath>

#include "autograd/node.h"
#include "ops/cpu/loops.h"
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
  detail::require_cpu(index, op);
}

// Every index must lie in [0, size); negative indices are refused, as in torch.gather.
static void check_bounds(const Tensor& index, int64_t size, int64_t dim, const char* op) {
  Tensor ic = index.contiguous();
  const int64_t* p = ic.data_ptr<int64_t>();
  for (int64_t i = 0, n = ic.numel(); i < n; ++i)
    MU_CHECK(p[i] >= 0 && p[i] < size, op, ": index ", p[i], " is out of bounds for dimension ", dim, " with size ",
             size);
}

// A 0-dim tensor is treated as shape [1], so every op has a dim to work along.
static Tensor at_least_1d(const Tensor& t) { return t.dim() == 0 ? t.reshape({1}) : t; }

// ---------------------------------------------------------------- the line walk

// Calls body(offs) for every line of `shape` along `dim`, offs[k] being operand k's
// element offset at the line's start. Lines are independent (each touches its own
// elements of every operand), so they may run on several threads.
template <size_t N, class Body>
static void for_each_line(const Shape& shape, int64_t dim, const std::array<Shape, N>& strides, Body body) {
  int64_t len = shape[size_t(dim)], total = numel_of(shape);
  if (total == 0) return;
  int64_t lines = total / len, nd = int64_t(shape.size());
  bool par = total >= cpu::kParallelGrain && lines > 1 && !omp_in_parallel();
#pragma omp parallel for if (par) schedule(static)
  for (int64_t l = 0; l < lines; ++l) {
    std::array<int64_t, N> off{};
    // Decompose the line number into the multi-index of every dim but `dim`.
    int64_t r = l;
    for (int64_t d = nd - 1; d >= 0; --d) {
      if (d == dim) continue;
      int64_t i = r % shape[size_t(d)];
      r /= shape[size_t(d)];
      for (size_t k = 0; k < N; ++k) off[k] += i * strides[k][size_t(d)];
    }
    body(off);
  }
}

// ---------------------------------------------------------------- gather, scatter_add

namespace cpu {
// out[..j..] = x[..index[..j..]..] along dim; out has index's shape. No bounds checks.
static Tensor gather_kernel(const Tensor& x, int64_t dim, const Tensor& index) {
  Tensor out = empty(index.shape(), x.dtype());
  const Shape &os = out.strides(), &is = index.strides(), &xs = x.strides();
  const int64_t* pi = index.data_ptr<int64_t>();
  int64_t m = index.shape()[size_t(dim)], osd = os[size_t(dim)], isd = is[size_t(dim)], xsd = xs[size_t(dim)];
  MU_DISPATCH_ALL(x.dtype(), "gather", [&] {
    scalar_t* po = out.data_ptr<scalar_t>();
    const scalar_t* px = x.data_ptr<scalar_t>();
    for_each_line<3>(index.shape(), dim, {os, is, xs}, [&](const std::array<int64_t, 3>& off) {
      for (int64_t j = 0; j < m; ++j) po[off[0] + j * osd] = px[off[2] + pi[off[1] + j * isd] * xsd];
    });
  });
  return out;
}

// out[..index[..j..]..] += src[..j..] along dim, in place on `out`. No bounds checks.
// A line of index writes only into the matching line of out, so lines never race, and
// within a line the additions run in a fixed order: the result is deterministic.
static void scatter_add_kernel(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src) {
  const Shape &os = out.strides(), &is = index.strides(), &ss = src.strides();
  const int64_t* pi = index.data_ptr<int64_t>();
  int64_t m = index.shape()[size_t(dim)], osd = os[size_t(dim)], isd = is[size_t(dim)], ssd = ss[size_t(dim)];
  MU_DISPATCH_NUMERIC(out.dtype(), "scatter_add", [&] {
    scalar_t* po = out.data_ptr<scalar_t>();
    const scalar_t* ps = src.data_ptr<scalar_t>();
    for_each_line<3>(index.shape(), dim, {os, is, ss}, [&](const std::array<int64_t, 3>& off) {
      for (int64_t j = 0; j < m; ++j) po[off[0] + pi[off[1] + j * isd] * osd] += ps[off[2] + j * ssd];
    });
  });
}
}  // namespace cpu

// Zeros of `shape` with src scatter-added along dim at index (the gradient of a gather).
static Tensor scatter_add_into_zeros(const Shape& shape, int64_t dim, const Tensor& index, const Tensor& src) {
  Tensor out = zeros(shape, src.dtype());
  cpu::scatter_add_kernel(out, dim, index, src);
  return out;
}

Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) {
  require_int64_index(index, "gather");
  detail::require_cpu(x, "gather");
  MU_CHECK(index.dim() == x.dim(), "gather: index has ", index.dim(), " dimensions (shape ", shape_str(index.shape()),
           ") but the input has ", x.dim(), " (shape ", shape_str(x.shape()), "); they must match");
  Tensor xv = at_least_1d(x), iv = at_least_1d(index);
  int64_t d = wrap_dim(dim, xv.dim(), "gather");
  for (int64_t k = 0; k < xv.dim(); ++k)
    MU_CHECK(k == d || iv.shape()[size_t(k)] <= xv.shape()[size_t(k)], "gather: index of shape ",
             shape_str(index.shape()), " is larger than the input of shape ", shape_str(x.shape()), " in dimension ", k,
             " (only dimension ", d, " may differ)");
  check_bounds(iv, xv.shape()[size_t(d)], d, "gather");
  Tensor y = cpu::gather_kernel(xv.detach(), d, iv).reshape(index.shape());
  return record("GatherBackward", y, {x}, [is = save(iv), sx = x.shape(), sxv = xv.shape(), d](const Tensor& g) -> TensorList {
    Tensor iv = is.get();
    return {scatter_add_into_zeros(sxv, d, iv, g.reshape(iv.shape())).reshape(sx)};
  });
}

Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src) {
  const char* op = "scatter_add";
  require_int64_index(index, op);
  detail::require_cpu(x, op);
  detail::require_same(x, src, op);
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
  Tensor out = xv.detach().clone();
  cpu::scatter_add_kernel(out, d, iv, sv.detach());
  out = out.reshape(x.shape());
  return record("ScatterAddBackward", out, {x, src},
                [is = save(iv), ss = src.shape(), ssv = sv.shape(), d](const Tensor& g) -> TensorList {
    Tensor iv = is.get();
    // src's gradient is g gathered at index; src elements beyond index's extent were
    // never added, so theirs is zero.
    Tensor gs = cpu::gather_kernel(at_least_1d(g), d, iv);
    if (gs.shape() != ssv) {
      Tensor full_gs = zeros(ssv, g.dtype());
      Tensor corner = full_gs;
      for (int64_t k = 0; k < int64_t(ssv.size()); ++k) corner = corner.narrow(k, 0, gs.shape()[size_t(k)]);
      corner.copy_(gs);
      gs = full_gs;
    }
    return {g, gs.reshape(ss)};
  });
}

// ---------------------------------------------------------------- index_select, embedding

namespace cpu {
// x viewed as (outer, n, inner) dense, out as (outer, m, inner): out[o, j, :] = x[o, idx[j], :].
template <class T>
static void select_rows(const T* x, T* out, const int64_t* idx, int64_t outer, int64_t n, int64_t m, int64_t inner) {
  bool par = outer * m * inner >= kParallelGrain && outer * m > 1 && !omp_in_parallel();
#pragma omp parallel for if (par) schedule(static)
  for (int64_t r = 0; r < outer * m; ++r) {
    int64_t o = r / m, j = r % m;
    const T* src = x + (o * n + idx[j]) * inner;
    T* dst = out + r * inner;
    for (int64_t i = 0; i < inner; ++i) dst[i] = src[i];
  }
}

// The reverse: grad (outer, n, inner) zeroed, grad[o, idx[j], :] += g[o, j, :]. Each
// thread owns a block of (o, column) pairs and adds every j into it in order, so no two
// threads write one element and the sums do not depend on the thread count.
template <class T>
static void add_rows(const T* g, T* grad, const int64_t* idx, int64_t outer, int64_t n, int64_t m, int64_t inner) {
  constexpr int64_t kBlock = 256;  // columns per task: long enough to vectorise
  int64_t col_blocks = (inner + kBlock - 1) / kBlock, tasks = outer * col_blocks;
  bool par = outer * m * inner >= kParallelGrain && tasks > 1 && !omp_in_parallel();
#pragma omp parallel for if (par) schedule(static)
  for (int64_t t = 0; t < tasks; ++t) {
    int64_t o = t / col_blocks, c0 = (t % col_blocks) * kBlock, c1 = std::min(inner, c0 + kBlock);
    for (int64_t j = 0; j < m; ++j) {
      const T* src = g + (o * m + j) * inner;
      T* dst = grad + (o * n + idx[j]) * inner;
      for (int64_t i = c0; i < c1; ++i) dst[i] += src[i];
    }
  }
}
}  // namespace cpu

// Sizes before and after `dim`: x viewed as (outer, x.size(dim), inner).
static std::pair<int64_t, int64_t> outer_inner(const Shape& s, int64_t dim) {
  int64_t outer = 1, inner = 1;
  for (int64_t k = 0; k < int64_t(s.size()); ++k) {
    if (k < dim) outer *= s[size_t(k)];
    if (k > dim) inner *= s[size_t(k)];
  }
  return {outer, inner};
}

// index_select, with the op named in errors (embedding reports itself).
static Tensor index_select_as(const Tensor& x, int64_t dim, const Tensor& index, const char* op) {
  require_int64_index(index, op);
  detail::require_cpu(x, op);
  MU_CHECK(index.dim() <= 1, op, ": index must be 1-D, got shape ", shape_str(index.shape()));
  Tensor xv = at_least_1d(x);
  int64_t d = wrap_dim(dim, xv.dim(), op);
  int64_t n = xv.shape()[size_t(d)], m = index.numel();
  check_bounds(index, n, d, op);
  auto [outer, inner] = outer_inner(xv.shape(), d);
  Shape out_shape = xv.shape();
  out_shape[size_t(d)] = m;
  Tensor xc = xv.detach().contiguous(), ic = index.contiguous();
  Tensor y = empty(out_shape, x.dtype());
  MU_DISPATCH_ALL(x.dtype(), op, [&] {
    cpu::select_rows(xc.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), ic.data_ptr<int64_t>(), outer, n, m, inner);
  });
  if (x.dim() == 0) y = y.reshape(index.dim() == 0 ? Shape{} : Shape{m});  // torch keeps a scalar a scalar
  return record("IndexSelectBackward", y, {x},
                [is = save(ic), sx = x.shape(), sxv = xv.shape(), outer, inner, n, m](const Tensor& g) -> TensorList {
    Tensor gc = g.contiguous(), grad = zeros(sxv, g.dtype());
    MU_DISPATCH_FLOAT(g.dtype(), "index_select_backward", [&] {
      cpu::add_rows(gc.data_ptr<scalar_t>(), grad.data_ptr<scalar_t>(), is.get().data_ptr<int64_t>(), outer, n, m,
                    inner);
    });
    return {grad.reshape(sx)};
  });
}

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  return index_select_as(x, dim, index, "index_select");
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


namespace cpu {
// Running sums along the middle axis of x viewed as (outer, n, inner), dense; from the
// end when `reverse`. Tasks are (o, block of columns): each owns its outputs.
template <class T>
static void cumsum_lines(const T* x, T* out, int64_t outer, int64_t n, int64_t inner, bool reverse) {
  using A = acc_t<T>;
  constexpr int64_t kBlock = 256;
  int64_t col_blocks = (inner + kBlock - 1) / kBlock, tasks = outer * col_blocks;
  bool par = outer * n * inner >= kParallelGrain && tasks > 1 && !omp_in_parallel();
#pragma omp parallel for if (par) schedule(static)
  for (int64_t t = 0; t < tasks; ++t) {
    int64_t o = t / col_blocks, c0 = (t % col_blocks) * kBlock, c1 = std::min(inner, c0 + kBlock);
    A acc[kBlock] = {};
    for (int64_t s = 0; s < n; ++s) {
      int64_t j = reverse ? n - 1 - s : s;
      const T* src = x + (o * n + j) * inner;
      T* dst = out + (o * n + j) * inner;
      for (int64_t i = c0; i < c1; ++i) {
        acc[i - c0] += A(src[i]);
        dst[i] = T(acc[i - c0]);
      }
    }
  }
}
}  // namespace cpu

// cumsum from the start (or, reversed, from the end); each is the other's gradient.
static Tensor cumsum_dir(const Tensor& x, int64_t dim, bool reverse) {
  const char* op = "cumsum";
  detail::require_cpu(x, op);
  // Bools sum as integers, as in torch.
  Tensor xv = at_least_1d(x.dtype() == kBool ? x.to(kInt64) : x);
  int64_t d = wrap_dim(dim, xv.dim(), op);
  auto [outer, inner] = outer_inner(xv.shape(), d);
  Tensor xc = xv.detach().contiguous(), y = empty(xv.shape(), xv.dtype());
  MU_DISPATCH_NUMERIC(xv.dtype(), op, [&] {
    cpu::cumsum_lines(xc.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), outer, xv.shape()[size_t(d)], inner, reverse);
  });
  y = y.reshape(x.shape());
  return record(reverse ? "ReverseCumsumBackward" : "CumsumBackward", y, {x},
                [d, reverse](const Tensor& g) -> TensorList { return {cumsum_dir(g, d, !reverse)}; });
}

Tensor cumsum(const Tensor& x, int64_t dim) { return cumsum_dir(x, dim, false); }

// ---------------------------------------------------------------- sort, topk

// Strict order of (value, position) pairs: by value (NaN above every number, as in
// torch.sort), ties by position, which makes any sort with it stable.
namespace {
template <class T>
struct LineOrder {
  const T* v;
  int64_t st;
  bool descending;
  bool operator()(int64_t a, int64_t b) const {
    T x = v[a * st], y = v[b * st];
    bool xn = x != x, yn = y != y;
    if (xn || yn) {
      if (xn && yn) return a < b;
      return descending ? xn : yn;  // NaN first when descending, last when ascending
    }
    if (x != y) return descending ? x > y : x < y;
    return a < b;
  }
};
}  // namespace

namespace cpu {
// For every line of x (dense, (outer, n, inner)) along the middle axis, the positions
// of its first k elements in the order above, written to idx (outer, k, inner).
template <class T>
static void order_lines(const T* x, int64_t* idx, int64_t outer, int64_t n, int64_t inner, int64_t k, bool descending) {
  int64_t lines = outer * inner;
  bool par = lines * n >= kParallelGrain && lines > 1 && !omp_in_parallel();
#pragma omp parallel if (par)
  {
    std::vector<int64_t> perm(static_cast<size_t>(n));  // one scratch line per thread
#pragma omp for schedule(static)
    for (int64_t l = 0; l < lines; ++l) {
      int64_t o = l / inner, i = l % inner;
      LineOrder<T> less{x + o * n * inner + i, inner, descending};
      for (int64_t j = 0; j < n; ++j) perm[size_t(j)] = j;
      if (k == n)
        std::sort(perm.begin(), perm.end(), less);
      else
        std::partial_sort(perm.begin(), perm.begin() + k, perm.end(), less);
      int64_t* dst = idx + o * k * inner + i;
      for (int64_t j = 0; j < k; ++j) dst[j * inner] = perm[size_t(j)];
    }
  }
}
}  // namespace cpu

// The first k positions along dim in sorted order, and their values gathered from x.
static ValuesIndices sorted_prefix(const Tensor& x, int64_t dim, int64_t k, bool descending, const char* op) {
  detail::require_cpu(x, op);
  Tensor xv = at_least_1d(x);
  int64_t d = wrap_dim(dim, xv.dim(), op);
  int64_t n = xv.shape()[size_t(d)];
  MU_CHECK(k >= 0 && k <= n, op, ": k = ", k, " is out of range for dimension ", d, " of size ", n);
  auto [outer, inner] = outer_inner(xv.shape(), d);
  Shape idx_shape = xv.shape();
  idx_shape[size_t(d)] = k;
  Tensor xc = xv.detach().contiguous(), idx = empty(idx_shape, kInt64);
  MU_DISPATCH_NUMERIC(xv.dtype(), op, [&] {
    cpu::order_lines(xc.data_ptr<scalar_t>(), idx.data_ptr<int64_t>(), outer, n, inner, k, descending);
  });
  Tensor values = gather(xv, d, idx);
  if (x.dim() == 0) return {values.reshape({}), idx.reshape({})};
  return {values, idx};
}

ValuesIndices sort(const Tensor& x, int64_t dim, bool descending) {
  int64_t n = x.dim() == 0 ? 1 : x.shape()[size_t(wrap_dim(dim, x.dim(), "sort"))];
  return sorted_prefix(x, dim, n, descending, "sort");
}

ValuesIndices topk(const Tensor& x, int64_t k, int64_t dim, bool largest) {
  return sorted_prefix(x, dim, k, largest, "topk");
}

}  // namespace mu
