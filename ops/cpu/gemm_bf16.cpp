// Products of two bfloat16 matrices into float32 or bfloat16 on CPUs with AVX512_BF16
// (Zen 4, Cooper Lake and later): autocast's many-row products (a prompt, a whole-context
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
//
// Where the bytes go (GPT-2 mini's head, 1024 x 256 by 50257, at about 360 GFLOP/s on
// two Zen 4 cores, each of its three products 66-74 ms): a weight B = wᵀ with its depths
// contiguous is read in place, never packed; a small packed B stays in L2 while A is
// packed one panel at a time just before its tiles (a 50257-row A is read once, not
// written out packed and read again per B panel); packing interleaves lines with vector
// permutes where the lines lie side by side; a bfloat16 C is rounded in the tile's
// registers, not written as float32 and rounded by a second pass; a Linear layer's bias (one
// value per column) or the MLP-Mixer's token-mixing bias (one per row) is added in them too
// (the single rounding a bfloat16 output needs, without a float32 twin).
#include "ops/cpu/gemm.h"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "ops/cpu/parallel.h"
#include "ops/cpu/simd.h"
#include "tensor/error.h"

#if defined(__AVX512BF16__) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__x86_64__)
#include <immintrin.h>
#define MUMOE_HAVE_DPBF16 1
#endif

