// CPU GEMM: the entry (gemm), the choice of path per product by shape (gemm_one), the
// optional OpenBLAS backend and the per-thread scratch buffers. The paths (gemm_parts.h):
//  - a 1-row or 1-column operand: matrix-vector loops; a few rows against a transposed B:
//    dot products reading B in place (gemm_dots.cpp);
//  - small products (B fits in L2) and tiny ones: no packing; register blocks of rows of C
//    summed over the whole depth, reading A and B in place (gemm_small.cpp);
//  - the rest: the Goto/BLIS scheme, packed blocks and a register-tile micro-kernel, or
//    for a depth that dwarfs the output, slabs of depth (gemm_packed.cpp).
// Threads (OpenMP) take whole products of a batch when there are enough of them, else
// blocks of one product. The vector code is GCC vector extensions, as wide as the target
// allows (AVX-512, AVX2 or SSE), so one source serves every x86-64 machine.
#include "ops/cpu/gemm.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <string>

#include "ops/cpu/gemm_parts.h"
#include "tensor/error.h"

#ifdef MUMOE_OPENBLAS
#include <cblas.h>
#endif

namespace mu::cpu {

using namespace gemm_detail;

namespace {

// Whole products of a batch go to threads in runs of at least this many flops.
constexpr double kTinyRun = 1 << 18;

// ---------------------------------------------------------------- native entry

// C = the addend: the paths without a bias epilogue add the product onto it instead.
template <class T>
void fill_bias_rows(int64_t M, int64_t N, Addend<T> bias, T* C, int64_t c_rs, int64_t c_cs) {
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) C[i * c_rs + j * c_cs] = bias.get(i, j);
}

// The checks and edge cases every entry shares (gemm, gemm_bf16_widening; `name` is the
// entry's, for messages): sizes non-negative, at most one bias, which goes into `bias`
// unless accumulating (a bias goes with a product that writes C). Returns false when
// nothing is left to compute: an empty C, or an empty sum (K == 0), C then set to the
// bias (or 0) unless accumulating.
template <class T, class TC>
bool product_left(const char* name, int64_t batch, int64_t M, int64_t N, int64_t K, MatrixRef<TC> C,
                  bool accumulate, const T* col_bias, const T* row_bias, Addend<T>& bias) {
  MU_CHECK(batch >= 0 && M >= 0 && N >= 0 && K >= 0, name, ": negative size (batch ", batch, ", M ", M, ", N ", N,
           ", K ", K, ")");
  MU_CHECK(col_bias == nullptr || row_bias == nullptr, name, ": a bias per column or one per row, not both");
  bias = col_bias && !accumulate  ? Addend<T>{col_bias, 0, 1}
         : row_bias && !accumulate ? Addend<T>{row_bias, 1, 0}
                                   : Addend<T>{};
  if (batch == 0 || M == 0 || N == 0) return false;
  if (K > 0) return true;
  if (!accumulate)
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j)
          C.data[b * C.batch_stride + i * C.row_stride + j * C.col_stride] = TC(bias ? bias.get(i, j) : T(0));
  return false;
}

// The path gemm_one takes for a product of this shape and these strides.
enum class Path { Gemv, Tiny, Dots, GemvRow, FewRows, Small, Deep, Blocked };

template <class T>
Path gemm_path(int64_t M, int64_t N, int64_t K, int64_t a_cs, int64_t b_rs, int64_t b_cs) {
  const double work = double(M) * double(N) * double(K);
  const bool small = (work <= kSmallWork && double(K) * double(N) * sizeof(T) <= kSmallBBytes && b_cs == 1) ||
                     work <= kTinyWork || (K <= kTinyDepth && double(K) * double(N) * sizeof(T) <= kSmallBBytes);
  if (N == 1) return Path::Gemv;  // C column = A · b column
  if (M > 1 && tiny_product_fits<T>(M, N, K)) return Path::Tiny;
  // Narrower than a vector, with A's rows and B's columns both running along the depth
  // (a tensor ring's chain gradient: 2048 products of 4 x 4 over 149): one dot product
  // per element. The vector paths would copy B dense and pad it to a vector's width,
  // which cost ten times the arithmetic.
  if (M > 1 && N < Vec<T>::width && K >= Vec<T>::width && a_cs == 1 && b_rs == 1) return Path::Dots;
  if (M == 1) return Path::GemvRow;  // C row = Bᵀ · a row
  if (M <= kFewRows && b_rs == 1 && b_cs != 1 && N >= Vec<T>::width && K >= Vec<T>::width && !small)
    return Path::FewRows;
  if (small) return Path::Small;
  return deep_product(M, N, K) ? Path::Deep : Path::Blocked;
}

