// Stand-ins for the cuBLAS GEMMs ops/cuda/matmul.cu calls, for emu.h's harnesses: the
// documented column-major semantics (C = alpha op(A) op(B) + beta C per batch entry, op
// N or T, leading dimensions checked as cuBLAS checks them, C not read when beta is 0),
// summed in the compute type (float for float32 and bfloat16, double for float64), in k
// order. The library's types and enums come from cublas_v2.h; the calls are renamed.
#pragma once
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <algorithm>

template <class T>
float emu_blas_f(T x) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return __bfloat162float(x);
  else return float(x);
}

template <class T, class Acc>
cublasStatus_t emu_gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, Acc alpha, const T* A,
                        int lda, long long sa, const T* B, int ldb, long long sb, Acc beta, T* C, int ldc,
                        long long sc, int count) {
  const int rows_a = ta == CUBLAS_OP_N ? m : k, rows_b = tb == CUBLAS_OP_N ? k : n;
  if (m < 0 || n < 0 || k < 0 || count < 0 || lda < std::max(1, rows_a) || ldb < std::max(1, rows_b) ||
      ldc < std::max(1, m))
    return CUBLAS_STATUS_INVALID_VALUE;
  for (int bi = 0; bi < count; ++bi)
    for (int j = 0; j < n; ++j)
      for (int i = 0; i < m; ++i) {
        Acc s = 0;
        for (int p = 0; p < k; ++p) {
          const T a = ta == CUBLAS_OP_N ? A[bi * sa + i + (long long)p * lda] : A[bi * sa + p + (long long)i * lda];
          const T b = tb == CUBLAS_OP_N ? B[bi * sb + p + (long long)j * ldb] : B[bi * sb + j + (long long)p * ldb];
          if constexpr (std::is_same_v<Acc, double>) s += a * b;
          else s += emu_blas_f(a) * emu_blas_f(b);
        }
        T& c = C[bi * sc + i + (long long)j * ldc];
        const Acc r = beta == Acc(0) ? alpha * s : alpha * s + beta * Acc(emu_blas_f(c));
        if constexpr (std::is_same_v<T, __nv_bfloat16>) c = __float2bfloat16_rn(r);
        else c = T(r);
      }
  return CUBLAS_STATUS_SUCCESS;
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
  if (at != bt || at != ct) return CUBLAS_STATUS_NOT_SUPPORTED;
  const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
  if (at == CUDA_R_32F)
    return emu_gemm<float, float>(ta, tb, m, n, k, al, static_cast<const float*>(A), lda, sa,
                                  static_cast<const float*>(B), ldb, sb, be, static_cast<float*>(C), ldc, sc, count);
  if (at == CUDA_R_16BF)
    return emu_gemm<__nv_bfloat16, float>(ta, tb, m, n, k, al, static_cast<const __nv_bfloat16*>(A), lda, sa,
                                          static_cast<const __nv_bfloat16*>(B), ldb, sb, be,
                                          static_cast<__nv_bfloat16*>(C), ldc, sc, count);
  return CUBLAS_STATUS_NOT_SUPPORTED;
}

inline const char* emu_cublas_status(cublasStatus_t s) {
  return s == CUBLAS_STATUS_INVALID_VALUE ? "CUBLAS_STATUS_INVALID_VALUE" : "a cuBLAS error";
}
#define cublasDgemmStridedBatched emu_cublasDgemmStridedBatched
#define cublasGemmStridedBatchedEx emu_cublasGemmStridedBatchedEx
#define cublasGetStatusName emu_cublas_status
#define cublasGetStatusString emu_cublas_status
