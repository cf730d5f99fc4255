// CPU kernels of fused scaled dot-product attention (declared in ops/kernels/attention.h).
//
// Forward (flash-attention style): for each (b, h) and block of Bq query rows, walk the
// keys in blocks of Bk. For each key block the score tile is computed, and each query
// keeps a running max m and running sum l of exp(s - m): when a block raises the max,
// what was summed so far (l and the output accumulator) is rescaled by exp(m_old - m_new).
// So a thread holds one Bk x Bq tile and a few Bq x D blocks, never a T x T matrix. Only
// out and the row log-sum-exp L = m + log l are kept for backward.
//
// Backward recomputes P = exp(S - L) tile by tile (S the scaled scores) and applies the
// standard rules, with Di = rowsum(dO ∘ O):
//   dV += Pᵀ dO,  dP = dO Vᵀ,  dS = P ∘ (dP - Di),  dQ += scale dS K,  dK += scale dSᵀ Q.
// (With dropout, O uses P ∘ M / (1 - p): dV takes that product, dP is multiplied by
// M / (1 - p) before dS, and Di = rowsum(dO ∘ O) still equals rowsum(P ∘ dP).)
// It walks key blocks on the outside, so a key block's dK and dV stay in a local tile;
// dQ gathers contributions from every key block, so one head's key blocks run on one
// thread, or, when there are fewer heads than threads, are split over threads that each
// sum into their own dQ copy, added up at the end: no two threads write one value.
//
// Layout. A score tile is stored transposed, St[j][i] for key j and query i, so that the
// per-query softmax bookkeeping (max, sum, rescale, mask) runs along rows of the tile,
// one vector of queries at a time, with no reduction across vector lanes. The tile is
// St = K_blk · (scale Q_blk)ᵀ: K's rows are read in place and Q is transposed once per
// query block (forward) or once per call (backward). Every product of tiles is the small
// matrix product tile_gemm, written with GCC vector extensions (as ops/cpu/gemm_*.cpp): it
// keeps a 4-row strip of the result in vector registers over the whole depth, so every
// inner step is a few loads and fused multiply-adds. Its operands' rows are whole
// vectors: q, k, v and dO are used in place when D is a whole number of vectors and T a
// multiple of 4 (D = 64), and otherwise copied once per call into zero-padded buffers.
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "ops/cpu/dropout_lanes.h"
#include "ops/cpu/loops.h"
#include "ops/cpu/simd.h"
#include "ops/cpu/widen.h"
#include "ops/kernels/attention.h"

