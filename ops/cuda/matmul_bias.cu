// The CUDA product-and-bias kernel (declared in ops/kernels/linalg.h; the CPU twin is in
// ops/cpu/matmul.cpp): linear's forward, out = a · b + bias, as one cuBLASLt matmul whose
// epilogue adds the bias to the float32 (float64) sums before the result is rounded and
// stored, as torch's F.linear runs on a GPU; composed, a GEMM and then an elementwise pass
// read and wrote the whole output again (GPT-2 124M at B=8, T=1024 in bfloat16: 113 MB of
// Linear outputs per block).
//
// The layouts are matmul.cu's: out (M x N, row-major, dense) read column-major is outᵀ
// (N x M, leading dimension N) = bᵀ · aᵀ, so cuBLASLt's A is b and its B is a (cublas_view
// gives each its op and leading dimension); the bias, one value per row of D = outᵀ, is
// one per column of out.
//
// cuBLASLt picks a kernel by a heuristic query per problem; its answer (or that it has
// none) is kept per device, dtype, math mode, sizes, layouts and pointer alignment, so a
// training step asks once per distinct Linear. Where it has no kernel, where an operand
// has no cuBLAS view, for an empty inner size, or with MUMOE_CUBLASLT=off (to time one
// against the other), the product runs through the matmul kernels and the elementwise add
// adds the bias with the same numerics: a bfloat16 product kept in float32 until the bias
// is added, then rounded once.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <type_traits>

#include "ops/cuda/cublas_view.cuh"
#include "ops/cuda/dtypes.cuh"
#include "ops/cuda/packs.cuh"
#include "ops/cuda/runtime.cuh"
#include "ops/kernels/linalg.h"
#include "ops/kernels/map.h"

namespace mu::cuda_kernels {
namespace {

// The composed path: the product through the matmul kernels (an empty inner size gives
// zeros), then the bias added by the elementwise add kernel. A bfloat16 product goes into
// a float32 twin (matmul_accumulate into zeros) and the add, computing in float32, rounds
// once as it writes out.
template <class T>
void composed(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& bias) {
  const Tensor row_bias = bias.expand(out.shape());
  if constexpr (std::is_same_v<T, cuda::bf16>) {
    const Tensor wide = empty(out.shape(), TensorOptions(kFloat32).device(out.device()));
    MU_CUDA_CHECK(cudaMemsetAsync(wide.raw_data(), 0, size_t(wide.numel()) * sizeof(float), cuda::stream(out)));
    kernels::matmul_accumulate(out.device(), wide, a, b);
    kernels::map<fn::Add>()(out.device(), out, std::array<Tensor, 3>{wide, row_bias, Tensor()}, fn::Add{});
  } else {
    kernels::matmul(out.device(), out, a, b);
    kernels::map<fn::Add>()(out.device(), out, std::array<Tensor, 3>{out, row_bias, Tensor()}, fn::Add{});
  }
}

// ---------------------------------------------------------------- cuBLASLt

// The descriptors of one call, destroyed on every way out.
struct LtDescs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  LtDescs() = default;
  LtDescs(const LtDescs&) = delete;
  LtDescs& operator=(const LtDescs&) = delete;
  ~LtDescs() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

template <class V>
void set_op(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const V& v) {
  MU_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, attr, &v, sizeof(v)));
}

// The largest power of two, up to 256, dividing the address: the heuristic's answer
// depends on the pointers' alignment.
int64_t alignment(const void* p) {
  const uintptr_t v = reinterpret_cast<uintptr_t>(p) | 256;
  return int64_t(v & (~v + 1));
}

// What the heuristic said for one problem: its algorithm, or that it has none.
struct LtChoice {
  bool found = false;
  cublasLtMatmulAlgo_t algo{};
};
using LtKey = std::array<int64_t, 12>;
std::mutex g_choices_mu;
std::map<LtKey, LtChoice> g_choices;

