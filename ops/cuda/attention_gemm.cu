// Attention through cuBLAS for long sequences (float32 and bfloat16): the score matrix
// S = Q Kᵀ and every product with it are strided-batched GEMMs on the tensor cores, and
// the softmax, the causal mask and the dropout mask are row kernels over S in between.
//
//   forward   S = Q Kᵀ (float32)   P = softmax(scale S, mask) ∘ M/(1-p)   O = P V
//   backward  S = Q Kᵀ again, P from S and the forward's lse
//             dV = Pdᵀ dO    dP = dO Vᵀ    dS = scale · P ∘ (dP ∘ M/(1-p) - Di)
//             dQ = dS K      dK = dSᵀ Q                 (Di = rowsum(dO ∘ O))
//
// Under a causal mask the products skip the blocks of scores above the diagonal: queries
// and keys are cut into blocks (Blocks below), row block [r0, r1) computes its scores and
// O = P V over keys [0, r1) only, and key block [c0, c1) its dV and dK over rows [c0, Tq)
// only. With 8 blocks that is 36 of the 64 block products, 56% of the multiply-adds.
//
// It moves O(Tq·Tk) bytes per head through memory (the tiled kernel of attention.cu
// moves none), but the GEMMs run on the matrix units, which the tiled kernel's scalar
// float arithmetic does not use: for T in the hundreds and above it is several times
// faster. attention.cu asks attention_gemm_wanted() before its tiled kernels. The
// probabilities and the dropout mask are the tiled kernel's, entry for entry
// (ops/kernels/attention.h), so both paths compute the same function.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "ops/cuda/attention_common.cuh"
#include "ops/cuda/attention_gemm.cuh"
#include "ops/cuda/dtypes.cuh"
#include "ops/cuda/lines.cuh"
#include "ops/cuda/runtime.cuh"

