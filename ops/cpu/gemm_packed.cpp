// The CPU GEMM's packed path (the Goto/BLIS scheme; gemm_parts.h says who calls it). C is
// computed in blocks of NC columns x KC depth x MC rows sized so that the operands stay in
// cache; each block of A and B is first copied ("packed") into a dense buffer in the exact
// order the micro-kernel reads it, so the inner loop streams aligned memory whatever the
// original strides were; the micro-kernel keeps an MR x NR tile of C in vector registers
// for the whole depth KC. Products whose depth dwarfs their output are cut along the depth
// instead (gemm_deep).
#include <omp.h>

#include <algorithm>
#include <vector>

#include "ops/cpu/gemm.h"
#include "ops/cpu/gemm_parts.h"
#include "ops/cpu/parallel.h"
#include "tensor/error.h"

namespace mu::cpu::gemm_detail {
namespace {

template <class T>
struct Tile {
  static constexpr int NV = 2;                         // vectors per row of the C tile
  static constexpr int NR = NV * Vec<T>::width;        // tile columns: 32 floats on AVX-512
  // Tile rows: MR * NV accumulators + NV vectors of B + 1 broadcast of A must fit in
  // the register file (12*2 + 2 + 1 = 27 of 32; 6*2 + 2 + 1 = 15 of 16).
  static constexpr int MR = kVecRegs == 32 ? 12 : 6;
  // Cache blocking: an MC x KC block of packed A (384 KB) stays in L2 while the KC x NR
  // panels of packed B stream past it; a KC x NC block of packed B (8 MB at most) stays
  // in L3. A deep KC makes each load and store of the C tile pay for more multiplies;
  // measured on Zen 4, 1024^3: KC = 192 gives 197 GFLOP/s, 256 204, 512 209, 1024 210.
  static constexpr int64_t KC = 512 * 4 / int64_t(sizeof(T));  // 512 floats, 256 doubles
  static constexpr int64_t MC = MR * 16;
  static constexpr int64_t NC = NR * 128;
};

// ---------------------------------------------------------------- packing

// Copies rows [0, m) x depth [0, kc) of A (element (i, p) at a[i * rs + p * cs]) into
// MR-row panels: panel r holds, for each p, the MR values A[r*MR .. r*MR+MR-1][p] side by
// side, which is the order the micro-kernel broadcasts them. The last panel is padded
// with zeros so the kernel never needs a shorter tile. A of bfloat16 values (S) is
// widened to float32 (T) as it is copied, exactly.
template <class T, class S = T>
void pack_a(int64_t m, int64_t kc, const S* a, int64_t rs, int64_t cs, T* dst) {
  constexpr int MR = Tile<T>::MR;
  for (int64_t i0 = 0; i0 < m; i0 += MR, dst += MR * kc) {
    const int64_t mr = std::min<int64_t>(MR, m - i0);
    const S* src = a + i0 * rs;
    if (mr == MR && cs == 1) {
      // Row-major A: read each row sequentially (MR streams), write one panel line per p.
      for (int64_t p = 0; p < kc; ++p)
        for (int i = 0; i < MR; ++i) dst[p * MR + i] = T(src[i * rs + p]);
    } else if (mr == MR && rs == 1 && std::is_same_v<S, T>) {
      // Transposed A: the MR values of one p are adjacent in memory already. A copy of
      // constant size is a few vector moves; as a loop, GCC vectorised it across p with
      // one insert per element (a quarter of a weight gradient's time went here).
      for (int64_t p = 0; p < kc; ++p) __builtin_memcpy(dst + p * MR, src + p * cs, MR * sizeof(T));
    } else if (rs == 1 && std::is_same_v<S, T>) {
      // A last, partial panel of a transposed A: the mr values, then zeros.
      for (int64_t p = 0; p < kc; ++p) copy_padded<MR>(dst + p * MR, reinterpret_cast<const T*>(src) + p * cs, mr);
    } else {
      for (int64_t p = 0; p < kc; ++p) {
        for (int64_t i = 0; i < mr; ++i) dst[p * MR + i] = T(src[i * rs + p * cs]);
        for (int64_t i = mr; i < MR; ++i) dst[p * MR + i] = T(0);
      }
    }
  }
}

// Copies depth [0, kc) x columns [j0, j0 + NR) of B (element (p, j) at b[p * rs + j * cs])
// into one NR-column panel, row p of the panel being NR consecutive values; columns at or
// past n are zero. B of bfloat16 values (S) is widened to float32 (T) as it is copied,
// a vector at a time where its lines are contiguous (load_as).
template <class T, class S = T>
void pack_b_panel(int64_t kc, int64_t nr, const S* b, int64_t rs, int64_t cs, T* dst) {
  constexpr int NR = Tile<T>::NR, W = Vec<T>::width;
  if (nr == NR && cs == 1) {
    // Row-major B: each panel row is a contiguous run of the source.
    if constexpr (std::is_same_v<S, T>)
      for (int64_t p = 0; p < kc; ++p) __builtin_memcpy(dst + p * NR, b + p * rs, NR * sizeof(T));
    else
      for (int64_t p = 0; p < kc; ++p)
        for (int j = 0; j < NR; j += W) store(dst + p * NR + j, load_as<T>(b + p * rs + j));
  } else if (cs == 1 && std::is_same_v<S, T>) {
    // The last, partial panel of a row-major B: the nr values, then zeros.
    for (int64_t p = 0; p < kc; ++p) copy_padded<NR>(dst + p * NR, reinterpret_cast<const T*>(b) + p * rs, nr);
  } else if (nr == NR && rs == 1) {
    // Transposed B (x · Wᵀ, a Linear layer's weight): W x W blocks are loaded as W
    // vectors along the depth, transposed in registers and stored as W panel rows; the
    // depth's last kc mod W steps one value at a time. Element by element, the whole
    // copy had cost 5% of a tensor-ring layer's step.
    using V = typename Vec<T>::type;
    int64_t p0 = 0;
    for (; p0 + W <= kc; p0 += W)
      for (int jb = 0; jb < NR; jb += W) {
        V r[W];
        for (int jj = 0; jj < W; ++jj) r[jj] = load_as<T>(b + (jb + jj) * cs + p0);
        transpose_block(r);
        for (int pp = 0; pp < W; ++pp) store(dst + (p0 + pp) * NR + jb, r[pp]);
      }
    for (int j = 0; j < NR; ++j)
      for (int64_t p = p0; p < kc; ++p) dst[p * NR + j] = T(b[j * cs + p]);
  } else {
    for (int64_t p = 0; p < kc; ++p) {
      for (int64_t j = 0; j < nr; ++j) dst[p * NR + j] = T(b[p * rs + j * cs]);
      for (int64_t j = nr; j < NR; ++j) dst[p * NR + j] = T(0);
    }
  }
}

// ---------------------------------------------------------------- micro-kernel

// C tile (MR x NR, row stride ldc, unit column stride) = or += packed A panel · packed B
// panel over depth kc. The accumulators are plain arrays of vectors: with the loops over
// i and j fully unrolled GCC keeps every one of them in a register, broadcasts a[i] once
// per row and issues one fused multiply-add per (i, j) (GCC contracts a * b + c into an
// FMA in C++ by default).
//
// DirectA: `a` is not a packed panel but MR rows of A read in place, row i of depth p at
// a[i * ars + p * aps]; the broadcast costs the same one load as that of a packed a[i].
// `b` advances by bps per step of depth: NR through a packed panel, B's row stride when
// its NR columns are read in place.
// Packing a row-major A is a transposition, one scalar load and store per element: with
// the 96 columns of a μMoE rank it cost a sixth of the product.
//
// A C of bfloat16 values (TC) is written once, the float32 sums plus the bias rounded as
// they are stored (store_as): the product's whole depth in one slice (gemm_serial).
template <class T, bool DirectA = false, class TC = T>
void micro_kernel(int64_t kc, const T* __restrict a, const T* __restrict b, TC* __restrict c, int64_t ldc,
                  bool overwrite, int64_t ars = 0, int64_t aps = 0, Addend<T> bias = {},
                  int64_t bps = Tile<T>::NR) {
  using V = typename Vec<T>::type;
  constexpr int W = Vec<T>::width, MR = Tile<T>::MR, NV = Tile<T>::NV;
  V acc[MR][NV];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) acc[i][j] = V{};
  // Ask for the C tile now so that its cache misses overlap the multiply loop: the start
  // of each of a row's NV vectors and its last element, every cache line the row touches
  // (two when the row is aligned, three when not). With the first lines alone, a product
  // whose C is past the caches stalled on the rest as the tile was stored: the
  // MLP-Mixer's 6272 x 128 by 128 x 512 (12.8 MB of C) took 2.47 ms, 2.08 with the last
  // element too (medians of 5 alternating runs, 2 threads, bench_sgemm --shape); 1024^3
  // 5.48 -> 5.19 ms. Rows of an odd length are never aligned, and their middle line
  // stalled in turn: GPT-2 mini's logits, 1024 x 256 by 256 x 50257 (206 MB of C, rows of
  // 50257 floats), 91.3 -> 76.8 ms with each vector's start (medians of 5 alternating
  // runs; later sets 75.4 -> 71.7 and 74.5 -> 65.0; bench_gpt2 gpt2-mini 338 -> 326 ms, 6
  // runs); aligned rows unchanged.
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) __builtin_prefetch(c + i * ldc + j * W, 1);
    __builtin_prefetch(c + i * ldc + NV * W - 1, 1);
  }

  // Four steps of depth per loop trip: the loop's own counter, pointer and branch
  // instructions then cost a quarter as much issue bandwidth. On this 2-core AVX2 machine
  // that made 2-thread products 8-13% faster (596 x 768 x 2048, 1024^3, 768 x 2048 x 596,
  // both builds timed alternately in one process); unrolling by 8 gained nothing more,
  // and prefetching the panels from inside the loop lost 10%.