// out = a · b + bias through cuBLASLt; false (nothing queued) when an operand has no
// cuBLAS view or cuBLASLt has no kernel for the problem.
template <class T>
bool matmul_bias_lt(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& bias) {
  const int64_t M = a.size(0), K = a.size(1), N = b.size(1);
  cublasOperation_t op_a, op_b;
  int64_t ld_a, ld_b;
  if (!cuda::cublas_view(M, K, a.stride(0), a.stride(1), op_a, ld_a) ||
      !cuda::cublas_view(K, N, b.stride(0), b.stride(1), op_b, ld_b))
    return false;
  constexpr bool is_bf16 = std::is_same_v<T, cuda::bf16>, is_f64 = std::is_same_v<T, double>;
  const cudaDataType_t type = is_bf16 ? CUDA_R_16BF : is_f64 ? CUDA_R_64F : CUDA_R_32F;
  const bool tf32 = !is_bf16 && !is_f64 && cuda::allow_tf32();
  // A large TF32 product with a matrix off 16-byte alignment: matmul.cu's padded buffers
  // give it the fast kernels, which cuBLASLt would not use either; the bias then costs
  // its own pass. (bfloat16 stays here: the composed path's float32 product is not padded.)
  const bool aligned = cuda::aligned16(a.raw_data()) && cuda::aligned16(b.raw_data()) &&
                       cuda::aligned16(out.raw_data()) && (ld_a * 4) % 16 == 0 && (ld_b * 4) % 16 == 0 &&
                       (N * 4) % 16 == 0;
  if (tf32 && !aligned && 2.0 * double(M) * double(N) * double(K) >= double(int64_t(1) << 31)) return false;
  const cublasComputeType_t compute = is_f64 ? CUBLAS_COMPUTE_64F : tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                                         : CUBLAS_COMPUTE_32F;
  const int dev = out.device().index;
  const cuda::CublasWorkspace ws = cuda::cublas_workspace(dev);
  LtDescs d;
  MU_CUBLAS_CHECK(cublasLtMatmulDescCreate(&d.op, compute, is_f64 ? CUDA_R_64F : CUDA_R_32F));
  // cuBLASLt's A is b, its B is a (see the top); each laid out as stored, before its op.
  set_op(d.op, CUBLASLT_MATMUL_DESC_TRANSA, int32_t(op_b));
  set_op(d.op, CUBLASLT_MATMUL_DESC_TRANSB, int32_t(op_a));
  set_op(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE, uint32_t(CUBLASLT_EPILOGUE_BIAS));
  set_op(d.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias.raw_data());
  set_op(d.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, int32_t(type));
  const bool b_n = op_b == CUBLAS_OP_N, a_n = op_a == CUBLAS_OP_N;
  MU_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.a, type, b_n ? N : K, b_n ? K : N, ld_b));
  MU_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.b, type, a_n ? K : M, a_n ? M : K, ld_a));
  MU_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.d, type, N, M, N));  // C is D (beta = 0)

  const LtKey key{dev, int64_t(type), int64_t(tf32), int64_t(op_a), int64_t(op_b), M, N, K, ld_a, ld_b,
                  std::min({alignment(a.raw_data()), alignment(b.raw_data()), alignment(out.raw_data())}),
                  alignment(bias.raw_data())};
  LtChoice choice;
  bool known = false;
  {
    std::lock_guard<std::mutex> lock(g_choices_mu);
    auto it = g_choices.find(key);
    if (it != g_choices.end()) choice = it->second, known = true;
  }
  if (!known) {
    MU_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&d.pref));
    const uint64_t max_ws = ws.bytes;
    MU_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_ws,
                                                         sizeof(max_ws)));
    // A split inner size's partial sums added in float32, never in bfloat16 (runtime.cu's
    // math mode says why: it is the cuBLAS handle's rule too).
    const uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    MU_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes,
                                                         sizeof(schemes)));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(cuda::cublaslt(dev), d.op, d.a, d.b, d.d, d.d, d.pref,
                                                             1, &result, &found);
    MU_CHECK(st == CUBLAS_STATUS_SUCCESS || st == CUBLAS_STATUS_NOT_SUPPORTED,
             "cublasLtMatmulAlgoGetHeuristic failed: ", cublasGetStatusName(st), " (", cublasGetStatusString(st),
             ") for a product-and-bias of ", shape_str(a.shape()), " x ", shape_str(b.shape()), " (",
             dtype_name(a.dtype()), ")");
    choice.found = st == CUBLAS_STATUS_SUCCESS && found > 0;
    if (choice.found) choice.algo = result.algo;
    std::lock_guard<std::mutex> lock(g_choices_mu);
    g_choices[key] = choice;
  }
  if (!choice.found) return false;
  using Scale = std::conditional_t<is_f64, double, float>;
  const Scale alpha = 1, beta = 0;
  MU_CUBLAS_CHECK(cublasLtMatmul(cuda::cublaslt(dev), d.op, &alpha, b.raw_data(), d.a, a.raw_data(), d.b, &beta,
                                 out.raw_data(), d.d, out.raw_data(), d.d, &choice.algo, ws.data, ws.bytes,
                                 cuda::stream(out)));
  return true;
}

bool lt_enabled() {
  const char* env = std::getenv("MUMOE_CUBLASLT");
  return !(env && std::strcmp(env, "off") == 0);
}

template <class T>
void matmul_bias_typed(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& bias) {
  if (out.numel() == 0) return;
  if (a.size(1) > 0 && lt_enabled() && matmul_bias_lt<T>(out, a, b, bias)) return;
  composed<T>(out, a, b, bias);
}

void matmul_bias(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& bias) {
  MU_CHECK(a.dim() == 2 && b.dim() == 2 && out.dim() == 2 && bias.dim() == 1 && bias.size(0) == b.size(1),
           "matmul_bias: rank-2 operands and a bias of one value per column expected, got ", shape_str(a.shape()),
           " x ", shape_str(b.shape()), " + ", shape_str(bias.shape()), " into ", shape_str(out.shape()));
  MU_CHECK(b.dtype() == a.dtype() && out.dtype() == a.dtype() && bias.dtype() == a.dtype(),
           "matmul_bias: one dtype expected, got ", dtype_name(a.dtype()), " x ", dtype_name(b.dtype()), " + ",
           dtype_name(bias.dtype()), " into ", dtype_name(out.dtype()));
  MU_CHECK(out.is_contiguous() && bias.is_contiguous(), "matmul_bias on CUDA: out and bias must be dense");
  cuda::dispatch_float_bf16(a.dtype(), "matmul_bias",
                            [&](auto tag) { matmul_bias_typed<decltype(tag)>(out, a, b, bias); });
}

}  // namespace

MU_REGISTER_KERNEL(kernels::matmul_bias, DeviceType::CUDA, matmul_bias);

}  // namespace mu::cuda_kernels