// The matrix at src (element (i, j) at src[i * rs + j * cs]) widened into dst (rows x
// cols, row-major) on up to nt threads; returns dst.
const float* widened_rows(int64_t rows, int64_t cols, const bfloat16_t* src, int64_t rs, int64_t cs, float* dst,
                          int nt) {
  split_range(rows, double(rows) * double(cols) >= double(1 << 16) ? nt : 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      if (cs == 1) {
        widen_run(src + i * rs, cols, dst + i * cols);
      } else {
        for (int64_t j = 0; j < cols; ++j) dst[i * cols + j] = float(src[i * rs + j * cs]);
      }
    }
  });
  return dst;
}

// One product on `nt` threads, K > 0: picks the path for its shape. A bias (not when
// accumulating) is added as the small, blocked and dot-product paths store C; the
// matrix-vector and deep paths accumulate onto C filled with it. Operands of bfloat16
// values (S) for a float32 C (T): the packed paths widen them as they pack them; the
// others, which read their operands in place, take float32 copies first (per thread).
template <class T, class S = T>
void gemm_one(int64_t M, int64_t N, int64_t K, const S* A, int64_t a_rs, int64_t a_cs, const S* B, int64_t b_rs,
              int64_t b_cs, T* C, int64_t c_rs, int64_t c_cs, bool accumulate, int nt, Addend<T> bias) {
  const Path path = gemm_path<T>(M, N, K, a_cs, b_rs, b_cs);
  if constexpr (!std::is_same_v<S, T>) {
    static_assert(std::is_same_v<T, float> && std::is_same_v<S, bfloat16_t>, "gemm_one: float32 from bfloat16 only");
    if (path != Path::Deep && path != Path::Blocked) {
      thread_local Scratch<float> wide_a, wide_b;
      const float* a = widened_rows(M, K, A, a_rs, a_cs, wide_a.get(M * K), nt);
      const float* b = widened_rows(K, N, B, b_rs, b_cs, wide_b.get(K * N), nt);
      return gemm_one<float>(M, N, K, a, K, 1, b, N, 1, C, c_rs, c_cs, accumulate, nt, bias);
    }
  }
  if (bias && (path == Path::Gemv || path == Path::GemvRow || path == Path::Deep)) {
    fill_bias_rows(M, N, bias, C, c_rs, c_cs);
    accumulate = true;
    bias = {};
  }
  if constexpr (std::is_same_v<S, T>) {
    switch (path) {
      case Path::Gemv: return gemv<T>(M, K, A, a_rs, a_cs, B, b_rs, C, c_rs, accumulate, nt);
      case Path::Tiny:
        return tiny_product<T>(M, N, K, A, a_rs, a_cs, B, b_rs, b_cs, C, c_rs, c_cs, accumulate, bias);
      case Path::Dots:
        split_range(M, nt, [&](int64_t i0, int64_t i1) {
          for (int64_t i = i0; i < i1; ++i)
            for (int64_t j = 0; j < N; ++j) {
              const T v = dot<T>(K, A + i * a_rs, 1, B + j * b_cs, 1);
              T& dst = C[i * c_rs + j * c_cs];
              dst = accumulate ? dst + v : v + (bias ? bias.get(i, j) : T(0));
            }
        });
        return;
      case Path::GemvRow: return gemv<T>(N, K, B, b_cs, b_rs, A, a_cs, C, c_cs, accumulate, nt);
      case Path::FewRows:
        return gemm_few_rows<T>(M, N, K, A, a_rs, a_cs, B, b_cs, C, c_rs, c_cs, accumulate, nt, bias);
      case Path::Small:
        return gemm_small<T>(M, N, K, A, a_rs, a_cs, B, b_rs, b_cs, C, c_rs, c_cs, accumulate, nt, bias);
      case Path::Deep:
      case Path::Blocked: break;
    }
  }
  if (path == Path::Deep)
    return gemm_deep<T, S>(M, N, K, A, a_rs, a_cs, B, b_rs, b_cs, C, c_rs, c_cs, accumulate, nt);
  gemm_blocked<T, S>(M, N, K, A, a_rs, a_cs, B, b_rs, b_cs, C, c_rs, c_cs, accumulate, nt, bias);
}

