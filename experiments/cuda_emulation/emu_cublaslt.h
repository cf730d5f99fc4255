// Stand-ins for the cuBLASLt calls ops/cuda/matmul_bias.cu makes, for emu.h's harnesses
// and the emulated device: descriptors that hold what the calls set (in the opaque
// structs cublasLt.h declares), a heuristic that answers for the problems the stand-in
// computes and refuses the rest, and a matmul with the documented semantics (D = alpha
// op(A) op(B) + beta C, column-major, plus the bias epilogue: one value per row of D added
// before D is rounded), computed as emu_cublas.h computes a GEMM. Only the attributes the
// library sets are taken; any other is refused (CUBLAS_STATUS_INVALID_VALUE), so that a new
// one is modelled here before the library relies on it.
#pragma once
#include <cublasLt.h>

#include <algorithm>
#include <climits>
#include <cstring>

#include "emu_cublas.h"
#include "emu_queue.h"

struct EmuLtOp {
  cublasComputeType_t compute;
  cudaDataType_t scale;
  int32_t trans_a = CUBLAS_OP_N, trans_b = CUBLAS_OP_N;
  uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  int32_t bias_type = -1;  // the default: D's type
};
struct EmuLtLayout {
  cudaDataType_t type;
  uint64_t rows, cols;
  int64_t ld;
};
struct EmuLtPref {
  uint64_t max_workspace = 0;
  uint32_t reduction_schemes = CUBLASLT_REDUCTION_SCHEME_MASK;
};
static_assert(sizeof(EmuLtOp) <= sizeof(cublasLtMatmulDescOpaque_t) &&
              sizeof(EmuLtLayout) <= sizeof(cublasLtMatrixLayoutOpaque_t) &&
              sizeof(EmuLtPref) <= sizeof(cublasLtMatmulPreferenceOpaque_t));

// The stand-in's state in an opaque struct and back (copied: the structs are plain data).
template <class S, class Opaque>
S emu_lt_get(const Opaque* o) {
  S s;
  std::memcpy(&s, o->data, sizeof(S));
  return s;
}
template <class S, class Opaque>
void emu_lt_put(Opaque* o, const S& s) {
  std::memcpy(o->data, &s, sizeof(S));
}

// Sets field f from buf when size is its size.
template <class F>
cublasStatus_t emu_lt_set(F& f, const void* buf, size_t size) {
  if (buf == nullptr || size != sizeof(F)) return CUBLAS_STATUS_INVALID_VALUE;
  std::memcpy(&f, buf, sizeof(F));
  return CUBLAS_STATUS_SUCCESS;
}

inline cublasStatus_t emu_cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* d, cublasComputeType_t compute,
                                                   cudaDataType_t scale) {
  *d = new cublasLtMatmulDescOpaque_t{};
  EmuLtOp op;
  op.compute = compute;
  op.scale = scale;
  emu_lt_put(*d, op);
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t emu_cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
  delete d;
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t emu_cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr,
                                                         const void* buf, size_t size) {
  EmuLtOp op = emu_lt_get<EmuLtOp>(d);
  cublasStatus_t st;
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA: st = emu_lt_set(op.trans_a, buf, size); break;
    case CUBLASLT_MATMUL_DESC_TRANSB: st = emu_lt_set(op.trans_b, buf, size); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE: st = emu_lt_set(op.epilogue, buf, size); break;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: st = emu_lt_set(op.bias, buf, size); break;
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: st = emu_lt_set(op.bias_type, buf, size); break;
    default: return CUBLAS_STATUS_INVALID_VALUE;
  }
  emu_lt_put(d, op);
  return st;
}

inline cublasStatus_t emu_cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* l, cudaDataType type, uint64_t rows,
                                                     uint64_t cols, int64_t ld) {
  *l = new cublasLtMatrixLayoutOpaque_t{};
  emu_lt_put(*l, EmuLtLayout{type, rows, cols, ld});
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t emu_cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
  delete l;
  return CUBLAS_STATUS_SUCCESS;
}

inline cublasStatus_t emu_cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* p) {
  *p = new cublasLtMatmulPreferenceOpaque_t{};
  emu_lt_put(*p, EmuLtPref{});
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t emu_cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
  delete p;
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t emu_cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                               cublasLtMatmulPreferenceAttributes_t attr,
                                                               const void* buf, size_t size) {
  EmuLtPref pref = emu_lt_get<EmuLtPref>(p);
  cublasStatus_t st;
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: st = emu_lt_set(pref.max_workspace, buf, size); break;
    case CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK: st = emu_lt_set(pref.reduction_schemes, buf, size); break;
    default: return CUBLAS_STATUS_INVALID_VALUE;
  }
  emu_lt_put(p, pref);
  return st;
}

