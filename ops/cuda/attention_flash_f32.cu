// The float32 attention backward on the tensor cores, at float32 accuracy and without the
// score matrix in memory (ops/cuda/attention.cu asks it after the bfloat16 flash path,
// before its cuBLAS and tiled paths).
//
// Every tile product runs on the tensor cores in tf32 (10 mantissa bits) with each
// float32 operand split in two: x_hi, x rounded to tf32 (|x - x_hi| <= 2^-11 |x|), and
// x_lo = x - x_hi, exact in float32, of which the tensor cores read the top 11
// significant bits (an error <= 2^-21 |x|). Then
//   a b = a_hi b_hi + a_hi b_lo + a_lo b_hi  (+ a_lo b_lo, <= 2^-22 |a b|, dropped):
// three tensor-core products within ~2^-20 of a b at worst, where tf32 alone is 2^-11
// and float32's own rounding 2^-24. On attention's gradients that is ~2e-6 of the largest
// entry (emulated), beside ~5e-7 for the float32 tiled kernels: float32's tolerances, not
// tf32's. Three products still cost less than one on the float32 units (H100: ~495 dense
// tf32 TFLOP/s against ~67 float32). So this is not the TF32 a user opts into for matmuls
// (cuda::set_allow_tf32), and it is tested against float64 at the float32 bounds.
//
// One block per (64-key tile j, head bh), four warps, laid out as attention_flash.cu's:
// K_j and V_j stay in shared memory, dK_j and dV_j accumulate in the warps' fragments,
// and the block walks the 64-query tiles i that see tile j (from the diagonal when causal):
//   S  = Q_i K_jᵀ, dP = dO_i V_jᵀ                    warp w: query rows 16w..16w+15
//   Pd = P ∘ M/(1-p), dS = scale (Pd ∘ dP - P Di)    in place of S and dP (shared memory)
//   dQ_i's share = dS K_j                            warp w's rows, from its fragments
//                                                    to key tile j's scratch slab
//   dV_j += Pdᵀ dO_i,  dK_j += dSᵀ Q_i               warp w: key rows 16w..16w+15
// and dq_sum_kernel (attention_common.cuh) adds each query's shares in key-tile order.
// Every gradient is summed in a fixed order (no atomics): two runs of one call agree bit
// for bit, as the tiled kernels' do. The probabilities and the dropout mask are the other
// paths', entry for entry (ops/cuda/attention_common.cuh).
#include <mma.h>

#include <cstdint>
#include <type_traits>

#include "ops/cuda/attention_common.cuh"
#include "ops/cuda/attention_flash.cuh"
#include "ops/cuda/runtime.cuh"

