// How cuBLAS reads a strided row-major matrix in place, shared by the kernels that call
// cuBLAS GEMMs (ops/cuda/matmul.cu, ops/cuda/grouped_mm.cu). nvcc only.
#pragma once
#include <cublas_v2.h>

#include <cstdint>

namespace mu::cuda {

// The cuBLAS view of a rows x cols matrix with strides (sr, sc), or false when none fits.
// Row-major (sc == 1) read column-major is the cols x rows transpose: op N, ld = sr >= cols.
// Column-major (sr == 1) is the matrix itself: op T turns it, ld = sc >= rows. A size-1 dim
// makes its stride irrelevant, and then the leading dimension is set to the smallest legal one.
inline bool cublas_view(int64_t rows, int64_t cols, int64_t sr, int64_t sc, cublasOperation_t& op, int64_t& ld) {
  const int64_t min_row_ld = cols > 1 ? cols : 1, min_col_ld = rows > 1 ? rows : 1;
  if (sc == 1 || cols == 1) {
    const int64_t l = rows == 1 ? min_row_ld : sr;
    if (l >= min_row_ld) {
      op = CUBLAS_OP_N;
      ld = l;
      return true;
    }
  }
  if (sr == 1 || rows == 1) {
    const int64_t l = cols == 1 ? min_col_ld : sc;
    if (l >= min_col_ld) {
      op = CUBLAS_OP_T;
      ld = l;
      return true;
    }
  }
  return false;
}

}  // namespace mu::cuda
