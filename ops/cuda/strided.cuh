// Strided addressing on the device: a tensor's sizes and strides packed by value into a
// kernel's arguments, and the element offset of a row-major position. nvcc only.
#pragma once
#include <cstdint>

#include "tensor/error.h"
#include "tensor/shape.h"
#include "tensor/tensor.h"

namespace mu::cuda {

// Tensors of more dims are refused with an error; the models stay far below.
constexpr int kMaxDims = 10;

// The sizes of an iteration space and the strides (in elements) of up to N operands
// over it; a broadcast operand has stride 0 along its expanded dims.
template <int N>
struct Strided {
  int nd = 0;
  int64_t sizes[kMaxDims] = {};
  int64_t strides[N][kMaxDims] = {};

  // The offsets of row-major position i in every operand.
  __device__ __forceinline__ void offsets(int64_t i, int64_t (&off)[N]) const {
    for (int k = 0; k < N; ++k) off[k] = 0;
    for (int d = nd - 1; d >= 0; --d) {
      const int64_t s = sizes[d];
      const int64_t q = i / s;
      const int64_t r = i - q * s;
      i = q;
      for (int k = 0; k < N; ++k) off[k] += r * strides[k][d];
    }
  }
};

// The iteration space `shape` with operand k read through t[k]'s strides broadcast to it.
template <int N>
Strided<N> strided(const Shape& shape, const Tensor* const (&t)[N], const char* op) {
  MU_CHECK(shape.size() <= size_t(kMaxDims), op, " on CUDA: at most ", kMaxDims, " dims are supported, got ",
           shape.size(), " (shape ", shape_str(shape), ")");
  Strided<N> g;
  g.nd = int(shape.size());
  for (int d = 0; d < g.nd; ++d) g.sizes[d] = shape[size_t(d)];
  for (int k = 0; k < N; ++k) {
    const Shape st = broadcast_strides(t[k]->shape(), t[k]->strides(), shape);
    for (int d = 0; d < g.nd; ++d) g.strides[k][d] = st[size_t(d)];
  }
  return g;
}

}  // namespace mu::cuda
