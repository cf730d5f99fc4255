// Strided addressing on the device: a tensor's sizes and strides packed by value into a
// kernel's arguments, and the element offset of a row-major position. nvcc only.
//
// Finding a position's coordinates takes a division per dim, and a 64-bit division is
// dozens of instructions: enough to make a bandwidth-bound kernel (a bias add, a
// transposing copy) several times slower than its memory traffic. So strided() merges
// the dims every operand walks as one (a dense row of a broadcast bias: one dim instead
// of three), and when every position fits in 31 bits each division is a 32-bit
// multiply-high and a shift by a precomputed magic number (prepare()).
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
  bool small = false;  // every position < 2^31: the magic-number divisions below apply
  int64_t sizes[kMaxDims] = {};
  int64_t strides[N][kMaxDims] = {};
  // n / sizes[d] == (umulhi(n, magic[d]) + n) >> shift[d] for 0 <= n < 2^31: the
  // round-up reciprocal method (Granlund and Montgomery), magic = 2^32 (2^shift - s) / s
  // + 1 with 2^shift the least power of two >= s.
  uint32_t magic[kMaxDims] = {};
  uint8_t shift[kMaxDims] = {};

  // Fills `small` and the magic numbers from nd and sizes: call after setting them.
  void prepare() {
    int64_t total = 1;
    small = true;
    for (int d = 0; d < nd; ++d) {
      const int64_t s = sizes[d];
      if (s <= 0 || s > INT32_MAX) {
        small = false;
        return;
      }
      total = total > INT32_MAX / s ? int64_t(INT32_MAX) + 1 : total * s;
      int sh = 0;
      while ((int64_t(1) << sh) < s) ++sh;
      shift[d] = uint8_t(sh);
      magic[d] = uint32_t(((uint64_t(1) << 32) * ((uint64_t(1) << sh) - uint64_t(s))) / uint64_t(s) + 1);
    }
    small = total <= INT32_MAX;
  }

  // The offsets of row-major position i in every operand.
  __device__ __forceinline__ void offsets(int64_t i, int64_t (&off)[N]) const {
    for (int k = 0; k < N; ++k) off[k] = 0;
    if (small) {
      uint32_t n = uint32_t(i);
      for (int d = nd - 1; d >= 0; --d) {
        const uint32_t q = (__umulhi(n, magic[d]) + n) >> shift[d];
        const int64_t r = int64_t(n - q * uint32_t(sizes[d]));
        n = q;
        for (int k = 0; k < N; ++k) off[k] += r * strides[k][d];
      }
      return;
    }
    for (int d = nd - 1; d >= 0; --d) {
      const int64_t s = sizes[d];
      const int64_t q = i / s;
      const int64_t r = i - q * s;
      i = q;
      for (int k = 0; k < N; ++k) off[k] += r * strides[k][d];
    }
  }
};

// The iteration space `shape` with operand k read through t[k]'s strides broadcast to it,
// its dims merged where every operand allows (size-1 dims dropped; a dim folded into
// the next inner one when each operand's stride there is the inner stride times the
// inner size).
// (TensorT: Tensor; the host emulation of experiments/cuda_emulation passes its own.)
template <int N, class TensorT = Tensor>
Strided<N> strided(const Shape& shape, const TensorT* const (&t)[N], const char* op) {
  MU_CHECK(shape.size() <= size_t(kMaxDims), op, " on CUDA: at most ", kMaxDims, " dims are supported, got ",
           shape.size(), " (shape ", shape_str(shape), ")");
  Shape st[N];
  for (int k = 0; k < N; ++k) st[k] = broadcast_strides(t[k]->shape(), t[k]->strides(), shape);
  Strided<N> g;
  // Walk the dims from the innermost out, keeping a merged dim at g.nd - 1.
  int64_t rev_sizes[kMaxDims];
  int64_t rev_strides[N][kMaxDims];
  int m = 0;
  for (int d = int(shape.size()) - 1; d >= 0; --d) {
    const int64_t s = shape[size_t(d)];
    if (s == 1) continue;
    bool merge = m > 0;
    for (int k = 0; k < N && merge; ++k)
      merge = st[k][size_t(d)] == rev_strides[k][m - 1] * rev_sizes[m - 1];
    if (merge) {
      rev_sizes[m - 1] *= s;
      continue;
    }
    rev_sizes[m] = s;
    for (int k = 0; k < N; ++k) rev_strides[k][m] = st[k][size_t(d)];
    ++m;
  }
  g.nd = m;
  for (int d = 0; d < m; ++d) {
    g.sizes[d] = rev_sizes[m - 1 - d];
    for (int k = 0; k < N; ++k) g.strides[k][d] = rev_strides[k][m - 1 - d];
  }
  g.prepare();
  return g;
}

}  // namespace mu::cuda
