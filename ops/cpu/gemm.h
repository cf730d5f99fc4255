// CPU matrix multiply: C[b] = A[b]·B[b] (or C[b] += A[b]·B[b]) for a batch of strided
// operands. A native cache-blocked, packed kernel is always built; when the library is
// linked with OpenBLAS (MUMOE_OPENBLAS), cblas_?gemm is available as a second backend.
#pragma once
#include <cstdint>

#include "tensor/half.h"

namespace mu::cpu {

// Below this many flops (2 M N K summed over the batch) one thread does the whole product
// (gemm and gemm_batch_sum): starting a team costs more than it saves.
inline constexpr double kParallelFlops = 1 << 20;

// One operand's geometry, in elements. Element (i, j) of matrix b lives at
// data[b * batch_stride + i * row_stride + j * col_stride]. The native kernel takes any
// strides (even 0, for a broadcast row or column); BLAS needs row_stride == 1 or
// col_stride == 1 and is bypassed for other layouts.
template <class T>
struct MatrixRef {
  T* data = nullptr;
  int64_t batch_stride = 0;  // 0: the same matrix for every batch entry
  int64_t row_stride = 0;
  int64_t col_stride = 1;
};

// For each b < batch: C[b] (M x N) = A[b] (M x K) · B[b] (K x N), or C[b] += ... when
// `accumulate`. C must not overlap A or B; distinct C[b] must not overlap each other.
// K == 0 gives C = 0 (or leaves C as it is when accumulating). `bias` (N contiguous
// values, ignored when accumulating) is added to every row of C as C is stored, as a
// Linear layer's: C = A·B + 1 biasᵀ without a second pass over C. `row_bias` (M contiguous
// values, likewise) is added to every column instead, C = A·B + row_bias 1ᵀ: a Linear
// layer applied along C's rows (an MLP-Mixer's token MLP). At most one of the two; both
// are shared by every entry of the batch.
template <class T>
void gemm(int64_t batch, int64_t M, int64_t N, int64_t K, MatrixRef<const T> A, MatrixRef<const T> B,
          MatrixRef<T> C, bool accumulate = false, const T* bias = nullptr, const T* row_bias = nullptr);

// C (M x N) = Σ_b A[b] · B[b] over b < batch (C's batch stride is not used): the gradient
// of a matrix shared by every entry of a batched product, without the batch of partial
// products. Fastest when A[b]'s rows and B[b]'s columns are contiguous along the depth
// (gemm_batch_sum.cpp); any other strides go through gemm one product at a time. The
// result is the same on any number of threads. C must not overlap A or B.
template <class T>
void gemm_batch_sum(int64_t batch, int64_t M, int64_t N, int64_t K, MatrixRef<const T> A, MatrixRef<const T> B,
                    MatrixRef<T> C);

// C[b] = A[b] · B[b] (+ a bias as gemm's, N or M float32 values) for bfloat16 operands of
// any strides, on every CPU: gemm's float32 products, its packed paths widening the
// operands (exactly) as they pack them, its paths that read operands in place doing so
// on float32 copies of them (small products). Autocast's products where the CPU has no
// AVX512_BF16, without whole float32 copies of the operands. The result is bit for bit
// gemm<float>'s on the widened operands laid out alike, wherever the product takes a
// packed path (the same sums in the same order). C is float32, or bfloat16 where
// gemm_bf16_widening_rounds says that the product's tiles sum their whole depth before
// they are stored (blocked products of depth up to 512): each sum plus its bias rounded
// once as it is stored, with no float32 twin of C (others throw; callers round a twin).
void gemm_bf16_widening(int64_t batch, int64_t M, int64_t N, int64_t K, MatrixRef<const bfloat16_t> A,
                        MatrixRef<const bfloat16_t> B, MatrixRef<float> C, const float* col_bias = nullptr,
                        const float* row_bias = nullptr);
bool gemm_bf16_widening_rounds(int64_t M, int64_t N, int64_t K, int64_t a_cs, int64_t b_rs, int64_t b_cs);
void gemm_bf16_widening(int64_t batch, int64_t M, int64_t N, int64_t K, MatrixRef<const bfloat16_t> A,
                        MatrixRef<const bfloat16_t> B, MatrixRef<bfloat16_t> C, const float* col_bias = nullptr,
                        const float* row_bias = nullptr);

// Whether gemm multiplies an M x K by K x N float32 product on its tiny-product path
// (a tensor ring's per-token chains): a few dozen instructions a product, which the
// bfloat16 GEMM's packing would cost many times over.
bool gemm_tiny_product(int64_t M, int64_t N, int64_t K);
// C (M x N, row stride ldc, unit column stride) = A · B for bfloat16 operands of any
// strides and a gemm_tiny_product shape (K >= 1): the float32 product of their values,
// plus `bias` (N float32 values, one per column) and `row_bias` (M, one per row) where not
// null, rounded once for a bfloat16 C. On every CPU (float32 FMAs).
void gemm_bf16_tiny(int64_t M, int64_t N, int64_t K, const bfloat16_t* A, int64_t a_rs, int64_t a_cs,
                    const bfloat16_t* B, int64_t b_rs, int64_t b_cs, float* C, int64_t ldc,
                    const float* bias = nullptr, const float* row_bias = nullptr);
void gemm_bf16_tiny(int64_t M, int64_t N, int64_t K, const bfloat16_t* A, int64_t a_rs, int64_t a_cs,
                    const bfloat16_t* B, int64_t b_rs, int64_t b_cs, bfloat16_t* C, int64_t ldc,
                    const float* bias = nullptr, const float* row_bias = nullptr);

// gemm_batch_sum of bfloat16 operands into a float32 C (gemm_batch_sum.cpp): autocast's
// gradient of a weight shared by a batch (an MLP-Mixer's token weights), without float32
// copies of the operands: on VDPBF16PS where the build's target has AVX512_BF16, else
// float32 FMAs on operands widened in registers. Only for A[b]'s rows and B[b]'s columns
// contiguous along the depth (other layouts throw; callers widen those operands).
void gemm_batch_sum_bf16(int64_t batch, int64_t M, int64_t N, int64_t K, MatrixRef<const bfloat16_t> A,
                         MatrixRef<const bfloat16_t> B, MatrixRef<float> C);

// C (M x N) = A (M x K) · B in float32 for B(k, j) = bt[j * ldb + k] in bfloat16: the
// transpose of a row-major N x K matrix, which is what a Linear layer multiplies by under
// autocast (x · wᵀ). B is read in place and widened in registers (exactly), instead of
// copied whole to float32 first: a decoding step's few rows read 2 bytes per weight
// rather than 2 + 4 written + 4 read (one row by a 3072 x 768 weight 767 -> 46 us, by
// GPT-2 mini's 50257 x 256 head 10.4 -> 0.38 ms). For 1 to 16 rows, N and K at least a
// vector's width, any strides of A and C. Each element of C is summed in the same order
// on any number of threads. bf16_weight_product_fits says whether a product should take
// it (or, where gemm_bf16 below runs, gemm_bf16_few_rows): there up to 12 rows (16 by a
// weight past 16 MB), else up to 16.
bool bf16_weight_product_fits(int64_t M, int64_t N, int64_t K);
void gemm_bf16_weight(int64_t M, int64_t N, int64_t K, const float* A, int64_t a_rs, int64_t a_cs,
                      const bfloat16_t* bt, int64_t ldb, float* C, int64_t c_rs, int64_t c_cs);

// C (M x N, row stride ldc, unit column stride) = A (M x K) · B (K x N), both bfloat16
// with any strides, on the VDPBF16PS instruction (gemm_bf16.cpp): autocast's products of
// many rows, at twice float32's multiply-adds per instruction and without float32 copies
// of the operands. C is float32, or bfloat16 with each float32 sum rounded once as it is
// stored (the same bits as a float32 C rounded by a copy, without writing it). `bias` (N
// float32 values, one per column: a Linear layer's) and `row_bias` (M values, one per row:
// the MLP-Mixer's token mixing), where not null, are added to the float32 sums (in that
// order) before they are stored and rounded: a bfloat16 output rounded once. Only where
// the build's target has AVX512_BF16 (gemm_bf16_available); elsewhere gemm_bf16 throws and
// callers widen the operands.
bool gemm_bf16_available();
void gemm_bf16(int64_t M, int64_t N, int64_t K, const bfloat16_t* A, int64_t a_rs, int64_t a_cs, const bfloat16_t* B,
               int64_t b_rs, int64_t b_cs, float* C, int64_t ldc, const float* bias = nullptr,
               const float* row_bias = nullptr);
void gemm_bf16(int64_t M, int64_t N, int64_t K, const bfloat16_t* A, int64_t a_rs, int64_t a_cs, const bfloat16_t* B,
               int64_t b_rs, int64_t b_cs, bfloat16_t* C, int64_t ldc, const float* bias = nullptr,
               const float* row_bias = nullptr);

// C (M x N, any strides) = A (M x K, rows contiguous) · wᵀ for a row-major N x K bfloat16
// weight w read in place, 1 <= M <= kBf16FewRows: the dot-product form on VDPBF16PS (a
// decoding step's few rows by a weight), where gemm_bf16_available().
inline constexpr int64_t kBf16FewRows = 16;
void gemm_bf16_few_rows(int64_t M, int64_t N, int64_t K, const bfloat16_t* A, int64_t a_rs, const bfloat16_t* w,
                        int64_t ldw, float* C, int64_t c_rs, int64_t c_cs);

// Which implementation gemm uses. Auto: the library's choice, currently the native kernel
// for every product (gemm.cpp, kAutoUsesBlas, says why). Native / Blas force one; Blas
// still runs layouts BLAS cannot express (neither stride 1) and calls made inside an
// OpenMP parallel region natively. The initial choice comes from the environment
// variable MUMOE_GEMM=auto|native|blas, read once, so benchmarks switch without rebuilding.
enum class GemmBackend { Auto, Native, Blas };

void set_gemm_backend(GemmBackend backend);  // throws for Blas in a build without OpenBLAS
GemmBackend gemm_backend();
const char* gemm_backend_name(GemmBackend backend);  // "auto", "native", "blas"
bool gemm_have_blas();  // true when built with OpenBLAS

}  // namespace mu::cpu