namespace mu::cpu {

#ifdef MUMOE_HAVE_DPBF16

namespace {

constexpr int64_t kMR = 12;  // rows of the C tile
constexpr int64_t kNR = 32;  // columns of the C tile: two vectors of 16 float32 lanes

// What is added to the float32 sums before they are stored: one value per column of C (a
// Linear layer's bias), one per row (the MLP-Mixer's token-mixing bias), either, both
// (column first) or neither (null pointers).
struct Bias {
  const float* col = nullptr;  // N values
  const float* row = nullptr;  // M values
  // The same for the block of C whose top-left element is (i, j).
  Bias at(int64_t i, int64_t j) const { return {col ? col + j : nullptr, row ? row + i : nullptr}; }
  float add_to(float sum, int64_t i, int64_t j) const {
    if (col) sum += col[j];
    if (row) sum += row[i];
    return sum;
  }
};

// The depth pair (x[2p], x[2p + 1]) as one 32-bit value, the first in the low half (the
// lane order VDPBF16PS pairs them in); a depth past K reads as zero.
inline uint32_t pair_at(const bfloat16_t* x, int64_t stride, int64_t p, int64_t K) {
  const uint32_t lo = x[2 * p * stride].bits;
  const uint32_t hi = 2 * p + 1 < K ? x[(2 * p + 1) * stride].bits : 0u;
  return lo | (hi << 16);
}

// Pairs packed per block of a panel, so that a block's writes (kPairBlock x Width 32-bit
// values: 3 or 8 KiB) stay in L1 while each line's depths are read in order. Packing the
// whole panel line by line instead wrote a 12-line panel of 50257 depths (1.2 MiB, past
// L2) in 12 strided passes.
constexpr int64_t kPairBlock = 64;

// One panel of Width lines (line c's depth k at x[c * ls + k * ks]; lines from `valid` on
// are 0) into panel[p * Width + c] for the P = ceil(K / 2) depth pairs.
template <int64_t Width>
void pack_panel(int64_t K, const bfloat16_t* x, int64_t ks, int64_t ls, int64_t valid, uint32_t* panel) {
  static_assert(Width <= 32, "a panel's lines are one vector of 32 bfloat16 lanes");
  const int64_t P = (K + 1) / 2;
  if (ls == 1) {
    // Lines side by side in memory (B's columns of a row-major B, A's rows of a
    // transposed A: a Linear layer's backward products): depth 2p's Width values and
    // depth 2p + 1's are two masked loads, interleaved into the Width pairs by one
    // permute (lane j of the result takes lane j / 2 of the first row for even j, of the
    // second for odd j). Lines past `valid` load as 0, as does the second row of an odd
    // depth's last pair.
    alignas(64) static constexpr uint16_t kLow[32] = {0, 32, 1, 33, 2, 34, 3, 35, 4, 36, 5, 37, 6, 38, 7, 39,
                                                      8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
    const __m512i low = _mm512_load_si512(kLow), high = _mm512_add_epi16(low, _mm512_set1_epi16(16));
    const __mmask32 lanes = valid >= 32 ? ~__mmask32(0) : __mmask32((uint32_t(1) << valid) - 1);
    for (int64_t p = 0; p < P; ++p) {
      const bfloat16_t* row = x + 2 * p * ks;
      const __m512i first = _mm512_maskz_loadu_epi16(lanes, row);
      const __m512i second = 2 * p + 1 < K ? _mm512_maskz_loadu_epi16(lanes, row + ks) : _mm512_setzero_si512();
      const __m512i pairs = _mm512_permutex2var_epi16(first, low, second);  // lines 0..15
      if constexpr (Width == 32) {
        _mm512_storeu_si512(panel + p * Width, pairs);
        _mm512_storeu_si512(panel + p * Width + 16, _mm512_permutex2var_epi16(first, high, second));
      } else {
        _mm512_mask_storeu_epi32(panel + p * Width, __mmask16((1u << Width) - 1), pairs);
      }
    }
    return;
  }
  // Depths contiguous along a line (a row-major A, a Linear layer's weight as B = wᵀ):
  // each of the first K / 2 pairs is one 32-bit value, and the pairs of 16 lines are a
  // 16 x 16 block of them, read as 16 vectors and transposed in registers (simd.h), so
  // that each pair's Width values are one store (a Mixer's channel products spent 14% of
  // their time packing A pair by pair); the pairs past the last whole block, other
  // strides and an odd depth's last pair go pair by pair (pair_at).
  const int64_t whole = ks == 1 ? K / 2 : 0;
  const int64_t blocked = whole / 16 * 16;
  using VF = Vec<float>::type;
  for (int64_t p0 = 0; p0 < blocked; p0 += 16)
    for (int64_t c0 = 0; c0 < Width; c0 += 16) {
      VF r[16];
      for (int64_t i = 0; i < 16; ++i) {
        r[i] = VF{};
        if (c0 + i < std::min(valid, Width)) std::memcpy(&r[i], x + (c0 + i) * ls + 2 * p0, sizeof(VF));
      }
      transpose_block(r);  // r[j] lane i: line c0 + i's pair p0 + j
      const __mmask16 lanes = Width - c0 >= 16 ? __mmask16(0xffff) : __mmask16((1u << (Width - c0)) - 1);
      for (int64_t j = 0; j < 16; ++j) _mm512_mask_storeu_epi32(panel + (p0 + j) * Width + c0, lanes, __m512i(r[j]));
    }
  for (int64_t p0 = blocked; p0 < P; p0 += kPairBlock) {
    const int64_t p1 = std::min(P, p0 + kPairBlock);
    for (int64_t c = 0; c < Width; ++c) {
      uint32_t* out = panel + c;
      if (c >= valid) {
        for (int64_t p = p0; p < p1; ++p) out[p * Width] = 0;
        continue;
      }
      const bfloat16_t* line = x + c * ls;
      const int64_t split = std::clamp(whole, p0, p1);
      for (int64_t p = p0; p < split; ++p) std::memcpy(&out[p * Width], line + 2 * p, sizeof(uint32_t));
      for (int64_t p = split; p < p1; ++p) out[p * Width] = pair_at(line, ks, p, K);
    }
  }
}

// `lines` lines of K depths (line l's depth k at x[l * ls + k * ks]) as panels of Width
// lines: panel q, pair p, line c at dst[(q * P + p) * Width + c], P = ceil(K / 2) pairs;
// lines past the last are 0. B's panels are its columns (Width kNR, ks = B's row stride),
// A's its rows (Width kMR, ks = A's column stride).
template <int64_t Width>
void pack_pairs(int64_t K, int64_t lines, const bfloat16_t* x, int64_t ks, int64_t ls, uint32_t* dst, int nt) {
  const int64_t P = (K + 1) / 2, panels = (lines + Width - 1) / Width;
  parallel_for(panels, nt, [&](int64_t q) {
    pack_panel<Width>(K, x + q * Width * ls, ks, ls, std::min(Width, lines - q * Width), dst + q * P * Width);
  });
}

// The first lanes of v (mask m) into c: float32 as they are, bfloat16 rounded as
// bfloat16_t(float) rounds (simd.h, store_as), the lanes past m through a buffer.
inline void store_lanes(float* c, __m512 v, __mmask16 m) { _mm512_mask_storeu_ps(c, m, v); }
inline void store_lanes(bfloat16_t* c, __m512 v, __mmask16 m) {
  if (m == 0xffff) return store_as(c, Vec<float>::type(v));
  alignas(64) bfloat16_t rounded[16];
  store_as(rounded, Vec<float>::type(v));
  const __m256i h = _mm256_load_si256(reinterpret_cast<const __m256i*>(rounded));
  _mm256_mask_storeu_epi16(c, m, h);
}

// The kMR x (16 V) tile of C at c (row stride ldc, unit column stride) = A panel · the
// first 16 V columns of a B panel, over P depth pairs; rows >= m and columns >= n are not
// stored. V = 2 is the whole kNR-column panel; V = 1 its first half, for a last panel of
// at most 16 columns (GPT-2 124M's sampling loop has rows 65 to 127 of Linears taking the
// weight-in-place form below: panels of 32 rows did 16% more work than the rows asked).
// `bias` (the tile's, Bias::at) is added to the sums before they are stored, a bfloat16 C
// rounded once with it.
template <int V, class TC>
void micro_kernel(int64_t P, const uint32_t* __restrict ap, const uint32_t* __restrict bp, TC* c, int64_t ldc,
                  int64_t m, int64_t n, Bias bias) {
  __m512 acc[kMR][V];
  for (int i = 0; i < kMR; ++i)
    for (int v = 0; v < V; ++v) acc[i][v] = _mm512_setzero_ps();
  for (int64_t p = 0; p < P; ++p) {
    __m512bh b[V];
    for (int v = 0; v < V; ++v) b[v] = (__m512bh)_mm512_loadu_si512(bp + p * kNR + 16 * v);
#pragma GCC unroll 12
    for (int i = 0; i < kMR; ++i) {
      const __m512bh a = (__m512bh)_mm512_set1_epi32(int(ap[p * kMR + i]));
      for (int v = 0; v < V; ++v) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], a, b[v]);
    }
  }
  const __mmask16 m0 = n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1);
  const __mmask16 m1 = n >= 32 ? __mmask16(0xffff) : n <= 16 ? __mmask16(0) : __mmask16((1u << (n - 16)) - 1);
  if (bias.col) {  // one value per column: the same vectors for every row
    const __m512 b0 = _mm512_maskz_loadu_ps(m0, bias.col);
    const __m512 b1 = V == 2 ? _mm512_maskz_loadu_ps(m1, bias.col + 16) : _mm512_setzero_ps();
    for (int i = 0; i < kMR; ++i) {
      acc[i][0] = _mm512_add_ps(acc[i][0], b0);
      if constexpr (V == 2) acc[i][1] = _mm512_add_ps(acc[i][1], b1);
    }
  }
  if (bias.row) {  // one value per row, broadcast; rows past m are not read (nor stored)
    for (int i = 0; i < kMR; ++i) {
      const __m512 r = _mm512_set1_ps(i < m ? bias.row[i] : 0.0f);
      for (int v = 0; v < V; ++v) acc[i][v] = _mm512_add_ps(acc[i][v], r);
    }
  }
  for (int64_t i = 0; i < std::min(m, kMR); ++i) {
    store_lanes(c + i * ldc, acc[i][0], m0);
    if constexpr (V == 2) store_lanes(c + i * ldc + 16, acc[i][1], m1);
  }
}

