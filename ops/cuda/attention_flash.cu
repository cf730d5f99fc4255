// Attention on the tensor cores, forward and backward, for bfloat16 and float32 at head
// dim 64, without the score matrix in memory (ops/cuda/attention.cu asks it after cuDNN,
// before the cuBLAS path and its tiled kernels). The cuBLAS path (attention_gemm.cu)
// writes S, P and dP for every head, ~2.8 GB per GPT-2 layer at B 8, H 12, T 1024; these
// kernels keep each 64 x 64 tile of them in shared memory.
//
// Forward: one block per (64-query tile i, head bh), four warps, warp w owning query rows
// 16w..16w+15. The block walks the key tiles j (up to the diagonal when causal):
//   S = Q_i K_jᵀ                                     (the backward's product, the same
//                                                     fragments in the same order: the
//                                                     backward recomputes these bits)
//   per row: the running max m and sum l of exp(scale S - m) (the old output and sum
//   rescaled by exp(m_old - m_new) when the max rises), P ∘ M/(1-p) for the output
//   O_i += P V_j                                     O_i in shared memory, loaded into
//                                                     fragments and stored back (their
//                                                     layout is the hardware's: a row's
//                                                     rescaling is done in memory)
// and writes O / l and lse = m + log l (scaled-score units, as every path's).
//
// Backward: one block per (64-key tile j, head bh), four warps. K_j and V_j stay in shared memory;
// dK_j and dV_j accumulate in the warps' WMMA fragments (float32) while the block walks
// the 64-query tiles i that see tile j (from the diagonal on when causal):
//   S  = Q_i K_jᵀ, dP = dO_i V_jᵀ                   warp w: query rows 16w..16w+15
//   Pd = P ∘ M/(1-p), dS = scale (Pd ∘ dP - P Di)   (P = exp(scale S - lse_i), masked;
//                                                    Di = rowsum(dO ∘ O), precomputed)
//   dQ_i's share = dS K_j                           warp w's rows, from its fragments to
//                                                    key tile j's scratch slab (float32)
//   dV_j += Pdᵀ dO_i,  dK_j += dSᵀ Q_i              warp w: key rows 16w..16w+15
// and dq_sum_kernel (attention_common.cuh) adds each query's shares in key-tile order and
// rounds once to the tensors' type. Every gradient is summed in a fixed order (no
// atomics): two runs of one call agree bit for bit. The probabilities and the dropout
// mask are the other paths', entry for entry (attention_common.cuh).
//
// The two types differ in their products only (the Math policies below):
// - bfloat16: 16 x 16 x 16 bfloat16 products; P (forward), Pd and dS rounded to bfloat16
//   for theirs, in tiles of their own beside the float S and dP.
// - float32: 16 x 16 x 8 tf32 products with each operand split in two: x_hi, x rounded to
//   tf32 (|x - x_hi| <= 2^-11 |x|), and x_lo, the rest (exact in float32) rounded to tf32
//   (an error <= 2^-22 |x|). Then
//     a b = a_hi b_hi + a_hi b_lo + a_lo b_hi  (+ a_lo b_lo, <= 2^-22 |a b|, dropped):
//   three products within ~2^-21 of a b at worst, where tf32 alone is 2^-11 and float32's
//   own rounding 2^-24. On attention's gradients that is ~2e-6 of the largest entry
//   (emulated), beside ~5e-7 for the float32 tiled kernels: float32's tolerances, not
//   tf32's. Three products still cost less than one on the float32 units (H100: ~495
//   dense tf32 TFLOP/s against ~67 float32). So this is not the TF32 a user opts into for
//   matmuls (cuda::set_allow_tf32), and it is tested against float64 at the float32
//   bounds. P, Pd and dS stay float32, written over S and dP (two blocks fit an SM).
#include <mma.h>

#include <cstdint>
#include <type_traits>

#include "ops/cuda/attention_common.cuh"
#include "ops/cuda/attention_flash.cuh"
#include "ops/cuda/dtypes.cuh"
#include "ops/cuda/runtime.cuh"

