// CPU kernels of fused scaled dot-product attention (declared in ops/kernels/attention.h).
//
// Forward (flash-attention style): for each (b, h) and block of Bq query rows, walk the
// keys in blocks of Bk. For each block, the score tile S = Q Kᵀ (Bq x Bk) is computed, and
// each row keeps a running max m and running sum l of exp(scale s - m): when a block
// raises the max, what was summed so far (l and the output accumulator) is rescaled by
// exp(m_old - m_new). So a thread holds one Bq x Bk tile and a few Bq x D blocks, never a
// T x T matrix. Only out and the row log-sum-exp L = m + log l are kept for backward.
//
// Backward recomputes P = exp(scale S - L) tile by tile and applies the standard rules,
// with Di = rowsum(dO ∘ O):
//   dV += Pᵀ dO,  dP = dO Vᵀ,  dS = P ∘ (dP - Di),  dQ += scale dS K,  dK += scale dSᵀ Q.
// (With dropout, O uses P ∘ M / (1 - p): dV takes that product, dP is multiplied by
// M / (1 - p) before dS, and Di = rowsum(dO ∘ O) still equals rowsum(P ∘ dP).)
// It walks key blocks on the outside, so a key block's dK and dV stay in a local tile;
// dQ gathers contributions from every key block, so one head's key blocks run on one
// thread, or, when there are fewer heads than threads, are split over threads that each
// sum into their own dQ copy, added up at the end: no two threads write one value.
//
// Every product of tiles is the small matrix product tile_gemm, written with GCC vector
// extensions (as ops/cpu/gemm.cpp): it keeps a 4-row strip of C in vector registers over
// the whole depth, so every inner step is one load of a B row and fused multiply-adds.
// Tiles are padded with zeros so that their column counts are whole vectors.
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "ops/cpu/loops.h"
#include "ops/kernels/attention.h"