// The weight-side form, for a B that is the transpose of a row-major N x K matrix w (a
// Linear layer's x · wᵀ) with K even: Cᵀ = w · Aᵀ by the same micro-kernel with the
// operands' roles swapped. w takes the broadcast side, read in place (each of its rows
// holds its depth pairs contiguously), and A the vector side, packed in panels of kNR rows
// (A is the small operand: a prompt, a sampling loop's context). The weight is then never
// copied: GPT-2 124M's Linears at about 80 rows took 1.18 ms a call with it packed, 1.00
// read in place (a whole-context sampling loop's kernel profile). The kMR x (16 V) tile
// of Cᵀ (kMR columns of C by 16 V rows) is transposed in registers into C; `bias` (the
// tile's, Bias::at) is added to the sums first: a column's value to a row of the tile of
// Cᵀ, a row's values lane by lane.
template <int V, class TC>
void micro_kernel_t(int64_t P, const bfloat16_t* __restrict w, int64_t ldw, const uint32_t* __restrict xp, TC* c,
                    int64_t ldc, int64_t n, int64_t m, Bias bias) {
  __m512 acc[kMR][V];
  for (int i = 0; i < kMR; ++i)
    for (int v = 0; v < V; ++v) acc[i][v] = _mm512_setzero_ps();
  const int64_t rows = std::min(n, kMR);
  const bfloat16_t* row[kMR];
  for (int64_t i = 0; i < kMR; ++i) row[i] = w + std::min(i, rows - 1) * ldw;  // rows past n repeat the last
  for (int64_t p = 0; p < P; ++p) {
    __m512bh b[V];
    for (int v = 0; v < V; ++v) b[v] = (__m512bh)_mm512_loadu_si512(xp + p * kNR + 16 * v);
#pragma GCC unroll 12
    for (int i = 0; i < kMR; ++i) {
      int32_t pair;
      std::memcpy(&pair, row[i] + 2 * p, sizeof(pair));
      const __m512bh a = (__m512bh)_mm512_set1_epi32(pair);
      for (int v = 0; v < V; ++v) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], a, b[v]);
    }
  }
  if (bias.col) {  // columns past n are not read (nor stored)
    for (int i = 0; i < kMR; ++i) {
      const __m512 b = _mm512_set1_ps(i < rows ? bias.col[i] : 0.0f);
      for (int v = 0; v < V; ++v) acc[i][v] = _mm512_add_ps(acc[i][v], b);
    }
  }
  if (bias.row) {  // lanes [16 v, 16 v + 16) are rows of C; rows past m are not read
    for (int v = 0; v < V; ++v) {
      const int64_t left = std::min<int64_t>(m - 16 * v, 16);
      const __m512 r = _mm512_maskz_loadu_ps(__mmask16((1u << left) - 1), bias.row + 16 * v);
      for (int i = 0; i < kMR; ++i) acc[i][v] = _mm512_add_ps(acc[i][v], r);
    }
  }
  // Each half of the tile (16 rows of C) transposed in registers, its kMR columns padded
  // to 16 with zeros; row r of C is then lanes [0, rows) of one vector.
  const __mmask16 lanes = __mmask16((1u << rows) - 1);
  for (int h = 0; h < V; ++h) {
    Vec<float>::type x[16];
    for (int i = 0; i < 16; ++i) x[i] = i < kMR ? Vec<float>::type(acc[i][h]) : Vec<float>::type{};
    transpose_block(x);
    for (int64_t r = 0; r < std::min<int64_t>(m - 16 * h, 16); ++r)
      store_lanes(c + (16 * h + r) * ldc, __m512(x[r]), lanes);
  }
}