#pragma GCC unroll 4
  for (int64_t p = 0; p < kc; ++p) {
    V bv[NV];
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) __builtin_memcpy(&bv[j], b + j * W, sizeof(V));  // packed panels are 64-byte aligned
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const V ai = splat(DirectA ? a[i * ars] : a[i]);
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) acc[i][j] += ai * bv[j];
    }
    a += DirectA ? aps : MR;
    b += bps;
  }

  // Stored here rather than through store_small (below), whose store is the same: routed
  // through it, the tile's products ran 13-16% slower (1024^3 and 596 x 768 x 2048, both
  // builds timed alternately in one process).
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) {
      TC* cp = c + i * ldc + j * W;
      V v = acc[i][j];
      if constexpr (!std::is_same_v<TC, T>) {  // bfloat16: the whole sum, rounded
        if (bias) v += bias.vec(i, j * W);
        store_as(cp, v);
      } else {
        if (!overwrite) {
          V old;
          __builtin_memcpy(&old, cp, sizeof(V));  // C rows need not be vector-aligned
          v += old;
        } else if (bias) {  // a bias (per column or per row), added as C is stored
          v += bias.vec(i, j * W);
        }
        __builtin_memcpy(cp, &v, sizeof(V));
      }
    }
  }
}

// One tile of C that may be partial (mr < MR or nr < NR at the matrix edge) or have a
// non-unit column stride: computed into a local tile, then the valid part merged into C.
template <class T, bool DirectA = false, class TC = T>
void edge_tile(int64_t kc, const T* a, const T* b, TC* c, int64_t rs, int64_t cs, int64_t mr, int64_t nr,
               bool overwrite, int64_t ars = 0, int64_t aps = 0, Addend<T> bias = {}, int64_t bps = Tile<T>::NR) {
  constexpr int MR = Tile<T>::MR, NR = Tile<T>::NR;
  alignas(64) T tmp[MR * NR];
  micro_kernel<T, DirectA>(kc, a, b, tmp, NR, true, ars, aps, {}, bps);
  for (int64_t i = 0; i < mr; ++i)
    for (int64_t j = 0; j < nr; ++j) {
      TC& dst = c[i * rs + j * cs];
      if constexpr (std::is_same_v<TC, T>)
        dst = overwrite ? tmp[i * NR + j] + (bias ? bias.get(i, j) : T(0)) : dst + tmp[i * NR + j];
      else  // the sum plus the bias, rounded once (one slice of depth: always overwrite)
        dst = TC(tmp[i * NR + j] + (bias ? bias.get(i, j) : T(0)));
    }
}