namespace mu::cuda_kernels {

namespace {

using namespace nvcuda;

constexpr int kTile = 64;      // queries and keys per tile
constexpr int kD = 64;         // head dim this kernel is built for (every product's inner size is 64)
constexpr int kWarps = 4;      // 16 rows of each tile per warp
constexpr int kThreads = 32 * kWarps;
constexpr int kLd = kD + 4;    // row pitch in floats: rows 4 banks apart (conflict-free fragment
                               // loads), 16-byte rows (WMMA wants a multiple of 4 floats)

using FragC = wmma::fragment<wmma::accumulator, 16, 16, 8, float>;
template <bool Col>
using Layout = std::conditional_t<Col, wmma::col_major, wmma::row_major>;

using Geo = AttentionGeo;  // ops/cuda/attention_common.cuh

// The shared memory of one block, in bytes: K_j, V_j, Q_i, dO_i, S (then Pd) and dP (then
// dS), 64 x kLd floats each, and lse_i and Di (64 floats each): 104,960 bytes, two
// blocks to an SM.
constexpr size_t kSmem = (size_t(6) * kTile * kLd + 2 * kTile) * sizeof(float);

// rows [r0, r0 + 64) of a (T x 64) float matrix into a shared tile; rows past T are zeros.
__device__ __forceinline__ void load_tile(float* dst, const float* src, int64_t r0, int64_t T) {
  constexpr int kVecs = kD / 4;  // 16-byte vectors per row
  for (int idx = threadIdx.x; idx < kTile * kVecs; idx += kThreads) {
    const int r = idx / kVecs, c = idx % kVecs;
    float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
    if (r0 + r < T) x = reinterpret_cast<const float4*>(src + (r0 + r) * kD)[c];
    *reinterpret_cast<float4*>(dst + r * kLd + c * 4) = x;
  }
}

// A loaded fragment split into its tf32 high part (in place) and the rest. Element by
// element in the fragment's own layout, which is the same for both. The rounding is two
// integer operations (half a tf32 unit added to the bits, the low 13 cut: to nearest,
// ties away from zero, as cvt.rna.tf32.f32 rounds); the rest is left for the tensor cores
// to truncate (its error 2^-11 of a part that is at most 2^-12 of x).
template <class F>
__device__ __forceinline__ void split_tf32(F& hi, F& lo) {
#pragma unroll
  for (int t = 0; t < hi.num_elements; ++t) {
    const float x = hi.x[t];
    hi.x[t] = __uint_as_float((__float_as_uint(x) + 0x1000u) & 0xffffe000u);
    lo.x[t] = x - hi.x[t];
  }
}

// c (a 16 x 64 strip: four 16 x 16 fragments) += A B in three tf32 products each, A 16 x
// 64 at a (row-major: A[r][k] at a[r kLd + k]; ACol: a[k kLd + r]) and B 64 x 64 at b
// (row-major: B[k][n] at b[k kLd + n]; BCol: b[n kLd + k]). The small products first, so
// that they are not lost against a large running sum.
template <bool ACol, bool BCol>
__device__ __forceinline__ void strip_acc(FragC (&c)[4], const float* a, const float* b) {
  using FA = wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, Layout<ACol>>;
  using FB = wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, Layout<BCol>>;
#pragma unroll
  for (int k = 0; k < kD / 8; ++k) {
    FA a_hi, a_lo;
    wmma::load_matrix_sync(a_hi, ACol ? a + k * 8 * kLd : a + k * 8, kLd);
    split_tf32(a_hi, a_lo);
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      FB b_hi, b_lo;
      wmma::load_matrix_sync(b_hi, BCol ? b + n * 16 * kLd + k * 8 : b + k * 8 * kLd + n * 16, kLd);
      split_tf32(b_hi, b_lo);
      wmma::mma_sync(c[n], a_lo, b_hi, c[n]);
      wmma::mma_sync(c[n], a_hi, b_lo, c[n]);
      wmma::mma_sync(c[n], a_hi, b_hi, c[n]);
    }
  }
}

// The same into a zeroed c.
template <bool ACol, bool BCol>
__device__ __forceinline__ void strip_product(FragC (&c)[4], const float* a, const float* b) {
#pragma unroll
  for (int n = 0; n < 4; ++n) wmma::fill_fragment(c[n], 0.f);
  strip_acc<ACol, BCol>(c, a, b);
}

// The four fragments of a 16 x 64 strip to rows [0, 16) of p (pitch ld floats).
__device__ __forceinline__ void store_strip(float* p, int ld, const FragC (&c)[4]) {
#pragma unroll
  for (int n = 0; n < 4; ++n) wmma::store_matrix_sync(p + n * 16, c[n], ld, wmma::mem_row_major);
}

// Block b: head b % BH, key tile b / BH (every head's first key tile first: under a
// causal mask those walk the most query tiles, and started first they leave no tail).
__global__ void __launch_bounds__(kThreads)
    flash_backward_f32_kernel(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                              const float* __restrict__ dout, const float* __restrict__ lse,
                              const float* __restrict__ di, float* __restrict__ dq_part, float* __restrict__ dk,
                              float* __restrict__ dv, DqSlabs slabs, int64_t BH, Geo g) {
  extern __shared__ __align__(128) unsigned char smem[];
  float* sK = reinterpret_cast<float*>(smem);
  float* sV = sK + kTile * kLd;
  float* sQ = sV + kTile * kLd;
  float* sdO = sQ + kTile * kLd;
  float* sS = sdO + kTile * kLd;   // S, then Pd: [query][key]
  float* sdP = sS + kTile * kLd;   // dP, then dS: [query][key]
  float* sL = sdP + kTile * kLd;
  float* sDi = sL + kTile;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t bh = int64_t(blockIdx.x) % BH, jt = int64_t(blockIdx.x) / BH, j0 = jt * kTile;
  const float* qh = q + bh * g.Tq * kD;
  const float* dOh = dout + bh * g.Tq * kD;
  const float* lh = lse + bh * g.Tq;
  const float* dih = di + bh * g.Tq;
  // This key tile's slab: query row i's share at row i of `part` (rows from the slab's first on).
  float* part = dq_part + (bh * slabs.per_head() + slabs.before(jt) - slabs.first(jt)) * kD;

  load_tile(sK, k + bh * g.Tk * kD, j0, g.Tk);
  load_tile(sV, v + bh * g.Tk * kD, j0, g.Tk);

  FragC dKf[4], dVf[4];
#pragma unroll
  for (int n = 0; n < 4; ++n) {
    wmma::fill_fragment(dKf[n], 0.f);
    wmma::fill_fragment(dVf[n], 0.f);
  }

  const int r0 = warp * 16;  // this warp's query rows within a query tile, and key rows within K_j
  // Causal: query tiles wholly before key tile j see none of its keys.
  for (int64_t i0 = g.causal ? j0 : 0; i0 < g.Tq; i0 += kTile) {
    __syncthreads();  // the previous tile's readers are done with sQ, sdO, sS, sdP
    load_tile(sQ, qh, i0, g.Tq);
    load_tile(sdO, dOh, i0, g.Tq);
    for (int r = threadIdx.x; r < kTile; r += kThreads) {
      sL[r] = i0 + r < g.Tq ? lh[i0 + r] : 0.f;
      sDi[r] = i0 + r < g.Tq ? dih[i0 + r] : 0.f;
    }
    __syncthreads();

    FragC acc[4];
    strip_product<false, true>(acc, sQ + r0 * kLd, sK);  // S = Q_i K_jᵀ: Kᵀ read column-major
    store_strip(sS + r0 * kLd, kLd, acc);
    strip_product<false, true>(acc, sdO + r0 * kLd, sV);  // dP = dO_i V_jᵀ
    store_strip(sdP + r0 * kLd, kLd, acc);
    __syncwarp();

    // The warp's 16 rows x 64 keys, element by element (each lane every 32nd entry):
    // S becomes Pd, dP becomes dS.
    for (int e = lane; e < 16 * kTile; e += 32) {
      const int r = r0 + e / kTile, c = e % kTile;
      const int64_t i = i0 + r, j = j0 + c;
      const bool seen = i < g.Tq && j < g.Tk && (!g.causal || j <= i);
      float pd = 0.f, ds = 0.f;
      if (seen) {
        const float p = expf(g.scale * sS[r * kLd + c] - sL[r]);
        pd = g.dropout ? p * attention_keep_factor(g.key, g.threshold, g.keep, bh, g.Tq, g.Tk, i, j) : p;
        ds = g.scale * (pd * sdP[r * kLd + c] - p * sDi[r]);
      }
      sS[r * kLd + c] = pd;
      sdP[r * kLd + c] = ds;
    }
    __syncwarp();

    // Key tile j's share of dQ_i's rows: dS K_j, K read row-major (keys x d). The slab
    // has whole query tiles (rows rounded up), so the padding rows land in it too.
    strip_product<false, false>(acc, sdP + r0 * kLd, sK);
    store_strip(part + (i0 + r0) * kD, kD, acc);
    __syncthreads();  // every warp's Pd and dS rows are in place

    // dV_j (the warp's key rows) += Pdᵀ dO_i and dK_j += dSᵀ Q_i: Pdᵀ and dSᵀ read
    // column-major from their [query][key] tiles, starting at key column 16w.
    strip_acc<true, false>(dVf, sS + r0, sdO);
    strip_acc<true, false>(dKf, sdP + r0, sQ);
  }

  // dK_j, dV_j: through shared memory (sS, sdP are free now) to their rows, 16 bytes at a time.
  __syncthreads();
  store_strip(sS + r0 * kLd, kLd, dKf);
  store_strip(sdP + r0 * kLd, kLd, dVf);
  __syncwarp();
  float* dkh = dk + bh * g.Tk * kD;
  float* dvh = dv + bh * g.Tk * kD;
  constexpr int kVecs = kD / 4;
  for (int e = lane; e < 16 * kVecs; e += 32) {
    const int r = r0 + e / kVecs, c = e % kVecs * 4;
    if (j0 + r < g.Tk) {
      *reinterpret_cast<float4*>(dkh + (j0 + r) * kD + c) = *reinterpret_cast<const float4*>(sS + r * kLd + c);
      *reinterpret_cast<float4*>(dvh + (j0 + r) * kD + c) = *reinterpret_cast<const float4*>(sdP + r * kLd + c);
    }
  }
}

}  // namespace

