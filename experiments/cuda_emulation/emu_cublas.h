// Stand-ins for the cuBLAS GEMMs ops/cuda/matmul.cu and grouped_mm.cu call, for emu.h's
// harnesses: the documented column-major semantics (C = alpha op(A) op(B) + beta C per
// batch entry, op N or T, leading dimensions checked as cuBLAS checks them, C not read
// when beta is 0), summed in the compute type (float for float32 and bfloat16, double for
// float64), in k order. The library's types and enums come from cublas_v2.h; the calls
// are renamed.
#pragma once
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <algorithm>
#include <type_traits>
#include <vector>
#include "emu_convert.h"
#include "emu_queue.h"


inline long emu_cublas_calls = 0;  // GEMM calls so far (the attention harness tells the cuBLAS path by it)

// The sizes and leading dimensions as cuBLAS checks them.
inline bool emu_gemm_dims_ok(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, int lda, int ldb,
                             int ldc) {
  const int rows_a = ta == CUBLAS_OP_N ? m : k, rows_b = tb == CUBLAS_OP_N ? k : n;
  return m >= 0 && n >= 0 && k >= 0 && lda >= std::max(1, rows_a) && ldb >= std::max(1, rows_b) &&
         ldc >= std::max(1, m);
}

// The type combinations of the Ex calls the stand-in computes: float32 throughout, or
// bfloat16 operands with a bfloat16 or float32 result.
inline bool emu_gemm_types_ok(cudaDataType_t at, cudaDataType_t bt, cudaDataType_t ct) {
  return at == bt && ((at == CUDA_R_32F && ct == CUDA_R_32F) || (at == CUDA_R_16BF && (ct == CUDA_R_16BF || ct == CUDA_R_32F)));
}

// bias (when given): one value per row of C, added to every column before C is rounded
// and stored (cuBLASLt's bias epilogue, emu_cublaslt.h).
template <class T, class Acc, class TC>
void emu_gemm_run(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, Acc alpha, const T* A, int lda,
                  long long sa, const T* B, int ldb, long long sb, Acc beta, TC* C, int ldc, long long sc, int count,
                  const TC* bias = nullptr);

// A and B of type T, C of type TC (T, or float32 beside bfloat16 operands), sums in Acc.
template <class T, class Acc, class TC = T>
cublasStatus_t emu_gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, Acc alpha, const T* A,
                        int lda, long long sa, const T* B, int ldb, long long sb, Acc beta, TC* C, int ldc,
                        long long sc, int count) {
  ++emu_cublas_calls;
  if (count < 0 || !emu_gemm_dims_ok(ta, tb, m, n, k, lda, ldb, ldc)) return CUBLAS_STATUS_INVALID_VALUE;
  // The products run on the stream (emu_queue.h): the scalars and pointers are the call's.
  emu_defer([=] { emu_gemm_run<T, Acc, TC>(ta, tb, m, n, k, alpha, A, lda, sa, B, ldb, sb, beta, C, ldc, sc, count); });
  return CUBLAS_STATUS_SUCCESS;
}

template <class T, class Acc, class TC>
void emu_gemm_run(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, Acc alpha, const T* A, int lda,
                  long long sa, const T* B, int ldb, long long sb, Acc beta, TC* C, int ldc, long long sc, int count,
                  const TC* bias) {
  for (int bi = 0; bi < count; ++bi)
    for (int j = 0; j < n; ++j)
      for (int i = 0; i < m; ++i) {
        Acc s = 0;
        for (int p = 0; p < k; ++p) {
          const T a = ta == CUBLAS_OP_N ? A[bi * sa + i + (long long)p * lda] : A[bi * sa + p + (long long)i * lda];
          const T b = tb == CUBLAS_OP_N ? B[bi * sb + p + (long long)j * ldb] : B[bi * sb + j + (long long)p * ldb];
          if constexpr (std::is_same_v<Acc, double>) s += a * b;
          else s += float(to_d(a)) * float(to_d(b));  // the values read exactly, multiplied in float32
        }
        TC& c = C[bi * sc + i + (long long)j * ldc];
        const Acc r = (beta == Acc(0) ? alpha * s : alpha * s + beta * Acc(to_d(c))) +
                      (bias ? Acc(to_d(bias[i])) : Acc(0));
        c = from_d<TC>(r);
      }
}

inline cublasStatus_t emu_cublasDgemmStridedBatched(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb, int m,
                                                    int n, int k, const double* alpha, const double* A, int lda,
                                                    long long sa, const double* B, int ldb, long long sb,
                                                    const double* beta, double* C, int ldc, long long sc, int count) {
  return emu_gemm<double, double>(ta, tb, m, n, k, *alpha, A, lda, sa, B, ldb, sb, *beta, C, ldc, sc, count);
}