// A tile by micro_kernel with V chosen from the columns left (at most 16: V = 1).
template <class TC>
inline void tile(int64_t P, const uint32_t* ap, const uint32_t* bp, TC* c, int64_t ldc, int64_t m, int64_t n,
                 Bias bias) {
  if (n <= 16) return micro_kernel<1>(P, ap, bp, c, ldc, m, n, bias);
  micro_kernel<2>(P, ap, bp, c, ldc, m, n, bias);
}
// The same for micro_kernel_t, from the rows of A left.
template <class TC>
inline void tile_t(int64_t P, const bfloat16_t* w, int64_t ldw, const uint32_t* xp, TC* c, int64_t ldc, int64_t n,
                   int64_t m, Bias bias) {
  if (m <= 16) return micro_kernel_t<1>(P, w, ldw, xp, c, ldc, n, m, bias);
  micro_kernel_t<2>(P, w, ldw, xp, c, ldc, n, m, bias);
}

// B's packed panels up to this size are kept whole in each core's L2 while A is packed
// panel by panel as the tiles reach it (gemm_bf16_into).
constexpr int64_t kResidentBytes = int64_t(1) << 20;

// Whether x · wᵀ reads the weight in place (micro_kernel_t) rather than packing it like
// any B: for fewer than 256 rows, where packing w costs more than the product gains from
// it, and for a weight of 2^21 elements or more (4 MiB, past L2, where packing it is one
// more pass through memory). Otherwise packed, which runs the longer tiles: on two Zen 4
// cores an MLP-Mixer's channel products (6272 rows by 512 x 128 and 128 x 512) went from
// 300 and 232 GFLOP/s in place to 401 and 383 packed; 768 x 768 at 512 rows 399 -> 418, at
// 64 rows 402 in place against 304 packed; GPT-2 mini's head (50257 x 256) ties at 1024
// rows (357 and 359) and is in place.
inline bool weight_in_place(int64_t M, int64_t N, int64_t K) {
  return M < 256 || N * K >= (int64_t(1) << 21);
}