// ---------------------------------------------------------------- blocked product

// C (M x N) = or += A · B on the calling thread alone, K > 0: the five loops of the
// Goto scheme. Packed B (KC x NC) is reused by every row block of A, packed A (MC x KC)
// by every column panel of B, and one KC x NR panel of B by every MR-row panel of A. A
// row-major B of at most direct_b_panels panels is read in place instead (below).
// Operands of bfloat16 values (S) are widened to float32 (T) as they are packed, so they
// are always packed: the micro-kernel reads float32. A C of bfloat16 values (TC) takes a
// depth of at most KC, which each tile sums whole before it rounds and stores it.
template <class T, class S = T, class TC = T>
void gemm_serial(int64_t M, int64_t N, int64_t K, const S* A, int64_t a_rs, int64_t a_cs, const S* B, int64_t b_rs,
                 int64_t b_cs, TC* C, int64_t c_rs, int64_t c_cs, bool accumulate, Addend<T> bias = {},
                 int64_t direct_b_panels = 8) {
  // Operands read in place only where both they and C are T (the in-place tiles below).
  constexpr bool same = std::is_same_v<S, T> && std::is_same_v<TC, T>;
  if constexpr (!std::is_same_v<TC, T>)
    MU_CHECK(K <= Tile<T>::KC && !accumulate, "gemm: a bfloat16 C takes a depth of at most ", Tile<T>::KC,
             " and no accumulation, got K = ", K, accumulate ? ", accumulating" : "");
  constexpr int64_t MR = Tile<T>::MR, NR = Tile<T>::NR, KC = Tile<T>::KC, MC = Tile<T>::MC, NC = Tile<T>::NC;
  const int64_t kc_max = std::min(KC, K);
  T* bpack = packed_b_buffer<T>(kc_max * std::min(NC, (N + NR - 1) / NR * NR));
  T* apack = packed_a_buffer<T>(kc_max * std::min(MC, (M + MR - 1) / MR * MR));
  // Packing pays when each packed row serves many panels of B; for a narrow B (up to 8
  // panels) a row-major A is read in place. Measured on AVX2 (Zen, one thread): 6272 x 96
  // x 512 went from ~54 to ~72 GFLOP/s, 16384 x 64 x 49 from ~50 to ~63; 1024^3 was ~15%
  // slower in place, so wide products still pack. A transposed A (a weight gradient's
  // Xᵀ) is read in place only with AVX-512's 12-row tiles, where each step of depth
  // reads 12 adjacent values for 24 multiply-adds: on Zen 5, 512 x 96 x 6272 went from
  // 295 to 356 GFLOP/s on 2 threads (148 to 183 on one), 64 x 96 x 6272 from 237 to 275.
  // With AVX2's 6-row tiles it lost (55 -> 38 GFLOP/s, Zen 3): half the work per step,
  // and each step still a new cache line.
  const bool direct_a = same && N <= 8 * NR && (a_cs == 1 || (MR >= 12 && a_rs == 1));
  // Likewise a packed panel of B pays when many MR-row panels of A read it; with no more
  // rows than one row block (a weight gradient dW = Xᵀ dY with few rows) a row-major B's
  // full panels are read in place, each row of NR values at the row stride. On Zen 5, 2
  // threads: 128 x 96 x 6272 went from 350 to 379 GFLOP/s, 64 x 96 x 6272 from 288 to 318.
  // A deep product's slabs (gemm_deep) pass up to 16 panels: their rows of B arrive from
  // memory, and the micro-kernel's multiplies hide those reads where a packing pass would
  // wait on them alone (below).
  const bool direct_b = same && b_cs == 1 && M <= MC && N <= direct_b_panels * NR;

  for (int64_t jc = 0; jc < N; jc += NC) {
    const int64_t nc = std::min(NC, N - jc);
    for (int64_t pc = 0; pc < K; pc += KC) {
      const int64_t kc = std::min(KC, K - pc);
      // The first slice of depth writes C (plus the bias, if any), later ones add to it.
      const bool overwrite = !accumulate && pc == 0;
      for (int64_t jp = 0; jp * NR < nc; ++jp)
        if (!direct_b || nc - jp * NR < NR)
          pack_b_panel<T, S>(kc, std::min(NR, nc - jp * NR), B + pc * b_rs + (jc + jp * NR) * b_cs, b_rs, b_cs,
                             bpack + jp * NR * kc);
      for (int64_t ic = 0; ic < M; ic += MC) {
        const int64_t mc = std::min(MC, M - ic), full = mc / MR * MR;
        const S* ablock = A + ic * a_rs + pc * a_cs;
        // An A read in place (micro_kernel's DirectA) still has its last, partial panel
        // packed (zero-padded) at its usual place.
        if (!direct_a) pack_a<T, S>(mc, kc, ablock, a_rs, a_cs, apack);
        else if (full < mc) pack_a<T, S>(mc - full, kc, ablock + full * a_rs, a_rs, a_cs, apack + full * kc);
        for (int64_t jp = 0; jp * NR < nc; ++jp) {
          const int64_t nr = std::min(NR, nc - jp * NR);
          const bool b_in_place = direct_b && nr == NR;
          const T* bp = bpack + jp * NR * kc;
          if constexpr (same)
            if (b_in_place) bp = B + pc * b_rs + (jc + jp * NR);
          const int64_t bps = b_in_place ? b_rs : NR;
          for (int64_t ip = 0; ip * MR < mc; ++ip) {
            const int64_t mr = std::min(MR, mc - ip * MR);
            TC* cp = C + (ic + ip * MR) * c_rs + (jc + jp * NR) * c_cs;
            const Addend<T> bias_tile = overwrite ? bias.at(ic + ip * MR, jc + jp * NR) : Addend<T>{};
            const bool whole = nr == NR && c_cs == 1;
            if constexpr (same)
              if (direct_a && mr == MR) {
                const T* ap = ablock + ip * MR * a_rs;
                if (whole) micro_kernel<T, true>(kc, ap, bp, cp, c_rs, overwrite, a_rs, a_cs, bias_tile, bps);
                else edge_tile<T, true>(kc, ap, bp, cp, c_rs, c_cs, mr, nr, overwrite, a_rs, a_cs, bias_tile, bps);
                continue;
              }
            if (mr == MR && whole) {
              micro_kernel<T, false, TC>(kc, apack + ip * MR * kc, bp, cp, c_rs, overwrite, 0, 0, bias_tile, bps);
            } else {
              edge_tile<T, false, TC>(kc, apack + ip * MR * kc, bp, cp, c_rs, c_cs, mr, nr, overwrite, 0, 0,
                                      bias_tile, bps);
            }
          }
        }
      }
    }
  }
}