// The problem one call describes, checked as cuBLASLt checks it: sizes from the layouts
// (A is m x k after its op, B k x n, C and D m x n), leading dimensions at least the
// stored heights, the types a stand-in computes (emu_gemm_types_ok with one compute type
// for each: 32F or its TF32 form with float scalars, or 64F with double ones), the bias
// epilogue with a bias in D's type. INVALID_VALUE for an inconsistent call, NOT_SUPPORTED
// for one the stand-in does not compute.
struct EmuLtProblem {
  EmuLtOp op;
  EmuLtLayout a, b, c, d;
  int m = 0, n = 0, k = 0;
};
inline cublasStatus_t emu_lt_problem(cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t A, cublasLtMatrixLayout_t B,
                                     cublasLtMatrixLayout_t C, cublasLtMatrixLayout_t D, EmuLtProblem& p) {
  if (!desc || !A || !B || !C || !D) return CUBLAS_STATUS_INVALID_VALUE;
  p.op = emu_lt_get<EmuLtOp>(desc);
  p.a = emu_lt_get<EmuLtLayout>(A), p.b = emu_lt_get<EmuLtLayout>(B);
  p.c = emu_lt_get<EmuLtLayout>(C), p.d = emu_lt_get<EmuLtLayout>(D);
  const bool ta = p.op.trans_a == CUBLAS_OP_T, tb = p.op.trans_b == CUBLAS_OP_T;
  if ((p.op.trans_a != CUBLAS_OP_N && !ta) || (p.op.trans_b != CUBLAS_OP_N && !tb)) return CUBLAS_STATUS_INVALID_VALUE;
  const uint64_t am = ta ? p.a.cols : p.a.rows, ak = ta ? p.a.rows : p.a.cols;
  const uint64_t bk = tb ? p.b.cols : p.b.rows, bn = tb ? p.b.rows : p.b.cols;
  if (ak != bk || p.d.rows != am || p.d.cols != bn || p.c.rows != p.d.rows || p.c.cols != p.d.cols)
    return CUBLAS_STATUS_INVALID_VALUE;
  for (const EmuLtLayout* l : {&p.a, &p.b, &p.c, &p.d})
    if (l->ld < int64_t(std::max<uint64_t>(1, l->rows)) || l->rows > INT_MAX || l->cols > INT_MAX)
      return CUBLAS_STATUS_INVALID_VALUE;
  p.m = int(am), p.n = int(bn), p.k = int(ak);
  if (p.a.type != p.b.type || p.c.type != p.d.type) return CUBLAS_STATUS_NOT_SUPPORTED;
  const bool f64 = p.a.type == CUDA_R_64F && p.d.type == CUDA_R_64F && p.op.compute == CUBLAS_COMPUTE_64F &&
                   p.op.scale == CUDA_R_64F;
  const bool f32 = emu_gemm_types_ok(p.a.type, p.b.type, p.d.type) && p.op.scale == CUDA_R_32F &&
                   (p.op.compute == CUBLAS_COMPUTE_32F ||
                    (p.op.compute == CUBLAS_COMPUTE_32F_FAST_TF32 && p.a.type == CUDA_R_32F));
  if (!f64 && !f32) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (p.op.epilogue == CUBLASLT_EPILOGUE_BIAS) {
    if (p.op.bias == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    if (p.op.bias_type != -1 && p.op.bias_type != int32_t(p.d.type)) return CUBLAS_STATUS_NOT_SUPPORTED;
  } else if (p.op.epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  return CUBLAS_STATUS_SUCCESS;
}

inline long emu_cublaslt_calls = 0;  // matmuls so far
// A harness clears it to have every problem refused by the heuristic (no algorithm), as
// cuBLASLt refuses problems it has no kernel for.
inline bool emu_cublaslt_heuristic = true;

inline cublasStatus_t emu_cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t desc,
                                                         cublasLtMatrixLayout_t A, cublasLtMatrixLayout_t B,
                                                         cublasLtMatrixLayout_t C, cublasLtMatrixLayout_t D,
                                                         cublasLtMatmulPreference_t pref, int requested,
                                                         cublasLtMatmulHeuristicResult_t results[], int* found) {
  if (!pref || requested <= 0 || !results || !found) return CUBLAS_STATUS_INVALID_VALUE;
  *found = 0;
  EmuLtProblem p;
  const cublasStatus_t st = emu_lt_problem(desc, A, B, C, D, p);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  if (!emu_cublaslt_heuristic) return CUBLAS_STATUS_NOT_SUPPORTED;
  results[0] = cublasLtMatmulHeuristicResult_t{};
  results[0].algo.data[0] = 0x454d55;  // any value: the stand-in has one algorithm
  results[0].state = CUBLAS_STATUS_SUCCESS;
  results[0].wavesCount = 1;
  *found = 1;
  return CUBLAS_STATUS_SUCCESS;
}

inline cublasStatus_t emu_cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t desc, const void* alpha,
                                         const void* A, cublasLtMatrixLayout_t Adesc, const void* B,
                                         cublasLtMatrixLayout_t Bdesc, const void* beta, const void* C,
                                         cublasLtMatrixLayout_t Cdesc, void* D, cublasLtMatrixLayout_t Ddesc,
                                         const cublasLtMatmulAlgo_t* algo, void*, size_t, cudaStream_t stream) {
  EmuLtProblem p;
  const cublasStatus_t st = emu_lt_problem(desc, Adesc, Bdesc, Cdesc, Ddesc, p);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  // The stand-in computes D in place of C (the library passes one matrix as both).
  if (algo == nullptr || !alpha || !beta || C != D) return CUBLAS_STATUS_NOT_SUPPORTED;
  ++emu_cublaslt_calls;
  const cublasOperation_t ta = cublasOperation_t(p.op.trans_a), tb = cublasOperation_t(p.op.trans_b);
  const void* bias = p.op.epilogue == CUBLASLT_EPILOGUE_BIAS ? p.op.bias : nullptr;
  const int m = p.m, n = p.n, k = p.k, lda = int(p.a.ld), ldb = int(p.b.ld), ldd = int(p.d.ld);
  using bf = __nv_bfloat16;
  if (p.d.type == CUDA_R_64F) {
    const double al = *static_cast<const double*>(alpha), be = *static_cast<const double*>(beta);
    emu_defer_on(stream, [=] {
      emu_gemm_run<double, double, double>(ta, tb, m, n, k, al, static_cast<const double*>(A), lda, 0,
                                           static_cast<const double*>(B), ldb, 0, be, static_cast<double*>(D), ldd, 0,
                                           1, static_cast<const double*>(bias));
    });
  } else {
    const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
    if (p.a.type == CUDA_R_32F)
      emu_defer_on(stream, [=] {
        emu_gemm_run<float, float, float>(ta, tb, m, n, k, al, static_cast<const float*>(A), lda, 0,
                                          static_cast<const float*>(B), ldb, 0, be, static_cast<float*>(D), ldd, 0, 1,
                                          static_cast<const float*>(bias));
      });
    else if (p.d.type == CUDA_R_16BF)
      emu_defer_on(stream, [=] {
        emu_gemm_run<bf, float, bf>(ta, tb, m, n, k, al, static_cast<const bf*>(A), lda, 0, static_cast<const bf*>(B),
                                    ldb, 0, be, static_cast<bf*>(D), ldd, 0, 1, static_cast<const bf*>(bias));
      });
    else
      emu_defer_on(stream, [=] {
        emu_gemm_run<bf, float, float>(ta, tb, m, n, k, al, static_cast<const bf*>(A), lda, 0,
                                       static_cast<const bf*>(B), ldb, 0, be, static_cast<float*>(D), ldd, 0, 1,
                                       static_cast<const float*>(bias));
      });
  }
  return CUBLAS_STATUS_SUCCESS;
}

#define cublasLtMatmulDescCreate emu_cublasLtMatmulDescCreate
#define cublasLtMatmulDescDestroy emu_cublasLtMatmulDescDestroy
#define cublasLtMatmulDescSetAttribute emu_cublasLtMatmulDescSetAttribute
#define cublasLtMatrixLayoutCreate emu_cublasLtMatrixLayoutCreate
#define cublasLtMatrixLayoutDestroy emu_cublasLtMatrixLayoutDestroy
#define cublasLtMatmulPreferenceCreate emu_cublasLtMatmulPreferenceCreate
#define cublasLtMatmulPreferenceDestroy emu_cublasLtMatmulPreferenceDestroy
#define cublasLtMatmulPreferenceSetAttribute emu_cublasLtMatmulPreferenceSetAttribute
#define cublasLtMatmulAlgoGetHeuristic emu_cublasLtMatmulAlgoGetHeuristic
#define cublasLtMatmul emu_cublasLtMatmul