template <class T, class S = T, class TC = T>
void gemm_native(int64_t batch, int64_t M, int64_t N, int64_t K, MatrixRef<const S> A, MatrixRef<const S> B,
                 MatrixRef<TC> C, bool accumulate, Addend<T> bias) {
  int nt = omp_in_parallel() ? 1 : omp_get_max_threads();
  if (2.0 * double(M) * double(N) * double(K) * double(batch) < kParallelFlops) nt = 1;
  auto one = [&](int64_t b, int threads) {
    const S *a = A.data + b * A.batch_stride, *bb = B.data + b * B.batch_stride;
    TC* c = C.data + b * C.batch_stride;
    if constexpr (std::is_same_v<TC, T>)
      gemm_one<T, S>(M, N, K, a, A.row_stride, A.col_stride, bb, B.row_stride, B.col_stride, c, C.row_stride,
                     C.col_stride, accumulate, threads, bias);
    else  // a bfloat16 C: blocked products of one slice of depth (gemm_bf16_widening checks)
      gemm_blocked<T, S, TC>(M, N, K, a, A.row_stride, A.col_stride, bb, B.row_stride, B.col_stride, c,
                             C.row_stride, C.col_stride, false, threads, bias);
  };
  // Enough products to share out evenly: whole products per thread, no synchronisation.
  if (nt > 1 && batch >= nt && (batch % nt == 0 || batch >= 4 * nt)) {
    // Products handed out one at a time, so that a thread slowed by another process takes
    // fewer; tiny ones in runs of about kTinyRun flops each, since taking a product off the
    // shared counter costs more than a 4 x 4 x 149 product (a tensor ring's chain).
    const double flops = 2.0 * double(M) * double(N) * double(K);
    const int64_t run = std::clamp<int64_t>(int64_t(kTinyRun / flops), 1, std::max<int64_t>(1, batch / (8 * nt)));
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
    for (int64_t r0 = 0; r0 < batch; r0 += run)
      for (int64_t b = r0; b < std::min(batch, r0 + run); ++b) one(b, 1);
    return;
  }
  for (int64_t b = 0; b < batch; ++b) one(b, nt);
}

// ---------------------------------------------------------------- OpenBLAS

#ifdef MUMOE_OPENBLAS
// Whether Auto sends large products (M N K >= kBlasMinWork) to OpenBLAS. It does not:
// measured on this Zen 4 machine with OpenBLAS 0.3.21 (pthreads build), the native
// kernel is as fast or faster at every shape tried (1024^3: ~209 vs ~205 GFLOP/s on 2
// threads), and OpenBLAS runs its own thread pool, which contends with the OpenMP
// workers that spin after every elementwise op: a 512^3 product alternating with an
// OpenMP loop took 3.6 ms through OpenBLAS against 1.3 ms native. Flip this where a
// BLAS does better; MUMOE_GEMM=blas or set_gemm_backend(Blas) forces it anyway.
constexpr bool kAutoUsesBlas = false;
constexpr double kBlasMinWork = 128.0 * 128.0 * 128.0;

