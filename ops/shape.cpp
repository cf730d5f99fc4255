// Views, which share storage with their input, and ops that join, split or mask whole
// tensors. A view's gradient is the inverse re-indexing of the output gradient.
#include <algorithm>
#include <numeric>
#include <optional>

#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "ops/ops.h"
#include "ops/pointwise.h"
#include "tensor/checked.h"

namespace mu {

using autograd::record;
using autograd::record_multi;
using autograd::TensorList;

// A view of x's storage with new geometry, recorded with `backward`.
static Tensor as_view(const Tensor& x, const Shape& shape, const Shape& strides, int64_t offset, const char* name,
                      autograd::BackwardFn backward) {
  Tensor v = make_view(x.storage(), shape, strides, offset, x.dtype());
  return record(name, v, {x}, std::move(backward));
}

// Fills -1 in a requested shape from the element count; throws on a mismatch.
static Shape infer_shape(const Shape& req, int64_t numel, const char* op, const Shape& from) {
  Shape s = req;
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      MU_CHECK(infer < 0, op, ": only one dimension can be -1, got shape ", shape_str(req));
      infer = int64_t(i);
    } else {
      MU_CHECK(s[i] >= 0, op, ": invalid size ", s[i], " in shape ", shape_str(req));
      known = checked_mul(known, s[i], op, ": shape ", ShapeText{req}, " has too many elements");
    }
  }
  if (infer >= 0) {
    MU_CHECK(known != 0 && numel % known == 0, op, ": shape ", shape_str(req), " is invalid for input of shape ",
             shape_str(from), " (", numel, " elements)");
    s[size_t(infer)] = numel / known;
  }
  MU_CHECK(numel_of(s) == numel, op, ": shape ", shape_str(req), " is invalid for input of shape ", shape_str(from),
           " (", numel, " elements)");
  return s;
}

