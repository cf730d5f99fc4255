// The CPU GEMM's dot-product paths (gemm_parts.h says who calls them): a dot product, a
// product with a 1-row or 1-column operand (gemv), and a few rows of A against a
// transposed B read in place (gemm_few_rows).
#include <algorithm>

#include "ops/cpu/gemm_parts.h"
#include "tensor/error.h"

namespace mu::cpu::gemm_detail {

// ---------------------------------------------------------------- matrix-vector

// Sum of x[i * incx] * y[i * incy] for i < n, with several vector accumulators when both
// are contiguous (a single scalar accumulator would serialise on the add latency, and
// GCC may not reorder a float sum by itself).
template <class T>
T dot(int64_t n, const T* x, int64_t incx, const T* y, int64_t incy) {
  if (incx == 1 && incy == 1) {
    using V = typename Vec<T>::type;
    constexpr int W = Vec<T>::width;
    V acc[4] = {};
    int64_t i = 0;
    for (; i + 4 * W <= n; i += 4 * W)
      for (int u = 0; u < 4; ++u) {
        V a, b;
        __builtin_memcpy(&a, x + i + u * W, sizeof(V));
        __builtin_memcpy(&b, y + i + u * W, sizeof(V));
        acc[u] += a * b;
      }
    for (; i + W <= n; i += W) {
      V a, b;
      __builtin_memcpy(&a, x + i, sizeof(V));
      __builtin_memcpy(&b, y + i, sizeof(V));
      acc[0] += a * b;
    }
    V v = (acc[0] + acc[1]) + (acc[2] + acc[3]);
    T s = 0;
    for (int w = 0; w < W; ++w) s += v[w];
    for (; i < n; ++i) s += x[i] * y[i];
    return s;
  }
  T s = 0;
  for (int64_t i = 0; i < n; ++i) s += x[i * incx] * y[i * incy];
  return s;
}

// y (length L, stride ys) = or += Mat (L x K, strides ls, ks) · x (length K, stride xs).
// The product with a 1-row or 1-column operand, where a GEMM tile would mostly multiply
// padding. Rows of Mat contiguous: one dot product per output. Columns of Mat contiguous:
// y accumulates whole columns (axpy), which vectorises along y.
template <class T>
void gemv(int64_t L, int64_t K, const T* mat, int64_t ls, int64_t ks, const T* x, int64_t xs, T* y, int64_t ys,
          bool accumulate, int nt) {
  if (ls == 1 && ks != 1) {
    split_range(L, nt, [&](int64_t l0, int64_t l1) {
      // This thread's outputs, summed over every column in a dense local buffer.
      T* acc = packed_a_buffer<T>(std::max<int64_t>(1, l1 - l0));
      for (int64_t l = l0; l < l1; ++l) acc[l - l0] = T(0);
      for (int64_t k = 0; k < K; ++k) {
        const T xk = x[k * xs];
        const T* col = mat + k * ks;
        for (int64_t l = l0; l < l1; ++l) acc[l - l0] += col[l] * xk;
      }
      for (int64_t l = l0; l < l1; ++l) y[l * ys] = accumulate ? y[l * ys] + acc[l - l0] : acc[l - l0];
    });
    return;
  }
  split_range(L, nt, [&](int64_t l0, int64_t l1) {
    for (int64_t l = l0; l < l1; ++l) {
      const T v = dot(K, mat + l * ls, ks, x, xs);
      y[l * ys] = accumulate ? y[l * ys] + v : v;
    }
  });
}

// ---------------------------------------------------------------- few rows, transposed B

// Products of 1 to kFewRows rows of A against a transposed B (x · wᵀ with w's rows
// contiguous: a Linear layer's weight, the language-model head at a few sequences). The
// blocked path would pack the whole of B for them, a transposing copy of the weight
// written and read again for a handful of rows. Here each column of C is w's row j read
// once, in place, against the R rows of A: R x U vectors of partial sums along the depth
// (U independent chains per row when R is small, to cover the multiply-add's latency),
// whose lanes are added at the end. Consecutive columns are consecutive rows of w, so the
// weight is read as one stream. The rows of A are read again for every column, so the
// depth goes in chunks whose R rows of A stay in L1 (kFewRowsChunkBytes), each chunk's
// sums added onto C. Measured (2 threads, Zen 4, float32, one weight; medians of three
// runs), against the previous kernel (W columns at a time, W rows of w transposed in
// registers): GPT-2 mini's head (256 -> 50257) at 2, 4 and 8 rows 1.97 -> 1.04,
// 2.22 -> 1.21, 2.49 -> 1.8-2.7 ms; a 3072 -> 768 Linear 162 -> 82, 226 -> 133,
// 304 -> 298 us; 768 -> 3072 155 -> 72, 206 -> 119, 280 -> 266 us. Up to kFewRows rows
// (gemm_parts.h).
// Rows of A per pass over a block of w (dot_columns' register tile): past 8 rows the
// partial sums would not fit in the registers with their chains. 9 to 16 rows take two
// groups over w's rows while they are in cache: at 12 and 16 rows the shapes above and a
// 256 -> 1024 Linear took 0.45-0.87 of the packed path's time (the head 2.2 and 3.3 ms
// against 5.0 and 6.4); at 24 rows two of the four were slower, at 32 three.
constexpr int64_t kFewRowsGroup = 8;
// The columns a thread's range is taken in: their rows of w (one depth chunk of each)
// kept in L2 while every group of rows passes over them.
constexpr int64_t kFewRowsBlockBytes = 256 * 1024;
// 16 KB of A rows per depth chunk, half of Zen 4's L1: at 24 KB (or no chunks) a 3072 ->
// 768 Linear took 106 instead of 82 us at 2 rows, 150-220 instead of 128 at 4.
constexpr int64_t kFewRowsChunkBytes = 16 * 1024;

namespace {

// W depths of one row of B as a vector of T, the first n <= W of them read, the rest
// zero; a bfloat16 B (autocast's weights, gemm_bf16_weight) widened in registers
// (load_as).
template <class T, class TB>
inline typename Vec<T>::type load_depths(const TB* src, int64_t n) {
  constexpr int W = Vec<T>::width;
  if constexpr (std::is_same_v<T, TB>) {
    return n == W ? load(src) : load_first(src, n);
  } else {
    if (n == W) return load_as<T>(src);
    TB line[W] = {};
    std::copy(src, src + n, line);
    return load_as<T>(line);
  }
}

// Columns [j0, j1) of C (R rows) = or += A · B over depths [0, K), B(k, j) at
// bt[j * ldb + k] of type TB (T, or bfloat16 for a float32 product: load_depths), A's
// rows contiguous (row stride a_rs). The bias, when given, is added as C is written.
template <class T, int R, int U, class TB>
void dot_columns(int64_t j0, int64_t j1, int64_t K, const T* A, int64_t a_rs, const TB* bt, int64_t ldb, T* C,
                 int64_t c_rs, int64_t c_cs, bool accumulate, Addend<T> bias) {
  using V = typename Vec<T>::type;
  constexpr int W = Vec<T>::width;
  for (int64_t j = j0; j < j1; ++j) {
    const TB* col = bt + j * ldb;
    V acc[R][U] = {};
    int64_t p0 = 0;
    for (; p0 + U * W <= K; p0 += U * W)
#pragma GCC unroll 8
      for (int u = 0; u < U; ++u) {
        const V b = load_depths<T>(col + p0 + u * W, W);
#pragma GCC unroll 8
        for (int m = 0; m < R; ++m) acc[m][u] += load<T>(A + m * a_rs + p0 + u * W) * b;
      }
    for (; p0 < K; p0 += W) {  // fewer than U vectors of depth left, the last maybe partial
      const int64_t depth = std::min<int64_t>(W, K - p0);
      const V b = load_depths<T>(col + p0, depth);
#pragma GCC unroll 8
      for (int m = 0; m < R; ++m) acc[m][0] += load_depths<T>(A + m * a_rs + p0, depth) * b;
    }
#pragma GCC unroll 8
    for (int m = 0; m < R; ++m) {
      V v = acc[m][0];
      for (int u = 1; u < U; ++u) v += acc[m][u];
      const T sum = lane_sum<T>(v);
      T& dst = C[m * c_rs + j * c_cs];
      dst = accumulate ? dst + sum : sum + (bias ? bias.get(m, j) : T(0));
    }
  }
}

// dot_columns for R = M rows, U chains per row: 4 for 1 or 2 rows, 2 up to 6, 1 for 7
// and 8 (R x U accumulators, at most 12 of the 32 vector registers).
template <class T, class TB>
void dot_columns(int64_t M, int64_t j0, int64_t j1, int64_t K, const T* A, int64_t a_rs, const TB* bt, int64_t ldb,
                 T* C, int64_t c_rs, int64_t c_cs, bool accumulate, Addend<T> bias) {
  switch (M) {
#define MU_FEW_ROWS(R, U) \
  case R: return dot_columns<T, R, U, TB>(j0, j1, K, A, a_rs, bt, ldb, C, c_rs, c_cs, accumulate, bias);
    MU_FEW_ROWS(1, 4) MU_FEW_ROWS(2, 4) MU_FEW_ROWS(3, 2) MU_FEW_ROWS(4, 2)
    MU_FEW_ROWS(5, 2) MU_FEW_ROWS(6, 2) MU_FEW_ROWS(7, 1) MU_FEW_ROWS(8, 1)
#undef MU_FEW_ROWS
  }
  MU_FAIL("gemm: a few-row product called with ", M, " rows, outside [1, ", kFewRowsGroup, "]");
}

}  // namespace

// C (M x N, 1 <= M <= kFewRows) = or += A · B for B(k, j) at bt[j * ldb + k], N >= W,
// K >= W: threads take contiguous ranges of columns. Within a range, blocks of columns
// (their rows of w kept in L2, kFewRowsBlockBytes) are taken by every depth chunk, and
// within a chunk by every group of at most kFewRowsGroup rows of A, so that w is read from
// memory once however many groups there are. A with non-unit column stride is first
// copied dense (M x K values, next to B's N x K). Each element of C is summed in the same
// order on any number of threads.
template <class T, class TB>
void gemm_few_rows(int64_t M, int64_t N, int64_t K, const T* A, int64_t a_rs, int64_t a_cs, const TB* bt,
                   int64_t ldb, T* C, int64_t c_rs, int64_t c_cs, bool accumulate, int nt, Addend<T> bias) {
  constexpr int W = Vec<T>::width;
  if (a_cs != 1) {
    A = dense_rows(M, K, A, a_rs, a_cs, packed_a_buffer<T>(M * K));
    a_rs = K;
  }
  // Rows in groups of equal size (within one), each at most kFewRowsGroup.
  const int64_t groups = (M + kFewRowsGroup - 1) / kFewRowsGroup;
  const int64_t group_rows = (M + groups - 1) / groups;
  // Equal chunks of whole vectors, each at most kFewRowsChunkBytes of a group's rows of A.
  const int64_t chunks = (group_rows * K * int64_t(sizeof(T)) + kFewRowsChunkBytes - 1) / kFewRowsChunkBytes;
  const int64_t kc = ((K + chunks - 1) / chunks + W - 1) / W * W;
  const int64_t cb = std::max<int64_t>(W, kFewRowsBlockBytes / (kc * int64_t(sizeof(TB))));
  split_range(N, nt, [&](int64_t j0, int64_t j1) {
    for (int64_t jb = j0; jb < j1; jb += cb)
      for (int64_t k0 = 0; k0 < K; k0 += kc)
        for (int64_t i0 = 0; i0 < M; i0 += group_rows)
          dot_columns<T, TB>(std::min(group_rows, M - i0), jb, std::min(j1, jb + cb), std::min(kc, K - k0),
                             A + i0 * a_rs + k0, a_rs, bt + k0, ldb, C + i0 * c_rs, c_rs, c_cs, accumulate || k0 > 0,
                             k0 > 0 ? Addend<T>{} : bias.at(i0, 0));
  });
}

template float dot<float>(int64_t, const float*, int64_t, const float*, int64_t);
template double dot<double>(int64_t, const double*, int64_t, const double*, int64_t);
template void gemv<float>(int64_t, int64_t, const float*, int64_t, int64_t, const float*, int64_t, float*, int64_t,
                          bool, int);
template void gemv<double>(int64_t, int64_t, const double*, int64_t, int64_t, const double*, int64_t, double*,
                           int64_t, bool, int);
template void gemm_few_rows<float, float>(int64_t, int64_t, int64_t, const float*, int64_t, int64_t, const float*,
                                          int64_t, float*, int64_t, int64_t, bool, int, Addend<float>);
template void gemm_few_rows<double, double>(int64_t, int64_t, int64_t, const double*, int64_t, int64_t,
                                            const double*, int64_t, double*, int64_t, int64_t, bool, int,
                                            Addend<double>);
template void gemm_few_rows<float, bfloat16_t>(int64_t, int64_t, int64_t, const float*, int64_t, int64_t,
                                               const bfloat16_t*, int64_t, float*, int64_t, int64_t, bool, int,
                                               Addend<float>);

}  // namespace mu::cpu::gemm_detail
