// The CPU GEMM's paths without packing (gemm_parts.h says who calls them): small products,
// whose B stays in L2 while register blocks of rows of A pass over it, summed over the
// whole depth; very shallow ones (tiny_depth_rows); and tiny products (a tensor ring's
// per-token chains), a few dozen instructions each, with masked loads and stores.
#include <algorithm>

#include "ops/cpu/gemm_parts.h"
#include "tensor/error.h"

namespace mu::cpu::gemm_detail {
namespace {

// ---------------------------------------------------------------- small products

// The store of one vector of accumulated C (W columns from column j of row `dst`): added
// to C when accumulating, else plus the bias, if any. A whole vector is one unaligned
// store; a partial one (n < W lanes, or a strided C) is stored lane by lane.
template <class T>
inline void store_small(T* dst, int64_t c_cs, int64_t i, int64_t j, int64_t n, typename Vec<T>::type v,
                        bool accumulate, Addend<T> bias) {
  using V = typename Vec<T>::type;
  if (n == Vec<T>::width && c_cs == 1) {
    if (accumulate) {
      V old;
      __builtin_memcpy(&old, dst, sizeof(V));
      v += old;
    } else if (bias) {
      v += bias.vec(i, j);
    }
    __builtin_memcpy(dst, &v, sizeof(V));
  } else {
    for (int64_t w = 0; w < n; ++w)
      dst[w * c_cs] = accumulate ? dst[w * c_cs] + v[w] : v[w] + (bias ? bias.get(i, j + w) : T(0));
  }
}

// R rows of C = or += R rows of A · B, B row-major (unit column stride), R <= 6.
// Columns go two vectors at a time while two whole vectors remain: R x 2 register
// accumulators, each step of depth loading two vectors of B and broadcasting R values of
// A (R + 2 loads for 2R multiply-adds; one vector at a time it was R + 1 loads for R,
// and these products were load-bound: an MLP-Mixer's token products, 64 x 128 over 49,
// ran at 48 GFLOP/s). The accumulators are independent of each other, so the FMAs
// overlap instead of waiting on one another. The remaining columns go one vector at a
// time; the last, partial vector (N not a multiple of W) reads `tail`, a zero-padded
// copy of those columns with row stride W, so it is a vector loop too; only its valid
// lanes are stored.
template <class T, int R>
void small_rows(int64_t N, int64_t K, const T* A, int64_t a_rs, int64_t a_cs, const T* B, int64_t b_rs,
                const T* tail, T* C, int64_t c_rs, int64_t c_cs, bool accumulate, Addend<T> bias) {
  static_assert(R <= 6, "R x 2 accumulators, 2 vectors of B and a broadcast must fit 16 registers");
  using V = typename Vec<T>::type;
  constexpr int W = Vec<T>::width;
  int64_t j = 0;
  for (; j + 2 * W <= N; j += 2 * W) {
    V acc[R][2];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = V{};
    for (int64_t k = 0; k < K; ++k) {
      V b0, b1;
      __builtin_memcpy(&b0, B + k * b_rs + j, sizeof(V));
      __builtin_memcpy(&b1, B + k * b_rs + j + W, sizeof(V));
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const V a = splat(A[r * a_rs + k * a_cs]);
        acc[r][0] += a * b0;
        acc[r][1] += a * b1;
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      store_small<T>(C + r * c_rs + j * c_cs, c_cs, r, j, W, acc[r][0], accumulate, bias);
      store_small<T>(C + r * c_rs + (j + W) * c_cs, c_cs, r, j + W, W, acc[r][1], accumulate, bias);
    }
  }
  for (; j < N; j += W) {
    const int64_t n = std::min<int64_t>(W, N - j);
    const T* b = n == W ? B + j : tail;
    const int64_t bs = n == W ? b_rs : W;
    V acc[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[r] = V{};
    for (int64_t k = 0; k < K; ++k) {
      V bv;
      __builtin_memcpy(&bv, b + k * bs, sizeof(V));
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[r] += splat(A[r * a_rs + k * a_cs]) * bv;
    }
    for (int r = 0; r < R; ++r) store_small<T>(C + r * c_rs + j * c_cs, c_cs, r, j, n, acc[r], accumulate, bias);
  }
}

// Rows of C are taken kSmallRows at a time (small_rows' R), the last few 4, 2, 1.
constexpr int64_t kSmallRows = 6;

// Rows [i0, i1) of C = or += A · B, B row-major: blocks of 6 rows, then 4, 2, 1.
template <class T>
void small_row_range(int64_t i0, int64_t i1, int64_t N, int64_t K, const T* A, int64_t a_rs, int64_t a_cs,
                     const T* B, int64_t b_rs, const T* tail, T* C, int64_t c_rs, int64_t c_cs, bool accumulate,
                     Addend<T> bias) {
  int64_t i = i0;
  for (; i + kSmallRows <= i1; i += kSmallRows)
    small_rows<T, kSmallRows>(N, K, A + i * a_rs, a_rs, a_cs, B, b_rs, tail, C + i * c_rs, c_rs, c_cs, accumulate,
                              bias.at(i, 0));
  if (i + 4 <= i1) {
    small_rows<T, 4>(N, K, A + i * a_rs, a_rs, a_cs, B, b_rs, tail, C + i * c_rs, c_rs, c_cs, accumulate,
                     bias.at(i, 0));
    i += 4;
  }
  if (i + 2 <= i1) {
    small_rows<T, 2>(N, K, A + i * a_rs, a_rs, a_cs, B, b_rs, tail, C + i * c_rs, c_rs, c_cs, accumulate,
                     bias.at(i, 0));
    i += 2;
  }
  if (i < i1)
    small_rows<T, 1>(N, K, A + i * a_rs, a_rs, a_cs, B, b_rs, tail, C + i * c_rs, c_rs, c_cs, accumulate,
                     bias.at(i, 0));
}

// R rows of C = or += R rows of A · B for a depth of KK (compile-time, at most
// kTinyDepth), B row-major: the R x KK values of A are broadcast once, then each vector
// of columns takes KK loads of B and R x KK multiply-adds. small_rows, with the depth a
// runtime loop, spent more on setting up its unrolled loop than on the arithmetic at
// these depths (a tensor ring's chain, 2048 products of 4 x 4 by 4 x 149: 0.8 ms on one
// thread, over 1500 cycles a product). The last, partial vector reads `tail`, the
// zero-padded copy of the last columns with row stride W.
template <class T, int R, int KK>
void tiny_depth_rows(int64_t N, const T* A, int64_t a_rs, int64_t a_cs, const T* B, int64_t b_rs, const T* tail,
                     T* C, int64_t c_rs, int64_t c_cs, bool accumulate, Addend<T> bias) {
  using V = typename Vec<T>::type;
  constexpr int W = Vec<T>::width;
  V a[R][KK];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int k = 0; k < KK; ++k) a[r][k] = splat(A[r * a_rs + k * a_cs]);
  for (int64_t j = 0; j < N; j += W) {
    const int64_t n = std::min<int64_t>(W, N - j);
    const T* b = n == W ? B + j : tail;
    const int64_t bs = n == W ? b_rs : W;
    V acc[R] = {};
#pragma GCC unroll 8
    for (int k = 0; k < KK; ++k) {
      V bv;
      __builtin_memcpy(&bv, b + k * bs, sizeof(V));
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[r] += a[r][k] * bv;
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) store_small<T>(C + r * c_rs + j * c_cs, c_cs, r, j, n, acc[r], accumulate, bias);
  }
}

// Rows [i0, i1) of C = or += A · B for a depth KK: blocks of 4 rows, then 2, 1.
template <class T, int KK>
void tiny_depth_range(int64_t i0, int64_t i1, int64_t N, const T* A, int64_t a_rs, int64_t a_cs, const T* B,
                      int64_t b_rs, const T* tail, T* C, int64_t c_rs, int64_t c_cs, bool accumulate, Addend<T> bias) {
  int64_t i = i0;
  for (; i + 4 <= i1; i += 4)
    tiny_depth_rows<T, 4, KK>(N, A + i * a_rs, a_rs, a_cs, B, b_rs, tail, C + i * c_rs, c_rs, c_cs, accumulate,
                              bias.at(i, 0));
  if (i + 2 <= i1) {
    tiny_depth_rows<T, 2, KK>(N, A + i * a_rs, a_rs, a_cs, B, b_rs, tail, C + i * c_rs, c_rs, c_cs, accumulate,
                              bias.at(i, 0));
    i += 2;
  }
  if (i < i1)
    tiny_depth_rows<T, 1, KK>(N, A + i * a_rs, a_rs, a_cs, B, b_rs, tail, C + i * c_rs, c_rs, c_cs, accumulate,
                              bias.at(i, 0));
}

// The same with the depth K (1 <= K <= kTinyDepth) picked at run time.
template <class T>
void tiny_depth_range(int64_t K, int64_t i0, int64_t i1, int64_t N, const T* A, int64_t a_rs, int64_t a_cs,
                      const T* B, int64_t b_rs, const T* tail, T* C, int64_t c_rs, int64_t c_cs, bool accumulate,
                      Addend<T> bias) {
  switch (K) {
#define MU_TINY_DEPTH(KK) \
  case KK: return tiny_depth_range<T, KK>(i0, i1, N, A, a_rs, a_cs, B, b_rs, tail, C, c_rs, c_cs, accumulate, bias);
    MU_TINY_DEPTH(1) MU_TINY_DEPTH(2) MU_TINY_DEPTH(3) MU_TINY_DEPTH(4)
    MU_TINY_DEPTH(5) MU_TINY_DEPTH(6) MU_TINY_DEPTH(7) MU_TINY_DEPTH(8)
#undef MU_TINY_DEPTH
  }
  MU_FAIL("gemm: tiny_depth_range called with depth ", K, " outside [1, ", kTinyDepth, "]");
}

// ---------------------------------------------------------------- tiny products

// Products within tiny_product_fits (gemm_parts.h): R rows of C at a time take K steps,
// each broadcasting R values of A against B's row k, read with masked loads (lanes past N
// zero), from B itself where its rows are contiguous, else from a dense copy of B made
// once per product; C's rows are stored with masked stores.

// The first n <= W lanes of v stored at dst (column stride c_cs), added to C when
// accumulating, else plus the bias: with a masked store where C's row is contiguous (the
// lane-by-lane store of store_small, whose vector GCC then kept in memory, took most of a
// tiny product's time).
template <class T>
inline void store_first(T* dst, int64_t c_cs, int64_t i, int64_t j, int64_t n, typename Vec<T>::type v,
                        bool accumulate, Addend<T> bias) {
#if defined(__AVX512F__) && defined(__x86_64__)
  if (c_cs == 1 && (!bias || bias.cs <= 1)) {
    if (accumulate) v += load_first(dst, n);
    else if (bias) v += bias.cs == 1 ? load_first(bias.p + i * bias.rs + j, n) : splat(bias.get(i, j));
    if constexpr (std::is_same_v<T, float> && Vec<T>::width == 16)
      return _mm512_mask_storeu_ps(dst, __mmask16((1u << n) - 1), __m512(v));
    else if constexpr (std::is_same_v<T, double> && Vec<T>::width == 8)
      return _mm512_mask_storeu_pd(dst, __mmask8((1u << n) - 1), __m512d(v));
  }
#endif
  store_small<T>(dst, c_cs, i, j, n, v, accumulate, bias);
}

// R rows of C (from row i0) = or += R rows of A · B over K depths, NV vectors of columns,
// the first n of them valid; B's row k at B + k * b_rs, unit column stride, read with
// masked loads (its lanes past n as zero).
template <class T, int R, int NV, class TA = T>
void tiny_rows(int64_t K, const TA* A, int64_t a_rs, int64_t a_cs, const T* B, int64_t b_rs, int64_t n, T* C,
               int64_t c_rs, int64_t c_cs, bool accumulate, Addend<T> bias, int64_t i0) {
  using V = typename Vec<T>::type;
  constexpr int W = Vec<T>::width;
  V acc[R][NV];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) acc[r][v] = V{};
  for (int64_t k = 0; k < K; ++k) {
    V b[NV];
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) b[v] = load_first(B + k * b_rs + v * W, std::min<int64_t>(W, n - v * W));
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const V a = splat(T(A[r * a_rs + k * a_cs]));  // a bfloat16 A widened exactly
#pragma GCC unroll 2
      for (int v = 0; v < NV; ++v) acc[r][v] += a * b[v];
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v)
      store_first<T>(C + r * c_rs + v * W * c_cs, c_cs, i0 + r, v * W, std::min<int64_t>(W, n - v * W), acc[r][v],
                     accumulate, bias);
}

