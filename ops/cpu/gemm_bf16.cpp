// Products of two bfloat16 matrices into float32 on CPUs with AVX512_BF16 (Zen 4,
// Cooper Lake and later): autocast's many-row products (a prompt, a whole-context
// sampling loop, a training step) without float32 copies of their operands.
//
// VDPBF16PS multiplies 16 pairs of bfloat16 values lane by lane and adds both products
// of each pair into a float32 lane: twice the multiply-adds of a float32 FMA per
// instruction, on operands of half the bytes. Its pairs run along the depth, so both
// operands are packed here with the two values of each depth pair side by side:
//  - B in panels of NR = 32 columns: for depth pair p, the 32 columns' pairs (two
//    vectors of 16 pairs) are 128 contiguous bytes;
//  - A in panels of MR = 12 rows: for depth pair p, the 12 rows' pairs, each one 32-bit
//    value that the micro-kernel broadcasts to every lane.
// The micro-kernel keeps a 12 x 32 tile of C in 24 vector registers over the whole depth
// (24 + 2 for B + 1 for A's pair = 27 of 32), so that C is written once. Panels are
// padded with zeros (rows past M, columns past N, an odd depth's last pair), which add
// nothing; only C's valid elements are stored. Each element of C is summed in the same
// order whatever the thread count. The instruction's own rounding: each product of a
// pair rounded once as it is added, denormal inputs and results taken as zero.
#include "ops/cpu/gemm.h"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "ops/cpu/parallel.h"
#include "tensor/error.h"

#if defined(__AVX512BF16__) && defined(__AVX512F__) && defined(__x86_64__)
#include <immintrin.h>
#define MUMOE_HAVE_DPBF16 1
#endif