inline cublasStatus_t emu_cublasGemmStridedBatchedEx(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb,
                                                     int m, int n, int k, const void* alpha, const void* A,
                                                     cudaDataType_t at, int lda, long long sa, const void* B,
                                                     cudaDataType_t bt, int ldb, long long sb, const void* beta,
                                                     void* C, cudaDataType_t ct, int ldc, long long sc, int count,
                                                     cublasComputeType_t, cublasGemmAlgo_t) {
  // float32 throughout, or bfloat16 operands with a bfloat16 or float32 result.
  const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
  if (at != bt) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (at == CUDA_R_32F && ct == CUDA_R_32F)
    return emu_gemm<float, float>(ta, tb, m, n, k, al, static_cast<const float*>(A), lda, sa,
                                  static_cast<const float*>(B), ldb, sb, be, static_cast<float*>(C), ldc, sc, count);
  using bf = __nv_bfloat16;
  if (at == CUDA_R_16BF && ct == CUDA_R_16BF)
    return emu_gemm<bf, float>(ta, tb, m, n, k, al, static_cast<const bf*>(A), lda, sa, static_cast<const bf*>(B),
                               ldb, sb, be, static_cast<bf*>(C), ldc, sc, count);
  if (at == CUDA_R_16BF && ct == CUDA_R_32F)
    return emu_gemm<bf, float, float>(ta, tb, m, n, k, al, static_cast<const bf*>(A), lda, sa,
                                      static_cast<const bf*>(B), ldb, sb, be, static_cast<float*>(C), ldc, sc, count);
  return CUBLAS_STATUS_NOT_SUPPORTED;
}

inline cublasStatus_t emu_cublasDgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                                      const double* alpha, const double* A, int lda, const double* B, int ldb,
                                      const double* beta, double* C, int ldc) {
  return emu_cublasDgemmStridedBatched(h, ta, tb, m, n, k, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1);
}

inline cublasStatus_t emu_cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                       int k, const void* alpha, const void* A, cudaDataType_t at, int lda,
                                       const void* B, cudaDataType_t bt, int ldb, const void* beta, void* C,
                                       cudaDataType_t ct, int ldc, cublasComputeType_t compute,
                                       cublasGemmAlgo_t algo) {
  return emu_cublasGemmStridedBatchedEx(h, ta, tb, m, n, k, alpha, A, at, lda, 0, B, bt, ldb, 0, beta, C, ct, ldc, 0,
                                        1, compute, algo);
}

// Groups of problems with per-group sizes and scalars (float), the problems' pointers in
// order across the groups. A harness clears emu_cublas_grouped to have it refused
// (CUBLAS_STATUS_NOT_SUPPORTED), as cuBLAS refuses combinations it lacks.
inline bool emu_cublas_grouped = true;
inline cublasStatus_t emu_cublasGemmGroupedBatchedEx(
    cublasHandle_t h, const cublasOperation_t ta[], const cublasOperation_t tb[], const int m[], const int n[],
    const int k[], const void* alpha, const void* const A[], cudaDataType_t at, const int lda[],
    const void* const B[], cudaDataType_t bt, const int ldb[], const void* beta, void* const C[], cudaDataType_t ct,
    const int ldc[], int groups, const int group_size[], cublasComputeType_t compute) {
  if (!emu_cublas_grouped || !emu_gemm_types_ok(at, bt, ct)) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (groups < 0) return CUBLAS_STATUS_INVALID_VALUE;
  for (int g = 0; g < groups; ++g)
    if (group_size[g] < 0 || !emu_gemm_dims_ok(ta[g], tb[g], m[g], n[g], k[g], lda[g], ldb[g], ldc[g]))
      return CUBLAS_STATUS_INVALID_VALUE;
  // The per-group arrays are host memory, read now; the pointer arrays A, B and C are
  // device memory, read when the products run on the stream (emu_queue.h).
  auto host = [groups](const auto* a) { return std::vector<std::remove_cv_t<std::remove_pointer_t<decltype(a)>>>(a, a + groups); };
  const auto vta = host(ta), vtb = host(tb);
  const auto vm = host(m), vn = host(n), vk = host(k), vlda = host(lda), vldb = host(ldb), vldc = host(ldc);
  const auto vsize = host(group_size);
  const auto valpha = host(static_cast<const float*>(alpha)), vbeta = host(static_cast<const float*>(beta));
  emu_defer([=] {
    int at_problem = 0;
    for (int g = 0; g < groups; ++g)
      for (int i = 0; i < vsize[size_t(g)]; ++i, ++at_problem) {
        const size_t q = size_t(g);
        emu_cublasGemmEx(h, vta[q], vtb[q], vm[q], vn[q], vk[q], &valpha[q], A[at_problem], at, vlda[q], B[at_problem],
                         bt, vldb[q], &vbeta[q], C[at_problem], ct, vldc[q], compute, CUBLAS_GEMM_DEFAULT);
      }
  });
  return CUBLAS_STATUS_SUCCESS;
}

inline const char* emu_cublas_status(cublasStatus_t s) {
  return s == CUBLAS_STATUS_INVALID_VALUE   ? "CUBLAS_STATUS_INVALID_VALUE"
         : s == CUBLAS_STATUS_NOT_SUPPORTED ? "CUBLAS_STATUS_NOT_SUPPORTED"
                                            : "a cuBLAS error";
}
#define cublasDgemmStridedBatched emu_cublasDgemmStridedBatched
#define cublasGemmStridedBatchedEx emu_cublasGemmStridedBatchedEx
#define cublasDgemm emu_cublasDgemm
#define cublasGemmEx emu_cublasGemmEx
#define cublasGemmGroupedBatchedEx emu_cublasGemmGroupedBatchedEx
#define cublasGetStatusName emu_cublas_status
#define cublasGetStatusString emu_cublas_status