namespace mu::cpu {
namespace {

// ---------------------------------------------------------------- vectors

// The widest vector the target has; AVX-512 also has 32 registers instead of 16.
#if defined(__AVX512F__)
constexpr int kVecBytes = 64;
constexpr int kVecRegs = 32;
#elif defined(__AVX__)
constexpr int kVecBytes = 32;
constexpr int kVecRegs = 16;
#else
constexpr int kVecBytes = 16;
constexpr int kVecRegs = 16;
#endif

template <class T>
struct Vec {
  typedef T type __attribute__((vector_size(kVecBytes)));
  static constexpr int width = kVecBytes / int(sizeof(T));
};

template <class T>
inline typename Vec<T>::type load(const T* p) {
  typename Vec<T>::type v;
  std::memcpy(&v, p, sizeof(v));  // any alignment
  return v;
}
template <class T>
inline void store(T* p, typename Vec<T>::type v) {
  std::memcpy(p, &v, sizeof(v));
}

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
    for (int n = 0; n < NV; ++n) bv[n] = load(b + p * ldb + n * W);
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

// C (M x N) = or += A (M x K) · B (K x N), A element (i, p) at a[i * ars + p * acs], B and
// C row-major with row strides ldb and ldc. M must be a multiple of MR and N of the
// vector width (the callers pad their tiles). K == 0 writes zeros (or adds nothing).
template <class T>
void tile_gemm(int64_t M, int64_t N, int64_t K, const T* a, int64_t ars, int64_t acs, const T* b, int64_t ldb, T* c,
               int64_t ldc, bool accumulate) {
  constexpr int W = Vec<T>::width;
  for (int64_t i = 0; i < M; i += MR) {
    const T* ai = a + i * ars;
    T* ci = c + i * ldc;
    int64_t n = 0;
    for (; n + kMainNV * W <= N; n += kMainNV * W) strip<T, kMainNV>(K, ai, ars, acs, b + n, ldb, ci + n, ldc, accumulate);
    for (; n < N; n += W) strip<T, 1>(K, ai, ars, acs, b + n, ldb, ci + n, ldc, accumulate);
  }
}

// ---------------------------------------------------------------- exp

// e^x for float in plain arithmetic, so that a loop of it vectorises: x = n ln2 + r with
// |r| <= ln2 / 2, e^r from its Taylor series to r^7 (truncation below 6e-9 relative,
// under float's rounding), times 2^n written straight into the exponent bits. Meant for
// x <= 88 (attention only takes x <= 0: a score minus its row's max); 0 below -87, where
// 2^n would leave the normal range; NaN stays NaN.
inline float exp_approx(float x) {
  constexpr float kShift = 0x1.8p23f;                   // adding it rounds to an integer
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;                // ln 2 in 9 bits: n * kLn2Hi is exact
  constexpr float kLn2Lo = -2.12194440054690583e-4f;    // ln 2 - kLn2Hi
  float xc = x > 88.0f ? 88.0f : x;
  float t = xc * kLog2e + kShift;                       // n in the low mantissa bits of t
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

// Block sizes: Bq query rows against Bk keys. Both multiples of MR, and Bk a whole number
// of vectors. 64 x 64 keeps a tile's operands (4 blocks of 64 x D floats and the score
// tile) within L2 and makes each strip's depth long enough to pay for its loads and stores.
constexpr int64_t Bq = 64;
constexpr int64_t Bk = 64;

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

struct Geometry {
  int64_t B, H, Tq, Tk, D;
  int64_t Dp;  // D rounded up to whole vectors: the row stride of the padded blocks
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
  g.scale = p.scale;
  g.causal = p.causal;
  g.dropout = p.dropout_p > 0;
  g.key = kernels::attention_dropout_key(p.seed);
  g.threshold = kernels::attention_dropout_threshold(p.dropout_p);
  g.keep_scale = p.dropout_p < 1 ? 1 / (1 - p.dropout_p) : 0;
  return g;
}

// Keys [0, n) of key block k0 that query row qi sees: all valid keys, or for causal
// masking those with j <= qi (possibly none).
inline int64_t keys_seen(const Geometry& g, int64_t qi, int64_t k0, int64_t kv) {
  if (!g.causal) return kv;
  return std::clamp<int64_t>(qi - k0 + 1, 0, kv);
}

// Multiplies row[j] (j < n) of query row qi (in head bh), keys from k0, by its dropout
// factor: 0 when dropped, 1 / (1 - p) when kept.
template <class T>
inline void apply_dropout(const Geometry& g, int64_t bh, int64_t qi, int64_t k0, int64_t n, const T* in, T* out) {
  const uint64_t base = uint64_t((bh * g.Tq + qi) * g.Tk + k0);  // the counter of (qi, k0)
  const T keep = T(g.keep_scale);
  for (int64_t j = 0; j < n; ++j) {
    bool kept = kernels::attention_dropout_bits(g.key, base + uint64_t(j)) >= g.threshold;
    out[j] = kept ? in[j] * keep : T(0);
  }
}

// Copies rows [r0, r0 + rows) of a (T x D) head into a (pad_rows x Dp) block, zeros
// everywhere else (columns past D, rows past `rows`).
template <class T>
void load_rows(const T* src, int64_t r0, int64_t rows, int64_t pad_rows, const Geometry& g, T* dst) {
  for (int64_t r = 0; r < pad_rows; ++r) {
    T* d = dst + r * g.Dp;
    if (r < rows) {
      std::memcpy(d, src + (r0 + r) * g.D, size_t(g.D) * sizeof(T));
      std::fill(d + g.D, d + g.Dp, T(0));
    } else {
      std::fill(d, d + g.Dp, T(0));
    }
  }
}

// Copies rows [r0, r0 + rows) of a (T x D) head, transposed, into a (D x Bk) block:
// dst[d * Bk + j] = src[(r0 + j) * D + d], zeros for j >= rows.
template <class T>
void load_transposed(const T* src, int64_t r0, int64_t rows, const Geometry& g, T* dst) {
  for (int64_t d = 0; d < g.D; ++d) std::fill(dst + d * Bk + rows, dst + (d + 1) * Bk, T(0));
  for (int64_t j = 0; j < rows; ++j) {
    const T* s = src + (r0 + j) * g.D;
    for (int64_t d = 0; d < g.D; ++d) dst[d * Bk + j] = s[d];
  }
}

// Largest and sum of a Bk-long row, in W independent lanes so that the loops vectorise
// (a single running max or float sum would be one serial chain).
template <class T>
inline T row_max(const T* x) {
  constexpr int W = Vec<T>::width;
  T lane[W];
  for (int w = 0; w < W; ++w) lane[w] = x[w];
  for (int64_t j = W; j < Bk; j += W)
    for (int w = 0; w < W; ++w) lane[w] = x[j + w] > lane[w] ? x[j + w] : lane[w];
  T m = lane[0];
  for (int w = 1; w < W; ++w) m = lane[w] > m ? lane[w] : m;
  return m;
}
template <class T>
inline T row_sum(const T* x) {
  constexpr int W = Vec<T>::width;
  T lane[W] = {};
  for (int64_t j = 0; j < Bk; j += W)
    for (int w = 0; w < W; ++w) lane[w] += x[j + w];
  T s = 0;
  for (int w = 0; w < W; ++w) s += lane[w];
  return s;
}

// ---------------------------------------------------------------- forward

// Per-thread buffers of the forward.
template <class T>
struct ForwardScratch {
  std::vector<T> q, kt, v, s, o;  // Q block, Kᵀ block, V block, score tile, output accumulator
  std::vector<T> m;               // running max per row (scaled-score units)
  std::vector<acc_t<T>> l;        // running sum per row, summed in double for float32
  explicit ForwardScratch(const Geometry& g)
      : q(size_t(Bq * g.Dp)), kt(size_t(std::max<int64_t>(g.D, 1) * Bk)), v(size_t(Bk * g.Dp)), s(size_t(Bq * Bk)),
        o(size_t(Bq * g.Dp)), m(size_t(Bq)), l(size_t(Bq)) {}
};

// Rows [q0, q0 + qv) of head bh.
template <class T>
void forward_block(const Geometry& g, const T* q, const T* k, const T* v, T* o, T* lse, int64_t bh, int64_t q0,
                   ForwardScratch<T>& sc) {
  using A = acc_t<T>;
  const T inf = std::numeric_limits<T>::infinity();
  const int64_t qv = std::min(Bq, g.Tq - q0), Mq = round_up(qv, MR);
  const T* qh = q + bh * g.Tq * g.D;
  const T* kh = k + bh * g.Tk * g.D;
  const T* vh = v + bh * g.Tk * g.D;
  T *Q = sc.q.data(), *Kt = sc.kt.data(), *V = sc.v.data(), *S = sc.s.data(), *O = sc.o.data();
  load_rows(qh, q0, qv, Mq, g, Q);
  std::fill(O, O + Mq * g.Dp, T(0));
  std::fill(sc.m.begin(), sc.m.end(), -inf);
  std::fill(sc.l.begin(), sc.l.end(), A(0));

  // Causal: keys past this block's last row are masked for every row in it.
  const int64_t kend = g.causal ? std::min(g.Tk, q0 + qv) : g.Tk;
  for (int64_t k0 = 0; k0 < kend; k0 += Bk) {
    const int64_t kv = std::min(Bk, kend - k0);
    load_transposed(kh, k0, kv, g, Kt);
    load_rows(vh, k0, kv, kv, g, V);
    // S = Q Kᵀ: raw scores, Mq x Bk (columns past kv are 0 and masked below).
    tile_gemm<T>(Mq, Bk, g.D, Q, g.Dp, 1, Kt, Bk, S, Bk, false);

    for (int64_t i = 0; i < qv; ++i) {
      T* row = S + i * Bk;
      const int64_t n = keys_seen(g, q0 + i, k0, kv);
      if (n == 0) {  // a causal row before this key block: it sees none of it
        std::fill(row, row + Bk, T(0));
        continue;
      }
      // Scale, mask (-inf past n, so that exp gives 0), and the new running max.
      const T sc_ = T(g.scale);
      for (int64_t j = 0; j < Bk; ++j) row[j] = j < n ? row[j] * sc_ : -inf;
      const T m_old = sc.m[size_t(i)], m_new = std::max(m_old, row_max(row));
      for (int64_t j = 0; j < Bk; ++j) row[j] = exp_of(row[j] - m_new);
      // What was summed under the old max is worth exp(m_old - m_new) now (0 for the
      // first block, whose m_old is -inf).
      const T alpha = T(std::exp(A(m_old) - A(m_new)));
      sc.l[size_t(i)] = sc.l[size_t(i)] * A(alpha) + A(row_sum(row));
      sc.m[size_t(i)] = m_new;
      if (alpha != T(1)) {
        T* orow = O + i * g.Dp;
        for (int64_t d = 0; d < g.Dp; ++d) orow[d] *= alpha;
      }
      // The softmax denominator counts every key; the output only the kept ones.
      if (g.dropout) apply_dropout(g, bh, q0 + i, k0, n, row, row);
    }
    // O += P V over the kv keys (rows past qv of S hold zero scores times zero Q rows,
    // and their output rows are never written out).
    tile_gemm<T>(Mq, g.Dp, kv, S, Bk, 1, V, g.Dp, O, g.Dp, true);
  }

  T* oh = o + bh * g.Tq * g.D;
  T* lh = lse + bh * g.Tq;
  for (int64_t i = 0; i < qv; ++i) {
    const A l = sc.l[size_t(i)];
    // l == 0 only without keys (Tk == 0): the output is 0 (an empty sum), L is -inf.
    const T inv = l > 0 ? T(A(1) / l) : T(0);
    for (int64_t d = 0; d < g.D; ++d) oh[(q0 + i) * g.D + d] = O[i * g.Dp + d] * inv;
    lh[q0 + i] = l > 0 ? T(A(sc.m[size_t(i)]) + std::log(l)) : -inf;
  }
}

template <class T>
void forward_typed(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                   const kernels::AttentionParams& p) {
  const Geometry g = geometry<T>(q, k, p);
  const T *qd = q.data_ptr<T>(), *kd = k.data_ptr<T>(), *vd = v.data_ptr<T>();
  T *od = out.data_ptr<T>(), *ld = lse.data_ptr<T>();
  const int64_t BH = g.B * g.H, nq = (g.Tq + Bq - 1) / Bq, items = BH * nq;
  // About 4 Bq x Tk x D multiply-adds per item; one thread when the whole call is small.
  const bool par = items > 1 && double(items) * double(Bq) * double(g.Tk) * double(g.D) >= 1e6 && !omp_in_parallel();
#pragma omp parallel if (par)
  {
    ForwardScratch<T> sc(g);
    // Dynamic: causal blocks further down cost more. The last query blocks of every head
    // come first, so the long items are not left to the end.
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < items; ++it) {
      const int64_t qb = nq - 1 - it / BH, bh = it % BH;
      forward_block(g, qd, kd, vd, od, ld, bh, qb * Bq, sc);
    }
  }
}

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                       const kernels::AttentionParams& p) {
  MU_DISPATCH_FLOAT(q.dtype(), "attention_forward", [&] { forward_typed<scalar_t>(q, k, v, out, lse, p); });
}

// ---------------------------------------------------------------- backward

// Per-thread buffers of the backward.
template <class T>
struct BackwardScratch {
  std::vector<T> kt, kb, vt;   // Kᵀ, K and Vᵀ of the key block
  std::vector<T> dk, dv;       // the key block's dK and dV accumulators
  std::vector<T> q, dout;      // Q and dO of the query block
  std::vector<T> p, pd, ds;    // P, P with dropout applied, dP then dS
  std::vector<T> dq;           // dQ accumulator for a whole head, Tq rows (padded) x Dp
  std::vector<T> di;           // Di = rowsum(dO ∘ O) for a whole head
  BackwardScratch(const Geometry& g, int64_t tq_pad)
      : kt(size_t(std::max<int64_t>(g.D, 1) * Bk)), kb(size_t(Bk * g.Dp)), vt(kt.size()), dk(size_t(Bk * g.Dp)),
        dv(size_t(Bk * g.Dp)), q(size_t(Bq * g.Dp)), dout(size_t(Bq * g.Dp)), p(size_t(Bq * Bk)),
        pd(g.dropout ? size_t(Bq * Bk) : 0), ds(size_t(Bq * Bk)), dq(size_t(tq_pad * g.Dp)), di(size_t(g.Tq)) {}
};

struct BackwardTensors {
  const void *q, *k, *v, *o, *lse, *dout;
  void *dq, *dk, *dv;
};

// Key blocks kb = first, first + step, ... of head bh; their dK and dV are written out,
// their dQ contributions summed into sc.dq (zeroed here).
template <class T>
void backward_keys(const Geometry& g, const BackwardTensors& t, int64_t bh, int64_t first, int64_t step,
                   BackwardScratch<T>& sc) {
  const int64_t hq = bh * g.Tq * g.D, hk = bh * g.Tk * g.D;
  const T* qh = static_cast<const T*>(t.q) + hq;
  const T* oh = static_cast<const T*>(t.o) + hq;
  const T* gh = static_cast<const T*>(t.dout) + hq;
  const T* lh = static_cast<const T*>(t.lse) + bh * g.Tq;
  const T* kh = static_cast<const T*>(t.k) + hk;
  const T* vh = static_cast<const T*>(t.v) + hk;
  T* dkh = static_cast<T*>(t.dk) + hk;
  T* dvh = static_cast<T*>(t.dv) + hk;
  T *Kt = sc.kt.data(), *K = sc.kb.data(), *Vt = sc.vt.data(), *dK = sc.dk.data(), *dV = sc.dv.data();
  T *Q = sc.q.data(), *dO = sc.dout.data(), *P = sc.p.data(), *dS = sc.ds.data(), *dQ = sc.dq.data();
  T* Pd = g.dropout ? sc.pd.data() : P;  // the probabilities as the output used them
  const T sc_ = T(g.scale);

  std::fill(sc.dq.begin(), sc.dq.end(), T(0));
  // Di = dO_i · O_i, once per head.
  for (int64_t i = 0; i < g.Tq; ++i) {
    acc_t<T> s = 0;
    for (int64_t d = 0; d < g.D; ++d) s += acc_t<T>(gh[i * g.D + d]) * acc_t<T>(oh[i * g.D + d]);
    sc.di[size_t(i)] = T(s);
  }

  const int64_t nk = (g.Tk + Bk - 1) / Bk;
  for (int64_t kb = first; kb < nk; kb += step) {
    const int64_t k0 = kb * Bk, kv = std::min(Bk, g.Tk - k0), Mk = round_up(kv, MR);
    load_transposed(kh, k0, kv, g, Kt);
    load_transposed(vh, k0, kv, g, Vt);
    load_rows(kh, k0, kv, Mk, g, K);
    std::fill(dK, dK + Mk * g.Dp, T(0));
    std::fill(dV, dV + Mk * g.Dp, T(0));

    // Causal: rows before k0 see none of these keys; start at the query block holding k0.
    for (int64_t q0 = g.causal ? k0 / Bq * Bq : 0; q0 < g.Tq; q0 += Bq) {
      const int64_t qv = std::min(Bq, g.Tq - q0), Mq = round_up(qv, MR);
      load_rows(qh, q0, qv, Mq, g, Q);
      load_rows(gh, q0, qv, Mq, g, dO);
      // P's raw scores S = Q Kᵀ, and dP = dO Vᵀ, both Mq x Bk.
      tile_gemm<T>(Mq, Bk, g.D, Q, g.Dp, 1, Kt, Bk, P, Bk, false);
      tile_gemm<T>(Mq, Bk, g.D, dO, g.Dp, 1, Vt, Bk, dS, Bk, false);

      for (int64_t i = 0; i < Mq; ++i) {
        T *prow = P + i * Bk, *pdrow = Pd + i * Bk, *drow = dS + i * Bk;
        const int64_t n = i < qv ? keys_seen(g, q0 + i, k0, kv) : 0;  // padding rows see nothing
        if (n == 0) {
          std::fill(prow, prow + Bk, T(0));
          std::fill(pdrow, pdrow + Bk, T(0));
          std::fill(drow, drow + Bk, T(0));
          continue;
        }
        // P = exp(scale S - L), 0 where masked.
        const T L = lh[q0 + i], Di = sc.di[size_t(q0 + i)];
        for (int64_t j = 0; j < Bk; ++j) prow[j] = j < n ? exp_of(prow[j] * sc_ - L) : T(0);
        if (g.dropout) {
          // dS = P ∘ (dP ∘ M / (1 - p) - Di) = Pd ∘ dP - P Di, Pd = P ∘ M / (1 - p).
          apply_dropout(g, bh, q0 + i, k0, Bk, prow, pdrow);
          for (int64_t j = 0; j < Bk; ++j) drow[j] = pdrow[j] * drow[j] - prow[j] * Di;
        } else {
          for (int64_t j = 0; j < Bk; ++j) drow[j] = prow[j] * (drow[j] - Di);
        }
      }
      // dV += Pdᵀ dO: A(r, p) = Pd[p][r], over the qv query rows.
      tile_gemm<T>(Mk, g.Dp, qv, Pd, 1, Bk, dO, g.Dp, dV, g.Dp, true);
      // dK += dSᵀ Q (scaled at the end).
      tile_gemm<T>(Mk, g.Dp, qv, dS, 1, Bk, Q, g.Dp, dK, g.Dp, true);
      // dQ += dS K over the kv keys (scaled at the end); rows past qv add zeros into the
      // padding rows of the accumulator.
      tile_gemm<T>(Mq, g.Dp, kv, dS, Bk, 1, K, g.Dp, dQ + q0 * g.Dp, g.Dp, true);
    }
    for (int64_t j = 0; j < kv; ++j)
      for (int64_t d = 0; d < g.D; ++d) {
        dkh[(k0 + j) * g.D + d] = dK[j * g.Dp + d] * sc_;
        dvh[(k0 + j) * g.D + d] = dV[j * g.Dp + d];
      }
  }
}

template <class T>
void backward_typed(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                    const Tensor& grad_out, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                    const kernels::AttentionParams& p) {
  const Geometry g = geometry<T>(q, k, p);
  const BackwardTensors t{q.data_ptr<T>(),  k.data_ptr<T>(),  v.data_ptr<T>(), out.data_ptr<T>(), lse.data_ptr<T>(),
                          grad_out.data_ptr<T>(), dq.data_ptr<T>(), dk.data_ptr<T>(), dv.data_ptr<T>()};
  T* dqd = dq.data_ptr<T>();
  const int64_t BH = g.B * g.H, nk = (g.Tk + Bk - 1) / Bk, tq_pad = round_up(g.Tq, Bq);
  const bool par = BH * nk > 1 && double(BH) * double(g.Tq) * double(g.Tk) * double(g.D) >= 1e6 && !omp_in_parallel();
  const int threads = par ? omp_get_max_threads() : 1;
  // Heads run whole on one thread each when there are enough of them; else each head's
  // key blocks are dealt round-robin to `split` work items (even causal loads), each with
  // its own dQ partial sum.
  const int64_t split = std::clamp<int64_t>((threads + BH - 1) / BH, 1, std::max<int64_t>(nk, 1));
  std::vector<T> partial(split > 1 ? size_t(BH * split * g.Tq * g.D) : 0);
  const int64_t items = BH * split;
  if (dq.numel() > 0 && nk == 0) std::fill(dqd, dqd + dq.numel(), T(0));  // Tk == 0: no key reaches dQ
#pragma omp parallel if (par)
  {
    BackwardScratch<T> sc(g, tq_pad);
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < items; ++it) {
      const int64_t bh = it / split, part = it % split;
      if (nk == 0) continue;
      backward_keys(g, t, bh, part, split, sc);
      // The head's dQ (scaled), or this item's share of it.
      T* dst = split == 1 ? dqd + bh * g.Tq * g.D : partial.data() + it * g.Tq * g.D;
      for (int64_t i = 0; i < g.Tq; ++i)
        for (int64_t d = 0; d < g.D; ++d) dst[i * g.D + d] = sc.dq[size_t(i * g.Dp + d)] * T(g.scale);
    }
  }
  if (split > 1 && nk > 0) {
    const int64_t per_head = g.Tq * g.D;
#pragma omp parallel for if (par) schedule(static)
    for (int64_t e = 0; e < BH * per_head; ++e) {
      const int64_t bh = e / per_head, r = e % per_head;
      T s = 0;
      for (int64_t part = 0; part < split; ++part) s += partial[size_t((bh * split + part) * per_head + r)];
      dqd[e] = s;
    }
  }
}

void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                        const Tensor& grad_out, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                        const kernels::AttentionParams& p) {
  MU_DISPATCH_FLOAT(q.dtype(), "attention_backward",
                    [&] { backward_typed<scalar_t>(q, k, v, out, lse, grad_out, dq, dk, dv, p); });
}

}  // namespace

MU_REGISTER_KERNEL(kernels::attention_forward, DeviceType::CPU, attention_forward);
MU_REGISTER_KERNEL(kernels::attention_backward, DeviceType::CPU, attention_backward);

}  // namespace mu::cpu