// How many blocks (rows x columns) C is cut into for `nt` threads. Each block is an
// independent product that packs its own rows of A and columns of B, so threads never
// wait for each other (packing B once for all threads would need a barrier per KC slice;
// packing it twice costs ~1% at 1024^3). There are two blocks per thread, handed out on
// demand, so a thread slowed down by another process on its core takes fewer; more
// blocks would repack more (four per thread: 188 instead of 205 GFLOP/s at 1024^3).
// Among the splits into `items` blocks, the one packing the least (M * cols + N * rows,
// times K) wins; ties go to more row blocks.
void block_grid(int64_t M, int64_t N, int64_t MR, int64_t NR, int nt, int64_t& rb, int64_t& cb) {
  const int64_t pm = (M + MR - 1) / MR, pn = (N + NR - 1) / NR;
  for (int64_t items : {2 * int64_t(nt), int64_t(nt)}) {
    int64_t best = -1;
    for (int64_t r = 1; r <= items; ++r) {
      const int64_t c = items / r;
      if (r * c != items || r > pm || c > pn) continue;
      const int64_t cost = M * c + N * r;
      if (best < 0 || cost <= best) {
        best = cost;
        rb = r;
        cb = c;
      }
    }
    if (best >= 0) return;
  }
  // Too small to give every thread a block of whole tiles: split the longer side only.
  if (pm >= pn) {
    rb = std::min<int64_t>(pm, nt);
    cb = 1;
  } else {
    rb = 1;
    cb = std::min<int64_t>(pn, nt);
  }
}

}  // namespace