namespace mu::cuda_kernels {

namespace {

using namespace nvcuda;
using cuda::bf16;

constexpr int kTile = 64;        // queries and keys per tile
constexpr int kD = 64;           // head dim this kernel is built for (every product's inner size is 64)
constexpr int kWarps = 4;        // 16 rows of each tile per warp
constexpr int kThreads = 32 * kWarps;
constexpr int kLdF = kTile + 4;  // float row pitch: rows 4 banks apart, 16-byte rows (WMMA: a multiple of 4)

template <bool Col>
using Layout = std::conditional_t<Col, wmma::col_major, wmma::row_major>;

using Geo = AttentionGeo;  // ops/cuda/attention_common.cuh

// bfloat16 products: an operand is its fragment, one tensor-core product per pair.
struct Bf16Math {
  using E = bf16;                  // the operand tiles' type
  using Frag = bf16;               // the fragments' element type
  static constexpr int kK = 16;    // a fragment's depth
  static constexpr int kLd = kD + 8;  // operand row pitch (WMMA: a multiple of 8 bfloat16s)
  static constexpr bool kInPlace = false;  // P, Pd and dS in bfloat16 tiles of their own
  using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;
  template <class F>
  __device__ static const F& operand(const F& f) {
    return f;
  }
  template <class FA, class FB>
  __device__ static void mma(FragC& c, const FA& a, const FB& b) {
    wmma::mma_sync(c, a, b, c);
  }
};

// float32 products as three tf32 ones (see the top of the file).
struct Tf32x3Math {
  using E = float;
  using Frag = wmma::precision::tf32;
  static constexpr int kK = 8;
  static constexpr int kLd = kLdF;
  static constexpr bool kInPlace = true;  // P and Pd over S, dS over dP
  using FragC = wmma::fragment<wmma::accumulator, 16, 16, 8, float>;
  template <class F>
  struct Split {
    F hi, lo;
  };
  // x rounded to tf32: half a tf32 unit added to the bits, the low 13 cut (to nearest,
  // ties away from zero, as cvt.rna.tf32.f32 rounds, in two integer operations). The
  // result's low 13 bits are zero: nothing is left to how the tensor cores read them.
  __device__ static float round_tf32(float x) {
    return __uint_as_float((__float_as_uint(x) + 0x1000u) & 0xffffe000u);
  }
  // The loaded fragment split, element by element in the fragment's own layout (the same
  // for both halves).
  template <class F>
  __device__ static Split<F> operand(const F& f) {
    Split<F> s;
#pragma unroll
    for (int t = 0; t < f.num_elements; ++t) {
      const float x = f.x[t];
      s.hi.x[t] = round_tf32(x);
      s.lo.x[t] = round_tf32(x - s.hi.x[t]);  // x - x_hi is exact in float32
    }
    return s;
  }
  // The small products first, so that they are not lost against a large running sum.
  template <class FA, class FB>
  __device__ static void mma(FragC& c, const Split<FA>& a, const Split<FB>& b) {
    wmma::mma_sync(c, a.lo, b.hi, c);
    wmma::mma_sync(c, a.hi, b.lo, c);
    wmma::mma_sync(c, a.hi, b.hi, c);
  }
};

template <class T>
using MathOf = std::conditional_t<std::is_same_v<T, float>, Tf32x3Math, Bf16Math>;

// The shared memory of a backward block, in bytes: Q_i, dO_i, K_j, V_j (operand tiles),
// S then Pd and dP then dS (float tiles; bfloat16 keeps Pd and dS in two more operand
// tiles), lse_i and Di (64 floats each). bfloat16 90,624 bytes, float32 104,960: two
// blocks to an SM either way.
template <class M>
constexpr size_t backward_smem() {
  const int e_tiles = M::kInPlace ? 4 : 6;
  return size_t(e_tiles) * kTile * M::kLd * sizeof(typename M::E) + size_t(2) * kTile * kLdF * sizeof(float) +
         size_t(2) * kTile * sizeof(float);
}
// A forward block's: Q_i, K_j, V_j (operand tiles), S then P and O_i (float tiles;
// bfloat16 keeps P in one more operand tile). bfloat16 71,680 bytes, float32 87,040.
template <class M>
constexpr size_t forward_smem() {
  const int e_tiles = M::kInPlace ? 3 : 4;
  return size_t(e_tiles) * kTile * M::kLd * sizeof(typename M::E) + size_t(2) * kTile * kLdF * sizeof(float);
}

// rows [r0, r0 + 64) of a (T x 64) matrix into a shared tile of pitch ld; rows past T are zeros.
template <class E>
__device__ __forceinline__ void load_tile(E* dst, const E* src, int64_t r0, int64_t T, int ld) {
  constexpr int kPer = 16 / sizeof(E), kVecs = kD / kPer;  // elements per 16-byte vector, vectors per row
  for (int idx = threadIdx.x; idx < kTile * kVecs; idx += kThreads) {
    const int r = idx / kVecs, c = idx % kVecs;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (r0 + r < T) v = reinterpret_cast<const uint4*>(src + (r0 + r) * kD)[c];
    *reinterpret_cast<uint4*>(dst + r * ld + c * kPer) = v;
  }
}

// c (a 16 x 64 strip: four 16 x 16 fragments) += A B, A 16 x 64 at a (row-major: A[r][k]
// at a[r ld + k]; ACol: a[k ld + r]) and B 64 x 64 at b (row-major: B[k][n] at b[k ld + n];
// BCol: b[n ld + k]), both of pitch M::kLd.
template <class M, bool ACol, bool BCol>
__device__ __forceinline__ void strip_acc(typename M::FragC (&c)[4], const typename M::E* a,
                                          const typename M::E* b) {
  using FA = wmma::fragment<wmma::matrix_a, 16, 16, M::kK, typename M::Frag, Layout<ACol>>;
  using FB = wmma::fragment<wmma::matrix_b, 16, 16, M::kK, typename M::Frag, Layout<BCol>>;
  constexpr int ld = M::kLd, kk = M::kK;
#pragma unroll
  for (int k = 0; k < kD / kk; ++k) {
    FA fa;
    wmma::load_matrix_sync(fa, ACol ? a + k * kk * ld : a + k * kk, ld);
    const auto& oa = M::operand(fa);
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      FB fb;
      wmma::load_matrix_sync(fb, BCol ? b + n * 16 * ld + k * kk : b + k * kk * ld + n * 16, ld);
      M::mma(c[n], oa, M::operand(fb));
    }
  }
}

// The same into a zeroed c.
template <class M, bool ACol, bool BCol>
__device__ __forceinline__ void strip_product(typename M::FragC (&c)[4], const typename M::E* a,
                                              const typename M::E* b) {
#pragma unroll
  for (int n = 0; n < 4; ++n) wmma::fill_fragment(c[n], 0.f);
  strip_acc<M, ACol, BCol>(c, a, b);
}

// The four fragments of a 16 x 64 strip to rows [0, 16) of p (pitch ld floats).
template <class FragC>
__device__ __forceinline__ void store_strip(float* p, int ld, const FragC (&c)[4]) {
#pragma unroll
  for (int n = 0; n < 4; ++n) wmma::store_matrix_sync(p + n * 16, c[n], ld, wmma::mem_row_major);
}

// Block b: head b % BH, query tile nq - 1 - b / BH (every head's last query tile first:
// under a causal mask those walk the most key tiles, and started first they leave no tail).
template <class T>
__global__ void __launch_bounds__(kThreads)
    flash_forward_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                         T* __restrict__ out, float* __restrict__ lse, int64_t BH, Geo g) {
  using M = MathOf<T>;
  using E = typename M::E;
  constexpr int ld = M::kLd;
  extern __shared__ __align__(128) unsigned char smem[];
  E* sQ = reinterpret_cast<E*>(smem);
  E* sK = sQ + kTile * ld;
  E* sV = sK + kTile * ld;
  float* sS = reinterpret_cast<float*>(sV + kTile * ld);  // S, [query][key]
  float* sO = sS + kTile * kLdF;                          // the output's running sums, [query][d]
  E* sP;  // P ∘ M/(1-p), [query][key]: over S (float32), or in a tile of its own
  if constexpr (M::kInPlace) sP = sS;
  else sP = reinterpret_cast<E*>(sO + kTile * kLdF);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t nq = (g.Tq + kTile - 1) / kTile;
  const int64_t bh = int64_t(blockIdx.x) % BH, i0 = (nq - 1 - int64_t(blockIdx.x) / BH) * kTile;
  const int r0 = warp * 16;  // this warp's query rows within the tile
  load_tile(sQ, q + bh * g.Tq * kD, i0, g.Tq, ld);
  for (int e = lane; e < 16 * kD; e += 32) sO[(r0 + e / kD) * kLdF + e % kD] = 0.f;

  // Each row's running max and sum, the same in every lane of the warp (after the
  // warp-wide reductions); m = -inf until the row has seen a key.
  const float inf = INFINITY;
  float m[16], l[16];
#pragma unroll
  for (int rr = 0; rr < 16; ++rr) m[rr] = -inf, l[rr] = 0.f;

  // Causal: keys past the tile's last query are masked for every query in it.
  const int64_t last = i0 + kTile < g.Tq ? i0 + kTile : g.Tq;
  const int64_t kend = g.causal ? (last < g.Tk ? last : g.Tk) : g.Tk;
  for (int64_t j0 = 0; j0 < kend; j0 += kTile) {
    __syncthreads();  // the previous tile's K and V are no longer read
    load_tile(sK, k + bh * g.Tk * kD, j0, g.Tk, ld);
    load_tile(sV, v + bh * g.Tk * kD, j0, g.Tk, ld);
    __syncthreads();

    typename M::FragC acc[4];
    strip_product<M, false, true>(acc, sQ + r0 * ld, sK);  // S = Q_i K_jᵀ
    store_strip(sS + r0 * kLdF, kLdF, acc);
    __syncwarp();

    // Row by row, the whole warp on each (lane c and c + 32 of 64 keys).
#pragma unroll
    for (int rr = 0; rr < 16; ++rr) {
      const int r = r0 + rr;
      const int64_t i = i0 + r;
      float sc[2];
      bool seen[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t j = j0 + lane + 32 * h;
        seen[h] = i < g.Tq && j < g.Tk && (!g.causal || j <= i);
        sc[h] = seen[h] ? g.scale * sS[r * kLdF + lane + 32 * h] : -inf;  // masked: exp(-inf) = 0
      }
      const float alpha = online_softmax_step<32>(sc, m[rr], l[rr]);  // sc becomes exp(sc - shift)
      // The denominator counts every key; the output only the kept ones.
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int c = lane + 32 * h;
        float pd = sc[h];
        if (g.dropout && seen[h]) pd *= attention_keep_factor(g.key, g.threshold, g.keep, bh, g.Tq, g.Tk, i, j0 + c);
        sP[r * ld + c] = cuda::narrow<E>(pd);
        sO[r * kLdF + c] *= alpha;
      }
    }
    __syncwarp();

    // O_i's rows += P V_j: the rescaled sums into fragments, the product added, back.
#pragma unroll
    for (int n = 0; n < 4; ++n) wmma::load_matrix_sync(acc[n], sO + r0 * kLdF + n * 16, kLdF, wmma::mem_row_major);
    strip_acc<M, false, false>(acc, sP + r0 * ld, sV);
    store_strip(sO + r0 * kLdF, kLdF, acc);
    __syncwarp();
  }

  T* oh = out + bh * g.Tq * kD;