// How BLAS can read an operand of `rows` x `cols` with strides (rs, cs): row-major
// (NoTrans, leading dimension rs) or column-major (Trans, leading dimension cs). A size-1
// dimension's stride is never used, so it may take whatever value BLAS requires.
bool blas_layout(int64_t rows, int64_t cols, int64_t rs, int64_t cs, CBLAS_TRANSPOSE& trans, int64_t& ld) {
  if ((cs == 1 || cols == 1) && (rows == 1 || rs >= std::max<int64_t>(1, cols))) {
    trans = CblasNoTrans;
    ld = rows == 1 ? std::max<int64_t>(1, cols) : rs;
    return ld <= INT_MAX;
  }
  if ((rs == 1 || rows == 1) && (cols == 1 || cs >= std::max<int64_t>(1, rows))) {
    trans = CblasTrans;
    ld = cols == 1 ? std::max<int64_t>(1, rows) : cs;
    return ld <= INT_MAX;
  }
  return false;
}

void blas_gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, const float* A, int lda, const float* B,
               int ldb, float beta, float* C, int ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
}
void blas_gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, const double* A, int lda,
               const double* B, int ldb, double beta, double* C, int ldc) {
  cblas_dgemm(CblasRowMajor, ta, tb, M, N, K, 1.0, A, lda, B, ldb, beta, C, ldc);
}

// Runs the whole batch through OpenBLAS if every operand has a layout it accepts;
// returns false (having done nothing) otherwise.
template <class T>
bool blas_layouts(int64_t M, int64_t N, int64_t K, const MatrixRef<const T>& A, const MatrixRef<const T>& B,
                  const MatrixRef<T>& C, CBLAS_TRANSPOSE& ta, CBLAS_TRANSPOSE& tb, int64_t& lda, int64_t& ldb,
                  int64_t& ldc) {
  CBLAS_TRANSPOSE tc;
  if (M > INT_MAX || N > INT_MAX || K > INT_MAX) return false;
  if (!blas_layout(M, K, A.row_stride, A.col_stride, ta, lda)) return false;
  if (!blas_layout(K, N, B.row_stride, B.col_stride, tb, ldb)) return false;
  // C is written row-major, so it must be NoTrans.
  return blas_layout(M, N, C.row_stride, C.col_stride, tc, ldc) && tc == CblasNoTrans;
}

// Whether BLAS can run this product (the layouts it accepts).
template <class T>
bool blas_can(int64_t M, int64_t N, int64_t K, const MatrixRef<const T>& A, const MatrixRef<const T>& B,
              const MatrixRef<T>& C) {
  CBLAS_TRANSPOSE ta, tb;
  int64_t lda, ldb, ldc;
  return blas_layouts(M, N, K, A, B, C, ta, tb, lda, ldb, ldc);
}

template <class T>
bool try_blas(int64_t batch, int64_t M, int64_t N, int64_t K, MatrixRef<const T> A, MatrixRef<const T> B,
              MatrixRef<T> C, bool accumulate) {
  CBLAS_TRANSPOSE ta, tb;
  int64_t lda, ldb, ldc;
  if (!blas_layouts(M, N, K, A, B, C, ta, tb, lda, ldb, ldc)) return false;
  // OpenBLAS keeps its own thread pool: size it like the OpenMP team, once.
  static std::once_flag threads_set;
  std::call_once(threads_set, [] { openblas_set_num_threads(omp_get_max_threads()); });
  for (int64_t b = 0; b < batch; ++b)
    blas_gemm(ta, tb, int(M), int(N), int(K), A.data + b * A.batch_stride, int(lda), B.data + b * B.batch_stride,
              int(ldb), accumulate ? T(1) : T(0), C.data + b * C.batch_stride, int(ldc));
  return true;
}
#endif

// ---------------------------------------------------------------- backend choice

GemmBackend backend_from_env() {
  const char* s = std::getenv("MUMOE_GEMM");
  if (s == nullptr || *s == '\0') return GemmBackend::Auto;
  std::string v(s);
  if (v == "auto") return GemmBackend::Auto;
  if (v == "native") return GemmBackend::Native;
  if (v == "blas") {
    MU_CHECK(gemm_have_blas(), "MUMOE_GEMM=blas, but this build has no OpenBLAS (install libopenblas-dev and "
             "reconfigure, or set MUMOE_GEMM=native)");
    return GemmBackend::Blas;
  }
  MU_FAIL("MUMOE_GEMM must be auto, native or blas, got \"", v, "\"");
}

