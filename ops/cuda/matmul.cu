// The CUDA matrix-product kernel (declared in ops/kernels/linalg.h; the CPU twin is
// ops/cpu/matmul.cpp): one strided-batched cuBLAS GEMM on the device's handle and stream.
//
// cuBLAS is column-major. A row-major out (M x N, dense) is, read column-major, outᵀ
// (N x M, leading dimension N), and outᵀ = bᵀ · aᵀ: so cuBLAS's "A" is b and its "B" is
// a, with m = N, n = M, k = K. Each operand has a unit stride along its rows or its
// columns (the op guarantees it); read column-major, a row-major matrix is already its
// own transpose (op N, leading dimension = its row stride) and a column-major one needs
// op T (leading dimension = its column stride). A layout cuBLAS cannot express (a
// leading dimension below the matrix's height, e.g. a broadcast column with row stride
// 0) is first packed densely into a workspace by a small copy kernel.
//
// Batch strides go to cuBLAS as they are, 0 included (a broadcast operand is read again
// for every batch entry). K == 0 is an empty sum: out is set to zeros with a memset on
// the stream, without calling cuBLAS.
//
// matmul_row_bias (the MLP-Mixer's token mixing, out = a · b + one bias value per row)
// is the same GEMM with beta = 1 onto out holding the bias broadcast: cuBLAS adds C to the
// float32 (float64) sums before D is rounded, so a bfloat16 out is rounded once, as the
// CPU's kernel and cuBLASLt's column bias (matmul_bias.cu) round it. (cuBLASLt's bias
// epilogue adds one value per row of D = outᵀ, one per column of out: not this one.)
//
// cuBLAS's fast kernels (tensor cores, 16-byte loads and stores) need every matrix to
// start on 16 bytes, and its leading dimension and batch stride to be whole multiples of
// 16 bytes; otherwise it falls back to kernels several times slower. A large bfloat16
// product (float32 under TF32 too; kPadMinFlops and up) whose N and K are whole multiples
// of 16 bytes first copies such an operand into a buffer whose leading dimension is
// rounded up to 16 bytes (and would compute a misaligned output there and copy it out):
// one read and one write of the matrix. Measured on an H200 (GPT-2 124M, bf16): the tied
// embedding's gradient, 50257 x 768 from the logits' gradient read transposed (leading
// dimension 50257), went from 4.3 to 1.8 ms. Where N or K itself is odd (the logits'
// product, N = 50257, and the features' gradient, K = 50257) padding the leading
// dimensions alone bought no faster kernel, and the copies cost 1.1 and 1.2 ms: those
// products are left as they are. Padding their sizes too (N and K rounded up to 16 bytes,
// the operands' extra rows and columns zero, the output's extra columns dropped) is what
// should bring the fast kernels: MUMOE_MATMUL_PAD=extents does that for large
// tensor-core products, not yet timed on a GPU, so not the default. MUMOE_MATMUL_PAD=always
// pads sizes and matrices of any float32 or bfloat16 product (tests), =never nothing.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>

#include "ops/cuda/cublas_view.cuh"
#include "ops/cuda/dtypes.cuh"
#include "ops/cuda/packs.cuh"
#include "ops/cuda/runtime.cuh"
#include "ops/kernels/copy.h"
#include "ops/kernels/linalg.h"

