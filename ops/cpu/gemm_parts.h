// What the files of the CPU GEMM share. gemm.cpp picks a path for each product (gemm_one)
// among those of gemm_packed.cpp (packed Goto/BLIS blocks, deep products), gemm_small.cpp
// (small and tiny products, read in place) and gemm_dots.cpp (dot products: matrix-vector,
// few rows against a transposed B). Here: the vector helpers they all use, the addend a
// product adds to C as it stores it, the per-thread scratch buffers, the shape thresholds
// gemm_one tests, and each path's entry, instantiated in its own file for float and double.
#pragma once
#include <omp.h>
#if defined(__x86_64__)
#include <immintrin.h>  // load_first's masked loads, gemm_small.cpp's masked stores
#endif

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <type_traits>
#include <utility>

#include "ops/cpu/simd.h"
#include "tensor/error.h"
#include "tensor/half.h"

namespace mu::cpu::gemm_detail {

// ---------------------------------------------------------------- vectors

// All lanes = x, as a vector initialiser with one x per lane (one broadcast instruction;
// the shorter `V{} + x` costs an extra add, since 0.0 + -0.0 is not -0.0).
template <class V, class T, size_t... Lane>
inline V splat_lanes(T x, std::index_sequence<Lane...>) {
  return V{((void)Lane, x)...};
}
template <class T>
inline typename Vec<T>::type splat(T x) {
  return splat_lanes<typename Vec<T>::type>(x, std::make_index_sequence<Vec<T>::width>());
}

// What a product that writes C adds to it as it stores it: element (i, j) of a broadcast
// matrix, p[i * rs + j * cs]. A Linear layer's bias, one value per column, is (bias, 0,
// 1); a bias per row (a Linear layer applied along the rows: an MLP-Mixer's token MLP) is
// (bias, 1, 0). Empty (p null) adds nothing.
template <class T>
struct Addend {
  const T* p = nullptr;
  int64_t rs = 0, cs = 1;
  explicit operator bool() const { return p != nullptr; }
  // The addend of the block whose top-left element is (i, j).
  Addend at(int64_t i, int64_t j) const { return p ? Addend{p + i * rs + j * cs, rs, cs} : Addend{}; }
  T get(int64_t i, int64_t j) const { return p[i * rs + j * cs]; }
  // Elements (i, j) .. (i, j + W - 1) as a vector: one load, one broadcast or W loads.
  typename Vec<T>::type vec(int64_t i, int64_t j) const {
    typename Vec<T>::type v;
    const T* q = p + i * rs + j * cs;
    if (cs == 1) {
      __builtin_memcpy(&v, q, sizeof(v));
    } else if (cs == 0) {
      v = splat(*q);
    } else {
      for (int w = 0; w < Vec<T>::width; ++w) v[w] = q[w * cs];
    }
    return v;
  }
};

// The first n <= W lanes of a vector from p, the rest zero: one masked load on AVX-512
// (lanes past n are not read), else an element loop.
template <class T>
inline typename Vec<T>::type load_first(const T* p, int64_t n) {
  using V = typename Vec<T>::type;
#if defined(__AVX512F__) && defined(__x86_64__)
  if constexpr (std::is_same_v<T, float> && Vec<T>::width == 16)
    return V(_mm512_maskz_loadu_ps(__mmask16((1u << n) - 1), p));
  else if constexpr (std::is_same_v<T, double> && Vec<T>::width == 8)
    return V(_mm512_maskz_loadu_pd(__mmask8((1u << n) - 1), p));
#endif
  V v{};
  for (int64_t i = 0; i < n; ++i) v[i] = p[i];
  return v;
}

// dst[0, W) = src[0, n) then zeros, for n <= W: one line of a zero-padded panel. A line
// of one vector is load_first's masked load and one store; other widths are built in a
// local array and stored as one constant-size copy. (As a local array's loop, GCC makes
// a one-vector line a call to memcpy, whose narrow stores the vector load of the line
// must wait out (store forwarding fails): a fifth of the time of a batch of 4 x 4 by
// 4 x 4 products.)
template <int W, class T>
inline void copy_padded(T* dst, const T* src, int64_t n) {
  if constexpr (W == Vec<T>::width) {
    const typename Vec<T>::type v = load_first(src, n);
    __builtin_memcpy(dst, &v, sizeof(v));
  } else {
    T line[W] = {};
    for (int64_t i = 0; i < n; ++i) line[i] = src[i];
    __builtin_memcpy(dst, line, sizeof(line));
  }
}

// ---------------------------------------------------------------- threads and buffers

// Runs body(begin, end) on nt threads, each taking one contiguous share of [0, n); on
// the calling thread alone when nt == 1, since even an inactive parallel region costs
// more than a tiny product.
template <class F>
void split_range(int64_t n, int nt, F&& body) {
  if (nt <= 1 || n <= 1) return body(int64_t(0), n);
#pragma omp parallel num_threads(nt)
  {
    const int team = omp_get_num_threads(), tid = omp_get_thread_num();
    body(n * tid / team, n * (tid + 1) / team);
  }
}

// A 64-byte-aligned buffer that only grows, so that packing does not hit malloc on every
// call. One per thread and purpose (thread_local below).
template <class T>
class Scratch {
 public:
  ~Scratch() { std::free(data_); }
  T* get(int64_t n) {
    if (n > size_) {
      std::free(data_);
      // aligned_alloc wants a size that is a multiple of the alignment.
      size_t bytes = (size_t(n) * sizeof(T) + 63) / 64 * 64;
      data_ = static_cast<T*>(std::aligned_alloc(64, bytes));
      MU_CHECK(data_ != nullptr, "gemm: out of memory allocating a ", bytes, "-byte packing buffer");
      size_ = n;
    }
    return data_;
  }