// -1 until the environment has been read.
std::atomic<int> g_backend{-1};

}  // namespace

bool gemm_have_blas() {
#ifdef MUMOE_OPENBLAS
  return true;
#else
  return false;
#endif
}

const char* gemm_backend_name(GemmBackend b) {
  switch (b) {
    case GemmBackend::Auto: return "auto";
    case GemmBackend::Native: return "native";
    case GemmBackend::Blas: return "blas";
  }
  return "?";
}

void set_gemm_backend(GemmBackend b) {
  MU_CHECK(b != GemmBackend::Blas || gemm_have_blas(),
           "set_gemm_backend(Blas): this build has no OpenBLAS (install libopenblas-dev and reconfigure)");
  g_backend.store(int(b));
}

GemmBackend gemm_backend() {
  int v = g_backend.load();
  if (v < 0) {
    v = int(backend_from_env());
    g_backend.store(v);
  }
  return GemmBackend(v);
}

template <class T>
void gemm(int64_t batch, int64_t M, int64_t N, int64_t K, MatrixRef<const T> A, MatrixRef<const T> B,
          MatrixRef<T> C, bool accumulate, const T* col_bias, const T* row_bias) {
  Addend<T> bias;
  if (!product_left("gemm", batch, M, N, K, C, accumulate, col_bias, row_bias, bias)) return;
#ifdef MUMOE_OPENBLAS
  const GemmBackend be = gemm_backend();
  // Inside someone else's parallel region OpenBLAS would add its own threads on top.
  const bool blas_wanted =
      !omp_in_parallel() && (be == GemmBackend::Blas || (be == GemmBackend::Auto && kAutoUsesBlas &&
                                                         double(M) * double(N) * double(K) >= kBlasMinWork));
  if (blas_wanted && bias && blas_can(M, N, K, A, B, C)) {
    // BLAS adds onto C (beta = 1) filled with the bias.
    for (int64_t b = 0; b < batch; ++b)
      fill_bias_rows(M, N, bias, C.data + b * C.batch_stride, C.row_stride, C.col_stride);
    accumulate = true;
    bias = {};
  }
  if (blas_wanted && !bias && try_blas<T>(batch, M, N, K, A, B, C, accumulate)) return;
#endif
  gemm_native<T>(batch, M, N, K, A, B, C, accumulate, bias);
}

void gemm_bf16_widening(int64_t batch, int64_t M, int64_t N, int64_t K, MatrixRef<const bfloat16_t> A,
                        MatrixRef<const bfloat16_t> B, MatrixRef<float> C, const float* col_bias,
                        const float* row_bias) {
  Addend<float> bias;
  if (product_left("gemm_bf16_widening", batch, M, N, K, C, false, col_bias, row_bias, bias))
    gemm_native<float, bfloat16_t>(batch, M, N, K, A, B, C, false, bias);
}

bool gemm_bf16_widening_rounds(int64_t M, int64_t N, int64_t K, int64_t a_cs, int64_t b_rs, int64_t b_cs) {
  return K >= 1 && gemm_path<float>(M, N, K, a_cs, b_rs, b_cs) == Path::Blocked && packed_product_rounds(K);
}

void gemm_bf16_widening(int64_t batch, int64_t M, int64_t N, int64_t K, MatrixRef<const bfloat16_t> A,
                        MatrixRef<const bfloat16_t> B, MatrixRef<bfloat16_t> C, const float* col_bias,
                        const float* row_bias) {
  Addend<float> bias;
  if (!product_left("gemm_bf16_widening", batch, M, N, K, C, false, col_bias, row_bias, bias)) return;
  MU_CHECK(gemm_bf16_widening_rounds(M, N, K, A.col_stride, B.row_stride, B.col_stride),
           "gemm_bf16_widening: a bfloat16 C is for products whose tiles sum their whole depth "
           "(gemm_bf16_widening_rounds), not ", M, " x ", K, " by ", K, " x ", N, " (A's column stride ", A.col_stride,
           ", B's strides ", B.row_stride, ", ", B.col_stride, ")");
  gemm_native<float, bfloat16_t, bfloat16_t>(batch, M, N, K, A, B, C, false, bias);
}