// C = or += A · B for one product on `nt` threads, K > 0.
template <class T, class S, class TC>
void gemm_blocked(int64_t M, int64_t N, int64_t K, const S* A, int64_t a_rs, int64_t a_cs, const S* B,
                  int64_t b_rs, int64_t b_cs, TC* C, int64_t c_rs, int64_t c_cs, bool accumulate, int nt,
                  Addend<T> bias) {
  constexpr int64_t MR = Tile<T>::MR, NR = Tile<T>::NR;
  int64_t rb = 1, cb = 1;
  if (nt > 1) block_grid(M, N, MR, NR, nt, rb, cb);
  if (rb * cb == 1) return gemm_serial<T, S, TC>(M, N, K, A, a_rs, a_cs, B, b_rs, b_cs, C, c_rs, c_cs, accumulate, bias);
  // Block boundaries fall on whole tiles, spreading the tiles as evenly as possible.
  const int64_t pm = (M + MR - 1) / MR, pn = (N + NR - 1) / NR;
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
  for (int64_t item = 0; item < rb * cb; ++item) {
    const int64_t r = item / cb, c = item % cb;
    const int64_t m0 = std::min(M, pm * r / rb * MR), m1 = std::min(M, pm * (r + 1) / rb * MR);
    const int64_t n0 = std::min(N, pn * c / cb * NR), n1 = std::min(N, pn * (c + 1) / cb * NR);
    if (m0 < m1 && n0 < n1)
      gemm_serial<T, S, TC>(m1 - m0, n1 - n0, K, A + m0 * a_rs, a_rs, a_cs, B + n0 * b_cs, b_rs, b_cs,
                     C + m0 * c_rs + n0 * c_cs, c_rs, c_cs, accumulate, bias.at(m0, n0));
  }
}