namespace mu::cpu {

#ifdef MUMOE_HAVE_DPBF16

namespace {

constexpr int64_t kMR = 12;  // rows of the C tile
constexpr int64_t kNR = 32;  // columns of the C tile: two vectors of 16 float32 lanes

// The depth pair (x[2p], x[2p + 1]) as one 32-bit value, the first in the low half (the
// lane order VDPBF16PS pairs them in); a depth past K reads as zero.
inline uint32_t pair_at(const bfloat16_t* x, int64_t stride, int64_t p, int64_t K) {
  const uint32_t lo = x[2 * p * stride].bits;
  const uint32_t hi = 2 * p + 1 < K ? x[(2 * p + 1) * stride].bits : 0u;
  return lo | (hi << 16);
}

// `lines` lines of K depths (line l's depth k at x[l * ls + k * ks]) as panels of Width
// lines: panel q, pair p, line c at dst[(q * P + p) * Width + c], P = ceil(K / 2) pairs;
// lines past the last are 0. B's panels are its columns (Width kNR, ks = B's row stride),
// A's its rows (Width kMR, ks = A's column stride).
template <int64_t Width>
void pack_pairs(int64_t K, int64_t lines, const bfloat16_t* x, int64_t ks, int64_t ls, uint32_t* dst, int nt) {
  const int64_t P = (K + 1) / 2, panels = (lines + Width - 1) / Width;
  parallel_for(panels, nt, [&](int64_t q) {
    uint32_t* panel = dst + q * P * Width;
    for (int64_t c = 0; c < Width; ++c) {
      const int64_t l = q * Width + c;
      if (l >= lines) {
        for (int64_t p = 0; p < P; ++p) panel[p * Width + c] = 0;
      } else if (ks == 1 && K % 2 == 0) {
        // Depths contiguous (a Linear layer's weight, a row-major A): each pair is one
        // 32-bit read.
        const bfloat16_t* line = x + l * ls;
        for (int64_t p = 0; p < P; ++p) std::memcpy(&panel[p * Width + c], line + 2 * p, sizeof(uint32_t));
      } else {
        for (int64_t p = 0; p < P; ++p) panel[p * Width + c] = pair_at(x + l * ls, ks, p, K);
      }
    }
  });
}

// The kMR x kNR tile of C at c (row stride ldc, unit column stride) = A panel · B panel
// over P depth pairs; rows >= m and columns >= n are not stored.
void micro_kernel(int64_t P, const uint32_t* __restrict ap, const uint32_t* __restrict bp, float* c, int64_t ldc,
                  int64_t m, int64_t n) {
  __m512 acc[kMR][2];
  for (int i = 0; i < kMR; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  for (int64_t p = 0; p < P; ++p) {
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(bp + p * kNR);
    const __m512bh b1 = (__m512bh)_mm512_loadu_si512(bp + p * kNR + 16);
#pragma GCC unroll 12
    for (int i = 0; i < kMR; ++i) {
      const __m512bh a = (__m512bh)_mm512_set1_epi32(int(ap[p * kMR + i]));
      acc[i][0] = _mm512_dpbf16_ps(acc[i][0], a, b0);
      acc[i][1] = _mm512_dpbf16_ps(acc[i][1], a, b1);
    }
  }
  const __mmask16 m0 = n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1);
  const __mmask16 m1 = n >= 32 ? __mmask16(0xffff) : n <= 16 ? __mmask16(0) : __mmask16((1u << (n - 16)) - 1);
  for (int64_t i = 0; i < std::min(m, kMR); ++i) {
    _mm512_mask_storeu_ps(c + i * ldc, m0, acc[i][0]);
    _mm512_mask_storeu_ps(c + i * ldc + 16, m1, acc[i][1]);
  }
}

// The weight-side form, for a B that is the transpose of a row-major N x K matrix w (a
// Linear layer's x · wᵀ) with K even: Cᵀ = w · Aᵀ by the same micro-kernel with the
// operands' roles swapped. w takes the broadcast side, read in place (each of its rows
// holds its depth pairs contiguously), and A the vector side, packed in panels of kNR rows
// (A is the small operand: a prompt, a sampling loop's context). The weight is then never
// copied: GPT-2 124M's Linears at about 80 rows took 1.18 ms a call with it packed, 1.00
// read in place (a whole-context sampling loop's kernel profile). The kMR x kNR tile of Cᵀ
// (kMR columns of C by kNR rows) goes through a buffer into C, transposed.
void micro_kernel_t(int64_t P, const bfloat16_t* __restrict w, int64_t ldw, const uint32_t* __restrict xp, float* c,
                    int64_t ldc, int64_t n, int64_t m) {
  __m512 acc[kMR][2];
  for (int i = 0; i < kMR; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  const int64_t rows = std::min(n, kMR);
  const bfloat16_t* row[kMR];
  for (int64_t i = 0; i < kMR; ++i) row[i] = w + std::min(i, rows - 1) * ldw;  // rows past n repeat the last
  for (int64_t p = 0; p < P; ++p) {
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(xp + p * kNR);
    const __m512bh b1 = (__m512bh)_mm512_loadu_si512(xp + p * kNR + 16);
#pragma GCC unroll 12
    for (int i = 0; i < kMR; ++i) {
      int32_t pair;
      std::memcpy(&pair, row[i] + 2 * p, sizeof(pair));
      const __m512bh a = (__m512bh)_mm512_set1_epi32(pair);
      acc[i][0] = _mm512_dpbf16_ps(acc[i][0], a, b0);
      acc[i][1] = _mm512_dpbf16_ps(acc[i][1], a, b1);
    }
  }
  alignas(64) float tile[kMR][kNR];
  for (int i = 0; i < kMR; ++i) {
    _mm512_store_ps(tile[i], acc[i][0]);
    _mm512_store_ps(tile[i] + 16, acc[i][1]);
  }
  for (int64_t r = 0; r < std::min(m, kNR); ++r)
    for (int64_t i = 0; i < rows; ++i) c[r * ldc + i] = tile[i][r];
}

}  // namespace

bool gemm_bf16_available() { return true; }

void gemm_bf16(int64_t M, int64_t N, int64_t K, const bfloat16_t* A, int64_t a_rs, int64_t a_cs, const bfloat16_t* B,
               int64_t b_rs, int64_t b_cs, float* C, int64_t ldc) {
  MU_CHECK(M >= 0 && N >= 0 && K >= 0, "gemm_bf16: negative size (M ", M, ", N ", N, ", K ", K, ")");
  if (M == 0 || N == 0) return;
  if (K == 0) {
    for (int64_t i = 0; i < M; ++i) std::fill(C + i * ldc, C + i * ldc + N, 0.0f);
    return;
  }
  int nt = omp_in_parallel() ? 1 : omp_get_max_threads();
  if (2.0 * double(M) * double(N) * double(K) < kParallelFlops) nt = 1;
  if (b_rs == 1 && K % 2 == 0) {  // x · wᵀ: the weight read in place (micro_kernel_t)
    const int64_t P = K / 2, x_panels = (M + kNR - 1) / kNR, w_blocks = (N + kMR - 1) / kMR;
    thread_local std::vector<uint32_t> x_packed;
    x_packed.resize(size_t(x_panels * P * kNR));
    uint32_t* xp = x_packed.data();
    pack_pairs<kNR>(K, M, A, a_cs, a_rs, xp, nt);  // A's rows in panels of kNR
    // Tiles weight block by weight block: consecutive tiles of a thread share the block's
    // kMR rows of w (in L1) and stream the packed panels of A.
    parallel_for(w_blocks * x_panels, nt, [&](int64_t t) {
      const int64_t wb = t / x_panels, xq = t % x_panels;
      micro_kernel_t(P, B + wb * kMR * b_cs, b_cs, xp + xq * P * kNR, C + xq * kNR * ldc + wb * kMR, ldc,
                     N - wb * kMR, M - xq * kNR);
    });
    return;
  }
  const int64_t P = (K + 1) / 2, row_panels = (M + kMR - 1) / kMR, col_panels = (N + kNR - 1) / kNR;
  // Both operands packed whole (each the size of the operand itself), once per call.
  thread_local std::vector<uint32_t> a_packed, b_packed;
  a_packed.resize(size_t(row_panels * P * kMR));
  b_packed.resize(size_t(col_panels * P * kNR));
  uint32_t *ap = a_packed.data(), *bp = b_packed.data();
  pack_pairs<kMR>(K, M, A, a_cs, a_rs, ap, nt);
  pack_pairs<kNR>(K, N, B, b_rs, b_cs, bp, nt);
  // Tiles column panel by column panel, so that consecutive tiles of a thread share their
  // B panel (in L2) and stream the A panels.
  parallel_for(row_panels * col_panels, nt, [&](int64_t t) {
    const int64_t q = t / row_panels, r = t % row_panels;
    micro_kernel(P, ap + r * P * kMR, bp + q * P * kNR, C + r * kMR * ldc + q * kNR, ldc, M - r * kMR, N - q * kNR);
  });
}

#else  // no AVX512_BF16 on the build target

bool gemm_bf16_available() { return false; }

void gemm_bf16(int64_t, int64_t, int64_t, const bfloat16_t*, int64_t, int64_t, const bfloat16_t*, int64_t, int64_t,
               float*, int64_t) {
  MU_FAIL("gemm_bf16: this build's target has no AVX512_BF16 (check gemm_bf16_available() first)");
}

#endif

}  // namespace mu::cpu