#pragma unroll
  for (int rr = 0; rr < 16; ++rr) {
    const int r = r0 + rr;
    const int64_t i = i0 + r;
    if (i >= g.Tq) continue;
    // l == 0 only for a row that saw no key (none here: query i sees key 0).
    const float inv = l[rr] > 0 ? 1.f / l[rr] : 0.f;
    oh[i * kD + lane] = cuda::narrow<T>(sO[r * kLdF + lane] * inv);
    oh[i * kD + lane + 32] = cuda::narrow<T>(sO[r * kLdF + lane + 32] * inv);
    if (lane == 0) lse[bh * g.Tq + i] = l[rr] > 0 ? m[rr] + logf(l[rr]) : -inf;
  }
}

// Block b: head b % BH, key tile b / BH (every head's first key tile first: under a
// causal mask those walk the most query tiles, and started first they leave no tail).
template <class T>
__global__ void __launch_bounds__(kThreads)
    flash_backward_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                          const T* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ di,
                          float* __restrict__ dq_part, T* __restrict__ dk, T* __restrict__ dv, DqSlabs slabs,
                          int64_t BH, Geo g) {
  using M = MathOf<T>;
  using E = typename M::E;
  constexpr int ld = M::kLd;
  extern __shared__ __align__(128) unsigned char smem[];
  E* sQ = reinterpret_cast<E*>(smem);
  E* sdO = sQ + kTile * ld;
  E* sK = sdO + kTile * ld;
  E* sV = sK + kTile * ld;
  float* sS = reinterpret_cast<float*>(sV + kTile * ld);  // S, [query][key]
  float* sdP = sS + kTile * kLdF;                          // dP, [query][key]
  float* sL = sdP + kTile * kLdF;
  float* sDi = sL + kTile;
  E* sPd;  // Pd and dS, [query][key]: over S and dP (float32), or in tiles of their own
  E* sdS;
  if constexpr (M::kInPlace) {
    sPd = sS;
    sdS = sdP;
  } else {
    sPd = reinterpret_cast<E*>(sDi + kTile);
    sdS = sPd + kTile * ld;
  }

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t bh = int64_t(blockIdx.x) % BH, jt = int64_t(blockIdx.x) / BH, j0 = jt * kTile;
  const T* qh = q + bh * g.Tq * kD;
  const T* dOh = dout + bh * g.Tq * kD;
  const float* lh = lse + bh * g.Tq;
  const float* dih = di + bh * g.Tq;
  // This key tile's slab: query row i's share at row i of `part` (rows from the slab's first on).
  float* part = dq_part + (bh * slabs.per_head() + slabs.before(jt) - slabs.first(jt)) * kD;

  load_tile(sK, k + bh * g.Tk * kD, j0, g.Tk, ld);
  load_tile(sV, v + bh * g.Tk * kD, j0, g.Tk, ld);

  typename M::FragC dKf[4], dVf[4];
#pragma unroll
  for (int n = 0; n < 4; ++n) {
    wmma::fill_fragment(dKf[n], 0.f);
    wmma::fill_fragment(dVf[n], 0.f);
  }

  const int r0 = warp * 16;  // this warp's query rows within a query tile, and key rows within K_j
  // Causal: query tiles wholly before key tile j see none of its keys.
  for (int64_t i0 = g.causal ? j0 : 0; i0 < g.Tq; i0 += kTile) {
    __syncthreads();  // the previous tile's readers are done with sQ, sdO, sS, sdP, sPd, sdS
    load_tile(sQ, qh, i0, g.Tq, ld);
    load_tile(sdO, dOh, i0, g.Tq, ld);
    for (int r = threadIdx.x; r < kTile; r += kThreads) {
      sL[r] = i0 + r < g.Tq ? lh[i0 + r] : 0.f;
      sDi[r] = i0 + r < g.Tq ? dih[i0 + r] : 0.f;
    }
    __syncthreads();

    typename M::FragC acc[4];
    strip_product<M, false, true>(acc, sQ + r0 * ld, sK);  // S = Q_i K_jᵀ: Kᵀ read column-major
    store_strip(sS + r0 * kLdF, kLdF, acc);
    strip_product<M, false, true>(acc, sdO + r0 * ld, sV);  // dP = dO_i V_jᵀ
    store_strip(sdP + r0 * kLdF, kLdF, acc);
    __syncwarp();

    // The warp's 16 rows x 64 keys, element by element (each lane every 32nd entry).
    for (int e = lane; e < 16 * kTile; e += 32) {
      const int r = r0 + e / kTile, c = e % kTile;
      const int64_t i = i0 + r, j = j0 + c;
      const bool seen = i < g.Tq && j < g.Tk && (!g.causal || j <= i);
      float pd = 0.f, ds = 0.f;
      if (seen) {
        const float p = expf(g.scale * sS[r * kLdF + c] - sL[r]);
        pd = g.dropout ? p * attention_keep_factor(g.key, g.threshold, g.keep, bh, g.Tq, g.Tk, i, j) : p;
        ds = g.scale * (pd * sdP[r * kLdF + c] - p * sDi[r]);
      }
      sPd[r * ld + c] = cuda::narrow<E>(pd);
      sdS[r * ld + c] = cuda::narrow<E>(ds);
    }
    __syncwarp();

    // Key tile j's share of dQ_i's rows: dS K_j, K read row-major (keys x d). The slab
    // has whole query tiles (rows rounded up), so the padding rows land in it too.
    strip_product<M, false, false>(acc, sdS + r0 * ld, sK);
    store_strip(part + (i0 + r0) * kD, kD, acc);
    __syncthreads();  // every warp's Pd and dS rows are in place

    // dV_j (the warp's key rows) += Pdᵀ dO_i and dK_j += dSᵀ Q_i: Pdᵀ and dSᵀ read
    // column-major from their [query][key] tiles, starting at key column 16w.
    strip_acc<M, true, false>(dVf, sPd + r0, sdO);
    strip_acc<M, true, false>(dKf, sdS + r0, sQ);
  }

  // dK_j, dV_j: through shared memory (sS, sdP are free now) to their rows.
  __syncthreads();
  store_strip(sS + r0 * kLdF, kLdF, dKf);
  store_strip(sdP + r0 * kLdF, kLdF, dVf);
  __syncwarp();
  T* dkh = dk + bh * g.Tk * kD;
  T* dvh = dv + bh * g.Tk * kD;
  for (int e = lane; e < 16 * kD; e += 32) {
    const int r = r0 + e / kD, c = e % kD;
    if (j0 + r < g.Tk) {
      dkh[(j0 + r) * kD + c] = cuda::narrow<T>(sS[r * kLdF + c]);
      dvh[(j0 + r) * kD + c] = cuda::narrow<T>(sdP[r * kLdF + c]);
    }
  }
}