// Strides that let `shape` view memory laid out as (old_shape, old_strides), if any:
// each run of new dims must map onto a run of old dims that is itself contiguous.
static std::optional<Shape> view_strides(const Shape& old_shape, const Shape& old_strides, const Shape& shape) {
  Shape st(shape.size());
  if (numel_of(old_shape) == 0 || old_shape.empty()) return contiguous_strides(shape);
  int64_t view_d = int64_t(shape.size()) - 1;
  int64_t chunk_base_stride = old_strides.empty() ? 1 : old_strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t d = int64_t(old_shape.size()) - 1; d >= 0; --d) {
    tensor_numel *= old_shape[size_t(d)];
    // At the start of a contiguous chunk of old dims (or the first dim): match new dims.
    if (d == 0 || (old_shape[size_t(d - 1)] != 1 &&
                   old_strides[size_t(d - 1)] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || shape[size_t(view_d)] == 1)) {
        st[size_t(view_d)] = view_numel * chunk_base_stride;
        view_numel *= shape[size_t(view_d)];
        --view_d;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (d > 0) {
        chunk_base_stride = old_strides[size_t(d - 1)];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return st;
}

Tensor Tensor::view(const Shape& req) const {
  Shape s = infer_shape(req, numel(), "view", shape());
  auto st = view_strides(shape(), strides(), s);
  MU_CHECK(st.has_value(), "view: shape ", shape_str(req), " is not compatible with the input's strides (shape ",
           shape_str(shape()), ", strides ", shape_str(strides()), "); use reshape(), which copies when needed");
  return as_view(*this, s, *st, storage_offset(), "ViewBackward",
                 [from = shape()](const Tensor& g) -> TensorList { return {g.reshape(from)}; });
}

Tensor Tensor::reshape(const Shape& req) const {
  Shape s = infer_shape(req, numel(), "reshape", shape());
  if (view_strides(shape(), strides(), s)) return view(s);
  return contiguous().view(s);
}

Tensor Tensor::permute(const Shape& dims) const {
  MU_CHECK(int64_t(dims.size()) == dim(), "permute: got ", dims.size(), " dims ", shape_str(dims), " for a tensor with ",
           dim(), " dimensions");
  Shape s(dims.size()), st(dims.size()), inverse(dims.size());
  std::vector<bool> used(dims.size(), false);
  for (size_t i = 0; i < dims.size(); ++i) {
    int64_t d = wrap_dim(dims[i], dim(), "permute");
    MU_CHECK(!used[size_t(d)], "permute: dimension ", dims[i], " repeated in ", shape_str(dims));
    used[size_t(d)] = true;
    s[i] = shape()[size_t(d)];
    st[i] = strides()[size_t(d)];
    inverse[size_t(d)] = int64_t(i);
  }
  return as_view(*this, s, st, storage_offset(), "PermuteBackward",
                 [inverse](const Tensor& g) -> TensorList { return {g.permute(inverse)}; });
}

Tensor Tensor::transpose(int64_t d0, int64_t d1) const {
  Shape perm(static_cast<size_t>(this->dim()));
  std::iota(perm.begin(), perm.end(), 0);
  if (dim() == 0) return permute(perm);
  std::swap(perm[size_t(wrap_dim(d0, dim(), "transpose"))], perm[size_t(wrap_dim(d1, dim(), "transpose"))]);
  return permute(perm);
}

Tensor Tensor::t() const {
  MU_CHECK(dim() <= 2, "t: expects a tensor with at most 2 dimensions, got shape ", shape_str(shape()),
           " (use transpose(d0, d1))");
  return dim() < 2 ? permute(dim() == 1 ? Shape{0} : Shape{}) : transpose(0, 1);
}

// Gradient of a slicing view: zeros of the input's shape with g written into the slice.
static Tensor scatter_into_zeros(const Tensor& g, const Shape& shape, const std::function<Tensor(const Tensor&)>& slicer) {
  Tensor z = zeros(shape, TensorOptions(g.dtype()).device(g.device()));
  slicer(z).copy_(g);
  return z;
}

Tensor Tensor::slice(int64_t d, int64_t start, int64_t end, int64_t step) const {
  d = wrap_sized_dim(d, dim(), "slice");
  MU_CHECK(step > 0, "slice: step must be positive, got ", step);
  int64_t n = shape()[size_t(d)];
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  Shape s = shape(), st = strides();
  // ceil((end - start) / step) without forming end - start + step - 1, which a huge step
  // would overflow.
  s[size_t(d)] = (end - start) / step + ((end - start) % step != 0);
  st[size_t(d)] = checked_mul(st[size_t(d)], step, "slice: stride of dimension ", d, " times step ", step);
  return as_view(*this, s, st, storage_offset() + start * strides()[size_t(d)], "SliceBackward",
                 [from = shape(), d, start, end, step](const Tensor& g) -> TensorList {
                   // The whole dim: the gradient is g itself, no zeros to fill and copy into.
                   if (g.shape() == from) return {g};
                   return {scatter_into_zeros(g, from, [&](const Tensor& z) { return z.slice(d, start, end, step); })};
                 });
}

Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
  d = wrap_sized_dim(d, dim(), "narrow");
  int64_t n = shape()[size_t(d)];
  if (start < 0 && start >= -n) start += n;
  // length <= n - start rather than start + length <= n: the sum may overflow.
  MU_CHECK(start >= 0 && start <= n && length >= 0 && length <= n - start, "narrow: start ", start, " and length ",
           length, " are out of bounds for dimension ", d, " of size ", n);
  return slice(d, start, start + length);
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  d = wrap_sized_dim(d, dim(), "select");
  int64_t i = wrap_index(index, shape()[size_t(d)], "select");
  Shape s = shape(), st = strides();
  s.erase(s.begin() + d);
  st.erase(st.begin() + d);
  return as_view(*this, s, st, storage_offset() + i * strides()[size_t(d)], "SelectBackward",
                 [from = shape(), d, i](const Tensor& g) -> TensorList {
                   // A dim of size 1 (einsum's single-entry batch): g with the dim put back, a view.
                   if (from[size_t(d)] == 1) return {g.unsqueeze(d)};
                   return {scatter_into_zeros(g, from, [&](const Tensor& z) { return z.select(d, i); })};
                 });
}

Tensor Tensor::expand(const Shape& req) const {
  MU_CHECK(req.size() >= size_t(dim()), "expand: cannot expand shape ", shape_str(shape()), " to fewer dimensions ",
           shape_str(req));
  size_t lead = req.size() - size_t(dim());
  Shape s(req.size()), st(req.size(), 0);
  for (size_t i = 0; i < req.size(); ++i) {
    if (i < lead) {
      MU_CHECK(req[i] >= 0, "expand: size -1 not allowed for a new leading dimension in ", shape_str(req));
      s[i] = req[i];
      continue;
    }
    int64_t have = shape()[i - lead];
    int64_t want = req[i] == -1 ? have : req[i];
    MU_CHECK(want >= 0, "expand: invalid size ", req[i], " for dimension ", i, " in ", shape_str(req));
    MU_CHECK(have == want || have == 1, "expand: the size of dimension ", i - lead, " (", have,
             ") must match the requested ", want, " or be 1 (expanding ", shape_str(shape()), " to ", shape_str(req), ")");
    s[i] = want;
    st[i] = have == want ? strides()[i - lead] : 0;
  }
  if (s == shape()) return *this;
  numel_of(s, "expand");  // refuses a shape whose element count overflows
  return as_view(*this, s, st, storage_offset(), "ExpandBackward",
                 [from = shape()](const Tensor& g) -> TensorList { return {sum_to(g, from)}; });
}

Tensor Tensor::squeeze() const {
  Shape s;
  for (int64_t v : shape())
    if (v != 1) s.push_back(v);
  return s == shape() ? *this : reshape(s);
}

Tensor Tensor::squeeze(int64_t d) const {
  d = wrap_dim(d, dim(), "squeeze");  // a 0-dim tensor takes 0 and -1 only, as in torch
  if (dim() == 0) return *this;
  if (shape()[size_t(d)] != 1) return *this;
  Shape s = shape();
  s.erase(s.begin() + d);
  return reshape(s);
}

Tensor Tensor::unsqueeze(int64_t d) const {
  d = wrap_dim(d, dim() + 1, "unsqueeze");
  Shape s = shape(), st = strides();
  int64_t stride = d < dim() ? strides()[size_t(d)] * shape()[size_t(d)] : 1;
  s.insert(s.begin() + d, 1);
  st.insert(st.begin() + d, stride);
  return as_view(*this, s, st, storage_offset(), "UnsqueezeBackward",
                 [from = shape()](const Tensor& g) -> TensorList { return {g.reshape(from)}; });
}

Tensor Tensor::flatten(int64_t start, int64_t end) const {
  if (dim() == 0) return reshape({1});
  start = wrap_dim(start, dim(), "flatten");
  end = wrap_dim(end, dim(), "flatten");
  MU_CHECK(start <= end, "flatten: start_dim ", start, " comes after end_dim ", end);
  Shape s(shape().begin(), shape().begin() + start);
  int64_t m = 1;
  for (int64_t d = start; d <= end; ++d) m *= shape()[size_t(d)];
  s.push_back(m);
  s.insert(s.end(), shape().begin() + end + 1, shape().end());
  return reshape(s);
}

// ---------------------------------------------------------------- join and split

Tensor cat(const std::vector<Tensor>& ts, int64_t dim) {
  MU_CHECK(!ts.empty(), "cat: expects a non-empty list of tensors");
  // torch's legacy rule: a 1-D tensor of size 0 joins tensors of any shape and adds
  // nothing (an accumulator that starts as empty({0})). The shape comes from the first
  // other tensor; if all are such, the result is one too.
  auto skipped = [](const Tensor& t) { return t.dim() == 1 && t.shape()[0] == 0; };
  size_t ref = 0;
  while (ref < ts.size() && skipped(ts[ref])) ++ref;
  if (ref == ts.size()) ref = 0;
  const Tensor& first = ts[ref];
  int64_t d = wrap_sized_dim(dim, first.dim(), "cat");
  Shape out_shape = first.shape();
  out_shape[size_t(d)] = 0;
  for (size_t i = 0; i < ts.size(); ++i) {
    const Tensor& t = ts[i];
    detail::require_same(first, t, "cat");
    if (i != ref && skipped(t)) continue;
    MU_CHECK(t.dim() == first.dim(), "cat: tensor ", i, " has ", t.dim(), " dimensions (shape ", shape_str(t.shape()),
             ") but tensor ", ref, " has ", first.dim(), " (shape ", shape_str(first.shape()), ")");
    for (int64_t k = 0; k < t.dim(); ++k)
      MU_CHECK(k == d || t.shape()[size_t(k)] == first.shape()[size_t(k)], "cat: sizes must match except in dimension ",
               d, ": tensor ", i, " has shape ", shape_str(t.shape()), ", tensor ", ref, " has ",
               shape_str(first.shape()));
    out_shape[size_t(d)] = checked_add(out_shape[size_t(d)], t.shape()[size_t(d)], "cat: sizes along dimension ", d);
  }
  Tensor out = empty(out_shape, TensorOptions(first.dtype()).device(first.device()));
  std::vector<int64_t> sizes;  // along d; -1 for a skipped tensor
  {
    NoGradGuard g;
    int64_t at = 0;
    for (size_t i = 0; i < ts.size(); ++i) {
      if (i != ref && skipped(ts[i])) {
        sizes.push_back(-1);
        continue;
      }
      int64_t n = ts[i].shape()[size_t(d)];
      out.narrow(d, at, n).copy_(ts[i]);
      sizes.push_back(n);
      at += n;
    }
  }
  return record("CatBackward", out, ts, [sizes, d](const Tensor& g) -> TensorList {
    TensorList grads;
    int64_t at = 0;
    for (int64_t n : sizes) {
      if (n < 0) {
        grads.push_back(zeros({0}, TensorOptions(g.dtype()).device(g.device())));
        continue;
      }
      grads.push_back(g.narrow(d, at, n));
      at += n;
    }
    return grads;
  });
}

Tensor stack(const std::vector<Tensor>& ts, int64_t dim) {
  MU_CHECK(!ts.empty(), "stack: expects a non-empty list of tensors");
  int64_t d = wrap_dim(dim, ts[0].dim() + 1, "stack");
  std::vector<Tensor> parts;
  for (size_t i = 0; i < ts.size(); ++i) {
    MU_CHECK(ts[i].shape() == ts[0].shape(), "stack: all tensors must have one shape; tensor ", i, " has ",
             shape_str(ts[i].shape()), ", tensor 0 has ", shape_str(ts[0].shape()));
    detail::require_same(ts[0], ts[i], "stack");  // dtype and device, named as stack's rather than cat's
    parts.push_back(ts[i].unsqueeze(d));
  }
  return cat(parts, d);
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  int64_t d = wrap_sized_dim(dim, x.dim(), "split");
  int64_t total = 0;
  for (int64_t s : sizes) {
    MU_CHECK(s >= 0, "split: negative section size ", s);
    total = checked_add(total, s, "split: section sizes");
  }
  MU_CHECK(total == x.shape()[size_t(d)], "split: section sizes add up to ", total, " but dimension ", d,
           " has size ", x.shape()[size_t(d)]);
  std::vector<Tensor> out;
  {
    // The pieces are plain views; the one node below records them all.
    NoGradGuard no_grad;
    int64_t at = 0;
    for (int64_t s : sizes) {
      out.push_back(x.narrow(d, at, s));
      at += s;
    }
  }
  // One node for all pieces: its backward joins their gradients with one cat (zeros for
  // a piece no gradient reached), where a node per piece would each fill an input-sized
  // tensor of zeros around its slice and the engine would sum those.
  return record_multi("SplitBackward", out, {x},
                      [d, sizes, shape = x.shape(), opts = TensorOptions(x.dtype()).device(x.device())](
                          const TensorList& g) -> TensorList {
                        TensorList parts;
                        for (size_t i = 0; i < sizes.size(); ++i) {
                          if (g[i].defined()) {
                            parts.push_back(g[i]);
                          } else {
                            Shape piece = shape;
                            piece[size_t(d)] = sizes[i];
                            parts.push_back(zeros(piece, opts));
                          }
                        }
                        return {cat(parts, d)};
                      });
}

std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim) {
  int64_t d = wrap_sized_dim(dim, x.dim(), "split");
  MU_CHECK(split_size > 0, "split: split_size must be positive, got ", split_size);
  int64_t n = x.shape()[size_t(d)];
  std::vector<int64_t> sizes;
  for (int64_t at = 0; at < n; at += split_size) sizes.push_back(std::min(split_size, n - at));
  if (n == 0) sizes.push_back(0);  // an empty dimension splits into one empty piece, as in PyTorch
  return split(x, sizes, d);
}