 private:
  T* data_ = nullptr;
  int64_t size_ = 0;
};

// A's panels and B's, one buffer each per thread.
template <class T>
T* packed_a_buffer(int64_t n) {
  thread_local Scratch<T> s;
  return s.get(n);
}
template <class T>
T* packed_b_buffer(int64_t n) {
  thread_local Scratch<T> s;
  return s.get(n);
}

// dst (rows x cols, row-major) = the matrix at src (element (i, j) at src[i * rs + j * cs]);
// returns dst.
template <class T>
const T* dense_rows(int64_t rows, int64_t cols, const T* src, int64_t rs, int64_t cs, T* dst) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) dst[i * cols + j] = src[i * rs + j * cs];
  return dst;
}

// ---------------------------------------------------------------- shapes

// Products up to kSmallWork multiply-adds (M N K) whose B is row-major and at most
// kSmallBBytes (so it stays in L2 while every block of rows of A passes over it) skip
// packing, as do products of any layout up to kTinyWork. Packing A and padding to whole
// MR x NR tiles is a fixed cost these sizes do not recover: on Zen 4 this path is 1.1x
// to 1.4x faster than the packed one from 16^3 to 256^3 (e.g. 4 x 128^3: 208 vs 163
// GFLOP/s on 2 threads), and 5x faster for a batch of 16^3 products.
constexpr double kSmallWork = 256.0 * 256.0 * 256.0;
constexpr double kSmallBBytes = 512 * 1024;
constexpr double kTinyWork = 32.0 * 32.0 * 32.0;

// Depths up to this take gemm_small's tiny_depth_rows.
constexpr int64_t kTinyDepth = 8;

// Products of at most kTinyWork multiply-adds whose rows of C are at most two vectors
// (N <= 2 W) over a depth of at most kTinyMaxDepth: a tensor ring's per-token chains (an
// MLP-Mixer's TRμMoE blocks multiply 16384 pairs of 4 x 9 and 9 x 4 matrices). For them
// gemm_small's setup (B copied dense, its last columns padded into a buffer, the rows
// shared out in blocks) cost several times the arithmetic (gemm_small.cpp's tiny_product).
constexpr int64_t kTinyMaxDepth = 64;