bool bf16_weight_product_fits(int64_t M, int64_t N, int64_t K) {
  // With AVX512_BF16 these rows take gemm_bf16_few_rows (dot products on VDPBF16PS), whose
  // time grows with the rows, and more rows gemm_bf16, which computes up to 16 in the
  // time of one (its half-width tiles). Measured on 2 Zen 4 cores, the dot form against
  // gemm_bf16: GPT-2's 768 -> 3072 Linear at 8, 12 and 16 rows 110 / 210, 186 / 206,
  // 261 / 208 us (3072 -> 768 at 16: 298 / 233; 256 -> 1024 at 16: 53 / 28); GPT-2 mini's
  // head (256 -> 50257: 25.7 MB of weight, from memory) at 12 and 16 rows 1.65 / 1.83
  // and 1.58 / 2.20 ms.
  int64_t rows = kFewRows;
  if (gemm_bf16_available()) rows = N * K * int64_t(sizeof(bfloat16_t)) > (int64_t(16) << 20) ? 16 : 12;
  return M >= 1 && M <= rows && N >= Vec<float>::width && K >= Vec<float>::width;
}

void gemm_bf16_weight(int64_t M, int64_t N, int64_t K, const float* A, int64_t a_rs, int64_t a_cs,
                      const bfloat16_t* bt, int64_t ldb, float* C, int64_t c_rs, int64_t c_cs) {
  MU_CHECK(M >= 1 && M <= kFewRows && N >= Vec<float>::width && K >= Vec<float>::width, "gemm_bf16_weight: ", M, " x ", K, " by ", K, " x ", N,
           " is outside its shapes (1 to ", kFewRows, " rows; N and K at least ", Vec<float>::width, ")");
  int nt = omp_in_parallel() ? 1 : omp_get_max_threads();
  if (2.0 * double(M) * double(N) * double(K) < kParallelFlops) nt = 1;
  gemm_few_rows<float, bfloat16_t>(M, N, K, A, a_rs, a_cs, bt, ldb, C, c_rs, c_cs, false, nt, {});
}

bool gemm_tiny_product(int64_t M, int64_t N, int64_t K) { return M > 1 && tiny_product_fits<float>(M, N, K); }
void gemm_bf16_tiny(int64_t M, int64_t N, int64_t K, const bfloat16_t* A, int64_t a_rs, int64_t a_cs,
                    const bfloat16_t* B, int64_t b_rs, int64_t b_cs, float* C, int64_t ldc, const float* bias,
                    const float* row_bias) {
  MU_CHECK(K >= 1 && gemm_tiny_product(M, N, K), "gemm_bf16_tiny: ", M, " x ", K, " by ", K, " x ", N,
           " is not a tiny product");
  bf16_tiny_product(M, N, K, A, a_rs, a_cs, B, b_rs, b_cs, C, ldc, bias, row_bias);
}
void gemm_bf16_tiny(int64_t M, int64_t N, int64_t K, const bfloat16_t* A, int64_t a_rs, int64_t a_cs,
                    const bfloat16_t* B, int64_t b_rs, int64_t b_cs, bfloat16_t* C, int64_t ldc, const float* bias,
                    const float* row_bias) {
  MU_CHECK(K >= 1 && gemm_tiny_product(M, N, K), "gemm_bf16_tiny: ", M, " x ", K, " by ", K, " x ", N,
           " is not a tiny product");
  bf16_tiny_product(M, N, K, A, a_rs, a_cs, B, b_rs, b_cs, C, ldc, bias, row_bias);
}

template void gemm<float>(int64_t, int64_t, int64_t, int64_t, MatrixRef<const float>, MatrixRef<const float>,
                          MatrixRef<float>, bool, const float*, const float*);
template void gemm<double>(int64_t, int64_t, int64_t, int64_t, MatrixRef<const double>, MatrixRef<const double>,
                           MatrixRef<double>, bool, const double*, const double*);

}  // namespace mu::cpu