namespace mu::cpu {
namespace {

// ---------------------------------------------------------------- tile products

// Rows of C a strip keeps in registers, and vectors per row: MR * NV accumulators + NV
// vectors of B + 1 broadcast must fit the register file (4*4 + 4 + 1 = 21 of 32 on
// AVX-512, 4*2 + 2 + 1 = 11 of 16 otherwise).
constexpr int MR = 4;
constexpr int kMainNV = kVecRegs == 32 ? 4 : 2;

// C (MR x NV vectors, row stride ldc) = or += A (MR x K, element (r, p) at
// a[r * ars + p * acs]) · B (K x NV vectors, row stride ldb). The accumulators are
// arrays of vectors; with the r and n loops unrolled GCC keeps all of them in registers
// and turns acc += a * b into one fused multiply-add.
template <class T, int NV>
inline void strip(int64_t K, const T* a, int64_t ars, int64_t acs, const T* b, int64_t ldb, T* c, int64_t ldc,
                  bool accumulate) {
  using V = typename Vec<T>::type;
  constexpr int W = Vec<T>::width;
  V acc[MR][NV];
#pragma GCC unroll 4
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int n = 0; n < NV; ++n) acc[r][n] = V{};
  for (int64_t p = 0; p < K; ++p) {
    V bv[NV];
#pragma GCC unroll 4
    for (int n = 0; n < NV; ++n) {
      bv[n] = load(b + p * ldb + n * W);
      // Pins the row of B in a register. Without it GCC folds the load into each of the
      // MR multiply-adds that use it, and the strip runs on the load ports, not the FMA
      // units (1.6x slower here).
      asm("" : "+v"(bv[n]));
    }
#pragma GCC unroll 4
    for (int r = 0; r < MR; ++r) {
      const T ar = a[r * ars + p * acs];
#pragma GCC unroll 4
      for (int n = 0; n < NV; ++n) acc[r][n] += ar * bv[n];  // scalar * vector: a broadcast
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int n = 0; n < NV; ++n) {
      T* cp = c + r * ldc + n * W;
      store(cp, accumulate ? load(cp) + acc[r][n] : acc[r][n]);
    }
}

// Which part of the depth the rows of a causal tile need: the strip of rows [i, i + MR)
// reads depth [i + begin_off, i + MR + end_off), clipped to [0, K). Outside it the A
// entries are masked zeros, so leaving them out changes nothing. The default is all of K.
struct Band {
  static constexpr int64_t kAll = int64_t(1) << 40;
  int64_t begin_off = -kAll;
  int64_t end_off = kAll;
};

// C (M x N) = or += A (M x K) · B (K x N), A element (i, p) at a[i * ars + p * acs], B and
// C row-major with row strides ldb and ldc. M must be a multiple of MR and N of the
// vector width; A is read for rows < M, B for rows < K. K == 0 writes zeros (or adds
// nothing). With a band (only when accumulating), each strip of rows reads only its
// part of the depth.
template <class T>
void tile_gemm(int64_t M, int64_t N, int64_t K, const T* a, int64_t ars, int64_t acs, const T* b, int64_t ldb, T* c,
               int64_t ldc, bool accumulate, Band band = {}) {
  constexpr int W = Vec<T>::width;
  for (int64_t i = 0; i < M; i += MR) {
    const int64_t p0 = std::clamp<int64_t>(i + band.begin_off, 0, K), p1 = std::clamp<int64_t>(i + MR + band.end_off, 0, K);
    if (p1 <= p0 && accumulate) continue;  // nothing to add
    const int64_t k = std::max<int64_t>(p1 - p0, 0);
    const T* ai = a + i * ars + p0 * acs;
    const T* bi = b + p0 * ldb;
    T* ci = c + i * ldc;
    int64_t n = 0;
    for (; n + kMainNV * W <= N; n += kMainNV * W) strip<T, kMainNV>(k, ai, ars, acs, bi + n, ldb, ci + n, ldc, accumulate);
    for (; n < N; n += W) strip<T, 1>(k, ai, ars, acs, bi + n, ldb, ci + n, ldc, accumulate);
  }
}

// ---------------------------------------------------------------- exp

// e^x for float in plain arithmetic, so that a loop of it vectorises: x = n ln2 + r with
// |r| <= ln2 / 2, e^r from its Taylor series to r^7 (truncation below 6e-9 relative,
// under float's rounding), times 2^n written straight into the exponent bits. Meant for
// x <= 88 (attention only takes x <= 0: a score minus its row's max); 0 below -87, where
// 2^n would leave the normal range (so exp(-inf) = 0); NaN stays NaN; exp(0) is exactly 1.
inline float exp_approx(float x) {
  constexpr float kShift = 0x1.8p23f;                 // adding it rounds to an integer
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;              // ln 2 in 9 bits: n * kLn2Hi is exact
  constexpr float kLn2Lo = -2.12194440054690583e-4f;  // ln 2 - kLn2Hi
  float xc = x > 88.0f ? 88.0f : x;
  float t = xc * kLog2e + kShift;                     // n in the low mantissa bits of t
  float n = t - kShift;
  float r = (xc - n * kLn2Hi) - n * kLn2Lo;
  float p = 1.0f + r * (1.0f + r * (1.0f / 2 + r * (1.0f / 6 + r * (1.0f / 24 + r * (1.0f / 120 +
            r * (1.0f / 720 + r * (1.0f / 5040)))))));
  int32_t e = std::bit_cast<int32_t>(t) - std::bit_cast<int32_t>(kShift);  // = n
  float two_n = std::bit_cast<float>((e + 127) << 23);
  return x < -87.0f ? 0.0f : p * two_n;
}
inline float exp_of(float x) { return exp_approx(x); }
// float64 serves the reference and gradcheck paths: the library's exp, exact to an ulp.
inline double exp_of(double x) { return std::exp(x); }

// ---------------------------------------------------------------- geometry

// Block sizes: Bq queries against Bk keys. Both multiples of MR, and Bq a whole number
// of vectors (the tile's rows). 64 x 64 keeps a tile's operands (a few 64 x D blocks and
// the score tile) in L1/L2 and gives every strip a depth long enough to pay for its loads
// and stores.
constexpr int64_t Bq = 64;
constexpr int64_t Bk = 64;

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

struct Geometry {
  int64_t B, H, Tq, Tk, D;
  int64_t Dp;          // D rounded up to whole vectors: the row stride of every (T x D) operand
  int64_t Tq_pad;      // Tq rounded up to whole query blocks
  double scale;
  bool causal;
  bool dropout;        // p > 0
  uint64_t key;        // attention_dropout_key(seed)
  uint64_t threshold;  // bits below it are dropped
  double keep_scale;   // 1 / (1 - p) for kept elements (0 for p = 1: nothing is kept)
};

template <class T>
Geometry geometry(const Tensor& q, const Tensor& k, const kernels::AttentionParams& p) {
  const Shape& qs = q.shape();
  Geometry g;
  g.B = qs[0], g.H = qs[1], g.Tq = qs[2], g.D = qs[3], g.Tk = k.shape()[2];
  g.Dp = std::max<int64_t>(round_up(g.D, Vec<T>::width), Vec<T>::width);
  g.Tq_pad = round_up(g.Tq, Bq);
  g.scale = p.scale;
  g.causal = p.causal;
  g.dropout = p.dropout_p > 0;
  g.key = kernels::attention_dropout_key(p.seed);
  g.threshold = kernels::attention_dropout_threshold(p.dropout_p);
  g.keep_scale = p.dropout_p < 1 ? 1 / (1 - p.dropout_p) : 0;
  return g;
}

// Buffers that only grow, one set per thread, kept across calls: a call then pays
// neither for fresh pages (a page fault each, and the kernel zeroing them) nor for
// malloc. Slots name what each holds; the contents are not initialised.
enum Slot { kKRows, kVRows, kQRows, kDORows, kQt, kDOt, kLse, kDi, kPartial,  // per call
            kTileQt, kTile, kTileP, kTileDS, kAccO, kAccDK, kAccDV, kAccDQ, kRowState, kRowSum,  // per thread
            kRowScores, kNumSlots };

template <class T>
T* workspace(Slot slot, int64_t n) {
  thread_local std::vector<T> buffers[kNumSlots];
  std::vector<T>& b = buffers[slot];
  if (int64_t(b.size()) < n) b.resize(size_t(n));
  return b.data();
}

// One (T x D) operand per head as the tile products read it: rows of stride Dp, at least
// round_up(T, MR) of them.
template <class T>
struct Rows {
  const T* data = nullptr;
  int64_t head_stride = 0;  // elements from one head to the next
};

// The source itself when it already has that layout, else a copy in the calling thread's
// workspace `slot` with zeros in the padding. The source's heads are src_stride apart (t D
// when dense; more for a view of a longer buffer, a key-value cache). Read in place, rows
// past t up to round_up(t, MR) are read too, by products whose results for them are never
// used (the forward's score rows past the block's keys): their values do not matter, but
// they must lie in memory the tensor owns, which `readable` (elements from src to the end
// of its storage) says.
template <class T>
Rows<T> make_rows(const T* src, const Geometry& g, int64_t t, Slot slot, int64_t src_stride = -1,
                  int64_t readable = -1) {
  const int64_t BH = g.B * g.H, rows = round_up(t, MR);
  if (src_stride < 0) src_stride = t * g.D;
  if (readable < 0) readable = BH * t * g.D;
  const bool in_place = g.Dp == g.D && src_stride >= rows * g.D && (BH - 1) * src_stride + rows * g.D <= readable;
  if (in_place || BH == 0) return {src, src_stride};
  const int64_t stride = rows * g.Dp;
  T* dst = workspace<T>(slot, BH * stride);
  parallel_for_if(BH, BH * t * g.D >= kParallelGrain && !omp_in_parallel(), [&](int64_t bh) {
    T* head = dst + bh * stride;
    for (int64_t r = 0; r < t; ++r) {
      std::memcpy(head + r * g.Dp, src + bh * src_stride + r * g.D, size_t(g.D) * sizeof(T));
      std::fill(head + r * g.Dp + g.D, head + (r + 1) * g.Dp, T(0));
    }
    std::fill(head + t * g.Dp, head + stride, T(0));
  });
  return {dst, stride};
}

// The forward's key or value rows: a dense tensor, or a view whose rows are dense (stride
// D, then 1) and whose heads are one stride apart (kernels::attention_rows_view).
template <class T>
Rows<T> key_rows(const Tensor& x, const Geometry& g, Slot slot) {
  const int64_t hs = kernels::attention_head_stride(x);
  const int64_t readable = int64_t(x.storage()->nbytes / sizeof(T)) - x.storage_offset();
  return make_rows(x.data_ptr<T>(), g, g.Tk, slot, hs, readable);
}

// Autocast's bfloat16 keys or values (B, H, T, D), with unit column stride (a dense
// tensor or a view of dense rows, as the op passes them), as float32 rows of stride Dp in
// the calling thread's workspace `slot`, widened as they are laid out: one pass over the
// bfloat16 values where there were a float32 copy of the tensor and then the rows (for
// D not a whole number of vectors) or the tiles reading that copy.
Rows<float> widened_rows(const Tensor& x, const Geometry& g, Slot slot) {
  const int64_t T = x.size(2), rows = round_up(T, MR), stride = rows * g.Dp;
  const bfloat16_t* src = x.data_ptr<bfloat16_t>();
  float* dst = workspace<float>(slot, g.B * g.H * stride);
  parallel_for_if(g.B * g.H, g.B * g.H * T * g.D >= kParallelGrain && !omp_in_parallel(), [&](int64_t bh) {
    const bfloat16_t* head = src + (bh / g.H) * x.stride(0) + (bh % g.H) * x.stride(1);
    float* out = dst + bh * stride;
    for (int64_t t = 0; t < T; ++t) {
      const bfloat16_t* row = head + t * x.stride(2);
      float* o = out + t * g.Dp;
      widen_run(row, g.D, o);
      std::fill(o + g.D, o + g.Dp, 0.0f);
    }
    std::fill(out + T * g.Dp, out + stride, 0.0f);
  });
  return {dst, stride};
}

// dst[d * ld + i] = scale * src[(i0 + i) * D + d] for i < n, and 0 for n <= i < ld: rows
// [i0, i0 + n) of one head's (T x D) matrix, transposed and scaled, into a D x ld block.
// The inner loop runs along a row of dst, so its stores are contiguous and its loads a
// strided gather, which vectorises (a scatter of stores would not).
template <class T>
void transpose_rows(const T* src, int64_t i0, int64_t n, int64_t ld, const Geometry& g, T scale, T* dst) {
  const T* s = src + i0 * g.D;
  for (int64_t d = 0; d < g.D; ++d) {
    T* row = dst + d * ld;
    for (int64_t i = 0; i < n; ++i) row[i] = s[i * g.D + d] * scale;
    std::fill(row + n, row + ld, T(0));
  }
}

// x · y over n elements, in W independent lanes so that the loop vectorises (one running
// sum would be one serial chain). Short sums (n = D): carried in T.
template <class T>
inline T dot(const T* x, const T* y, int64_t n) {
  constexpr int W = Vec<T>::width;
  T lane[W] = {};
  int64_t j = 0;
  for (; j + W <= n; j += W)
    for (int w = 0; w < W; ++w) lane[w] += x[j + w] * y[j + w];
  T s = 0;
  for (; j < n; ++j) s += x[j] * y[j];
  for (int w = 0; w < W; ++w) s += lane[w];
  return s;
}

// Multiplies the dropout factor (0 when dropped, 1 / (1 - p) when kept) into x[i], the
// entry of query q0 + i and key kj, for i < Bq. The counter of (qi, kj) is
// (bh Tq + qi) Tk + kj, so consecutive queries are Tk apart.
// Eight queries at a time (ops/cpu/dropout_lanes.h); Bq is a multiple of 8.
template <class T>
inline void apply_dropout(const Geometry& g, int64_t bh, int64_t q0, int64_t kj, const T* x, T* out) {
  static_assert(Bq % 8 == 0);
  const uint64_t base = uint64_t((bh * g.Tq + q0) * g.Tk + kj), step = uint64_t(g.Tk);
  const auto keep = typename DropoutLanes<T>::type{} + T(g.keep_scale);
  for (int64_t i = 0; i < Bq; i += 8) {
    const auto kept = dropout_kept8<T>(g.key, base + uint64_t(i) * step, step, g.threshold);
    store(out + i, dropout_select8<T>(kept, load<T, typename DropoutLanes<T>::type>(x + i) * keep));
  }
}

// ---------------------------------------------------------------- forward

// Per-thread buffers of the forward (in the thread's workspace).
template <class T>
struct ForwardScratch {
  T* qt;     // scale Qᵀ of the query block, D x Bq
  T* st;     // score tile, transposed: Bk x Bq
  T* o;      // output accumulator, Bq x Dp
  T *m, *alpha, *shift, *colsum;  // per query: running max, rescale, exp shift, tile sum
  acc_t<T>* l;                    // running sum per query, summed in double for float32
  explicit ForwardScratch(const Geometry& g)
      : qt(workspace<T>(kTileQt, std::max<int64_t>(g.D, 1) * Bq)), st(workspace<T>(kTile, Bk * Bq)),
        o(workspace<T>(kAccO, Bq * g.Dp)) {
    m = workspace<T>(kRowState, 4 * Bq);
    alpha = m + Bq, shift = m + 2 * Bq, colsum = m + 3 * Bq;
    l = workspace<acc_t<T>>(kRowSum, Bq);
  }
};

// ---------------------------------------------------------------- few queries

// Blocks of at most kRowQueries queries (a decoding step's one query against a key-value
// cache) run query by query in forward_rows rather than through score tiles. A tile
// computes a whole vector of query columns whatever the block holds, so for one query it
// does W times the score work (16 on AVX-512: D broadcast multiply-adds per key); row by
// row a key costs D multiply-adds on a vector of W keys (after a transpose) for the
// scores, and D / W vector multiply-adds for the output. Measured on Zen 4 (2 threads, 12
// heads, D = 64, a scratch loop over 12 layers' caches), rows against tiles, µs a call:
// against 960 keys 130 / 362 for one query, 195 / 362 for two, 263 / 355 for three, 330 /
// 360 for four; against 128 keys 12.7 / 34.5, 21 / 35, 31 / 35, 40 / 35.6.
constexpr int64_t kRowQueries = 3;

// s[j] = Σ_d K[j][d] qs[d] for keys j < n (rows ld apart), each one chain of multiply-adds
// in the order of d from 0: the rounding of forward_block's score tiles, and of the
// backward's, which recomputes P = exp(S - L) from the forward's L = m + log l (a score
// rounded otherwise here would leave each row of that P summing to 1 + O(|S| ulp)). W
// keys at a time: their rows, W columns at a time, are loaded as W vectors and transposed
// in registers, so that one vector holds one column of the W keys. The keys are T's, or
// bfloat16 widened as they are loaded (autocast: load_as).
template <class T, class TK>
void key_scores(const TK* kh, int64_t ld, int64_t D, const T* qs, int64_t n, T* s) {
  using V = typename Vec<T>::type;
  constexpr int W = Vec<T>::width;
  constexpr int64_t kAhead = 2 * W;  // how far ahead rows are prefetched (W and 4 W: 5-10% slower)
  for (int64_t j0 = 0; j0 < n; j0 += W) {
    // The rows kAhead keys on, a cache line at a time: a step reads its rows a column block
    // at a time, across rows, which the hardware prefetchers follow poorly. Without it a
    // cache in main memory (12 layers x 12 heads x 960 keys) took 1.6x as long, with it 7%
    // more time when in cache (128 keys).
    const int64_t ahead_end = std::min<int64_t>(n, j0 + kAhead + W);
    for (int64_t j = j0 + kAhead; j < ahead_end; ++j)
      for (int64_t p = 0; p < D; p += 64 / int64_t(sizeof(TK))) __builtin_prefetch(kh + j * ld + p);
    const int64_t keys = std::min<int64_t>(W, n - j0);
    V acc{};
    for (int64_t p0 = 0; p0 < D; p0 += W) {  // rows hold whole vectors: p0 + W <= ld
      V r[W];
      for (int jj = 0; jj < W; ++jj) r[jj] = jj < keys ? load_as<T>(kh + (j0 + jj) * ld + p0) : V{};
      transpose_block(r);
      const int64_t cols = std::min<int64_t>(W, D - p0);
      for (int pp = 0; pp < cols; ++pp) acc += qs[p0 + pp] * r[pp];
    }
    T lanes[W];
    std::memcpy(lanes, &acc, sizeof(acc));
    std::copy(lanes, lanes + keys, s + j0);
  }
}

// o[0, NV W) = Σ_{j < n} p[j] v[j ld + (0, NV W)]: NV vectors of a weighted sum of rows, two
// rows to a step so that two multiply-add chains per vector run side by side. V's rows
// are T's, or bfloat16 widened as they are loaded.
template <class T, int NV, class TV>
void weighted_rows(const TV* v, int64_t ld, const T* p, int64_t n, T* o) {
  using V = typename Vec<T>::type;
  constexpr int W = Vec<T>::width;
  V acc[2][NV] = {};
  int64_t j = 0;
  for (; j + 2 <= n; j += 2) {
    for (int u = 0; u < 2; ++u)
      for (int c = 0; c < NV; ++c) acc[u][c] += p[j + u] * load_as<T>(v + (j + u) * ld + c * W);
  }
  for (; j < n; ++j)
    for (int c = 0; c < NV; ++c) acc[0][c] += p[j] * load_as<T>(v + j * ld + c * W);
  for (int c = 0; c < NV; ++c) store(o + c * W, acc[0][c] + acc[1][c]);
}

// Queries [q0, q0 + qv) of head bh, one at a time, without dropout: the scores of all its
// keys (a row of Tk), their maximum, exp and sum in one pass each, then the output as the
// probabilities' combination of V's rows. The scores are rounded as forward_block's are; the
// rest differs from it by rounding only (no running max is needed when the whole row is
// at hand). The keys and values are T's, or autocast's bfloat16 ones for a float32 T
// (forward_typed).
template <class T, class TK>
void forward_rows(const Geometry& g, const T* q, const Rows<TK>& k, const Rows<TK>& v, T* o, T* lse, int64_t bh,
                  int64_t q0, int64_t qv, ForwardScratch<T>& sc) {
  using A = acc_t<T>;
  constexpr int W = Vec<T>::width;
  const T inf = std::numeric_limits<T>::infinity();
  const TK* kh = k.data + bh * k.head_stride;
  const TK* vh = v.data + bh * v.head_stride;
  T* s = workspace<T>(kRowScores, std::max<int64_t>(g.Tk, 1));
  T *qs = sc.qt, *O = sc.o;  // the scaled query and the output, Dp each
  for (int64_t i = 0; i < qv; ++i) {
    const int64_t qi = q0 + i, kend = g.causal ? std::min(g.Tk, qi + 1) : g.Tk;
    const T* qrow = q + (bh * g.Tq + qi) * g.D;
    for (int64_t d = 0; d < g.D; ++d) qs[d] = qrow[d] * T(g.scale);
    key_scores(kh, g.Dp, g.D, qs, kend, s);
    T mx = -inf;
    for (int64_t j = 0; j < kend; ++j) mx = s[j] > mx ? s[j] : mx;
    // As in forward_block: a row of masked scores only is taken against 0.
    const T shift = mx == -inf ? T(0) : mx;
    for (int64_t j = 0; j < kend; ++j) s[j] = exp_of(s[j] - shift);
    // The sum in 8 independent lanes (vectorised; one running sum would be a serial chain).
    A part[8] = {};
    int64_t j = 0;
    for (; j + 8 <= kend; j += 8)
      for (int u = 0; u < 8; ++u) part[u] += A(s[j + u]);
    for (; j < kend; ++j) part[0] += A(s[j]);
    const A l = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
    // O = Σ_j p_j V_j, up to four vectors of columns at a time: V's rows are read in order,
    // as they lie in memory. A vector of columns at a time over all keys read each row in
    // D / W passes: one query against 960 keys from main memory took 280-310 µs a call
    // that way, 215-240 µs this way (before the keys were prefetched).
    for (int64_t d0 = 0; d0 < g.Dp; d0 += 4 * W) {
      switch (std::min<int64_t>(4, (g.Dp - d0) / W)) {
        case 4: weighted_rows<T, 4>(vh + d0, g.Dp, s, kend, O + d0); break;
        case 3: weighted_rows<T, 3>(vh + d0, g.Dp, s, kend, O + d0); break;
        case 2: weighted_rows<T, 2>(vh + d0, g.Dp, s, kend, O + d0); break;
        default: weighted_rows<T, 1>(vh + d0, g.Dp, s, kend, O + d0); break;
      }
    }
    // l == 0 only without keys: the output is 0 (an empty sum), L is -inf.
    const T inv = l > 0 ? T(A(1) / l) : T(0);
    T* orow = o + (bh * g.Tq + qi) * g.D;
    for (int64_t d = 0; d < g.D; ++d) orow[d] = O[d] * inv;
    lse[bh * g.Tq + qi] = l > 0 ? T(A(shift) + std::log(l)) : -inf;
  }
}

// Queries [q0, q0 + qv) of head bh.
template <class T>
void forward_block(const Geometry& g, const T* q, const Rows<T>& k, const Rows<T>& v, T* o, T* lse, int64_t bh,
                   int64_t q0, ForwardScratch<T>& sc) {
  using A = acc_t<T>;
  const T inf = std::numeric_limits<T>::infinity();
  const int64_t qv = std::min(Bq, g.Tq - q0), Mq = round_up(qv, MR);
  if (qv <= kRowQueries && !g.dropout) return forward_rows(g, q, k, v, o, lse, bh, q0, qv, sc);
  // The tile's columns in use: the block's queries in whole vectors (Bq unless this is a
  // short last block, e.g. the one query of a decoding step, 16 columns instead of 64).
  // Every column is computed on its own, so the queries' results do not depend on it.
  const int64_t Nq = std::min(Bq, round_up(qv, Vec<T>::width));
  const T* kh = k.data + bh * k.head_stride;
  const T* vh = v.data + bh * v.head_stride;
  T *Qt = sc.qt, *St = sc.st, *O = sc.o;
  T *m = sc.m, *alpha = sc.alpha, *shift = sc.shift, *colsum = sc.colsum;
  A* l = sc.l;
  transpose_rows(q + bh * g.Tq * g.D, q0, qv, Bq, g, T(g.scale), Qt);
  std::fill(O, O + Mq * g.Dp, T(0));
  std::fill(m, m + Nq, -inf);
  std::fill(l, l + Nq, A(0));

  // Causal: keys past this block's last query are masked for every query in it.
  const int64_t kend = g.causal ? std::min(g.Tk, q0 + qv) : g.Tk;
  for (int64_t k0 = 0; k0 < kend; k0 += Bk) {
    const int64_t kv = std::min(Bk, kend - k0);
    // St = K_blk (scale Q_blk)ᵀ: the scaled scores, keys down, queries across.
    tile_gemm<T>(round_up(kv, MR), Nq, g.D, kh + k0 * g.Dp, g.Dp, 1, Qt, Bq, St, Bq, false);
    // Causal: -inf where key k0 + j comes after query q0 + i (only tiles on the diagonal).
    if (g.causal && k0 + kv - 1 > q0)
      for (int64_t j = 0; j < kv; ++j)
        for (int64_t i = 0; i < Nq; ++i) St[j * Bq + i] = k0 + j > q0 + i ? -inf : St[j * Bq + i];

    // New running max per query; the old sums are worth exp(m_old - m_new) now (0 for the
    // first block, where m_old = -inf). A query that has seen only masked keys keeps
    // m = -inf; its exps are taken against 0 so that no -inf - -inf appears.
    for (int64_t i = 0; i < Nq; ++i) colsum[i] = m[i];
    for (int64_t j = 0; j < kv; ++j)
      for (int64_t i = 0; i < Nq; ++i) colsum[i] = St[j * Bq + i] > colsum[i] ? St[j * Bq + i] : colsum[i];
    for (int64_t i = 0; i < Nq; ++i) {
      shift[i] = colsum[i] == -inf ? T(0) : colsum[i];
      alpha[i] = exp_of(m[i] - shift[i]);
      m[i] = colsum[i];
      colsum[i] = 0;
    }
    // P = exp(S - m), and its sum per query over this block.
    for (int64_t j = 0; j < kv; ++j)
      for (int64_t i = 0; i < Nq; ++i) {
        St[j * Bq + i] = exp_of(St[j * Bq + i] - shift[i]);
        colsum[i] += St[j * Bq + i];
      }
    for (int64_t i = 0; i < Nq; ++i) l[i] = l[i] * A(alpha[i]) + A(colsum[i]);
    for (int64_t i = 0; i < qv; ++i)
      if (alpha[i] != T(1))
        for (int64_t d = 0; d < g.Dp; ++d) O[i * g.Dp + d] *= alpha[i];
    // The softmax denominator counts every key; the output only the kept ones.
    if (g.dropout)
      for (int64_t j = 0; j < kv; ++j) apply_dropout(g, bh, q0, k0 + j, St + j * Bq, St + j * Bq);
    // O += P V: A(i, j) = St[j][i], over the kv keys; when causal, query q0 + i needs
    // keys up to j = i + q0 - k0 only.
    const Band band = g.causal ? Band{-Band::kAll, q0 - k0} : Band{};
    tile_gemm<T>(Mq, g.Dp, kv, St, 1, Bq, vh + k0 * g.Dp, g.Dp, O, g.Dp, true, band);
  }

  T* oh = o + bh * g.Tq * g.D;
  T* lh = lse + bh * g.Tq;
  for (int64_t i = 0; i < qv; ++i) {
    // l == 0 only without keys (Tk == 0): the output is 0 (an empty sum), L is -inf.
    const T inv = l[i] > 0 ? T(A(1) / l[i]) : T(0);
    for (int64_t d = 0; d < g.D; ++d) oh[(q0 + i) * g.D + d] = O[i * g.Dp + d] * inv;
    lh[q0 + i] = l[i] > 0 ? T(A(m[i]) + std::log(l[i])) : -inf;
  }
}

// The forward of queries q against key and value rows laid out for the tile products:
// every head's query blocks shared out over the threads.
template <class T, class TK>
void forward_rows_of(const Tensor& q, const Rows<TK>& kr, const Rows<TK>& vr, const Tensor& out, const Tensor& lse,
                     const Geometry& g) {
  const T* qd = q.data_ptr<T>();
  T *od = out.data_ptr<T>(), *ld = lse.data_ptr<T>();
  const int64_t BH = g.B * g.H, nq = (g.Tq + Bq - 1) / Bq, items = BH * nq;
  // One thread when the whole call is small: about Tq Tk D multiply-adds per head, but at
  // least a vector of query columns (Nq in forward_block), so that a decoding step's one
  // query against a long cache (12 heads x 930 keys at GPT-2 124M: 0.45 ms on one thread)
  // is shared out too.
  const double work = double(BH) * double(std::max<int64_t>(g.Tq, Vec<T>::width)) * double(g.Tk) * double(g.D);
  const bool par = items > 1 && work >= 1e6 && !omp_in_parallel();
  // Dynamic: causal blocks further down cost more. The last query blocks of every head
  // come first, so the long items are not left to the end.
  parallel_for_with(
      items, par ? omp_get_max_threads() : 1, [&] { return ForwardScratch<T>(g); },
      [&](ForwardScratch<T>& sc, int64_t it) {
        const int64_t qb = nq - 1 - it / BH, bh = it % BH;
        if constexpr (std::is_same_v<T, TK>)
          forward_block(g, qd, kr, vr, od, ld, bh, qb * Bq, sc);
        else
          forward_rows(g, qd, kr, vr, od, ld, bh, 0, g.Tq, sc);
      },
      Schedule::Dynamic);
}

// The forward on T's; the keys and values T's too, or (TK bfloat16, T float32) autocast's
// bfloat16 ones: read in place by calls of at most kRowQueries queries without dropout
// (a decoding step's, which forward_rows takes whole), widened once into float32 rows
// (widened_rows) for forward_block otherwise.
template <class T, class TK = T>
void forward_typed(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                   const kernels::AttentionParams& p) {
  const Geometry g = geometry<T>(q, k, p);
  if constexpr (!std::is_same_v<T, TK>) {
    if (g.Tq > kRowQueries || g.dropout) {
      static_assert(std::is_same_v<T, float> && std::is_same_v<TK, bfloat16_t>, "widened rows: bfloat16 to float32");
      return forward_rows_of<T, T>(q, widened_rows(k, g, kKRows), widened_rows(v, g, kVRows), out, lse, g);
    }
  }
  forward_rows_of<T, TK>(q, key_rows<TK>(k, g, kKRows), key_rows<TK>(v, g, kVRows), out, lse, g);
}

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                       const kernels::AttentionParams& p) {
  if (q.dtype() == kBFloat16) {  // autocast's attention: in float32 (ops/cpu/widen.h); lse is float32
    // The keys and values are never copied whole to float32: a decoding step's (a query
    // or a few against a key-value cache) are read as they are, widened in registers; any
    // other call's are widened once into the float32 rows the tiles read. Either way the
    // sums of the float32 forward on the widened values.
    Tensor wide = wide_like(out);
    forward_typed<float, bfloat16_t>(widened(q), k, v, wide, lse, p);
    narrow_into(out, wide);
    return;
  }
  MU_DISPATCH_FLOAT(q.dtype(), "attention_forward", [&] { forward_typed<scalar_t>(q, k, v, out, lse, p); });
}

// ---------------------------------------------------------------- backward

// What every backward work item reads, prepared once per call.
template <class T>
struct BackwardInputs {
  Rows<T> q, k, v, dout;  // row layouts of Q, K, V, dO
  // Per head and query block, D x Bq: (scale Q_blk)ᵀ and dO_blkᵀ, zero past Tq. Block by
  // block, so that a tile product reads rows Bq apart (rows Tq apart would be 4 KB apart
  // at Tq = 1024 and fall into the same few L1 sets).
  T *qt, *dot;
  T *lse, *di;            // per head, Tq_pad: L (+inf past Tq, so P is 0 there) and Di
};

// Per-thread buffers of the backward (in the thread's workspace).
template <class T>
struct BackwardScratch {
  T *dk, *dv;  // the key block's dK and dV accumulators, Bk x Dp
  T *p, *pd;   // P and P with dropout applied, transposed: Bk x Bq
  T* ds;       // dP then dS, transposed: Bk x Bq
  T* dq;       // dQ accumulator for a whole head, Tq_pad x Dp
  explicit BackwardScratch(const Geometry& g)
      : dk(workspace<T>(kAccDK, Bk * g.Dp)), dv(workspace<T>(kAccDV, Bk * g.Dp)), p(workspace<T>(kTile, Bk * Bq)),
        pd(g.dropout ? workspace<T>(kTileP, Bk * Bq) : p), ds(workspace<T>(kTileDS, Bk * Bq)),
        dq(workspace<T>(kAccDQ, g.Tq_pad * g.Dp)) {}
};

// Key blocks kb = first, first + step, ... of head bh: their dK and dV are written to
// dk and dv, their dQ contributions summed into sc.dq (zeroed here).
template <class T>
void backward_keys(const Geometry& g, const BackwardInputs<T>& in, T* dk, T* dv, int64_t bh, int64_t first,
                   int64_t step, BackwardScratch<T>& sc) {
  const T* Qh = in.q.data + bh * in.q.head_stride;
  const T* Kh = in.k.data + bh * in.k.head_stride;
  const T* Vh = in.v.data + bh * in.v.head_stride;
  const T* dOh = in.dout.data + bh * in.dout.head_stride;
  const T* Qth = in.qt + bh * g.D * g.Tq_pad;
  const T* dOth = in.dot + bh * g.D * g.Tq_pad;
  const T* Lh = in.lse + bh * g.Tq_pad;
  const T* Dih = in.di + bh * g.Tq_pad;
  T* dkh = dk + bh * g.Tk * g.D;
  T* dvh = dv + bh * g.Tk * g.D;
  T *dK = sc.dk, *dV = sc.dv, *P = sc.p, *dS = sc.ds, *dQ = sc.dq;
  T* Pd = sc.pd;  // the probabilities as the output used them (P itself without dropout)
  std::fill(dQ, dQ + g.Tq_pad * g.Dp, T(0));

  const int64_t nk = (g.Tk + Bk - 1) / Bk;
  for (int64_t kb = first; kb < nk; kb += step) {
    const int64_t k0 = kb * Bk, kv = std::min(Bk, g.Tk - k0), Mk = round_up(kv, MR);
    std::fill(dK, dK + Mk * g.Dp, T(0));
    std::fill(dV, dV + Mk * g.Dp, T(0));

    // Causal: queries before k0 see none of these keys; start at the block holding k0.
    for (int64_t q0 = g.causal ? k0 / Bq * Bq : 0; q0 < g.Tq; q0 += Bq) {
      const int64_t qv = std::min(Bq, g.Tq - q0), Mq = round_up(qv, MR);
      // St = K_blk (scale Q_blk)ᵀ and dPt = V_blk dO_blkᵀ, both Mk x Bq.
      tile_gemm<T>(Mk, Bq, g.D, Kh + k0 * g.Dp, g.Dp, 1, Qth + q0 * g.D, Bq, P, Bq, false);
      tile_gemm<T>(Mk, Bq, g.D, Vh + k0 * g.Dp, g.Dp, 1, dOth + q0 * g.D, Bq, dS, Bq, false);

      const T* L = Lh + q0;
      const T* Di = Dih + q0;
      for (int64_t j = 0; j < Mk; ++j) {
        T *pr = P + j * Bq, *pdr = Pd + j * Bq, *dr = dS + j * Bq;
        // P = exp(S - L), 0 for padding keys and, when causal, for queries before key k0 + j.
        // (L is +inf past Tq, so padding queries get 0 too.)
        const int64_t first_q = g.causal ? k0 + j - q0 : 0;  // the first query i that sees key j
        if (j >= kv) {
          std::fill(pr, pr + Bq, T(0));
        } else {
          for (int64_t i = 0; i < Bq; ++i) pr[i] = i >= first_q ? exp_of(pr[i] - L[i]) : T(0);
        }
        if (g.dropout) {
          // dS = P ∘ (dP ∘ M / (1 - p) - Di) = Pd ∘ dP - P Di, with Pd = P ∘ M / (1 - p).
          apply_dropout(g, bh, q0, k0 + j, pr, pdr);
          for (int64_t i = 0; i < Bq; ++i) dr[i] = pdr[i] * dr[i] - pr[i] * Di[i];
        } else {
          for (int64_t i = 0; i < Bq; ++i) dr[i] = pr[i] * (dr[i] - Di[i]);
        }
      }
      // When causal, key k0 + j is seen from query i = j + k0 - q0 on, and query q0 + i
      // sees keys up to j = i + q0 - k0: the bands of the three products below.
      const Band from_query = g.causal ? Band{k0 - q0, Band::kAll} : Band{};
      const Band to_key = g.causal ? Band{-Band::kAll, q0 - k0} : Band{};
      // dV += Pd dO and dK += dSt Q (scaled at the end): Mk x Dp over the qv queries.
      tile_gemm<T>(Mk, g.Dp, qv, Pd, Bq, 1, dOh + q0 * g.Dp, g.Dp, dV, g.Dp, true, from_query);
      tile_gemm<T>(Mk, g.Dp, qv, dS, Bq, 1, Qh + q0 * g.Dp, g.Dp, dK, g.Dp, true, from_query);
      // dQ += dS K (scaled at the end): A(i, j) = dSt[j][i], over the kv keys. Rows past
      // qv add zeros into the accumulator's padding rows.
      tile_gemm<T>(Mq, g.Dp, kv, dS, 1, Bq, Kh + k0 * g.Dp, g.Dp, dQ + q0 * g.Dp, g.Dp, true, to_key);
    }
    for (int64_t j = 0; j < kv; ++j)
      for (int64_t d = 0; d < g.D; ++d) {
        dkh[(k0 + j) * g.D + d] = dK[j * g.Dp + d] * T(g.scale);
        dvh[(k0 + j) * g.D + d] = dV[j * g.Dp + d];
      }
  }
}

template <class T>
void backward_typed(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                    const Tensor& grad_out, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                    const kernels::AttentionParams& p) {
  const Geometry g = geometry<T>(q, k, p);
  const int64_t BH = g.B * g.H, nk = (g.Tk + Bk - 1) / Bk;
  T *dqd = dq.data_ptr<T>(), *dkd = dk.data_ptr<T>(), *dvd = dv.data_ptr<T>();
  if (BH == 0) return;  // no heads: every gradient is empty
  if (nk == 0) {  // Tk == 0: no key reaches dQ (and dK, dV are empty)
    std::fill(dqd, dqd + dq.numel(), T(0));
    return;
  }
  const bool par = BH * nk > 1 && double(BH) * double(g.Tq) * double(g.Tk) * double(g.D) >= 1e6 && !omp_in_parallel();

  const T *qd = q.data_ptr<T>(), *od = out.data_ptr<T>(), *gd = grad_out.data_ptr<T>(), *ld = lse.data_ptr<T>();
  BackwardInputs<T> in;
  in.q = make_rows(qd, g, g.Tq, kQRows);
  in.k = make_rows(k.data_ptr<T>(), g, g.Tk, kKRows);
  in.v = make_rows(v.data_ptr<T>(), g, g.Tk, kVRows);
  in.dout = make_rows(gd, g, g.Tq, kDORows);
  in.qt = workspace<T>(kQt, BH * g.D * g.Tq_pad);
  in.dot = workspace<T>(kDOt, BH * g.D * g.Tq_pad);
  in.lse = workspace<T>(kLse, BH * g.Tq_pad);
  in.di = workspace<T>(kDi, BH * g.Tq_pad);
  parallel_for_if(BH, par, [&](int64_t bh) {
    const int64_t off = bh * g.Tq * g.D;
    for (int64_t q0 = 0; q0 < g.Tq; q0 += Bq) {  // block q0 / Bq starts at (bh Tq_pad + q0) D
      const int64_t qv = std::min(Bq, g.Tq - q0), at = (bh * g.Tq_pad + q0) * g.D;
      transpose_rows(qd + off, q0, qv, Bq, g, T(g.scale), in.qt + at);
      transpose_rows(gd + off, q0, qv, Bq, g, T(1), in.dot + at);
    }
    T* L = in.lse + bh * g.Tq_pad;
    T* Di = in.di + bh * g.Tq_pad;
    for (int64_t i = 0; i < g.Tq_pad; ++i) {
      if (i >= g.Tq) {
        L[i] = std::numeric_limits<T>::infinity();
        Di[i] = 0;
        continue;
      }
      L[i] = ld[bh * g.Tq + i];
      Di[i] = dot(gd + off + i * g.D, od + off + i * g.D, g.D);  // dO_i · O_i
    }
  });

  // Heads run whole on one thread each when there are enough of them; else each head's
  // key blocks are dealt round-robin to `split` work items (even causal loads), each with
  // its own dQ partial sum.
  const int threads = par ? omp_get_max_threads() : 1;
  const int64_t split = std::clamp<int64_t>((threads + BH - 1) / BH, 1, nk);
  const int64_t per_head = g.Tq * g.D, items = BH * split;
  T* partial = split > 1 ? workspace<T>(kPartial, items * per_head) : nullptr;
  parallel_for_with(
      items, threads, [&] { return BackwardScratch<T>(g); },
      [&](BackwardScratch<T>& sc, int64_t it) {
        const int64_t bh = it / split, part = it % split;
        backward_keys(g, in, dkd, dvd, bh, part, split, sc);
        // The head's dQ (scaled), or this item's share of it.
        T* dst = split == 1 ? dqd + bh * per_head : partial + it * per_head;
        for (int64_t i = 0; i < g.Tq; ++i)
          for (int64_t d = 0; d < g.D; ++d) dst[i * g.D + d] = sc.dq[i * g.Dp + d] * T(g.scale);
      },
      Schedule::Dynamic);
  if (split > 1) {
    parallel_for_if(BH * per_head, par, [&](int64_t e) {
      const int64_t bh = e / per_head, r = e % per_head;
      T s = 0;
      for (int64_t part = 0; part < split; ++part) s += partial[(bh * split + part) * per_head + r];
      dqd[e] = s;
    });
  }
}

void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                        const Tensor& grad_out, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                        const kernels::AttentionParams& p) {
  if (q.dtype() == kBFloat16) {
    Tensor wq = wide_like(dq), wk = wide_like(dk), wv = wide_like(dv);
    attention_backward(widened(q), widened(k), widened(v), widened(out), lse, widened(grad_out), wq, wk, wv, p);
    narrow_into(dq, wq);
    narrow_into(dk, wk);
    narrow_into(dv, wv);
    return;
  }
  MU_DISPATCH_FLOAT(q.dtype(), "attention_backward",
                    [&] { backward_typed<scalar_t>(q, k, v, out, lse, grad_out, dq, dk, dv, p); });
}

}  // namespace

MU_REGISTER_KERNEL(kernels::attention_forward, DeviceType::CPU, attention_forward);
MU_REGISTER_KERNEL(kernels::attention_backward, DeviceType::CPU, attention_backward);

}  // namespace mu::cpu