// `bias` is added to the float32 sums before they are stored.
template <class TC>
void gemm_bf16_into(int64_t M, int64_t N, int64_t K, const bfloat16_t* A, int64_t a_rs, int64_t a_cs,
                    const bfloat16_t* B, int64_t b_rs, int64_t b_cs, TC* C, int64_t ldc, Bias bias) {
  MU_CHECK(M >= 0 && N >= 0 && K >= 0, "gemm_bf16: negative size (M ", M, ", N ", N, ", K ", K, ")");
  if (M == 0 || N == 0) return;
  if (K == 0) {  // an empty sum: the bias alone, added as the tiles add it
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = TC(bias.add_to(0.0f, i, j));
    return;
  }
  int nt = omp_in_parallel() ? 1 : omp_get_max_threads();
  if (2.0 * double(M) * double(N) * double(K) < kParallelFlops) nt = 1;
  if (b_rs == 1 && K % 2 == 0 && weight_in_place(M, N, K)) {  // x · wᵀ, the weight read in place
    const int64_t P = K / 2, x_panels = (M + kNR - 1) / kNR, w_blocks = (N + kMR - 1) / kMR;
    thread_local std::vector<uint32_t> x_packed;
    x_packed.resize(size_t(x_panels * P * kNR));
    uint32_t* xp = x_packed.data();
    pack_pairs<kNR>(K, M, A, a_cs, a_rs, xp, nt);  // A's rows in panels of kNR
    // Tiles weight block by weight block: consecutive tiles of a thread share the block's
    // kMR rows of w (in L1) and stream the packed panels of A.
    parallel_for(w_blocks * x_panels, nt, [&](int64_t t) {
      const int64_t wb = t / x_panels, xq = t % x_panels;
      tile_t(P, B + wb * kMR * b_cs, b_cs, xp + xq * P * kNR, C + xq * kNR * ldc + wb * kMR, ldc, N - wb * kMR,
             M - xq * kNR, bias.at(xq * kNR, wb * kMR));
    });
    return;
  }
  const int64_t P = (K + 1) / 2, row_panels = (M + kMR - 1) / kMR, col_panels = (N + kNR - 1) / kNR;
  thread_local std::vector<uint32_t> a_packed, b_packed;
  b_packed.resize(size_t(col_panels * P * kNR));
  uint32_t* bp = b_packed.data();
  pack_pairs<kNR>(K, N, B, b_rs, b_cs, bp, nt);
  if (col_panels * P * kNR * int64_t(sizeof(uint32_t)) <= kResidentBytes && row_panels >= 2 * nt) {
    // B small (a Linear layer's input in the weight's gradient dYᵀ X): each thread packs
    // one A panel at a time and multiplies it by every B panel, so that A, however many
    // rows it has (GPT-2's head: 50257), is read once and never written out packed, and
    // B is read from L2. Packed whole first, that A (103 MB packed) was written out and
    // then read again once per B panel, eight times.
    parallel_for_with(
        row_panels, nt, [&] { return std::vector<uint32_t>(size_t(P * kMR)); },
        [&](std::vector<uint32_t>& panel, int64_t r) {
          pack_panel<kMR>(K, A + r * kMR * a_rs, a_cs, a_rs, std::min(kMR, M - r * kMR), panel.data());
          for (int64_t q = 0; q < col_panels; ++q)
            tile(P, panel.data(), bp + q * P * kNR, C + r * kMR * ldc + q * kNR, ldc, M - r * kMR, N - q * kNR,
                 bias.at(r * kMR, q * kNR));
        });
    return;
  }
  // Both operands packed whole (each the size of the operand itself), once per call.
  a_packed.resize(size_t(row_panels * P * kMR));
  uint32_t* ap = a_packed.data();
  pack_pairs<kMR>(K, M, A, a_cs, a_rs, ap, nt);
  // Tiles column panel by column panel, so that consecutive tiles of a thread share their
  // B panel (in L2) and stream the A panels.
  parallel_for(row_panels * col_panels, nt, [&](int64_t t) {
    const int64_t q = t / row_panels, r = t % row_panels;
    tile(P, ap + r * P * kMR, bp + q * P * kNR, C + r * kMR * ldc + q * kNR, ldc, M - r * kMR, N - q * kNR,
         bias.at(r * kMR, q * kNR));
  });
}