// ---------------------------------------------------------------- deep products

// A product whose depth dwarfs its output, the shape of every weight gradient (dW = Xᵀ dY
// summed over all tokens: 64 x 49 over 16384 rows in an MLP-Mixer's token MLP). Cutting
// its small C into a block per thread leaves each block a few, mostly padded tiles; cut
// the depth instead. The depth is split into slabs of about kSlabDepth, a number fixed
// by K alone (never by the thread count, so the sums, and the results, are the same on
// any number of threads); each slab's product goes to its own partial C, and the partials
// are added in slab order.
// Only for outputs of at most kDeepOutput elements: a larger C has tiles enough for every
// thread, and its partials would cost memory and traffic (GPT-2's head gradient g · wte,
// 1024 x 256 over 50257 classes, would keep 50 partials of 1 MB).
// At most kMaxSlabs slabs (deeper ones grow instead), so the partials stay within
// kMaxSlabs x kDeepOutput elements however long the depth.
constexpr int64_t kSlabDepth = 1024;
constexpr int64_t kDeepOutput = 64 * 1024;
constexpr int64_t kMaxSlabs = 64;

bool deep_product(int64_t M, int64_t N, int64_t K) {
  return K >= 2 * kSlabDepth && K >= 8 * std::max(M, N) && M * N <= kDeepOutput;
}