bool attention_backward_flash_f32(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                  const Tensor& lse, const Tensor& grad_out, const Tensor& dq, const Tensor& dk,
                                  const Tensor& dv, const kernels::AttentionParams& params) {
  if (q.dtype() != DType::Float32 || lse.dtype() != DType::Float32 || q.size(3) != kD) return false;
  const int64_t BH = q.size(0) * q.size(1), Tq = q.size(2), Tk = k.size(2);
  if (BH == 0 || Tq == 0 || Tk == 0) return false;  // the tiled path's empty cases
  if (!attention_aligned16({&q, &k, &v, &out, &grad_out, &dk, &dv})) return false;  // rows move as 16-byte vectors
  // MUMOE_ATTENTION=tiled or =gemm sends every call to that path (benchmarks, tests of each).
  if (attention_path_forced("tiled") || attention_path_forced("gemm")) return false;
  const int64_t tiles = (Tk + kTile - 1) / kTile;
  if (BH * tiles > int64_t(INT32_MAX)) return false;
  // dQ's scratch: whole query tiles per slab (the fragments are stored whole).
  const DqSlabs slabs{Tq, Tk, kTile, kTile, params.causal, (Tq + kTile - 1) / kTile * kTile};
  const size_t part_bytes = size_t(BH) * size_t(slabs.per_head()) * kD * sizeof(float);
  if (part_bytes > kDqSlabsCap) return false;

  const int dev = q.device().index;
  int limit = 0;
  MU_CUDA_CHECK(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  if (kSmem > size_t(limit)) return false;
  cudaStream_t stream = cuda::stream(dev);

  const int64_t rows = BH * Tq;
  cuda::Workspace ws(size_t(rows) * sizeof(float), dev);  // Di
  cuda::Workspace part(part_bytes, dev);
  attention_row_terms_kernel<float, float, float><<<cuda::grid_for(rows, 8), 256, 0, stream>>>(
      static_cast<const float*>(grad_out.raw_data()), static_cast<const float*>(out.raw_data()), nullptr,
      ws.as<float>(), nullptr, rows, int(kD));
  MU_CUDA_CHECK_LAUNCH("attention_backward (flash f32: row dots)");

  const Geo g = attention_geo(Tq, Tk, params);
  MU_CUDA_CHECK(
      cudaFuncSetAttribute(flash_backward_f32_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmem)));
  flash_backward_f32_kernel<<<unsigned(BH * tiles), kThreads, kSmem, stream>>>(
      static_cast<const float*>(q.raw_data()), static_cast<const float*>(k.raw_data()),
      static_cast<const float*>(v.raw_data()), static_cast<const float*>(grad_out.raw_data()),
      static_cast<const float*>(lse.raw_data()), ws.as<float>(), part.as<float>(), static_cast<float*>(dk.raw_data()),
      static_cast<float*>(dv.raw_data()), slabs, BH, g);
  MU_CUDA_CHECK_LAUNCH("attention_backward (flash f32)");
  // dS carries the scale already: the shares add up to dQ.
  const int64_t n = rows * kD;
  dq_sum_kernel<float, float><<<cuda::grid_for(n, 256), 256, 0, stream>>>(
      part.as<float>(), static_cast<float*>(dq.raw_data()), slabs, BH, int(kD), 1.f);
  MU_CUDA_CHECK_LAUNCH("attention_backward (flash f32: dq sum)");
  return true;
}

}  // namespace mu::cuda_kernels
