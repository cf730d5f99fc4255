// Shapes, strides and the small index arithmetic every op needs.
#pragma once
#include <array>
#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

namespace mu {

using Shape = std::vector<int64_t>;

// The element count of `shape`; a negative size, or a count (or largest stride) beyond
// int64, is an error naming `op` and the shape.
int64_t numel_of(const Shape& shape, const char* op = "shape");
// Row-major strides (in elements) for a dense tensor of this shape.
Shape contiguous_strides(const Shape& shape);
// "[2, 3, 4]"
std::string shape_str(const Shape& shape);
// A shape as a part of a message that is built only when something fails (the context of
// checked_mul and checked_add): streamed as shape_str would write it, so that the common
// case, nothing wrong, costs no string. Holds a reference: use it within the expression.
struct ShapeText {
  const Shape& shape;
};
std::ostream& operator<<(std::ostream& os, ShapeText s);
// Maps a possibly negative dim into [0, ndim); throws naming `op`, the dim and the rank.
int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op);
// wrap_dim for ops that read or cut a dimension (size, select, narrow, cat, split...): a
// 0-dim tensor has no dimension to read, which is an error naming `op` (PyTorch's
// "dimension specified as 0 but tensor has no dimensions"), not a read past the shape.
int64_t wrap_sized_dim(int64_t dim, int64_t ndim, const char* op);
// Maps a possibly negative index into [0, size); throws naming `op`, index and size.
int64_t wrap_index(int64_t index, int64_t size, const char* op);
// NumPy/PyTorch broadcasting of two shapes; throws with both shapes when incompatible.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);
// Strides that view a tensor of (shape, strides) as broadcast to `target` (stride 0 on
// expanded dims). `shape` must be broadcastable to `target`.
Shape broadcast_strides(const Shape& shape, const Shape& strides, const Shape& target);

// Sizes before and after `dim` (already wrapped): the tensor seen as (outer, n, inner).
// A 0-dim tensor is one line of one element.
inline std::array<int64_t, 3> line_geometry(const Shape& shape, int64_t dim) {
  int64_t outer = 1, inner = 1;
  for (int64_t k = 0; k < int64_t(shape.size()); ++k) {
    if (k < dim) outer *= shape[size_t(k)];
    if (k > dim) inner *= shape[size_t(k)];
  }
  return {outer, shape.empty() ? 1 : shape[size_t(dim)], inner};
}

}  // namespace mu