namespace mu::cuda_kernels {

namespace {

// Scratch for S, P and dP is at most this many bytes; longer calls run in chunks of heads.
constexpr size_t kWorkspaceCap = size_t(2) << 30;

// What the row kernels need to know about a call (bh0: the chunk's first head).
using RowGeo = AttentionGeo;

// The dropout factor of entry (i, j) of head bh: 0 when dropped, keep when kept (the
// tiled kernels' mask, ops/cuda/attention_common.cuh).
__device__ __forceinline__ float dropout_factor(const RowGeo& g, int64_t bh, int64_t i, int64_t j) {
  return attention_keep_factor(g.key, g.threshold, g.keep, bh, g.Tq, g.Tk, i, j);
}

// The entries of row i the products read: up to the end of its row block under a causal
// mask (the masked ones written as zeros), the whole row else.
__device__ __forceinline__ int64_t row_width(const RowGeo& g, int64_t block, int64_t i) {
  if (!g.causal) return g.Tk;
  const int64_t end = (i / block + 1) * block;
  return end < g.Tk ? end : g.Tk;
}

// Forward rows: one block per query row of the chunk. From the raw scores S (float32)
// writes P ∘ M/(1-p) in T and the row's log-sum-exp (scaled-score units).
template <class T, class L>
__global__ void softmax_rows_kernel(const float* __restrict__ S, T* __restrict__ P, L* __restrict__ lse, RowGeo g,
                                    int64_t block) {
  __shared__ alignas(8) unsigned char scratch[cuda::kScratchBytes];
  const cuda::BlockGroup group{int(threadIdx.x), int(blockDim.x), scratch};  // ops/cuda/lines.cuh
  const int64_t row = blockIdx.x, i = row % g.Tq, bh = g.bh0 + row / g.Tq;
  const float* s = S + row * g.Tk;
  T* p = P + row * g.Tk;
  const int64_t seen = g.causal ? (i + 1 < g.Tk ? i + 1 : g.Tk) : g.Tk;  // keys j < seen are visible
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < seen; j += blockDim.x) m = fmaxf(m, g.scale * s[j]);
  m = group.reduce(m, cuda::MaxOf{}, -INFINITY);
  float l = 0;
  for (int64_t j = threadIdx.x; j < seen; j += blockDim.x) l += expf(g.scale * s[j] - m);
  l = group.reduce(l, cuda::SumOf{}, 0.f);
  const float lse_row = m + logf(l);  // seen >= 1: l >= 1
  const int64_t width = row_width(g, block, i);
  for (int64_t j = threadIdx.x; j < width; j += blockDim.x) {
    float pj = j < seen ? expf(g.scale * s[j] - lse_row) : 0.f;
    if (g.dropout && pj != 0.f) pj *= dropout_factor(g, bh, i, j);
    p[j] = cuda::narrow<T>(pj);
  }
  if (threadIdx.x == 0) lse[row] = L(lse_row);
}

// Backward rows, first pass: Pd = P ∘ M/(1-p) in T from S and the forward's lse.
template <class T, class L>
__global__ void probs_rows_kernel(const float* __restrict__ S, const L* __restrict__ lse, T* __restrict__ Pd,
                                  RowGeo g, int64_t block) {
  const int64_t row = blockIdx.x, i = row % g.Tq, bh = g.bh0 + row / g.Tq;
  const float* s = S + row * g.Tk;
  T* p = Pd + row * g.Tk;
  const float L_row = float(lse[row]);
  const int64_t seen = g.causal ? (i + 1 < g.Tk ? i + 1 : g.Tk) : g.Tk, width = row_width(g, block, i);
  for (int64_t j = threadIdx.x; j < width; j += blockDim.x) {
    float pj = j < seen ? expf(g.scale * s[j] - L_row) : 0.f;
    if (g.dropout && pj != 0.f) pj *= dropout_factor(g, bh, i, j);
    p[j] = cuda::narrow<T>(pj);
  }
}

// Backward rows, second pass: dS = scale · (Pd ∘ dP - P · Di) (with Pd = P without
// dropout this is scale · P ∘ (dP - Di)), the gradient of the raw scores, in T.
template <class T, class L>
__global__ void dscores_rows_kernel(const float* __restrict__ S, const float* __restrict__ dP,
                                    const L* __restrict__ lse, const float* __restrict__ di, T* __restrict__ dS,
                                    RowGeo g, int64_t block) {
  const int64_t row = blockIdx.x, i = row % g.Tq, bh = g.bh0 + row / g.Tq;
  const float* s = S + row * g.Tk;
  const float* dp = dP + row * g.Tk;
  T* ds = dS + row * g.Tk;
  const float L_row = float(lse[row]), D_row = di[row];
  const int64_t seen = g.causal ? (i + 1 < g.Tk ? i + 1 : g.Tk) : g.Tk, width = row_width(g, block, i);
  for (int64_t j = threadIdx.x; j < width; j += blockDim.x) {
    float v = 0;
    if (j < seen) {
      const float p = expf(g.scale * s[j] - L_row);
      const float pd = g.dropout ? p * dropout_factor(g, bh, i, j) : p;
      v = g.scale * (pd * dp[j] - p * D_row);
    }
    ds[j] = cuda::narrow<T>(v);
  }
}

// Row-major batched GEMM: C[b] (M x N, ldc) = op(A[b]) · op(B[b]), op a transposition
// when asked; A and B of type `ab`, C of type `c`, sums in float32 (TF32 for float32
// operands when the user allowed it). In cuBLAS's column-major terms Cᵀ = op(B)ᵀ · op(A)ᵀ,
// so the operands swap places and keep their transposition flags.
void gemm_rm(cublasHandle_t h, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const void* A, int64_t lda,
             int64_t sa, const void* B, int64_t ldb, int64_t sb, void* C, int64_t ldc, int64_t sc, int64_t batch,
             cudaDataType_t ab, cudaDataType_t c) {
  const float alpha = 1, beta = 0;
  const cublasComputeType_t compute =
      ab == CUDA_R_32F && cuda::allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  MU_CUBLAS_CHECK(cublasGemmStridedBatchedEx(h, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                                             int(N), int(M), int(K), &alpha, B, ab, int(ldb), sb, A, ab, int(lda), sa,
                                             &beta, C, c, int(ldc), sc, int(batch), compute, CUBLAS_GEMM_DEFAULT));
}

template <class T>
constexpr cudaDataType_t cuda_type() {
  return std::is_same_v<T, cuda::bf16> ? CUDA_R_16BF : CUDA_R_32F;
}

// The log-sum-exps' type: float32 for bfloat16 inputs (ops/kernels/attention.h), T else.
template <class T>
using lse_of = std::conditional_t<std::is_same_v<T, cuda::bf16>, float, T>;

// The call's shape, and the heads per chunk that keep `per_entry` bytes of scratch per
// score entry under the cap.
struct Plan {
  int64_t BH, Tq, Tk, D, chunk;
};
Plan plan_for(const Tensor& q, const Tensor& k, size_t per_entry) {
  Plan p{q.size(0) * q.size(1), q.size(2), k.size(2), q.size(3), 1};
  const size_t per_head = size_t(p.Tq) * size_t(p.Tk) * per_entry;
  p.chunk = std::max<int64_t>(1, std::min<int64_t>(p.BH, int64_t(kWorkspaceCap / std::max<size_t>(per_head, 1))));
  return p;
}

RowGeo row_geo(const Plan& pl, const kernels::AttentionParams& p) { return attention_geo(pl.Tq, pl.Tk, p); }

// How a call's products are cut. Without a causal mask: one block of rows that sees every
// key, one block of keys that every row sees. With it: blocks of `size` queries and keys;
// row block [r0, r1) sees keys [0, min(r1, Tk)), key block [c0, c1) is seen by rows
// [c0, Tq) (by none when c0 >= Tq: those keys' dK and dV are zero). At most 8 blocks, so
// at most 8 GEMM calls per product, of at least 128 rows, so each keeps the matrix units
// busy over the batch of heads.
struct Blocks {
  int64_t Tq, Tk, size;
  bool causal;
  int64_t keys_seen(int64_t r1) const { return causal ? std::min(r1, Tk) : Tk; }  // by rows [.., r1)
  int64_t first_row(int64_t c0) const { return causal ? c0 : 0; }                 // seeing key c0
};
Blocks blocks_for(const Plan& pl, bool causal) {
  if (!causal) return {pl.Tq, pl.Tk, std::max(pl.Tq, pl.Tk), false};
  const int64_t eighth = (pl.Tq + 7) / 8;
  return {pl.Tq, pl.Tk, std::max<int64_t>(128, (eighth + 63) / 64 * 64), true};
}

// Threads per row kernel block: enough for a row of Tk, at most 256.
unsigned row_threads(int64_t Tk) { return Tk >= 256 ? 256u : Tk > 64 ? 128u : 64u; }

// The products of one chunk of nb heads, each over the blocks it needs. A row product is
// C[r0:r1] = A[r0:r1, 0:n] · B[0:n] (or with Bᵀ), a key product C[c0:c1] = A[i0:Tq, c0:c1]ᵀ
// · B[i0:Tq]; the pointers are the chunk's first head, the strides per head.
struct ChunkGemm {
  cublasHandle_t h;
  const Blocks& bl;
  int64_t D, nb;
  // S-shaped (Tq x Tk, row-major) = (Tq x D) · (Tk x D)ᵀ, the blocks at or below the diagonal.
  void scores(const void* A, int64_t sa, const void* B, int64_t sb, float* C, int64_t sc, cudaDataType_t ab) const {
    for (int64_t r0 = 0; r0 < bl.Tq; r0 += bl.size) {
      const int64_t r1 = std::min(bl.Tq, r0 + bl.size), n = bl.keys_seen(r1);
      gemm_rm(h, false, true, r1 - r0, n, D, elem(A, r0 * D, ab), D, sa, B, D, sb, C + r0 * bl.Tk, bl.Tk, sc, nb, ab,
              CUDA_R_32F);
    }
  }
  // (Tq x D) = (Tq x Tk) · (Tk x D): O = P V, dQ = dS K.
  void rows(const void* A, int64_t sa, const void* B, int64_t sb, void* C, int64_t sc, cudaDataType_t t) const {
    for (int64_t r0 = 0; r0 < bl.Tq; r0 += bl.size) {
      const int64_t r1 = std::min(bl.Tq, r0 + bl.size), n = bl.keys_seen(r1);
      gemm_rm(h, false, false, r1 - r0, D, n, elem(A, r0 * bl.Tk, t), bl.Tk, sa, B, D, sb, elem(C, r0 * D, t), D, sc,
              nb, t, t);
    }
  }
  // (Tk x D) = (Tq x Tk)ᵀ · (Tq x D): dV = Pdᵀ dO, dK = dSᵀ Q. Keys no row sees are left
  // alone (the caller zeroes them).
  void keys(const void* A, int64_t sa, const void* B, int64_t sb, void* C, int64_t sc, cudaDataType_t t) const {
    for (int64_t c0 = 0; c0 < bl.Tk && bl.first_row(c0) < bl.Tq; c0 += bl.size) {
      const int64_t c1 = std::min(bl.Tk, c0 + bl.size), i0 = bl.first_row(c0);
      gemm_rm(h, true, false, c1 - c0, D, bl.Tq - i0, elem(A, i0 * bl.Tk + c0, t), bl.Tk, sa, elem(B, i0 * D, t), D,
              sb, elem(C, c0 * D, t), D, sc, nb, t, t);
    }
  }
  // p + i elements of type t.
  static const void* elem(const void* p, int64_t i, cudaDataType_t t) {
    return static_cast<const char*>(p) + i * (t == CUDA_R_32F ? 4 : 2);
  }
  static void* elem(void* p, int64_t i, cudaDataType_t t) {
    return static_cast<char*>(p) + i * (t == CUDA_R_32F ? 4 : 2);
  }
};

template <class T>
void forward_typed(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                   const kernels::AttentionParams& params) {
  using L = lse_of<T>;
  const Plan pl = plan_for(q, k, sizeof(float) + sizeof(T));
  const Blocks bl = blocks_for(pl, params.causal);
  const int dev = q.device().index;
  cudaStream_t stream = cuda::stream(dev);
  const int64_t qs = pl.Tq * pl.D, ks = pl.Tk * pl.D, ss = pl.Tq * pl.Tk;
  cuda::Workspace ws(size_t(pl.chunk * ss) * (sizeof(float) + sizeof(T)), dev);
  float* S = ws.as<float>();
  T* P = reinterpret_cast<T*>(S + pl.chunk * ss);
  const T* qd = static_cast<const T*>(q.raw_data());
  const T* kd = static_cast<const T*>(k.raw_data());
  const T* vd = static_cast<const T*>(v.raw_data());
  T* od = static_cast<T*>(out.raw_data());
  L* ld = static_cast<L*>(lse.raw_data());
  RowGeo g = row_geo(pl, params);
  constexpr cudaDataType_t t = cuda_type<T>();
  for (int64_t b0 = 0; b0 < pl.BH; b0 += pl.chunk) {
    const int64_t nb = std::min(pl.chunk, pl.BH - b0);
    const ChunkGemm mm{cuda::cublas(dev), bl, pl.D, nb};
    g.bh0 = b0;
    mm.scores(qd + b0 * qs, qs, kd + b0 * ks, ks, S, ss, t);  // S = Q Kᵀ
    softmax_rows_kernel<T, L><<<unsigned(nb * pl.Tq), row_threads(pl.Tk), 0, stream>>>(S, P, ld + b0 * pl.Tq, g,
                                                                                      bl.size);
    MU_CUDA_CHECK_LAUNCH("attention_forward (cuBLAS path: softmax rows)");
    mm.rows(P, ss, vd + b0 * ks, ks, od + b0 * qs, qs, t);  // O = P V
  }
}

template <class T>
void backward_typed(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                    const Tensor& grad_out, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                    const kernels::AttentionParams& params) {
  using L = lse_of<T>;
  const Plan pl = plan_for(q, k, 2 * sizeof(float) + sizeof(T));
  const Blocks bl = blocks_for(pl, params.causal);
  const int dev = q.device().index;
  cudaStream_t stream = cuda::stream(dev);
  const int64_t qs = pl.Tq * pl.D, ks = pl.Tk * pl.D, ss = pl.Tq * pl.Tk;
  cuda::Workspace ws(size_t(pl.chunk * ss) * (2 * sizeof(float) + sizeof(T)) + size_t(pl.BH * pl.Tq) * sizeof(float),
                     dev);
  float* S = ws.as<float>();
  float* dP = S + pl.chunk * ss;
  float* di = dP + pl.chunk * ss;
  T* Pd = reinterpret_cast<T*>(di + pl.BH * pl.Tq);  // then dS, once dV is done with Pd
  const T* qd = static_cast<const T*>(q.raw_data());
  const T* kd = static_cast<const T*>(k.raw_data());
  const T* vd = static_cast<const T*>(v.raw_data());
  const T* gd = static_cast<const T*>(grad_out.raw_data());
  const L* ld = static_cast<const L*>(lse.raw_data());
  T* dqd = static_cast<T*>(dq.raw_data());
  T* dkd = static_cast<T*>(dk.raw_data());
  T* dvd = static_cast<T*>(dv.raw_data());
  const int64_t rows = pl.BH * pl.Tq;
  // Di = rowsum(dO ∘ O) (float32 sums), as the tiled backward computes it.
  attention_row_terms_kernel<T, float, float><<<cuda::grid_for(rows, 8), 256, 0, stream>>>(
      gd, static_cast<const T*>(out.raw_data()), nullptr, di, nullptr, rows, int(pl.D));
  MU_CUDA_CHECK_LAUNCH("attention_backward (cuBLAS path: row dots)");
  // Causal with Tk > Tq: keys from Tq on are seen by no row, their dK and dV are zero; the
  // key products below write the other rows.
  if (bl.causal && pl.Tk > pl.Tq) {
    MU_CUDA_CHECK(cudaMemsetAsync(dkd, 0, size_t(dk.numel()) * sizeof(T), stream));
    MU_CUDA_CHECK(cudaMemsetAsync(dvd, 0, size_t(dv.numel()) * sizeof(T), stream));
  }
  RowGeo g = row_geo(pl, params);
  const unsigned threads = row_threads(pl.Tk);
  constexpr cudaDataType_t t = cuda_type<T>();
  for (int64_t b0 = 0; b0 < pl.BH; b0 += pl.chunk) {
    const int64_t nb = std::min(pl.chunk, pl.BH - b0);
    const unsigned blocks = unsigned(nb * pl.Tq);
    const ChunkGemm mm{cuda::cublas(dev), bl, pl.D, nb};
    g.bh0 = b0;
    mm.scores(qd + b0 * qs, qs, kd + b0 * ks, ks, S, ss, t);  // S = Q Kᵀ again
    probs_rows_kernel<T, L><<<blocks, threads, 0, stream>>>(S, ld + b0 * pl.Tq, Pd, g, bl.size);
    MU_CUDA_CHECK_LAUNCH("attention_backward (cuBLAS path: probabilities)");
    mm.keys(Pd, ss, gd + b0 * qs, qs, dvd + b0 * ks, ks, t);     // dV = Pdᵀ dO
    mm.scores(gd + b0 * qs, qs, vd + b0 * ks, ks, dP, ss, t);    // dP = dO Vᵀ, float32
    T* dS = Pd;  // stream order: the dV products above have read Pd already
    dscores_rows_kernel<T, L><<<blocks, threads, 0, stream>>>(S, dP, ld + b0 * pl.Tq, di + b0 * pl.Tq, dS, g,
                                                               bl.size);
    MU_CUDA_CHECK_LAUNCH("attention_backward (cuBLAS path: score gradients)");
    mm.rows(dS, ss, kd + b0 * ks, ks, dqd + b0 * qs, qs, t);   // dQ = dS K
    mm.keys(dS, ss, qd + b0 * qs, qs, dkd + b0 * ks, ks, t);   // dK = dSᵀ Q
  }
}

}  // namespace