template <class T, int NV>
void tiny_product_nv(int64_t M, int64_t N, int64_t K, const T* A, int64_t a_rs, int64_t a_cs, const T* B,
                     int64_t b_rs, T* C, int64_t c_rs, int64_t c_cs, bool accumulate, Addend<T> bias) {
  int64_t i = 0;
  for (; i + 4 <= M; i += 4)
    tiny_rows<T, 4, NV>(K, A + i * a_rs, a_rs, a_cs, B, b_rs, N, C + i * c_rs, c_rs, c_cs, accumulate, bias, i);
  for (; i + 2 <= M; i += 2)
    tiny_rows<T, 2, NV>(K, A + i * a_rs, a_rs, a_cs, B, b_rs, N, C + i * c_rs, c_rs, c_cs, accumulate, bias, i);
  for (; i < M; ++i)
    tiny_rows<T, 1, NV>(K, A + i * a_rs, a_rs, a_cs, B, b_rs, N, C + i * c_rs, c_rs, c_cs, accumulate, bias, i);
}

}  // namespace

// C = or += A · B without packing, for products whose B fits in L2 (see gemm_one). B is
// copied to row-major form first unless it already is.
template <class T>
void gemm_small(int64_t M, int64_t N, int64_t K, const T* A, int64_t a_rs, int64_t a_cs, const T* B, int64_t b_rs,
                int64_t b_cs, T* C, int64_t c_rs, int64_t c_cs, bool accumulate, int nt, Addend<T> bias) {
  if (b_cs != 1) {
    B = dense_rows(K, N, B, b_rs, b_cs, packed_b_buffer<T>(K * N));
    b_rs = N;
  }
  constexpr int W = Vec<T>::width;
  const int64_t full = N / W * W;
  T* tail = nullptr;
  if (full < N) {
    tail = packed_a_buffer<T>(K * W);
    for (int64_t k = 0; k < K; ++k) copy_padded<W>(tail + k * W, B + k * b_rs + full, N - full);
  }
  if (K <= kTinyDepth) {  // threads take contiguous ranges of 4-row blocks
    split_range((M + 3) / 4, nt, [&](int64_t b0, int64_t b1) {
      tiny_depth_range<T>(K, std::min(M, b0 * 4), std::min(M, b1 * 4), N, A, a_rs, a_cs, B, b_rs, tail, C, c_rs, c_cs,
                          accumulate, bias);
    });
    return;
  }
  // Threads take contiguous ranges of row blocks.
  split_range((M + kSmallRows - 1) / kSmallRows, nt, [&](int64_t b0, int64_t b1) {
    small_row_range<T>(std::min(M, b0 * kSmallRows), std::min(M, b1 * kSmallRows), N, K, A, a_rs, a_cs, B, b_rs, tail,
                       C, c_rs, c_cs, accumulate, bias);
  });
}

