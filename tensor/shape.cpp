#include "tensor/shape.h"

#include <ostream>

#include "tensor/checked.h"
#include "tensor/error.h"

namespace mu {

int64_t numel_of(const Shape& shape, const char* op) {
  // The product of the sizes with zeros read as ones must fit too: it is the largest
  // contiguous stride, which a tensor of zero elements still computes.
  int64_t n = 1, strides = 1;
  for (int64_t s : shape) {
    MU_CHECK(s >= 0, op, ": negative dimension ", s, " in shape ", shape_str(shape));
    strides = checked_mul(strides, s > 0 ? s : 1, op, ": shape ", ShapeText{shape}, " has too many elements");
    n *= s;  // cannot overflow: n <= strides, checked just above
  }
  return n;
}

Shape contiguous_strides(const Shape& shape) {
  Shape st(shape.size());
  int64_t acc = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    st[i] = acc;
    acc = checked_mul(acc, shape[i] > 0 ? shape[i] : 1, "shape ", ShapeText{shape}, " has too many elements");
  }
  return st;
}

std::string shape_str(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::ostream& operator<<(std::ostream& os, ShapeText s) { return os << shape_str(s.shape); }

int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op) {
  int64_t n = ndim == 0 ? 1 : ndim;  // a scalar accepts dim 0 and -1, as in PyTorch
  MU_CHECK(dim >= -n && dim < n, op, ": dimension ", dim, " out of range for a tensor with ",
           ndim, " dimension", ndim == 1 ? "" : "s", " (expected in [", -n, ", ", n - 1, "])");
  return dim < 0 ? dim + n : dim;
}

int64_t wrap_sized_dim(int64_t dim, int64_t ndim, const char* op) {
  MU_CHECK(ndim > 0, op, ": dimension ", dim, " was given but the tensor is 0-dimensional (it has no dimensions)");
  return wrap_dim(dim, ndim, op);
}

int64_t wrap_index(int64_t index, int64_t size, const char* op) {
  MU_CHECK(index >= -size && index < size, op, ": index ", index,
           " out of range for dimension of size ", size);
  return index < 0 ? index + size : index;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    MU_CHECK(da == db || da == 1 || db == 1, op, ": shapes ", shape_str(a), " and ", shape_str(b),
             " cannot be broadcast together (dimension ", i, ": ", da, " vs ", db, ")");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

Shape broadcast_strides(const Shape& shape, const Shape& strides, const Shape& target) {
  Shape out(target.size(), 0);
  size_t lead = target.size() - shape.size();
  for (size_t i = 0; i < shape.size(); ++i)
    out[lead + i] = (shape[i] == 1 && target[lead + i] != 1) ? 0 : strides[i];
  return out;
}

}  // namespace mu