template <class T, class S>
void gemm_deep(int64_t M, int64_t N, int64_t K, const S* A, int64_t a_rs, int64_t a_cs, const S* B, int64_t b_rs,
               int64_t b_cs, T* C, int64_t c_rs, int64_t c_cs, bool accumulate, int nt) {
  // A multiple of 4 slabs, so that 2 or 4 threads take equal shares (7 slabs on 2 threads
  // left one idle for a seventh of the product: a Mixer's 128 x 512 weight gradient over
  // 6272 rows ran at 108 GFLOP/s); still a function of K alone.
  const int64_t slabs = std::min(kMaxSlabs, ((K + kSlabDepth - 1) / kSlabDepth + 3) / 4 * 4), mn = M * N;
  thread_local Scratch<T> partial_buffer;  // of the calling thread: the workers only write into it
  T* partial = partial_buffer.get(slabs * mn);
  parallel_for(
      slabs, nt,
      [&](int64_t s) {
        // B read in place up to 16 panels (512 floats): every slab reads its rows of B
        // once, straight from memory, so packing them was a pass of cache misses with no
        // arithmetic to hide them. The Mixer's weight gradient gᵀ · x, 128 x 6272 by 6272
        // x 512 (bench_sgemm --shape 128x6272x512 --transposed-a 1), went from 2.63 to
        // 2.25 ms (medians of 7 alternating runs, 2 Zen 5 threads, AVX-512 tiles; AVX2 not
        // timed; later sets 4-10 %). Outside deep slabs the wider in-place reads gained
        // nothing (384 x 1024 x 1024's 192-row blocks).
        const int64_t k0 = K * s / slabs, k1 = K * (s + 1) / slabs;
        gemm_serial<T, S>(M, N, k1 - k0, A + k0 * a_cs, a_rs, a_cs, B + k0 * b_rs, b_rs, b_cs, partial + s * mn, N, 1,
                       false, {}, 16);
      },
      Schedule::Dynamic);
  parallel_for(M, mn >= 4096 ? nt : 1, [&](int64_t i) {
    for (int64_t j = 0; j < N; ++j) {
      T sum = partial[i * N + j];
      for (int64_t s = 1; s < slabs; ++s) sum += partial[s * mn + i * N + j];
      T& dst = C[i * c_rs + j * c_cs];
      dst = accumulate ? dst + sum : sum;
    }
  });
}

template void gemm_blocked<float>(int64_t, int64_t, int64_t, const float*, int64_t, int64_t, const float*, int64_t,
                                  int64_t, float*, int64_t, int64_t, bool, int, Addend<float>);
template void gemm_blocked<double>(int64_t, int64_t, int64_t, const double*, int64_t, int64_t, const double*,
                                   int64_t, int64_t, double*, int64_t, int64_t, bool, int, Addend<double>);
template void gemm_deep<float>(int64_t, int64_t, int64_t, const float*, int64_t, int64_t, const float*, int64_t,
                               int64_t, float*, int64_t, int64_t, bool, int);
template void gemm_deep<double>(int64_t, int64_t, int64_t, const double*, int64_t, int64_t, const double*, int64_t,
                                int64_t, double*, int64_t, int64_t, bool, int);
template void gemm_blocked<float, bfloat16_t>(int64_t, int64_t, int64_t, const bfloat16_t*, int64_t, int64_t,
                                              const bfloat16_t*, int64_t, int64_t, float*, int64_t, int64_t, bool, int,
                                              Addend<float>);
template void gemm_blocked<float, bfloat16_t, bfloat16_t>(int64_t, int64_t, int64_t, const bfloat16_t*, int64_t,
                                                          int64_t, const bfloat16_t*, int64_t, int64_t, bfloat16_t*,
                                                          int64_t, int64_t, bool, int, Addend<float>);
bool packed_product_rounds(int64_t K) { return K <= Tile<float>::KC; }
template void gemm_deep<float, bfloat16_t>(int64_t, int64_t, int64_t, const bfloat16_t*, int64_t, int64_t,
                                           const bfloat16_t*, int64_t, int64_t, float*, int64_t, int64_t, bool, int);

}  // namespace mu::cpu::gemm_detail
