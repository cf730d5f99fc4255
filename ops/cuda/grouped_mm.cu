// CUDA grouped matrix-product kernels (declared in ops/kernels/grouped_mm.h; the CPU
// twin is ops/cpu/grouped_mm.cpp): the non-empty groups' GEMMs as one
// cublasGemmGroupedBatchedEx call (float32, bfloat16), or one GEMM per group (float64, a
// single group, matrix-vector problems, or where cuBLAS refuses the grouped call; see
// run()), on the device's stream without
// any host synchronisation (the offsets are host integers: every GEMM's sizes are known
// without reading the device). One call instead of one per group matters for many small
// groups: 128 experts of ~256 rows each took 1.27 ms per call as 128 launches on an H200.
//
// cuBLAS is column-major. A dense row-major C (rows x cols) is, read column-major, Cᵀ
// (cols x rows, leading dimension cols), and Cᵀ = Qᵀ · Pᵀ for C = P · Q: so cuBLAS's "A"
// is Q and its "B" is P, each read through its strided view (ops/cuda/cublas_view.cuh).
// The forward's P is a group's rows of x and Q is w[g]; the weight gradient's P is the
// transpose of a group's rows of x (the same memory, strides swapped) and Q is the
// group's rows of dy.
//
// float64: cublasDgemm. float32: cublasGemmEx in full float32 unless TF32 was allowed
// (cuda::set_allow_tf32, as matmul). bfloat16: cublasGemmEx on bfloat16 operands and
// result, the products summed in float32 and rounded once.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "ops/cuda/cublas_view.cuh"
#include "ops/cuda/dtypes.cuh"
#include "ops/cuda/runtime.cuh"
#include "ops/kernels/grouped_mm.h"