std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim) {
  MU_CHECK(chunks > 0, "chunk: number of chunks must be positive, got ", chunks);
  const int64_t d = wrap_sized_dim(dim, x.dim(), "chunk");
  const int64_t n = x.shape()[size_t(d)];
  // An empty dimension gives `chunks` empty pieces, as torch's chunk does (split would give
  // one): code that unpacks a fixed count (q, k, v of an empty batch) gets them all.
  if (n == 0) {
    MU_CHECK(chunks <= (int64_t(1) << 24), "chunk: ", chunks, " empty pieces of an empty dimension are too many");
    return split(x, std::vector<int64_t>(size_t(chunks), 0), d);
  }
  // ceil(n / chunks) without n + chunks - 1, which a huge chunk count would overflow.
  return split(x, std::max<int64_t>(1, n / chunks + (n % chunks != 0)), d);
}

// Keeps elements with (col - row) on the kept side of the diagonal k.
static Tensor triangle(const Tensor& x, int64_t k, bool lower) {
  const char* op = lower ? "tril" : "triu";
  MU_CHECK(x.dim() >= 2, op, ": expects a tensor with at least 2 dimensions, got shape ", shape_str(x.shape()));
  int64_t r = x.size(-2), c = x.size(-1);
  // col - row lies in [-(r - 1), c - 1]: a diagonal beyond keeps all or none, and one just
  // past that range says the same while it converts exactly (INT64_MAX does not).
  k = std::clamp<int64_t>(k, -r, c);
  const TensorOptions index(TensorOptions(kInt64).device(x.device()));
  Tensor rows = arange(r, index).reshape({r, 1}), cols = arange(c, index).reshape({1, c});
  Tensor keep = lower ? le(cols - rows, full({}, double(k), index)) : ge(cols - rows, full({}, double(k), index));
  return where(keep, x, zeros({}, TensorOptions(x.dtype()).device(x.device())));
}

Tensor tril(const Tensor& x, int64_t diagonal) { return triangle(x, diagonal, true); }
Tensor triu(const Tensor& x, int64_t diagonal) { return triangle(x, diagonal, false); }

}  // namespace mu