// C = or += A · B for tiny_product_fits shapes, on the calling thread.
template <class T>
void tiny_product(int64_t M, int64_t N, int64_t K, const T* A, int64_t a_rs, int64_t a_cs, const T* B, int64_t b_rs,
                  int64_t b_cs, T* C, int64_t c_rs, int64_t c_cs, bool accumulate, Addend<T> bias) {
  constexpr int W = Vec<T>::width;
  alignas(64) T dense[kTinyMaxDepth * 2 * W];
  if (b_cs != 1) {  // B's rows gathered once, N values each (the lanes past N are not read)
    B = dense_rows(K, N, B, b_rs, b_cs, dense);
    b_rs = N;
  }
  if (N <= W) return tiny_product_nv<T, 1>(M, N, K, A, a_rs, a_cs, B, b_rs, C, c_rs, c_cs, accumulate, bias);
  tiny_product_nv<T, 2>(M, N, K, A, a_rs, a_cs, B, b_rs, C, c_rs, c_cs, accumulate, bias);
}

// The same for bfloat16 operands (autocast's tensor-ring chains), into a float32 C or a
// bfloat16 C rounded once: B widened into a dense float32 copy (exact), A's values widened
// as they are broadcast, the sums in float32, 4 rows at a time through a float32 buffer.
// Each product of two bfloat16 values is exact in float32, so this is the float32 product
// of the rounded operands. (One VDPBF16PS GEMM call per product cost 1.3-2.7x as much:
// its packing is made for products a thousand times larger.)
template <class TC>
void bf16_tiny_product(int64_t M, int64_t N, int64_t K, const bfloat16_t* A, int64_t a_rs, int64_t a_cs,
                       const bfloat16_t* B, int64_t b_rs, int64_t b_cs, TC* C, int64_t ldc, const float* col_bias,
                       const float* row_bias) {
  constexpr int W = Vec<float>::width;
  alignas(64) float dense[kTinyMaxDepth * 2 * W];
  for (int64_t k = 0; k < K; ++k)
    for (int64_t j = 0; j < N; ++j) dense[k * N + j] = float(B[k * b_rs + j * b_cs]);
  alignas(64) float rows[4 * 2 * W];
  auto block = [&]<int R, int NV>(int64_t i) {
    tiny_rows<float, R, NV, bfloat16_t>(K, A + i * a_rs, a_rs, a_cs, dense, N, N, rows, 2 * W, 1, false, {}, i);
    for (int64_t r = 0; r < R; ++r)
      for (int64_t j = 0; j < N; ++j) {
        float sum = rows[r * 2 * W + j];
        if (col_bias) sum += col_bias[j];  // before the one rounding of a bfloat16 C
        if (row_bias) sum += row_bias[i + r];
        C[(i + r) * ldc + j] = TC(sum);
      }
  };
  auto blocks = [&]<int NV>() {
    int64_t i = 0;
    for (; i + 4 <= M; i += 4) block.template operator()<4, NV>(i);
    for (; i + 2 <= M; i += 2) block.template operator()<2, NV>(i);
    for (; i < M; ++i) block.template operator()<1, NV>(i);
  };
  if (N <= W) blocks.template operator()<1>();
  else blocks.template operator()<2>();
}

