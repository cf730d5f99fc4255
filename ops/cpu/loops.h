// The one iteration skeleton every elementwise CPU kernel is written on: walk N
// operands that share a (broadcast) shape, each with its own strides, handing the
// kernel one innermost run at a time so that its loop is a plain, vectorisable
// for-loop. Dimensions are coalesced first, and OpenMP splits the runs over threads
// when the tensor is large enough to pay for it (ops/cpu/parallel.h).
#pragma once
#include <omp.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "ops/cpu/parallel.h"
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

// Dims shorter than this are not worth a tile or a run of their own.
inline constexpr int64_t kMinSide = 8;

// Each operand's element offset at multi-index `index` of dims [0, end) other than `skip`
// (row-major, the last of them fastest): the start of one run of a walk below.
template <size_t N>
std::array<int64_t, N> offsets_at(const StridedLayout<N>& L, int64_t index, int64_t end, int64_t skip = -1) {
  std::array<int64_t, N> off{};
  for (int64_t d = end - 1; d >= 0; --d) {
    if (d == skip) continue;
    const int64_t i = index % L.shape[d];
    index /= L.shape[d];
    for (size_t k = 0; k < N; ++k) off[k] += i * L.strides[k][d];
  }
  return off;
}

// A transposing walk (see for_each_run): the dim j, other than the innermost, along
// which an operand that strides the innermost dim is dense; -1 when there is none or the
// two dims are too short to tile.
template <size_t N>
int64_t transposed_dim(const StridedLayout<N>& L) {
  const int64_t nd = int64_t(L.shape.size());
  if (nd < 2 || L.shape[nd - 1] < kMinSide) return -1;
  for (size_t k = 0; k < N; ++k) {
    const int64_t s = L.strides[k][nd - 1];
    if (s == 0 || s == 1 || s == -1) continue;
    for (int64_t d = nd - 2; d >= 0; --d)
      if ((L.strides[k][d] == 1 || L.strides[k][d] == -1) && L.shape[d] >= kMinSide) return d;
  }
  return -1;
}

// for_each_run over tiles of dims j and the innermost: every operand's runs stay along
// the innermost dim, but 16 of them (consecutive j) are walked per tile of 16 columns,
// so that an operand read (or written) across the innermost dim touches the same 16
// cache lines 16 times in a row instead of a new line per element. A batched transpose
// (a transposing copy, or an add of a tensor and a transposed view) runs at the speed of
// the cache instead of the speed of memory latency.
template <size_t N, class Run>
void for_each_tile_run(const StridedLayout<N>& L, int64_t j, Run&& run) {
  constexpr int64_t kTile = 16;
  const int64_t nd = int64_t(L.shape.size());
  const int64_t inner = L.shape[nd - 1], rows = L.shape[j];
  std::array<int64_t, N> inner_st, row_st;
  for (size_t k = 0; k < N; ++k) {
    inner_st[k] = L.strides[k][nd - 1];
    row_st[k] = L.strides[k][j];
  }
  // Work items: (every other dim's index, tile of rows); each walks all column tiles.
  int64_t batch = 1;
  for (int64_t d = 0; d + 1 < nd; ++d)
    if (d != j) batch *= L.shape[d];
  const int64_t row_tiles = (rows + kTile - 1) / kTile, items = batch * row_tiles;
  const int64_t total = batch * rows * inner;
  int nthreads = total >= kParallelGrain ? omp_get_max_threads() : 1;
  if (omp_in_parallel()) nthreads = 1;

  parallel_for(items, nthreads, [&](int64_t item) {
    // The item's base offsets: its tile of rows, then its index over the other dims.
    const int64_t r0 = (item % row_tiles) * kTile;
    const std::array<int64_t, N> base = offsets_at(L, item / row_tiles, nd - 1, j);
    const int64_t r1 = std::min(rows, r0 + kTile);
    for (int64_t c0 = 0; c0 < inner; c0 += kTile) {
      const int64_t n = std::min(kTile, inner - c0);
      for (int64_t r = r0; r < r1; ++r) {
        std::array<int64_t, N> off;
        for (size_t k = 0; k < N; ++k) off[k] = base[k] + r * row_st[k] + c0 * inner_st[k];
        run(off, n, inner_st);
      }
    }
  });
}

// A short innermost dim (under kMinSide) walked as an outer one when an operand is dense
// along a longer dim, which becomes the run (the longest such dim); for_each_short_dim_run
// then walks it. The copy of a tensor-ring core's gradient, (149, 768, 4) from a
// (4, 149, 768) permute, took 114k runs of 4 elements with an index decomposition each
// (0.68 ms for 458k floats; 0.23 ms with the dim moved).
template <size_t N>
bool move_dense_dim_inward(StridedLayout<N>& L) {
  const int64_t nd = int64_t(L.shape.size());
  if (nd < 2 || L.shape[nd - 1] >= kMinSide) return false;
  int64_t best = -1;
  for (int64_t d = 0; d + 1 < nd; ++d)
    for (size_t k = 0; k < N; ++k)
      if ((L.strides[k][d] == 1 || L.strides[k][d] == -1) && L.shape[d] >= kMinSide &&
          (best < 0 || L.shape[d] > L.shape[best]))
        best = d;
  if (best < 0) return false;
  L.shape.push_back(L.shape[best]);
  L.shape.erase(L.shape.begin() + best);
  for (size_t k = 0; k < N; ++k) {
    L.strides[k].push_back(L.strides[k][best]);
    L.strides[k].erase(L.strides[k].begin() + best);
  }
  return true;
}