// ---------------------------------------------------------------- few rows

// Few rows of A by a weight read in place, as dot products (a decoding step's head):
// C(m, j) = Σ_k A(m, k) w(j, k), 32 depths of a row of A and of a row of w multiplied pair
// by pair into 16 lanes per VDPBF16PS, the lanes summed once per element. Half the
// instructions of widening w to float32 for FMAs (gemm_bf16_weight), whose time grows
// with the rows; the depth in chunks whose R rows of A stay in L1.
constexpr int64_t kDotChunk = 1024;  // depths per chunk: R x 2 KB of A

template <int R>
void dot_pairs(int64_t j0, int64_t j1, int64_t K, const bfloat16_t* A, int64_t a_rs, const bfloat16_t* w, int64_t ldw,
               float* C, int64_t c_rs, int64_t c_cs, bool accumulate) {
  const __mmask32 tail = K % 32 == 0 ? ~__mmask32(0) : __mmask32((uint32_t(1) << (K % 32)) - 1);
  const int64_t whole = K / 32 * 32;
  for (int64_t j = j0; j < j1; ++j) {
    const bfloat16_t* row = w + j * ldw;
    __m512 acc[R];
    for (int m = 0; m < R; ++m) acc[m] = _mm512_setzero_ps();
    for (int64_t k = 0; k < whole; k += 32) {
      const __m512bh b = (__m512bh)_mm512_loadu_si512(row + k);
#pragma GCC unroll 16
      for (int m = 0; m < R; ++m)
        acc[m] = _mm512_dpbf16_ps(acc[m], (__m512bh)_mm512_loadu_si512(A + m * a_rs + k), b);
    }
    if (whole < K) {  // the last depths, the rest of the vector zero
      const __m512bh b = (__m512bh)_mm512_maskz_loadu_epi16(tail, row + whole);
      for (int m = 0; m < R; ++m)
        acc[m] = _mm512_dpbf16_ps(acc[m], (__m512bh)_mm512_maskz_loadu_epi16(tail, A + m * a_rs + whole), b);
    }
    for (int m = 0; m < R; ++m) {
      const float sum = lane_sum<float>(Vec<float>::type(acc[m]));  // simd.h
      float& dst = C[m * c_rs + j * c_cs];
      dst = accumulate ? dst + sum : sum;
    }
  }
}