namespace mu::cuda_kernels {
namespace {

// A strided matrix on the device: element (i, j) at data[i * sr + j * sc].
template <class T>
struct Mat {
  const T* data;
  int64_t rows, cols, sr, sc;
};

// cuBLAS takes sizes and leading dimensions as int: larger ones are refused by name.
void check_int(int64_t v, const char* what, const char* op) {
  MU_CHECK(v <= INT_MAX, op, " on CUDA: ", what, " = ", v, " exceeds cuBLAS's int32 limit (", INT_MAX, ")");
}

// Its cuBLAS view, which the op guarantees exists (ops/kernels/grouped_mm.h).
template <class T>
void view(const Mat<T>& a, const char* name, const char* op, cublasOperation_t& t, int64_t& ld) {
  MU_CHECK(cuda::cublas_view(a.rows, a.cols, a.sr, a.sc, t, ld), op, ": ", name, " (", a.rows, " x ", a.cols,
           ", strides ", a.sr, ", ", a.sc, ") has no layout cuBLAS can read; the op should have made it dense");
  check_int(ld, "a leading dimension", op);
}

// The grouped call's operand pointers reach the device as kernel arguments, which a launch
// copies when it is made: the host array may go as soon as the launch returns. (A
// cudaMemcpyAsync from pageable memory documents no such staging; the copy might read the
// array after it is gone.) kPointerChunk pointers a launch: 2 KB of arguments, within
// the 4 KB every architecture takes.
constexpr int kPointerChunk = 256;
struct PointerChunk {
  const void* p[kPointerChunk];
};
__global__ void write_pointers_kernel(PointerChunk chunk, int n, const void** dst) {
  if (int(threadIdx.x) < n) dst[threadIdx.x] = chunk.p[threadIdx.x];
}

// dst[0, n) = src[0, n) on the stream, dst in device memory.
void upload_pointers(const void** dst, const std::vector<const void*>& src, cudaStream_t stream) {
  for (size_t at = 0; at < src.size(); at += kPointerChunk) {
    const int n = int(std::min<size_t>(kPointerChunk, src.size() - at));
    PointerChunk chunk{};
    std::copy(src.begin() + std::ptrdiff_t(at), src.begin() + std::ptrdiff_t(at) + n, chunk.p);
    write_pointers_kernel<<<1, kPointerChunk, 0, stream>>>(chunk, n, dst + at);
    MU_CUDA_CHECK_LAUNCH("grouped_mm (operand pointers)");
  }
}

// One GEMM in cuBLAS's terms: cᵀ (m x n, ld m) = op(a) (m x k) · op(b) (k x n).
struct Problem {
  cublasOperation_t ta, tb;
  int m, n, k, lda, ldb, ldc;
  const void* a;
  const void* b;
  void* c;
};

// The problem for c (p.rows x q.cols, dense row-major) = p · q, with p.cols == q.rows > 0:
// cᵀ = qᵀ · pᵀ.
template <class T>
Problem problem(T* c, const Mat<T>& p, const Mat<T>& q, const char* op) {
  const int64_t m = q.cols, n = p.rows, k = p.cols;
  check_int(m, "N (output columns)", op);
  check_int(n, "rows of a group", op);
  check_int(k, "the inner size", op);
  Problem pr{};
  int64_t lda, ldb;
  view(q, "the right operand", op, pr.ta, lda);
  view(p, "the left operand", op, pr.tb, ldb);
  pr.m = int(m);
  pr.n = int(n);
  pr.k = int(k);
  pr.lda = int(lda);
  pr.ldb = int(ldb);
  pr.ldc = int(m);
  pr.a = q.data;
  pr.b = p.data;
  pr.c = c;
  return pr;
}

// Runs the problems on the stream `h` is bound to: grouped in one call where cuBLAS takes
// it, else one GEMM each.
template <class T>
void run(cublasHandle_t h, cudaStream_t stream, int device, const std::vector<Problem>& ps) {
  if (ps.empty()) return;
  if constexpr (std::is_same_v<T, double>) {
    const double alpha = 1, beta = 0;
    for (const Problem& p : ps)
      MU_CUBLAS_CHECK(cublasDgemm(h, p.ta, p.tb, p.m, p.n, p.k, &alpha, static_cast<const double*>(p.a), p.lda,
                                  static_cast<const double*>(p.b), p.ldb, &beta, static_cast<double*>(p.c), p.ldc));
  } else {
    constexpr bool is_bf16 = std::is_same_v<T, cuda::bf16>;
    const cudaDataType_t type = is_bf16 ? CUDA_R_16BF : CUDA_R_32F;
    const cublasComputeType_t compute =
        !is_bf16 && cuda::allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    // Matrix-vector problems (m = 1 or n = 1: an expert of width 1, a group of one row,
    // or such a weight gradient) go through cublasGemmEx one by one, the rest through one
    // grouped call. On an H200 (cuBLAS 13.0) the grouped call returned success yet left
    // rows of such bfloat16 products unwritten or wrong while the same problems one by one
    // were right: K 8, N 1 with groups of 1, 11 and 8 rows (m = 1); and the weight
    // gradient of four experts of width 1, m = 8 with n = 1.
    std::vector<Problem> vectors, grouped;
    for (const Problem& p : ps) (p.m == 1 || p.n == 1 ? vectors : grouped).push_back(p);
    const float alpha1 = 1, beta0 = 0;  // the scale type of CUBLAS_COMPUTE_32F* is float
    auto one_by_one = [&](const std::vector<Problem>& list) {
      for (const Problem& p : list)
        MU_CUBLAS_CHECK(cublasGemmEx(h, p.ta, p.tb, p.m, p.n, p.k, &alpha1, p.a, type, p.lda, p.b, type, p.ldb,
                                     &beta0, p.c, type, p.ldc, compute, CUBLAS_GEMM_DEFAULT));
    };
    one_by_one(vectors);
    if (grouped.size() > 1) {
      // Each problem a group of one: per-group sizes and scalars on the host, the operand
      // pointers in device memory (upload_pointers).
      const size_t n = grouped.size();
      std::vector<cublasOperation_t> ta(n), tb(n);
      std::vector<int> m(n), nn(n), k(n), lda(n), ldb(n), ldc(n), size(n, 1);
      std::vector<float> alpha(n, 1.f), beta(n, 0.f);
      std::vector<const void*> ptrs(3 * n);
      for (size_t i = 0; i < n; ++i) {
        const Problem& p = grouped[i];
        ta[i] = p.ta, tb[i] = p.tb, m[i] = p.m, nn[i] = p.n, k[i] = p.k;
        lda[i] = p.lda, ldb[i] = p.ldb, ldc[i] = p.ldc;
        ptrs[i] = p.a, ptrs[n + i] = p.b, ptrs[2 * n + i] = p.c;
      }
      cuda::Workspace dev_ptrs(3 * n * sizeof(void*), device);
      upload_pointers(dev_ptrs.as<const void*>(), ptrs, stream);
      const void* const* a = dev_ptrs.as<const void*>();
      const cublasStatus_t st = cublasGemmGroupedBatchedEx(
          h, ta.data(), tb.data(), m.data(), nn.data(), k.data(), alpha.data(), a, type, lda.data(), a + n, type,
          ldb.data(), beta.data(), const_cast<void* const*>(a + 2 * n), type, ldc.data(), int(n), size.data(),
          compute);
      if (st == CUBLAS_STATUS_SUCCESS) return;
      // Not this combination (cuBLAS names it NOT_SUPPORTED): the per-group loop below.
      MU_CHECK(st == CUBLAS_STATUS_NOT_SUPPORTED, "cublasGemmGroupedBatchedEx failed: ", cublasGetStatusName(st), " (",
               cublasGetStatusString(st), ")");
    }
    one_by_one(grouped);
  }
}

template <class T>
void grouped_mm_typed(const Tensor& out, const Tensor& x, const Tensor& w, const std::vector<int64_t>& offsets) {
  const int64_t G = w.size(0), K = x.size(1), N = w.size(2);
  if (out.numel() == 0) return;  // no rows or no columns: nothing to write
  cudaStream_t stream = cuda::stream(out);
  if (K == 0) {
    // An empty sum: zeros (all-zero bits are +0 in every float type); out is dense.
    MU_CUDA_CHECK(cudaMemsetAsync(out.raw_data(), 0, size_t(out.numel()) * sizeof(T), stream));
    return;
  }
  const T* xp = static_cast<const T*>(x.raw_data());
  const T* wp = static_cast<const T*>(w.raw_data());
  T* op = static_cast<T*>(out.raw_data());
  cublasHandle_t h = cuda::cublas(out.device().index);  // bound to `stream`
  std::vector<Problem> ps;
  for (int64_t g = 0; g < G; ++g) {
    const int64_t r0 = offsets[size_t(g)], rows = offsets[size_t(g) + 1] - r0;
    if (rows == 0) continue;
    const Mat<T> p{xp + r0 * x.stride(0), rows, K, x.stride(0), x.stride(1)};
    const Mat<T> q{wp + g * w.stride(0), K, N, w.stride(1), w.stride(2)};
    ps.push_back(problem<T>(op + r0 * N, p, q, "grouped_mm"));
  }
  run<T>(h, stream, out.device().index, ps);
}

template <class T>
void weight_grad_typed(const Tensor& dw, const Tensor& x, const Tensor& dy, const std::vector<int64_t>& offsets) {
  const int64_t G = dw.size(0), K = x.size(1), N = dy.size(1);
  if (dw.numel() == 0) return;
  cudaStream_t stream = cuda::stream(dw);
  const T* xp = static_cast<const T*>(x.raw_data());
  const T* dyp = static_cast<const T*>(dy.raw_data());
  T* dwp = static_cast<T*>(dw.raw_data());
  cublasHandle_t h = cuda::cublas(dw.device().index);
  std::vector<Problem> ps;
  for (int64_t g = 0; g < G; ++g) {
    const int64_t r0 = offsets[size_t(g)], rows = offsets[size_t(g) + 1] - r0;
    T* c = dwp + g * K * N;  // dw is dense
    if (rows == 0) {
      // No rows: an empty sum, zeros (cuBLAS is not asked to make them from k = 0).
      MU_CUDA_CHECK(cudaMemsetAsync(c, 0, size_t(K * N) * sizeof(T), stream));
      continue;
    }
    // x_gᵀ (K x rows): x's group rows with the strides swapped.
    const Mat<T> p{xp + r0 * x.stride(0), K, rows, x.stride(1), x.stride(0)};
    const Mat<T> q{dyp + r0 * dy.stride(0), rows, N, dy.stride(0), dy.stride(1)};
    ps.push_back(problem<T>(c, p, q, "grouped_mm_weight_grad"));
  }
  run<T>(h, stream, dw.device().index, ps);
}

void grouped_mm(const Tensor& out, const Tensor& x, const Tensor& w, const std::vector<int64_t>& offsets) {
  cuda::dispatch_float_bf16(x.dtype(), "grouped_mm",
                            [&](auto tag) { grouped_mm_typed<decltype(tag)>(out, x, w, offsets); });
}

void grouped_mm_weight_grad(const Tensor& dw, const Tensor& x, const Tensor& dy, const std::vector<int64_t>& offsets) {
  cuda::dispatch_float_bf16(x.dtype(), "grouped_mm_weight_grad",
                            [&](auto tag) { weight_grad_typed<decltype(tag)>(dw, x, dy, offsets); });
}

}  // namespace

MU_REGISTER_KERNEL(kernels::grouped_mm, DeviceType::CUDA, grouped_mm);
MU_REGISTER_KERNEL(kernels::grouped_mm_weight_grad, DeviceType::CUDA, grouped_mm_weight_grad);

}  // namespace mu::cuda_kernels