template void gemm_small<float>(int64_t, int64_t, int64_t, const float*, int64_t, int64_t, const float*, int64_t,
                                int64_t, float*, int64_t, int64_t, bool, int, Addend<float>);
template void gemm_small<double>(int64_t, int64_t, int64_t, const double*, int64_t, int64_t, const double*, int64_t,
                                 int64_t, double*, int64_t, int64_t, bool, int, Addend<double>);
template void tiny_product<float>(int64_t, int64_t, int64_t, const float*, int64_t, int64_t, const float*, int64_t,
                                  int64_t, float*, int64_t, int64_t, bool, Addend<float>);
template void tiny_product<double>(int64_t, int64_t, int64_t, const double*, int64_t, int64_t, const double*,
                                   int64_t, int64_t, double*, int64_t, int64_t, bool, Addend<double>);
template void bf16_tiny_product<float>(int64_t, int64_t, int64_t, const bfloat16_t*, int64_t, int64_t,
                                       const bfloat16_t*, int64_t, int64_t, float*, int64_t, const float*,
                                       const float*);
template void bf16_tiny_product<bfloat16_t>(int64_t, int64_t, int64_t, const bfloat16_t*, int64_t, int64_t,
                                            const bfloat16_t*, int64_t, int64_t, bfloat16_t*, int64_t, const float*,
                                            const float*);

}  // namespace mu::cpu::gemm_detail