bool attention_gemm_wanted(const Tensor& q, const Tensor& k, bool backward) {
  if (q.dtype() != DType::Float32 && q.dtype() != DType::BFloat16) return false;
  const int64_t Tq = q.size(2), Tk = k.size(2), D = q.size(3);
  if (q.size(0) * q.size(1) == 0 || Tq == 0 || Tk == 0 || D == 0) return false;
  if (D > 128) return false;  // the tiled kernel's limit, which refuses such calls by name: one rule for both
  // cuBLAS takes int sizes and leading dimensions; one head's S, dP and Pd must fit the cap.
  if (Tq > INT32_MAX || Tk > INT32_MAX || D > INT32_MAX || q.size(0) * q.size(1) > INT32_MAX) return false;
  if (double(Tq) * double(Tk) * double(2 * sizeof(float) + sizeof(float)) > double(kWorkspaceCap)) return false;
  // MUMOE_ATTENTION=tiled or =gemm picks a path for every call it can take (benchmarks,
  // tests of both); unset or anything else: the cuBLAS path from 128 x 128 scores on,
  // except the float32 forward, where the tiled kernel is faster (float32 GEMMs do not use
  // the matrix units), and the float32 backward at D = 64, where the tiled kernels' vector
  // variant is (H100, B 8, H 12, T 1024, D 64, causal: forward 0.49 ms tiled, 1.12 cuBLAS;
  // backward 2.02 ms tiled, 2.44 cuBLAS; one run, before the cuBLAS path skipped the
  // blocks above the diagonal, which leaves it 56% of those multiply-adds: to be timed
  // again, scripts/gpu_check.sh attention).
  if (attention_path_forced("tiled")) return false;
  if (attention_path_forced("gemm")) return true;
  if (q.dtype() == DType::Float32 && (!backward || D == 64)) return false;
  return Tq >= 128 && Tk >= 128;
}

void attention_forward_gemm(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                            const kernels::AttentionParams& params) {
  if (q.dtype() == DType::BFloat16)
    forward_typed<cuda::bf16>(q, k, v, out, lse, params);
  else
    forward_typed<float>(q, k, v, out, lse, params);
}

void attention_backward_gemm(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                             const Tensor& grad_out, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                             const kernels::AttentionParams& params) {
  if (q.dtype() == DType::BFloat16)
    backward_typed<cuda::bf16>(q, k, v, out, lse, grad_out, dq, dk, dv, params);
  else
    backward_typed<float>(q, k, v, out, lse, grad_out, dq, dk, dv, params);
}

}  // namespace mu::cuda_kernels