template <class T>
void backward_typed(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& grad_out,
                    const Tensor& lse, const Tensor& dq, const Tensor& dk, const Tensor& dv, const DqSlabs& slabs,
                    const kernels::AttentionParams& params) {
  const int64_t BH = q.size(0) * q.size(1), rows = BH * slabs.Tq;
  const int dev = q.device().index;
  cudaStream_t stream = cuda::stream(dev);
  cuda::Workspace ws(size_t(rows) * sizeof(float), dev);  // Di
  cuda::Workspace part(size_t(BH) * size_t(slabs.per_head()) * kD * sizeof(float), dev);
  attention_row_terms_kernel<T, float, float><<<cuda::grid_for(rows, 8), 256, 0, stream>>>(
      static_cast<const T*>(grad_out.raw_data()), static_cast<const T*>(out.raw_data()), nullptr, ws.as<float>(),
      nullptr, rows, int(kD));
  MU_CUDA_CHECK_LAUNCH("attention_backward (flash: row dots)");

  const Geo g = attention_geo(slabs.Tq, slabs.Tk, params);
  constexpr size_t smem = backward_smem<MathOf<T>>();
  MU_CUDA_CHECK(cudaFuncSetAttribute(flash_backward_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  flash_backward_kernel<T><<<unsigned(BH * slabs.tiles()), kThreads, smem, stream>>>(
      static_cast<const T*>(q.raw_data()), static_cast<const T*>(k.raw_data()), static_cast<const T*>(v.raw_data()),
      static_cast<const T*>(grad_out.raw_data()), static_cast<const float*>(lse.raw_data()), ws.as<float>(),
      part.as<float>(), static_cast<T*>(dk.raw_data()), static_cast<T*>(dv.raw_data()), slabs, BH, g);
  MU_CUDA_CHECK_LAUNCH("attention_backward (flash)");
  // dS carries the scale already: the shares add up to dQ, rounded once to T.
  const int64_t n = rows * kD;
  dq_sum_kernel<T, float><<<cuda::grid_for(n, 256), 256, 0, stream>>>(part.as<float>(), static_cast<T*>(dq.raw_data()),
                                                                       slabs, BH, int(kD), 1.f);
  MU_CUDA_CHECK_LAUNCH("attention_backward (flash: dq sum)");
}

}  // namespace

bool attention_forward_flash(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                             const kernels::AttentionParams& params) {
  const bool bf16_call = q.dtype() == DType::BFloat16, f32_call = q.dtype() == DType::Float32;
  if ((!bf16_call && !f32_call) || lse.dtype() != DType::Float32 || q.size(3) != kD) return false;
  const int64_t BH = q.size(0) * q.size(1), Tq = q.size(2), Tk = k.size(2);
  // Fewer than a tile of queries (decoding steps) would leave most of each block's
  // products to padding rows: the tiled kernels take them.
  if (BH == 0 || Tq < kTile || Tk == 0) return false;
  if (!attention_aligned16({&q, &k, &v})) return false;  // rows move as 16-byte vectors
  if (attention_path_forced("tiled") || attention_path_forced("gemm")) return false;
  const int64_t blocks = BH * ((Tq + kTile - 1) / kTile);
  if (blocks > int64_t(INT32_MAX)) return false;
  const int dev = q.device().index;
  int limit = 0;
  MU_CUDA_CHECK(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  const size_t smem = bf16_call ? forward_smem<Bf16Math>() : forward_smem<Tf32x3Math>();
  if (smem > size_t(limit)) return false;
  cudaStream_t stream = cuda::stream(dev);
  const Geo g = attention_geo(Tq, Tk, params);
  auto go = [&](auto tag) {
    using T = decltype(tag);
    MU_CUDA_CHECK(
        cudaFuncSetAttribute(flash_forward_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    flash_forward_kernel<T><<<unsigned(blocks), kThreads, smem, stream>>>(
        static_cast<const T*>(q.raw_data()), static_cast<const T*>(k.raw_data()), static_cast<const T*>(v.raw_data()),
        static_cast<T*>(out.raw_data()), static_cast<float*>(lse.raw_data()), BH, g);
    MU_CUDA_CHECK_LAUNCH("attention_forward (flash)");
  };
  if (bf16_call) go(bf16{});
  else go(float{});
  return true;
}

bool attention_backward_flash(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                              const Tensor& grad_out, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                              const kernels::AttentionParams& params) {
  const bool bf16_call = q.dtype() == DType::BFloat16, f32_call = q.dtype() == DType::Float32;
  if ((!bf16_call && !f32_call) || lse.dtype() != DType::Float32 || q.size(3) != kD) return false;
  const int64_t BH = q.size(0) * q.size(1), Tq = q.size(2), Tk = k.size(2);
  if (BH == 0 || Tq == 0 || Tk == 0) return false;  // the tiled path's empty cases
  if (!attention_aligned16({&q, &k, &v, &grad_out})) return false;  // rows move as 16-byte vectors
  // MUMOE_ATTENTION=tiled or =gemm sends every call to that path (benchmarks, tests of each).
  if (attention_path_forced("tiled") || attention_path_forced("gemm")) return false;
  // dQ's scratch: whole query tiles per slab (the fragments are stored whole).
  const DqSlabs slabs{Tq, Tk, kTile, kTile, params.causal, (Tq + kTile - 1) / kTile * kTile};
  if (BH * slabs.tiles() > int64_t(INT32_MAX)) return false;
  if (size_t(BH) * size_t(slabs.per_head()) * kD * sizeof(float) > kDqSlabsCap) return false;
  int limit = 0;
  MU_CUDA_CHECK(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, q.device().index));
  const size_t smem = bf16_call ? backward_smem<Bf16Math>() : backward_smem<Tf32x3Math>();
  if (smem > size_t(limit)) return false;
  if (bf16_call) backward_typed<bf16>(q, k, v, out, grad_out, lse, dq, dk, dv, slabs, params);
  else backward_typed<float>(q, k, v, out, grad_out, lse, dq, dk, dv, slabs, params);
  return true;
}

}  // namespace mu::cuda_kernels