template <int R>
void few_rows(int64_t N, int64_t K, const bfloat16_t* A, int64_t a_rs, const bfloat16_t* w, int64_t ldw, float* C,
              int64_t c_rs, int64_t c_cs, int nt) {
  parallel_team(nt, [&](int tid, int team) {  // one contiguous share of the columns each
    const int64_t j0 = N * tid / team, j1 = N * (tid + 1) / team;
    for (int64_t k0 = 0; k0 < K; k0 += kDotChunk)
      dot_pairs<R>(j0, j1, std::min(kDotChunk, K - k0), A + k0, a_rs, w + k0, ldw, C, c_rs, c_cs, k0 > 0);
  });
}

}  // namespace

void gemm_bf16_few_rows(int64_t M, int64_t N, int64_t K, const bfloat16_t* A, int64_t a_rs, const bfloat16_t* w,
                        int64_t ldw, float* C, int64_t c_rs, int64_t c_cs) {
  MU_CHECK(M >= 1 && M <= kBf16FewRows && N >= 0 && K >= 1, "gemm_bf16_few_rows: ", M, " x ", K, " by ", K, " x ", N,
           " is outside its shapes (1 to ", kBf16FewRows, " rows, a depth of at least 1)");
  int nt = omp_in_parallel() ? 1 : omp_get_max_threads();
  if (2.0 * double(M) * double(N) * double(K) < kParallelFlops) nt = 1;
  switch (M) {
#define MU_BF16_FEW(R) \
  case R: return few_rows<R>(N, K, A, a_rs, w, ldw, C, c_rs, c_cs, nt);
    MU_BF16_FEW(1) MU_BF16_FEW(2) MU_BF16_FEW(3) MU_BF16_FEW(4) MU_BF16_FEW(5) MU_BF16_FEW(6)
    MU_BF16_FEW(7) MU_BF16_FEW(8) MU_BF16_FEW(9) MU_BF16_FEW(10) MU_BF16_FEW(11) MU_BF16_FEW(12)
    MU_BF16_FEW(13) MU_BF16_FEW(14) MU_BF16_FEW(15) MU_BF16_FEW(16)
#undef MU_BF16_FEW
  }
}

bool gemm_bf16_available() { return true; }

void gemm_bf16(int64_t M, int64_t N, int64_t K, const bfloat16_t* A, int64_t a_rs, int64_t a_cs, const bfloat16_t* B,
               int64_t b_rs, int64_t b_cs, float* C, int64_t ldc, const float* bias, const float* row_bias) {
  gemm_bf16_into(M, N, K, A, a_rs, a_cs, B, b_rs, b_cs, C, ldc, Bias{bias, row_bias});
}
void gemm_bf16(int64_t M, int64_t N, int64_t K, const bfloat16_t* A, int64_t a_rs, int64_t a_cs, const bfloat16_t* B,
               int64_t b_rs, int64_t b_cs, bfloat16_t* C, int64_t ldc, const float* bias, const float* row_bias) {
  gemm_bf16_into(M, N, K, A, a_rs, a_cs, B, b_rs, b_cs, C, ldc, Bias{bias, row_bias});
}

#else  // no AVX512_BF16 on the build target

bool gemm_bf16_available() { return false; }

void gemm_bf16(int64_t, int64_t, int64_t, const bfloat16_t*, int64_t, int64_t, const bfloat16_t*, int64_t, int64_t,
               float*, int64_t, const float*, const float*) {
  MU_FAIL("gemm_bf16: this build's target has no AVX512_BF16 (check gemm_bf16_available() first)");
}
void gemm_bf16(int64_t, int64_t, int64_t, const bfloat16_t*, int64_t, int64_t, const bfloat16_t*, int64_t, int64_t,
               bfloat16_t*, int64_t, const float*, const float*) {
  MU_FAIL("gemm_bf16: this build's target has no AVX512_BF16 (check gemm_bf16_available() first)");
}
void gemm_bf16_few_rows(int64_t, int64_t, int64_t, const bfloat16_t*, int64_t, const bfloat16_t*, int64_t, float*,
                        int64_t, int64_t) {
  MU_FAIL("gemm_bf16_few_rows: this build's target has no AVX512_BF16 (check gemm_bf16_available() first)");
}

#endif

}  // namespace mu::cpu
