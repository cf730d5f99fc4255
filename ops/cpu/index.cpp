// CPU kernels of the indexing ops (declared in ops/kernels/index.h).
#include <omp.h>

#include <algorithm>
#include <array>
#include <vector>

#include "ops/cpu/loops.h"
#include "ops/functors.h"
#include "ops/kernels/index.h"

namespace mu::cpu {

// Calls body(offs) for every line of `shape` along `dim`, offs[k] being operand k's
// element offset at the line's start. Lines are independent (each touches its own
// elements of every operand), so they may run on several threads.
template <size_t N, class Body>
static void for_each_line(const Shape& shape, int64_t dim, const std::array<Shape, N>& strides, Body body) {
  int64_t len = shape[size_t(dim)], total = numel_of(shape);
  if (total == 0) return;
  int64_t lines = total / len, nd = int64_t(shape.size());
  bool par = total >= kParallelGrain && lines > 1 && !omp_in_parallel();
  parallel_for_if(lines, par, [&](int64_t l) {
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
  });
}

// out[..j..] = x[..index[..j..]..] along dim; out has index's shape. No bounds checks.
static void gather(const Tensor& out, const Tensor& x, int64_t dim, const Tensor& index) {
  const Shape &os = out.strides(), &is = index.strides(), &xs = x.strides();
  const int64_t* pi = index.data_ptr<int64_t>();
  int64_t m = index.shape()[size_t(dim)], osd = os[size_t(dim)], isd = is[size_t(dim)], xsd = xs[size_t(dim)];
  MU_DISPATCH_STORAGE(x.dtype(), "gather", [&] {  // data movement: every dtype, as on CUDA
    scalar_t* po = out.data_ptr<scalar_t>();
    const scalar_t* px = x.data_ptr<scalar_t>();
    for_each_line<3>(index.shape(), dim, {os, is, xs}, [&](const std::array<int64_t, 3>& off) {
      for (int64_t j = 0; j < m; ++j) po[off[0] + j * osd] = px[off[2] + pi[off[1] + j * isd] * xsd];
    });
  });
}

// out[..index[..j..]..] += src[..j..] along dim, in place on `out`. No bounds checks.
// A line of index writes only into the matching line of out, so lines never race, and
// within a line the additions run in a fixed order: the result is deterministic.
static void scatter_add(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src) {
  const Shape &os = out.strides(), &is = index.strides(), &ss = src.strides();
  const int64_t* pi = index.data_ptr<int64_t>();
  int64_t m = index.shape()[size_t(dim)], osd = os[size_t(dim)], isd = is[size_t(dim)], ssd = ss[size_t(dim)];
  MU_DISPATCH_NUMERIC(out.dtype(), "scatter_add", [&] {
    scalar_t* po = out.data_ptr<scalar_t>();
    const scalar_t* ps = src.data_ptr<scalar_t>();
    for_each_line<3>(index.shape(), dim, {os, is, ss}, [&](const std::array<int64_t, 3>& off) {
      for (int64_t j = 0; j < m; ++j) {
        scalar_t& o = po[off[0] + pi[off[1] + j * isd] * osd];
        o = fn::wrapping_add(o, ps[off[2] + j * ssd]);  // integers wrap, as torch's
      }
    });
  });
}

// x viewed as (outer, n, inner) dense, out as (outer, m, inner): out[o, j, :] = x[o, idx[j], :].
template <class T>
static void select_rows(const T* x, T* out, const int64_t* idx, int64_t outer, int64_t n, int64_t m, int64_t inner) {
  bool par = outer * m * inner >= kParallelGrain && outer * m > 1 && !omp_in_parallel();
  parallel_for_if(outer * m, par, [&](int64_t r) {
    int64_t o = r / m, j = r % m;
    const T* src = x + (o * n + idx[j]) * inner;
    T* dst = out + r * inner;
    for (int64_t i = 0; i < inner; ++i) dst[i] = src[i];
  });
}

// The reverse: grad (outer, n, inner) zeroed, grad[o, idx[j], :] += g[o, j, :]. Each
// thread owns a block of (o, column) pairs and adds every j into it in order, so no two
// threads write one element and the sums do not depend on the thread count.
template <class T>
static void add_rows(const T* g, T* grad, const int64_t* idx, int64_t outer, int64_t n, int64_t m, int64_t inner) {
  constexpr int64_t kBlock = 256;  // columns per task: long enough to vectorise
  int64_t col_blocks = (inner + kBlock - 1) / kBlock, tasks = outer * col_blocks;
  bool par = outer * m * inner >= kParallelGrain && tasks > 1 && !omp_in_parallel();
  parallel_for_if(tasks, par, [&](int64_t t) {
    int64_t o = t / col_blocks, c0 = (t % col_blocks) * kBlock, c1 = std::min(inner, c0 + kBlock);
    for (int64_t j = 0; j < m; ++j) {
      const T* src = g + (o * m + j) * inner;
      T* dst = grad + (o * n + idx[j]) * inner;
      for (int64_t i = c0; i < c1; ++i) dst[i] += src[i];
    }
  });
}

// Running sums of contiguous rows (cumsum over the last dim): each row's sum is a chain
// of dependent adds, one add's latency (4 cycles for double) an element, and kept in an
// array GCC stored and reloaded it each time as well. Eight rows run side by side, their
// chains interleaved in registers; each row still adds in its own order.
constexpr int64_t kScanRows = 8;
// Row r runs kScanSkew steps behind row r - 1: in rows of a power-of-two length the same
// step of each row falls on addresses equal modulo 4 KiB, whose loads the core then holds
// behind the other rows' stores ([1024, 4096] float32: 4.8 ms in step, 1.4 ms for rows
// of 4100).
constexpr int64_t kScanSkew = 16, kScanRamp = (kScanRows - 1) * kScanSkew;

// kScanRows rows of n from x to out; Reverse: from the end.
template <class T, bool Reverse>
static void cumsum_row_group(const T* x, T* out, int64_t n) {
  using A = acc_t<T>;
  A acc[kScanRows] = {};
  // Step k of row r is element k of the row, or n - 1 - k when Reverse.
  auto at = [n](int64_t r, int64_t k) { return r * n + (Reverse ? n - 1 - k : k); };
  for (int64_t s = 0; s < n + kScanRamp; ++s) {
    if (s >= kScanRamp && s < n) {
      for (int64_t r = 0; r < kScanRows; ++r) {  // a constant count: unrolled, acc in registers
        const int64_t i = at(r, s - r * kScanSkew);
        acc[r] = fn::wrapping_add(acc[r], A(x[i]));  // integers wrap, as torch's
        out[i] = T(acc[r]);
      }
    } else {  // the ramps: the rows that have started and not yet finished
      for (int64_t r = 0; r < kScanRows; ++r) {
        const int64_t k = s - r * kScanSkew;
        if (k < 0 || k >= n) continue;
        acc[r] = fn::wrapping_add(acc[r], A(x[at(r, k)]));
        out[at(r, k)] = T(acc[r]);
      }
    }
  }
}

template <class T>
static void cumsum_rows(const T* x, T* out, int64_t rows, int64_t n, bool reverse) {
  using A = acc_t<T>;
  // Tasks: groups of kScanRows rows, then each row left over alone (on its own thread
  // when there are few rows).
  const int64_t groups = rows / kScanRows, tasks = groups + rows % kScanRows;
  const bool par = rows * n >= kParallelGrain && tasks > 1 && !omp_in_parallel();
  parallel_for_if(tasks, par, [&](int64_t t) {
    if (t < groups) {
      const int64_t off = t * kScanRows * n;
      if (reverse) cumsum_row_group<T, true>(x + off, out + off, n);
      else cumsum_row_group<T, false>(x + off, out + off, n);
      return;
    }
    const int64_t r = groups * kScanRows + (t - groups);
    A acc = 0;
    for (int64_t s = 0; s < n; ++s) {
      const int64_t j = reverse ? n - 1 - s : s;
      acc = fn::wrapping_add(acc, A(x[r * n + j]));
      out[r * n + j] = T(acc);
    }
  });
}

// Running sums along the middle axis of x viewed as (outer, n, inner), dense; from the
// end when `reverse`. Tasks are (o, block of columns): each owns its outputs.
template <class T>
static void cumsum_lines(const T* x, T* out, int64_t outer, int64_t n, int64_t inner, bool reverse) {
  using A = acc_t<T>;
  if (inner == 1) return cumsum_rows(x, out, outer, n, reverse);
  constexpr int64_t kBlock = 256;
  int64_t col_blocks = (inner + kBlock - 1) / kBlock, tasks = outer * col_blocks;
  bool par = outer * n * inner >= kParallelGrain && tasks > 1 && !omp_in_parallel();
  parallel_for_if(tasks, par, [&](int64_t t) {
    int64_t o = t / col_blocks, c0 = (t % col_blocks) * kBlock, c1 = std::min(inner, c0 + kBlock);
    A acc[kBlock] = {};
    for (int64_t s = 0; s < n; ++s) {
      int64_t j = reverse ? n - 1 - s : s;
      const T* src = x + (o * n + j) * inner;
      T* dst = out + (o * n + j) * inner;
      for (int64_t i = c0; i < c1; ++i) {
        acc[i - c0] = fn::wrapping_add(acc[i - c0], A(src[i]));  // integers wrap, as torch's
        dst[i] = T(acc[i - c0]);
      }
    }
  });
}

// Strict order of (value, position) pairs: by value (NaN above every number, as in
// torch.sort), ties by position, which makes any sort with it stable. Always inlined:
// with a second caller in order_lines GCC left it out of line in partial_sort's loops
// (200 of 50257: 137 -> 209 us).
template <class T>
struct LineOrder {
  const T* v;
  int64_t st;
  bool descending;
  [[gnu::always_inline]] bool operator()(int64_t a, int64_t b) const {
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

// Lines with at least this many elements per one asked for take order_lines' one-pass
// selection.
constexpr int64_t kFewOfMany = 256;

// For every line of x (dense, (outer, n, inner)) along the middle axis, the positions
// of its first k elements in the order above, written to idx (outer, k, inner).
template <class T>
static void order_lines(const T* x, int64_t* idx, int64_t outer, int64_t n, int64_t inner, int64_t k, bool descending) {
  int64_t lines = outer * inner;
  bool par = lines * n >= kParallelGrain && lines > 1 && !omp_in_parallel();
  const bool few = k > 0 && k * kFewOfMany <= n;
  parallel_for_with(
      lines, par ? omp_get_max_threads() : 1,
      // One scratch line per thread: the k kept positions, or the whole line's order. (A
      // whole line for k of many, zeroed every call, took a third of a sampling step's
      // top-k over 50257 logits.)
      [&] { return std::vector<int64_t>(static_cast<size_t>(few ? k : n)); },
      [&](std::vector<int64_t>& perm, int64_t l) {
        int64_t o = l / inner, i = l % inner;
        const T* line = x + o * n * inner + i;
        LineOrder<T> less{line, inner, descending};
        if (few) {
          // Few of many (top-k sampling over a vocabulary): one pass, each position first
          // compared with the k-th best so far and inserted in order only when it beats
          // it. The order is total (ties by position), so these are partial_sort's k. A
          // line of 50257: k = 1 141 -> 85 us, k = 50 150 -> 100 us; k = 200 took 239 us
          // against partial_sort's 172 (insertions), hence the limit.
          int64_t kept = 0;
          T worst{};  // the k-th best value so far, once k are kept
          for (int64_t j = 0; j < n; ++j) {
            if (kept == k) {
              // A later position beats the k-th best only by value (ties go to the earlier
              // one): larger (smaller when ascending), or a NaN over a number when
              // descending, a number over a NaN when ascending (LineOrder). Compared here
              // without LineOrder's position lookups.
              const T y = line[j * inner];
              const bool beats = descending ? (y > worst || (y != y && worst == worst))
                                            : (y < worst || (worst != worst && y == y));
              if (!beats) continue;
            }
            int64_t at = kept < k ? kept++ : k - 1;  // full: the k-th best drops out
            for (; at > 0 && less(j, perm[size_t(at - 1)]); --at) perm[size_t(at)] = perm[size_t(at - 1)];
            perm[size_t(at)] = j;
            if (kept == k) worst = line[perm[size_t(k - 1)] * inner];
          }
        } else {
          for (int64_t j = 0; j < n; ++j) perm[size_t(j)] = j;
          if (k == n)
            std::sort(perm.begin(), perm.end(), less);
          else
            std::partial_sort(perm.begin(), perm.begin() + k, perm.end(), less);
        }
        int64_t* dst = idx + o * k * inner + i;
        for (int64_t j = 0; j < k; ++j) dst[j * inner] = perm[size_t(j)];
      });
}

static void index_select(const Tensor& out, const Tensor& x, const Tensor& index, int64_t outer, int64_t n, int64_t m,
                         int64_t inner) {
  MU_DISPATCH_STORAGE(x.dtype(), "index_select", [&] {  // every dtype, as on CUDA
    select_rows(x.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), index.data_ptr<int64_t>(), outer, n, m, inner);
  });
}

static void index_add_rows(const Tensor& grad, const Tensor& g, const Tensor& index, int64_t outer, int64_t n,
                           int64_t m, int64_t inner) {
  MU_DISPATCH_FLOAT(g.dtype(), "index_select_backward", [&] {
    add_rows(g.data_ptr<scalar_t>(), grad.data_ptr<scalar_t>(), index.data_ptr<int64_t>(), outer, n, m, inner);
  });
}

static void cumsum(const Tensor& out, const Tensor& x, int64_t outer, int64_t n, int64_t inner, bool reverse) {
  MU_DISPATCH_NUMERIC(x.dtype(), "cumsum", [&] {
    cumsum_lines(x.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), outer, n, inner, reverse);
  });
}

static void sort_indices(const Tensor& idx, const Tensor& x, int64_t outer, int64_t n, int64_t inner, int64_t k,
                         bool descending) {
  MU_DISPATCH_NUMERIC(x.dtype(), "sort", [&] {
    order_lines(x.data_ptr<scalar_t>(), idx.data_ptr<int64_t>(), outer, n, inner, k, descending);
  });
}

MU_REGISTER_KERNEL(kernels::gather, DeviceType::CPU, gather);
MU_REGISTER_KERNEL(kernels::scatter_add, DeviceType::CPU, scatter_add);
MU_REGISTER_KERNEL(kernels::index_select, DeviceType::CPU, index_select);
MU_REGISTER_KERNEL(kernels::index_add_rows, DeviceType::CPU, index_add_rows);
MU_REGISTER_KERNEL(kernels::cumsum, DeviceType::CPU, cumsum);
MU_REGISTER_KERNEL(kernels::sort_indices, DeviceType::CPU, sort_indices);

}  // namespace mu::cpu
