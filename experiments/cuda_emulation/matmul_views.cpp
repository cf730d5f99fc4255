// Checks the operand mapping of ops/cuda/matmul.cu without a GPU: cublas_view (extracted
// into view.h by run.sh) for random small shapes and layouts (row- and column-major,
// padded, broadcast rows or columns), with a dense copy where it finds no view, fed to a
// column-major GEMM with cuBLAS's semantics and leading-dimension checks, against the
// product read directly through the strides.
#include "view.h"
#include <cstdio>
#include <random>
#include <vector>
#include <cmath>
#include <algorithm>
// A strided matrix (rows x cols) over its own buffer.
struct Mat { int64_t r, c, sr, sc; std::vector<double> buf; double at(int64_t i, int64_t j) const { return buf[i * sr + j * sc]; } };
Mat make(int64_t r, int64_t c, int64_t sr, int64_t sc, std::mt19937& g) {
  int64_t n = 1 + (r - 1) * sr + (c - 1) * sc; if (r == 0 || c == 0) n = 1;
  Mat m{r, c, sr, sc, std::vector<double>(size_t(std::max<int64_t>(n, 1)))};
  std::normal_distribution<double> nd; for (auto& x : m.buf) x = nd(g); return m;
}
int main() {
  std::mt19937 g(1);
  int bad = 0, packed = 0, total = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    int64_t M = g() % 6 + 1, K = g() % 6 + 1, N = g() % 6 + 1;
    auto strides = [&](int64_t r, int64_t c, int64_t& sr, int64_t& sc) {
      switch (g() % 6) {
        case 0: sr = c; sc = 1; break;               // row-major
        case 1: sr = 1; sc = r; break;               // column-major
        case 2: sr = c + g() % 3; sc = 1; break;     // row-major, padded rows
        case 3: sr = 1; sc = r + g() % 3; break;     // column-major, padded
        case 4: sr = 0; sc = 1; break;               // broadcast rows
        default: sr = 1; sc = 0; break;              // broadcast columns
      }
    };
    int64_t asr, asc, bsr, bsc; strides(M, K, asr, asc); strides(K, N, bsr, bsc);
    // Only layouts the op passes (a unit stride along rows or columns, or a size-1 dim).
    auto passes = [](int64_t r, int64_t c, int64_t sr, int64_t sc) { return sc == 1 || c == 1 || sr == 1 || r == 1; };
    if (!passes(M, K, asr, asc) || !passes(K, N, bsr, bsc)) continue;
    Mat A = make(M, K, asr, asc, g), B = make(K, N, bsr, bsc, g);
    ++total;
    cublasOperation_t oa, ob; int64_t la, lb;
    bool va = cublas_view(M, K, asr, asc, oa, la), vb = cublas_view(K, N, bsr, bsc, ob, lb);
    // A packed operand is dense row-major: op N, ld = cols.
    std::vector<double> pa, pb;
    const double* da = A.buf.data(); const double* db = B.buf.data();
    if (!va) { ++packed; pa.resize(M * K); for (int64_t i = 0; i < M; ++i) for (int64_t j = 0; j < K; ++j) pa[i * K + j] = A.at(i, j); da = pa.data(); oa = CUBLAS_OP_N; la = K; }
    if (!vb) { ++packed; pb.resize(K * N); for (int64_t i = 0; i < K; ++i) for (int64_t j = 0; j < N; ++j) pb[i * N + j] = B.at(i, j); db = pb.data(); ob = CUBLAS_OP_N; lb = N; }
    // cuBLAS: C (m x n, ldc) = op(A') (m x k) op(B') (k x n), A' = b, B' = a, m = N, n = M.
    int64_t m = N, n = M, k = K;
    // cuBLAS's own argument checks.
    int64_t rowsA = ob == CUBLAS_OP_N ? m : k, rowsB = oa == CUBLAS_OP_N ? k : n;
    if (lb < std::max<int64_t>(1, rowsA) || la < std::max<int64_t>(1, rowsB)) { ++bad; printf("ld check fails\n"); continue; }
    for (int64_t i = 0; i < m; ++i) for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t p = 0; p < k; ++p) {
        double x = ob == CUBLAS_OP_N ? db[i + p * lb] : db[p + i * lb];
        double y = oa == CUBLAS_OP_N ? da[p + j * la] : da[j + p * la];
        s += x * y;
      }
      double want = 0; for (int64_t p = 0; p < K; ++p) want += A.at(j, p) * B.at(p, i);  // out[j][i], j a row of a
      if (std::abs(s - want) > 1e-12) { ++bad; break; }
    }
  }
  printf("%d layouts, %d packed operands, %d bad\n", total, packed, bad);
  return bad == 0 ? 0 : 1;
}