// The walk of a layout that move_dense_dim_inward reordered to (outer..., s, inner), s
// the short former innermost dim: items of a few outer rows each, every item walking its
// rows once per index of s. Each operand plane (one index of s) is then read in long
// sequential stretches, and the item's share of the other operand, written s times at a
// stride of up to s, stays in cache between the passes. With the s index inside the
// rows, s streams far apart advanced together: the TR core gradient's copy above, its
// source just written by a product on the other core, took 0.65-1.2 ms on 2 threads
// (0.2 ms on one); 1.9 ms per call in the TR layer's step, 0.38 ms walked so.
template <size_t N, class Run>
void for_each_short_dim_run(const StridedLayout<N>& L, Run& run) {
  const int64_t nd = int64_t(L.shape.size()), inner = L.shape[nd - 1], s = L.shape[nd - 2];
  std::array<int64_t, N> inner_st, s_st;
  for (size_t k = 0; k < N; ++k) {
    inner_st[k] = L.strides[k][nd - 1];
    s_st[k] = L.strides[k][nd - 2];
  }
  int64_t outer = 1;
  for (int64_t d = 0; d + 2 < nd; ++d) outer *= L.shape[d];
  if (outer * s * inner == 0) return;
  const int64_t block = std::max<int64_t>(1, kParallelGrain / (s * inner)), items = (outer + block - 1) / block;
  int nthreads = outer * s * inner >= kParallelGrain ? omp_get_max_threads() : 1;
  if (omp_in_parallel()) nthreads = 1;
  parallel_for(items, nthreads, [&](int64_t item) {
    const int64_t o1 = std::min(outer, (item + 1) * block);
    for (int64_t c = 0; c < s; ++c)
      for (int64_t o = item * block; o < o1; ++o) {
        // The row's offsets: its outer multi-index, then the index c of s.
        std::array<int64_t, N> off = offsets_at(L, o, nd - 2);
        for (size_t k = 0; k < N; ++k) off[k] += c * s_st[k];
        run(off, inner, inner_st);
      }
  });
}

// Calls run(offsets, n, inner_strides) for every innermost run of the iteration space:
// offsets[k] is operand k's element offset at the run's start, n its length. Runs come
// in no particular order (threads; with `free_order`, tiles when an operand is
// transposed): each element is visited exactly once. `free_order` also lets a short
// innermost dim be walked as an outer one (move_dense_dim_inward). Tiling pays for a copy (a
// transposing copy of (128, 49, 128) floats: 1.1-2.6 ms -> 0.5-0.9 ms on one thread) but
// not for a binary op with a transposed operand, which ran 3 times slower tiled (2.5 ms
// -> 7.4 ms for an add of that shape; the cause was not found), so only single-input
// maps (copies, conversions, unary functions) ask.
template <size_t N, class Run>
void for_each_run(const Shape& shape, const std::array<Shape, N>& strides, Run&& run, bool free_order = false) {
  StridedLayout<N> L = coalesce<N>(shape, strides);
  if (free_order && move_dense_dim_inward(L)) return for_each_short_dim_run(L, run);
  const int64_t nd = int64_t(L.shape.size());
  const int64_t inner = L.shape[nd - 1];
  std::array<int64_t, N> inner_st;
  for (size_t k = 0; k < N; ++k) inner_st[k] = L.strides[k][nd - 1];
  int64_t outer = 1;
  for (int64_t d = 0; d + 1 < nd; ++d) outer *= L.shape[d];
  if (outer * inner == 0) return;
  if (free_order)
    if (const int64_t j = transposed_dim(L); j >= 0) return for_each_tile_run(L, j, run);

  // Chunks of the (outer x inner) space: split the inner run too when there are few
  // outer rows, so that one long contiguous tensor still uses every thread.
  const int64_t total = outer * inner;
  int nthreads = total >= kParallelGrain ? omp_get_max_threads() : 1;
  if (omp_in_parallel()) nthreads = 1;

  parallel_team(nthreads, [&](int tid, int nt) {
    int64_t begin = total * tid / nt, end = total * (tid + 1) / nt;
    int64_t pos = begin;
    while (pos < end) {
      int64_t row = pos / inner, col = pos % inner;
      int64_t n = std::min(inner - col, end - pos);
      std::array<int64_t, N> off = offsets_at(L, row, nd - 1);
      for (size_t k = 0; k < N; ++k) off[k] += col * inner_st[k];
      run(off, n, inner_st);
      pos += n;
    }
  });
}

}  // namespace mu::cpu