namespace mu::cuda_kernels {
namespace {

// How cuBLAS reads one operand: its op and leading dimension, its batch stride, and where
// it lives (the tensor's data, or a packed copy).
struct Operand {
  const void* data = nullptr;
  cublasOperation_t op = CUBLAS_OP_N;
  int64_t ld = 1;
  int64_t batch_stride = 0;
};

// dst[(bi * rows + r) * cols + c] = src[bi * sb + r * sr + c * sc]: a dense row-major copy
// of `batch` strided matrices. One thread per element in a grid-stride loop.
template <class T>
__global__ void pack_kernel(T* dst, const T* src, int64_t batch, int64_t rows, int64_t cols, int64_t sb, int64_t sr,
                            int64_t sc) {
  const int64_t n = batch * rows * cols, step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += step) {
    const int64_t c = e % cols, r = (e / cols) % rows, bi = e / (cols * rows);
    dst[e] = src[bi * sb + r * sr + c * sc];
  }
}

// Operand `t` (rank 2, or rank 3 when batched) as cuBLAS reads it. When its layout has no
// cuBLAS view, a dense copy goes into `ws` (one matrix when the batch stride is 0).
template <class T>
Operand operand(const Tensor& t, bool batched, int64_t batch, std::unique_ptr<cuda::Workspace>& ws) {
  const int64_t rows = t.size(-2), cols = t.size(-1);
  Operand o;
  o.data = t.raw_data();
  o.batch_stride = batched && batch > 1 ? t.stride(0) : 0;
  if (cuda::cublas_view(rows, cols, t.stride(-2), t.stride(-1), o.op, o.ld)) return o;
  // Pack: a dense row-major copy, which cublas_view accepts (op N, ld = cols).
  const int64_t copies = o.batch_stride == 0 ? 1 : batch, n = copies * rows * cols;
  ws = std::make_unique<cuda::Workspace>(size_t(n) * sizeof(T), t.device().index);
  const int threads = 256;
  pack_kernel<T><<<cuda::grid_for(n, threads), threads, 0, cuda::stream(t)>>>(
      ws->as<T>(), static_cast<const T*>(t.raw_data()), copies, rows, cols, o.batch_stride, t.stride(-2), t.stride(-1));
  MU_CUDA_CHECK_LAUNCH("matmul (packing an operand)");
  o.data = ws->as<T>();
  o.op = CUBLAS_OP_N;
  o.ld = cols > 1 ? cols : 1;
  o.batch_stride = o.batch_stride == 0 ? 0 : rows * cols;
  return o;
}

// dst = src over a batch of lines (rows of a row-major matrix, columns of a column-major
// one): dst holds d_outer lines of d_inner elements (leading dimension ldd, batch stride
// dbs), src s_outer <= d_outer lines of s_inner <= d_inner (lds, sbs); what src lacks is
// zero (a product's padded inner size must add nothing). One block per line in a
// grid-stride loop, each thread moving 8 elements per turn with all 8 loads issued before
// the stores (one load in flight per thread leaves a copy waiting on memory latency).
template <class T>
__global__ void copy_lines_kernel(T* __restrict__ dst, int64_t ldd, int64_t dbs, int64_t d_outer, int64_t d_inner,
                                  const T* __restrict__ src, int64_t lds, int64_t sbs, int64_t s_outer,
                                  int64_t s_inner, int64_t batch) {
  constexpr int U = 8;
  for (int64_t r = blockIdx.x; r < batch * d_outer; r += gridDim.x) {
    const int64_t bi = r / d_outer, o = r % d_outer;
    const int64_t have = o < s_outer ? s_inner : 0;  // elements of this line src holds
    const T* s = src + bi * sbs + (o < s_outer ? o : 0) * lds;
    T* d = dst + bi * dbs + o * ldd;
    for (int64_t c0 = 0; c0 < d_inner; c0 += int64_t(U) * blockDim.x) {
      T v[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t c = c0 + int64_t(u) * blockDim.x + threadIdx.x;
        v[u] = c < have ? s[c] : T(0.0f);
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t c = c0 + int64_t(u) * blockDim.x + threadIdx.x;
        if (c < d_inner) d[c] = v[u];
      }
    }
  }
}

template <class T>
void copy_lines(T* dst, int64_t ldd, int64_t dbs, int64_t d_outer, int64_t d_inner, const T* src, int64_t lds,
                int64_t sbs, int64_t s_outer, int64_t s_inner, int64_t batch, cudaStream_t stream) {
  const int64_t lines = batch * d_outer;
  copy_lines_kernel<T><<<unsigned(lines < MU_CUDA_MAX_BLOCKS ? lines : MU_CUDA_MAX_BLOCKS), 256, 0, stream>>>(
      dst, ldd, dbs, d_outer, d_inner, src, lds, sbs, s_outer, s_inner, batch);
  MU_CUDA_CHECK_LAUNCH("matmul (padding copy)");
}

constexpr double kPadMinFlops = double(int64_t(1) << 31);  // 2 GFLOP: ~0.1 ms of tensor-core work

// n rounded up to a whole number of 16 bytes of T.
template <class T>
int64_t round16(int64_t n) {
  constexpr int64_t per = 16 / int64_t(sizeof(T));
  return (n + per - 1) / per * per;
}

// What a product pads (see the top of the file): nothing (on = false), or its misaligned
// matrices with the inner size K and the width N as given (zeros past K and N).
struct PadPlan {
  bool on = false;
  int64_t N = 0, K = 0;
};
template <class T>
PadPlan pad_plan(int64_t batch, int64_t M, int64_t N, int64_t K) {
  const char* env = std::getenv("MUMOE_MATMUL_PAD");
  const std::string mode = env ? env : "";
  if (mode == "never") return {};
  if (mode == "always") return {true, round16<T>(N), round16<T>(K)};
  const bool tensor_cores = std::is_same_v<T, cuda::bf16> || cuda::allow_tf32();
  if (!tensor_cores || 2.0 * double(batch) * double(M) * double(N) * double(K) < kPadMinFlops) return {};
  if (mode == "extents") return {true, round16<T>(N), round16<T>(K)};
  if (N == round16<T>(N) && K == round16<T>(K)) return {true, N, K};
  return {};
}

// A matrix cuBLAS reads at full speed: 16-byte start, leading dimension and batch stride.
template <class T>
bool aligned_for_cublas(const void* p, int64_t ld, int64_t batch_stride) {
  return cuda::aligned16(p) && (ld * int64_t(sizeof(T))) % 16 == 0 && (batch_stride * int64_t(sizeof(T))) % 16 == 0;
}

// Operand o (rows x cols of the product, stored as its op says) moved into `ws` as a
// rows_p x cols_p matrix (zeros past rows and cols) with a 16-byte leading dimension: the op
// stays, the storage's contiguous lines (rows for op N, columns for op T) get the stride.
template <class T>
Operand padded(const Operand& o, int64_t rows, int64_t cols, int64_t rows_p, int64_t cols_p, int64_t batch,
               int device, std::unique_ptr<cuda::Workspace>& ws, cudaStream_t stream) {
  const bool n = o.op == CUBLAS_OP_N;
  const int64_t outer = n ? rows : cols, inner = n ? cols : rows, outer_p = n ? rows_p : cols_p,
                inner_p = n ? cols_p : rows_p;
  const int64_t ld = round16<T>(inner_p), copies = o.batch_stride == 0 ? 1 : batch;
  auto buf = std::make_unique<cuda::Workspace>(size_t(copies * outer_p * ld) * sizeof(T), device);
  copy_lines<T>(buf->as<T>(), ld, outer_p * ld, outer_p, inner_p, static_cast<const T*>(o.data), o.ld, o.batch_stride,
                outer, inner, copies, stream);
  Operand p;
  p.data = buf->as<T>();
  p.op = o.op;
  p.ld = ld;
  p.batch_stride = o.batch_stride == 0 ? 0 : outer_p * ld;
  ws = std::move(buf);  // after the copy is queued: a packed source in ws lives until then
  return p;
}

// cuBLAS takes sizes and leading dimensions as int: larger ones are refused by name.
void check_int(int64_t v, const char* what, const Tensor& out, const Tensor& a, const Tensor& b) {
  MU_CHECK(v <= INT_MAX, "matmul on CUDA: ", what, " = ", v, " exceeds cuBLAS's int32 limit (", INT_MAX,
           ") for shapes ", shape_str(a.shape()), " x ", shape_str(b.shape()), " -> ", shape_str(out.shape()));
}

// out = a · b, or out += a · b when `accumulate` (beta = 1; out dense either way).
template <class T>
void matmul_typed(const Tensor& out, const Tensor& a, const Tensor& b, bool accumulate = false) {
  const bool batched = a.dim() == 3;
  const int64_t batch = batched ? a.size(0) : 1, M = a.size(-2), K = a.size(-1), N = b.size(-1);
  if (out.numel() == 0) return;  // batch, M or N is 0: nothing to write
  cudaStream_t stream = cuda::stream(out);
  if (K == 0) {
    // An empty sum: zeros (all-zero bits are +0 in every float type), or nothing to add.
    if (!accumulate) MU_CUDA_CHECK(cudaMemsetAsync(out.raw_data(), 0, size_t(out.numel()) * sizeof(T), stream));
    return;
  }
  check_int(M, "M (rows of a)", out, a, b);
  check_int(N, "N (columns of b)", out, a, b);
  check_int(K, "K (the inner size)", out, a, b);
  check_int(batch, "the batch size", out, a, b);
  std::unique_ptr<cuda::Workspace> wa, wb;  // packed copies, when an operand needs one
  Operand A = operand<T>(a, batched, batch, wa), B = operand<T>(b, batched, batch, wb);
  // Misaligned matrices of a large product go through padded buffers (see the top); the
  // product runs over Np columns and an inner size Kp (N and K, or rounded up).
  void* c_data = out.raw_data();
  int64_t ldc = N, Np = N, Kp = K;
  std::unique_ptr<cuda::Workspace> wc;
  if constexpr (!std::is_same_v<T, double>) {
    if (const PadPlan plan = pad_plan<T>(batch, M, N, K); plan.on) {
      const int dev = out.device().index;
      Np = plan.N, Kp = plan.K;
      if (Kp != K || !aligned_for_cublas<T>(A.data, A.ld, A.batch_stride))
        A = padded<T>(A, M, K, M, Kp, batch, dev, wa, stream);
      if (Kp != K || Np != N || !aligned_for_cublas<T>(B.data, B.ld, B.batch_stride))
        B = padded<T>(B, K, N, Kp, Np, batch, dev, wb, stream);
      if (Np != N || !aligned_for_cublas<T>(c_data, N, batched ? M * N : 0)) {
        ldc = round16<T>(Np);
        wc = std::make_unique<cuda::Workspace>(size_t(batch * M * ldc) * sizeof(T), dev);
        c_data = wc->as<T>();
        // What the product is added to, moved into the padded output first.
        if (accumulate)
          copy_lines<T>(wc->as<T>(), ldc, M * ldc, M, Np, static_cast<const T*>(out.raw_data()), N, M * N, M, N, batch,
                        stream);
      }
    }
  }
  check_int(A.ld, "a's leading dimension", out, a, b);
  check_int(B.ld, "b's leading dimension", out, a, b);
  check_int(ldc, "the output's leading dimension", out, a, b);
  check_int(Np, "N padded", out, a, b);
  check_int(Kp, "K padded", out, a, b);
  const int m = int(Np), n = int(M), k = int(Kp), count = int(batch);
  const long long stride_c = batched ? (long long)(M * ldc) : 0;
  cublasHandle_t h = cuda::cublas(out.device().index);  // bound to `stream`
  // outᵀ (m x n, ld N) = bᵀ (m x k) · aᵀ (k x n): cuBLAS's A is b, its B is a.
  if constexpr (std::is_same_v<T, double>) {
    const double alpha = 1, beta = accumulate ? 1 : 0;
    MU_CUBLAS_CHECK(cublasDgemmStridedBatched(h, B.op, A.op, m, n, k, &alpha, static_cast<const double*>(B.data),
                                              int(B.ld), B.batch_stride, static_cast<const double*>(A.data),
                                              int(A.ld), A.batch_stride, &beta, static_cast<double*>(out.raw_data()),
                                              m, stride_c, count));
  } else {
    // float32: fp32 math unless TF32 was allowed; bfloat16: bf16 operands and result,
    // products summed in fp32.
    constexpr bool is_bf16 = std::is_same_v<T, cuda::bf16>;
    const cudaDataType_t type = is_bf16 ? CUDA_R_16BF : CUDA_R_32F;
    const cublasComputeType_t compute =
        !is_bf16 && cuda::allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    const float alpha = 1, beta = accumulate ? 1 : 0;  // the scale type of CUBLAS_COMPUTE_32F* is float
    MU_CUBLAS_CHECK(cublasGemmStridedBatchedEx(h, B.op, A.op, m, n, k, &alpha, B.data, type, int(B.ld),
                                               B.batch_stride, A.data, type, int(A.ld), A.batch_stride, &beta,
                                               c_data, type, int(ldc), stride_c, count, compute,
                                               CUBLAS_GEMM_DEFAULT));
    // A padded output, its first N columns copied into out (dense).
    if (wc)
      copy_lines<T>(static_cast<T*>(out.raw_data()), N, M * N, M, N, wc->as<T>(), ldc, M * ldc, M, N, batch, stream);
  }
}

void matmul(const Tensor& out, const Tensor& a, const Tensor& b) {
  cuda::dispatch_float_bf16(a.dtype(), "matmul", [&](auto tag) { matmul_typed<decltype(tag)>(out, a, b); });
}

// out (M x N, dense, float32) += a · b for bfloat16 operands: one cuBLAS GEMM with beta = 1
// and cuBLAS's 16BF x 16BF -> 32F with 32F compute (the float32 twin of a bfloat16 product,
// summed in pieces). With out in the operands' dtype matmul_accumulate is matmul_typed
// accumulating.
void matmul_accumulate_into_float(const Tensor& out, const Tensor& a, const Tensor& b) {
  const int64_t M = a.size(0), K = a.size(1), N = b.size(1);
  if (out.numel() == 0 || K == 0) return;  // nothing to add
  check_int(M, "M (rows of a)", out, a, b);
  check_int(N, "N (columns of b)", out, a, b);
  check_int(K, "K (the inner size)", out, a, b);
  std::unique_ptr<cuda::Workspace> wa, wb;
  const Operand A = operand<cuda::bf16>(a, false, 1, wa), B = operand<cuda::bf16>(b, false, 1, wb);
  check_int(A.ld, "a's leading dimension", out, a, b);
  check_int(B.ld, "b's leading dimension", out, a, b);
  cublasHandle_t h = cuda::cublas(out.device().index);
  // outᵀ (N x M, ld N) += bᵀ · aᵀ, as in matmul_typed.
  const float alpha = 1, beta = 1;
  MU_CUBLAS_CHECK(cublasGemmStridedBatchedEx(h, B.op, A.op, int(N), int(M), int(K), &alpha, B.data, CUDA_R_16BF,
                                             int(B.ld), 0, A.data, CUDA_R_16BF, int(A.ld), 0, &beta, out.raw_data(),
                                             CUDA_R_32F, int(N), 0, 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// out (M x N, dense) += a · b (ops/kernels/linalg.h): one cuBLAS GEMM with beta = 1. out
// is float32 beside bfloat16 operands, else a's dtype.
void matmul_accumulate(const Tensor& out, const Tensor& a, const Tensor& b) {
  MU_CHECK(a.dim() == 2 && b.dim() == 2 && out.dim() == 2, "matmul_accumulate: rank-2 operands expected, got ",
           shape_str(a.shape()), " x ", shape_str(b.shape()), " into ", shape_str(out.shape()));
  MU_CHECK(b.dtype() == a.dtype() && (out.dtype() == a.dtype() || (a.dtype() == kBFloat16 && out.dtype() == kFloat32)),
           "matmul_accumulate: dtypes ", dtype_name(a.dtype()), " x ", dtype_name(b.dtype()), " into ",
           dtype_name(out.dtype()), " (out in the operands' dtype, or float32 beside bfloat16)");
  MU_CHECK(out.numel() == 0 || (out.stride(1) == 1 && out.stride(0) == out.size(1)),
           "matmul_accumulate on CUDA: out must be dense, got strides ", shape_str(out.strides()));
  if (out.dtype() != a.dtype()) return matmul_accumulate_into_float(out, a, b);
  cuda::dispatch_float_bf16(a.dtype(), "matmul_accumulate",
                            [&](auto tag) { matmul_typed<decltype(tag)>(out, a, b, true); });
}

}  // namespace

MU_REGISTER_KERNEL(kernels::matmul, DeviceType::CUDA, matmul);
MU_REGISTER_KERNEL(kernels::matmul_accumulate, DeviceType::CUDA, matmul_accumulate);

// out = a · b + bias[:, None] (see the top): the bias broadcast into out by the copy
// kernel, then the product added onto it (matmul_typed accumulating): three passes over
// out (the fill, C read, D written) where a bias epilogue would take one; as many as a GEMM
// and then an add, with one rounding. (Its GEMM part runs in the emulation harness,
// matmul_emulated.cpp.)
static void matmul_row_bias(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& bias) {
  MU_CHECK(out.is_contiguous() && out.dtype() == a.dtype() && bias.dtype() == a.dtype(),
           "matmul_row_bias on CUDA: a dense out and a bias of a's dtype expected, got out ", dtype_name(out.dtype()),
           " with strides ", shape_str(out.strides()), ", bias ", dtype_name(bias.dtype()), ", a ",
           dtype_name(a.dtype()));
  kernels::copy(out.device(), out, bias.unsqueeze(-1));
  cuda::dispatch_float_bf16(a.dtype(), "matmul_row_bias",
                            [&](auto tag) { matmul_typed<decltype(tag)>(out, a, b, true); });
}
MU_REGISTER_KERNEL(kernels::matmul_row_bias, DeviceType::CUDA, matmul_row_bias);

}  // namespace mu::cuda_kernels
