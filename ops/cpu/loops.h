// The one iteration skeleton every elementwise CPU kernel is written on: walk N
// operands that share a (broadcast) shape, each with its own strides, handing the
// kernel one innermost run at a time so that its loop is a plain, vectorisable
// for-loop. Dimensions are coalesced first, and OpenMP splits the runs over threads
// when the tensor is large enough to pay for it.
#pragma once
#include <omp.h>

#include <array>
#include <cstdint>
#include <vector>

#include "tensor/shape.h"

namespace mu::cpu {

// The type sums are carried in: float32 sums in double so that a long sum's error does
// not grow with its length; bool counts in int64.
template <class T> struct Accumulator { using type = T; };
template <> struct Accumulator<float> { using type = double; };
template <> struct Accumulator<bool> { using type = int64_t; };
template <class T> using acc_t = typename Accumulator<T>::type;

// Below this many elements an op runs on one thread: thread start-up would cost more.
inline constexpr int64_t kParallelGrain = 32768;

template <size_t N>
struct StridedLayout {
  Shape shape;                        // coalesced iteration shape, innermost last
  std::array<Shape, N> strides;       // per operand, in elements
};

// Merges adjacent dimensions that every operand walks as one (stride[d] * size[d] ==
// stride[d-1]) and drops size-1 dimensions, so a dense tensor becomes one long run.
template <size_t N>
StridedLayout<N> coalesce(const Shape& shape, const std::array<Shape, N>& strides) {
  StridedLayout<N> out;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    bool merge = !out.shape.empty();
    for (size_t k = 0; k < N && merge; ++k)
      merge = out.strides[k].back() == strides[k][d] * shape[d];
    if (merge) {
      out.shape.back() *= shape[d];
      for (size_t k = 0; k < N; ++k) out.strides[k].back() = strides[k][d];
    } else {
      out.shape.push_back(shape[d]);
      for (size_t k = 0; k < N; ++k) out.strides[k].push_back(strides[k][d]);
    }
  }
  if (out.shape.empty()) {  // a scalar, or all dims of size 1
    out.shape.push_back(1);
    for (size_t k = 0; k < N; ++k) out.strides[k].push_back(0);
  }
  return out;
}

// Calls run(offsets, n, inner_strides) for every innermost run of the iteration space:
// offsets[k] is operand k's element offset at the run's start, n its length.
template <size_t N, class Run>
void for_each_run(const Shape& shape, const std::array<Shape, N>& strides, Run&& run) {
  StridedLayout<N> L = coalesce<N>(shape, strides);
  const int64_t nd = int64_t(L.shape.size());
  const int64_t inner = L.shape[nd - 1];
  std::array<int64_t, N> inner_st;
  for (size_t k = 0; k < N; ++k) inner_st[k] = L.strides[k][nd - 1];
  int64_t outer = 1;
  for (int64_t d = 0; d + 1 < nd; ++d) outer *= L.shape[d];
  if (outer * inner == 0) return;

  // Chunks of the (outer x inner) space: split the inner run too when there are few
  // outer rows, so that one long contiguous tensor still uses every thread.
  const int64_t total = outer * inner;
  int nthreads = total >= kParallelGrain ? omp_get_max_threads() : 1;
  if (omp_in_parallel()) nthreads = 1;

#pragma omp parallel num_threads(nthreads) if (nthreads > 1)
  {
    int tid = omp_get_thread_num(), nt = omp_get_num_threads();
    int64_t begin = total * tid / nt, end = total * (tid + 1) / nt;
    std::vector<int64_t> idx(nd > 1 ? nd - 1 : 1, 0);
    int64_t pos = begin;
    while (pos < end) {
      int64_t row = pos / inner, col = pos % inner;
      int64_t n = std::min(inner - col, end - pos);
      // Decompose the row number into the outer multi-index.
      std::array<int64_t, N> off{};
      int64_t r = row;
      for (int64_t d = nd - 2; d >= 0; --d) {
        int64_t i = r % L.shape[d];
        r /= L.shape[d];
        for (size_t k = 0; k < N; ++k) off[k] += i * L.strides[k][d];
      }
      for (size_t k = 0; k < N; ++k) off[k] += col * inner_st[k];
      run(off, n, inner_st);
      pos += n;
    }
  }
}

}  // namespace mu::cpu