template <class T>
bool tiny_product_fits(int64_t M, int64_t N, int64_t K) {
  return double(M) * double(N) * double(K) <= kTinyWork && N <= 2 * Vec<T>::width && K <= kTinyMaxDepth;
}

// Rows of A up to which a product against a transposed B takes gemm_few_rows.
constexpr int64_t kFewRows = 16;

// ---------------------------------------------------------------- the paths

// gemm_packed.cpp: C = or += A · B for one product on `nt` threads, K > 0, packed in
// blocks; and products whose depth dwarfs their output (deep_product) cut along the depth.
// S, the operands' element type, is T, or bfloat16 for a float32 T: the operands widened
// as they are packed (autocast's products on CPUs without AVX512_BF16). TC, C's, is T, or
// bfloat16 for a float32 T where packed_product_rounds(K) (a depth the tiles sum whole,
// without accumulating): each tile's sums rounded once as they are stored.
template <class T, class S = T, class TC = T>
void gemm_blocked(int64_t M, int64_t N, int64_t K, const S* A, int64_t a_rs, int64_t a_cs, const S* B,
                  int64_t b_rs, int64_t b_cs, TC* C, int64_t c_rs, int64_t c_cs, bool accumulate, int nt,
                  Addend<T> bias = {});
bool packed_product_rounds(int64_t K);
bool deep_product(int64_t M, int64_t N, int64_t K);
template <class T, class S = T>
void gemm_deep(int64_t M, int64_t N, int64_t K, const S* A, int64_t a_rs, int64_t a_cs, const S* B, int64_t b_rs,
               int64_t b_cs, T* C, int64_t c_rs, int64_t c_cs, bool accumulate, int nt);

// gemm_small.cpp: products within kSmallWork (B in L2) without packing, on `nt` threads;
// tiny_product_fits products on the calling thread, float32 / float64 or bfloat16 operands.
template <class T>
void gemm_small(int64_t M, int64_t N, int64_t K, const T* A, int64_t a_rs, int64_t a_cs, const T* B, int64_t b_rs,
                int64_t b_cs, T* C, int64_t c_rs, int64_t c_cs, bool accumulate, int nt, Addend<T> bias = {});
template <class T>
void tiny_product(int64_t M, int64_t N, int64_t K, const T* A, int64_t a_rs, int64_t a_cs, const T* B, int64_t b_rs,
                  int64_t b_cs, T* C, int64_t c_rs, int64_t c_cs, bool accumulate, Addend<T> bias);
template <class TC>
void bf16_tiny_product(int64_t M, int64_t N, int64_t K, const bfloat16_t* A, int64_t a_rs, int64_t a_cs,
                       const bfloat16_t* B, int64_t b_rs, int64_t b_cs, TC* C, int64_t ldc, const float* col_bias,
                       const float* row_bias);

// gemm_dots.cpp: a dot product; a product with a 1-row or 1-column operand; 1 to kFewRows
// rows of A against B(k, j) = bt[j * ldb + k] (float32 A with a bfloat16 bt: autocast's
// x · wᵀ read in place).
template <class T>
T dot(int64_t n, const T* x, int64_t incx, const T* y, int64_t incy);
template <class T>
void gemv(int64_t L, int64_t K, const T* mat, int64_t ls, int64_t ks, const T* x, int64_t xs, T* y, int64_t ys,
          bool accumulate, int nt);
template <class T, class TB = T>
void gemm_few_rows(int64_t M, int64_t N, int64_t K, const T* A, int64_t a_rs, int64_t a_cs, const TB* bt,
                   int64_t ldb, T* C, int64_t c_rs, int64_t c_cs, bool accumulate, int nt, Addend<T> bias);

}  // namespace mu::cpu::gemm_detail
