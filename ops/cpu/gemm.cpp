// CPU GEMM. The native kernel has three paths, picked per product by shape (gemm_one):
//  - a 1-row or 1-column operand: matrix-vector loops;
//  - small products (B fits in L2): no packing; register blocks of 8 rows x 1 vector of
//    C summed over the whole depth, reading A and B in place;
//  - the rest: the Goto/BLIS scheme. C is computed in blocks of NC columns x KC depth x
//    MC rows sized so that the operands stay in cache; each block of A and B is first
//    copied ("packed") into a dense buffer in the exact order the micro-kernel reads it,
//    so the inner loop streams aligned memory whatever the original strides were; the
//    micro-kernel keeps an MR x NR tile of C in vector registers for the whole depth KC.
// Threads (OpenMP) take whole products of a batch when there are enough of them, else
// blocks of one product. The vector code is GCC vector extensions, as wide as the target
// allows (AVX-512, AVX2 or SSE), so one source serves every x86-64 machine.
#include "ops/cpu/gemm.h"

#include <omp.h>
#if defined(__x86_64__)
#include <immintrin.h>  // load_first's masked loads, store_first's masked stores
#endif

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>

#include "ops/cpu/parallel.h"
#include "ops/cpu/simd.h"
#include "tensor/error.h"
#include "tensor/half.h"

#ifdef MUMOE_OPENBLAS
#include <cblas.h>
#endif

namespace mu::cpu {
namespace {

// ---------------------------------------------------------------- tile geometry

// All lanes = x, as a vector initialiser with one x per lane (one broadcast instruction;
// the shorter `V{} + x` costs an extra add, since 0.0 + -0.0 is not -0.0).
template <class V, class T, size_t... Lane>
inline V splat_lanes(T x, std::index_sequence<Lane...>) {
  return V{((void)Lane, x)...};
}
template <class T>
inline typename Vec<T>::type splat(T x) {
  return splat_lanes<typename Vec<T>::type>(x, std::make_index_sequence<Vec<T>::width>());
}

// What a product that writes C adds to it as it stores it: element (i, j) of a broadcast
// matrix, p[i * rs + j * cs]. A Linear layer's bias, one value per column, is (bias, 0,
// 1); a bias per row (a Linear layer applied along the rows: an MLP-Mixer's token MLP) is
// (bias, 1, 0). Empty (p null) adds nothing.
template <class T>
struct Addend {
  const T* p = nullptr;
  int64_t rs = 0, cs = 1;
  explicit operator bool() const { return p != nullptr; }
  // The addend of the block whose top-left element is (i, j).
  Addend at(int64_t i, int64_t j) const { return p ? Addend{p + i * rs + j * cs, rs, cs} : Addend{}; }
  T get(int64_t i, int64_t j) const { return p[i * rs + j * cs]; }
  // Elements (i, j) .. (i, j + W - 1) as a vector: one load, one broadcast or W loads.
  typename Vec<T>::type vec(int64_t i, int64_t j) const {
    typename Vec<T>::type v;
    const T* q = p + i * rs + j * cs;
    if (cs == 1) {
      __builtin_memcpy(&v, q, sizeof(v));
    } else if (cs == 0) {
      v = splat(*q);
    } else {
      for (int w = 0; w < Vec<T>::width; ++w) v[w] = q[w * cs];
    }
    return v;
  }
};

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

// Whole products of a batch go to threads in runs of at least this many flops.
constexpr double kTinyRun = 1 << 18;

// ---------------------------------------------------------------- scratch buffers

// A 64-byte-aligned buffer that only grows, so that packing does not hit malloc on every
// call. One per thread and purpose (thread_local below).
template <class T>
class Scratch {
 public:
  ~Scratch() { std::free(data_); }
  T* get(int64_t n) {
    if (n > size_) {
      std::free(data_);
      // aligned_alloc wants a size that is a multiple of the alignment.
      size_t bytes = (size_t(n) * sizeof(T) + 63) / 64 * 64;
      data_ = static_cast<T*>(std::aligned_alloc(64, bytes));
      MU_CHECK(data_ != nullptr, "gemm: out of memory allocating a ", bytes, "-byte packing buffer");
      size_ = n;
    }
    return data_;
  }

 private:
  T* data_ = nullptr;
  int64_t size_ = 0;
};

template <class T>
T* packed_a_buffer(int64_t n) {
  thread_local Scratch<T> s;
  return s.get(n);
}
template <class T>
T* packed_b_buffer(int64_t n) {
  thread_local Scratch<T> s;
  return s.get(n);
}

// ---------------------------------------------------------------- packing

// The first n <= W lanes of a vector from p, the rest zero: one masked load on AVX-512
// (lanes past n are not read), else an element loop.
template <class T>
inline typename Vec<T>::type load_first(const T* p, int64_t n) {
  using V = typename Vec<T>::type;
#if defined(__AVX512F__) && defined(__x86_64__)
  if constexpr (std::is_same_v<T, float> && Vec<T>::width == 16)
    return V(_mm512_maskz_loadu_ps(__mmask16((1u << n) - 1), p));
  else if constexpr (std::is_same_v<T, double> && Vec<T>::width == 8)
    return V(_mm512_maskz_loadu_pd(__mmask8((1u << n) - 1), p));
#endif
  V v{};
  for (int64_t i = 0; i < n; ++i) v[i] = p[i];
  return v;
}

// dst[0, W) = src[0, n) then zeros, for n <= W: one line of a zero-padded panel. A line
// of one vector is load_first's masked load and one store; other widths are built in a
// local array and stored as one constant-size copy. (As a local array's loop, GCC makes
// a one-vector line a call to memcpy, whose narrow stores the vector load of the line
// must wait out (store forwarding fails): a fifth of the time of a batch of 4 x 4 by
// 4 x 4 products.)
template <int W, class T>
inline void copy_padded(T* dst, const T* src, int64_t n) {
  if constexpr (W == Vec<T>::width) {
    const typename Vec<T>::type v = load_first(src, n);
    __builtin_memcpy(dst, &v, sizeof(v));
  } else {
    T line[W] = {};
    for (int64_t i = 0; i < n; ++i) line[i] = src[i];
    __builtin_memcpy(dst, line, sizeof(line));
  }
}

// Copies rows [0, m) x depth [0, kc) of A (element (i, p) at a[i * rs + p * cs]) into
// MR-row panels: panel r holds, for each p, the MR values A[r*MR .. r*MR+MR-1][p] side by
// side, which is the order the micro-kernel broadcasts them. The last panel is padded
// with zeros so the kernel never needs a shorter tile.
template <class T>
void pack_a(int64_t m, int64_t kc, const T* a, int64_t rs, int64_t cs, T* dst) {
  constexpr int MR = Tile<T>::MR;
  for (int64_t i0 = 0; i0 < m; i0 += MR, dst += MR * kc) {
    const int64_t mr = std::min<int64_t>(MR, m - i0);
    const T* src = a + i0 * rs;
    if (mr == MR && cs == 1) {
      // Row-major A: read each row sequentially (MR streams), write one panel line per p.
      for (int64_t p = 0; p < kc; ++p)
        for (int i = 0; i < MR; ++i) dst[p * MR + i] = src[i * rs + p];
    } else if (mr == MR && rs == 1) {
      // Transposed A: the MR values of one p are adjacent in memory already. A copy of
      // constant size is a few vector moves; as a loop, GCC vectorised it across p with
      // one insert per element (a quarter of a weight gradient's time went here).
      for (int64_t p = 0; p < kc; ++p) __builtin_memcpy(dst + p * MR, src + p * cs, MR * sizeof(T));
    } else if (rs == 1) {
      // A last, partial panel of a transposed A: the mr values, then zeros.
      for (int64_t p = 0; p < kc; ++p) copy_padded<MR>(dst + p * MR, src + p * cs, mr);
    } else {
      for (int64_t p = 0; p < kc; ++p) {
        for (int64_t i = 0; i < mr; ++i) dst[p * MR + i] = src[i * rs + p * cs];
        for (int64_t i = mr; i < MR; ++i) dst[p * MR + i] = T(0);
      }
    }
  }
}

// Copies depth [0, kc) x columns [j0, j0 + NR) of B (element (p, j) at b[p * rs + j * cs])
// into one NR-column panel, row p of the panel being NR consecutive values; columns at or
// past n are zero.
template <class T>
void pack_b_panel(int64_t kc, int64_t nr, const T* b, int64_t rs, int64_t cs, T* dst) {
  constexpr int NR = Tile<T>::NR;
  if (nr == NR && cs == 1) {
    // Row-major B: each panel row is a contiguous run of the source.
    for (int64_t p = 0; p < kc; ++p) __builtin_memcpy(dst + p * NR, b + p * rs, NR * sizeof(T));
  } else if (cs == 1) {
    // The last, partial panel of a row-major B: the nr values, then zeros.
    for (int64_t p = 0; p < kc; ++p) copy_padded<NR>(dst + p * NR, b + p * rs, nr);
  } else if (nr == NR && rs == 1) {
    // Transposed B (x · Wᵀ, a Linear layer's weight): W x W blocks are loaded as W
    // vectors along the depth, transposed in registers and stored as W panel rows; the
    // depth's last kc mod W steps one value at a time. Element by element, the whole
    // copy had cost 5% of a tensor-ring layer's step.
    using V = typename Vec<T>::type;
    constexpr int W = Vec<T>::width;
    int64_t p0 = 0;
    for (; p0 + W <= kc; p0 += W)
      for (int jb = 0; jb < NR; jb += W) {
        V r[W];
        for (int jj = 0; jj < W; ++jj) r[jj] = load(b + (jb + jj) * cs + p0);
        transpose_block(r);
        for (int pp = 0; pp < W; ++pp) store(dst + (p0 + pp) * NR + jb, r[pp]);
      }
    for (int j = 0; j < NR; ++j)
      for (int64_t p = p0; p < kc; ++p) dst[p * NR + j] = b[j * cs + p];
  } else {
    for (int64_t p = 0; p < kc; ++p) {
      for (int64_t j = 0; j < nr; ++j) dst[p * NR + j] = b[p * rs + j * cs];
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
template <class T, bool DirectA = false>
void micro_kernel(int64_t kc, const T* __restrict a, const T* __restrict b, T* __restrict c, int64_t ldc,
                  bool overwrite, int64_t ars = 0, int64_t aps = 0, Addend<T> bias = {},
                  int64_t bps = Tile<T>::NR) {
  using V = typename Vec<T>::type;
  constexpr int W = Vec<T>::width, MR = Tile<T>::MR, NV = Tile<T>::NV;
  V acc[MR][NV];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) acc[i][j] = V{};
  // Ask for the C tile now so that its cache misses overlap the multiply loop.
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) __builtin_prefetch(c + i * ldc, 1);

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
      T* cp = c + i * ldc + j * W;
      V v = acc[i][j];
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

// One tile of C that may be partial (mr < MR or nr < NR at the matrix edge) or have a
// non-unit column stride: computed into a local tile, then the valid part merged into C.
template <class T, bool DirectA = false>
void edge_tile(int64_t kc, const T* a, const T* b, T* c, int64_t rs, int64_t cs, int64_t mr, int64_t nr,
               bool overwrite, int64_t ars = 0, int64_t aps = 0, Addend<T> bias = {}, int64_t bps = Tile<T>::NR) {
  constexpr int MR = Tile<T>::MR, NR = Tile<T>::NR;
  alignas(64) T tmp[MR * NR];
  micro_kernel<T, DirectA>(kc, a, b, tmp, NR, true, ars, aps, {}, bps);
  for (int64_t i = 0; i < mr; ++i)
    for (int64_t j = 0; j < nr; ++j) {
      T& dst = c[i * rs + j * cs];
      dst = overwrite ? tmp[i * NR + j] + (bias ? bias.get(i, j) : T(0)) : dst + tmp[i * NR + j];
    }
}

// ---------------------------------------------------------------- blocked product

// C (M x N) = or += A · B on the calling thread alone, K > 0: the five loops of the
// Goto scheme. Packed B (KC x NC) is reused by every row block of A, packed A (MC x KC)
// by every column panel of B, and one KC x NR panel of B by every MR-row panel of A.
template <class T>
void gemm_serial(int64_t M, int64_t N, int64_t K, const T* A, int64_t a_rs, int64_t a_cs, const T* B, int64_t b_rs,
                 int64_t b_cs, T* C, int64_t c_rs, int64_t c_cs, bool accumulate, Addend<T> bias = {}) {
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
  const bool direct_a = N <= 8 * NR && (a_cs == 1 || (MR >= 12 && a_rs == 1));
  // Likewise a packed panel of B pays when many MR-row panels of A read it; with no more
  // rows than one row block (a weight gradient dW = Xᵀ dY with few rows) a row-major B's
  // full panels are read in place, each row of NR values at the row stride. On Zen 5, 2
  // threads: 128 x 96 x 6272 went from 350 to 379 GFLOP/s, 64 x 96 x 6272 from 288 to 318.
  const bool direct_b = b_cs == 1 && M <= MC && N <= 8 * NR;

  for (int64_t jc = 0; jc < N; jc += NC) {
    const int64_t nc = std::min(NC, N - jc);
    for (int64_t pc = 0; pc < K; pc += KC) {
      const int64_t kc = std::min(KC, K - pc);
      // The first slice of depth writes C (plus the bias, if any), later ones add to it.
      const bool overwrite = !accumulate && pc == 0;
      for (int64_t jp = 0; jp * NR < nc; ++jp)
        if (!direct_b || nc - jp * NR < NR)
          pack_b_panel<T>(kc, std::min(NR, nc - jp * NR), B + pc * b_rs + (jc + jp * NR) * b_cs, b_rs, b_cs,
                          bpack + jp * NR * kc);
      for (int64_t ic = 0; ic < M; ic += MC) {
        const int64_t mc = std::min(MC, M - ic), full = mc / MR * MR;
        const T* ablock = A + ic * a_rs + pc * a_cs;
        // An A read in place (micro_kernel's DirectA) still has its last, partial panel
        // packed (zero-padded) at its usual place.
        if (!direct_a) pack_a<T>(mc, kc, ablock, a_rs, a_cs, apack);
        else if (full < mc) pack_a<T>(mc - full, kc, ablock + full * a_rs, a_rs, a_cs, apack + full * kc);
        for (int64_t jp = 0; jp * NR < nc; ++jp) {
          const int64_t nr = std::min(NR, nc - jp * NR);
          const bool b_in_place = direct_b && nr == NR;
          const T* bp = b_in_place ? B + pc * b_rs + (jc + jp * NR) : bpack + jp * NR * kc;
          const int64_t bps = b_in_place ? b_rs : NR;
          for (int64_t ip = 0; ip * MR < mc; ++ip) {
            const int64_t mr = std::min(MR, mc - ip * MR);
            T* cp = C + (ic + ip * MR) * c_rs + (jc + jp * NR) * c_cs;
            const Addend<T> bias_tile = overwrite ? bias.at(ic + ip * MR, jc + jp * NR) : Addend<T>{};
            const bool whole = nr == NR && c_cs == 1;
            if (direct_a && mr == MR) {
              const T* ap = ablock + ip * MR * a_rs;
              if (whole) micro_kernel<T, true>(kc, ap, bp, cp, c_rs, overwrite, a_rs, a_cs, bias_tile, bps);
              else edge_tile<T, true>(kc, ap, bp, cp, c_rs, c_cs, mr, nr, overwrite, a_rs, a_cs, bias_tile, bps);
            } else if (mr == MR && whole) {
              micro_kernel<T>(kc, apack + ip * MR * kc, bp, cp, c_rs, overwrite, 0, 0, bias_tile, bps);
            } else {
              edge_tile<T>(kc, apack + ip * MR * kc, bp, cp, c_rs, c_cs, mr, nr, overwrite, 0, 0, bias_tile, bps);
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

// C = or += A · B for one product on `nt` threads, K > 0.
template <class T>
void gemm_blocked(int64_t M, int64_t N, int64_t K, const T* A, int64_t a_rs, int64_t a_cs, const T* B,
                  int64_t b_rs, int64_t b_cs, T* C, int64_t c_rs, int64_t c_cs, bool accumulate, int nt,
                  Addend<T> bias = {}) {
  constexpr int64_t MR = Tile<T>::MR, NR = Tile<T>::NR;
  int64_t rb = 1, cb = 1;
  if (nt > 1) block_grid(M, N, MR, NR, nt, rb, cb);
  if (rb * cb == 1) return gemm_serial<T>(M, N, K, A, a_rs, a_cs, B, b_rs, b_cs, C, c_rs, c_cs, accumulate, bias);
  // Block boundaries fall on whole tiles, spreading the tiles as evenly as possible.
  const int64_t pm = (M + MR - 1) / MR, pn = (N + NR - 1) / NR;
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
  for (int64_t item = 0; item < rb * cb; ++item) {
    const int64_t r = item / cb, c = item % cb;
    const int64_t m0 = std::min(M, pm * r / rb * MR), m1 = std::min(M, pm * (r + 1) / rb * MR);
    const int64_t n0 = std::min(N, pn * c / cb * NR), n1 = std::min(N, pn * (c + 1) / cb * NR);
    if (m0 < m1 && n0 < n1)
      gemm_serial<T>(m1 - m0, n1 - n0, K, A + m0 * a_rs, a_rs, a_cs, B + n0 * b_cs, b_rs, b_cs,
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

template <class T>
void gemm_deep(int64_t M, int64_t N, int64_t K, const T* A, int64_t a_rs, int64_t a_cs, const T* B, int64_t b_rs,
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
        const int64_t k0 = K * s / slabs, k1 = K * (s + 1) / slabs;
        gemm_serial<T>(M, N, k1 - k0, A + k0 * a_cs, a_rs, a_cs, B + k0 * b_rs, b_rs, b_cs, partial + s * mn, N, 1,
                       false);
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

// ---------------------------------------------------------------- matrix-vector

// Runs body(begin, end) on nt threads, each taking one contiguous share of [0, n); on
// the calling thread alone when nt == 1, since even an inactive parallel region costs
// more than a tiny product.
template <class F>
void split_range(int64_t n, int nt, F&& body) {
  if (nt <= 1 || n <= 1) return body(int64_t(0), n);
#pragma omp parallel num_threads(nt)
  {
    const int team = omp_get_num_threads(), tid = omp_get_thread_num();
    body(n * tid / team, n * (tid + 1) / team);
  }
}

// Sum of x[i * incx] * y[i * incy] for i < n, with several vector accumulators when both
// are contiguous (a single scalar accumulator would serialise on the add latency, and
// GCC may not reorder a float sum by itself).
template <class T>
T dot(int64_t n, const T* x, int64_t incx, const T* y, int64_t incy) {
  if (incx == 1 && incy == 1) {
    using V = typename Vec<T>::type;
    constexpr int W = Vec<T>::width;
    V acc[4] = {};
    int64_t i = 0;
    for (; i + 4 * W <= n; i += 4 * W)
      for (int u = 0; u < 4; ++u) {
        V a, b;
        __builtin_memcpy(&a, x + i + u * W, sizeof(V));
        __builtin_memcpy(&b, y + i + u * W, sizeof(V));
        acc[u] += a * b;
      }
    for (; i + W <= n; i += W) {
      V a, b;
      __builtin_memcpy(&a, x + i, sizeof(V));
      __builtin_memcpy(&b, y + i, sizeof(V));
      acc[0] += a * b;
    }
    V v = (acc[0] + acc[1]) + (acc[2] + acc[3]);
    T s = 0;
    for (int w = 0; w < W; ++w) s += v[w];
    for (; i < n; ++i) s += x[i] * y[i];
    return s;
  }
  T s = 0;
  for (int64_t i = 0; i < n; ++i) s += x[i * incx] * y[i * incy];
  return s;
}

// y (length L, stride ys) = or += Mat (L x K, strides ls, ks) · x (length K, stride xs).
// The product with a 1-row or 1-column operand, where a GEMM tile would mostly multiply
// padding. Rows of Mat contiguous: one dot product per output. Columns of Mat contiguous:
// y accumulates whole columns (axpy), which vectorises along y.
template <class T>
void gemv(int64_t L, int64_t K, const T* mat, int64_t ls, int64_t ks, const T* x, int64_t xs, T* y, int64_t ys,
          bool accumulate, int nt) {
  if (ls == 1 && ks != 1) {
    split_range(L, nt, [&](int64_t l0, int64_t l1) {
      // This thread's outputs, summed over every column in a dense local buffer.
      T* acc = packed_a_buffer<T>(std::max<int64_t>(1, l1 - l0));
      for (int64_t l = l0; l < l1; ++l) acc[l - l0] = T(0);
      for (int64_t k = 0; k < K; ++k) {
        const T xk = x[k * xs];
        const T* col = mat + k * ks;
        for (int64_t l = l0; l < l1; ++l) acc[l - l0] += col[l] * xk;
      }
      for (int64_t l = l0; l < l1; ++l) y[l * ys] = accumulate ? y[l * ys] + acc[l - l0] : acc[l - l0];
    });
    return;
  }
  split_range(L, nt, [&](int64_t l0, int64_t l1) {
    for (int64_t l = l0; l < l1; ++l) {
      const T v = dot(K, mat + l * ls, ks, x, xs);
      y[l * ys] = accumulate ? y[l * ys] + v : v;
    }
  });
}

// ---------------------------------------------------------------- small products

// Products up to kSmallWork multiply-adds (M N K) whose B is row-major and at most
// kSmallBBytes (so it stays in L2 while every block of rows of A passes over it) skip
// packing, as do products of any layout up to kTinyWork. Packing A and padding to whole
// MR x NR tiles is a fixed cost these sizes do not recover: on Zen 4 this path is 1.1x
// to 1.4x faster than the packed one from 16^3 to 256^3 (e.g. 4 x 128^3: 208 vs 163
// GFLOP/s on 2 threads), and 5x faster for a batch of 16^3 products.
constexpr double kSmallWork = 256.0 * 256.0 * 256.0;
constexpr double kSmallBBytes = 512 * 1024;
constexpr double kTinyWork = 32.0 * 32.0 * 32.0;

// The store of one vector of accumulated C (W columns from column j of row `dst`): added
// to C when accumulating, else plus the bias, if any. A whole vector is one unaligned
// store; a partial one (n < W lanes, or a strided C) is stored lane by lane.
template <class T>
inline void store_small(T* dst, int64_t c_cs, int64_t i, int64_t j, int64_t n, typename Vec<T>::type v,
                        bool accumulate, Addend<T> bias) {
  using V = typename Vec<T>::type;
  if (n == Vec<T>::width && c_cs == 1) {
    if (accumulate) {
      V old;
      __builtin_memcpy(&old, dst, sizeof(V));
      v += old;
    } else if (bias) {
      v += bias.vec(i, j);
    }
    __builtin_memcpy(dst, &v, sizeof(V));
  } else {
    for (int64_t w = 0; w < n; ++w)
      dst[w * c_cs] = accumulate ? dst[w * c_cs] + v[w] : v[w] + (bias ? bias.get(i, j + w) : T(0));
  }
}

// R rows of C = or += R rows of A · B, B row-major (unit column stride), R <= 6.
// Columns go two vectors at a time while two whole vectors remain: R x 2 register
// accumulators, each step of depth loading two vectors of B and broadcasting R values of
// A (R + 2 loads for 2R multiply-adds; one vector at a time it was R + 1 loads for R,
// and these products were load-bound: an MLP-Mixer's token products, 64 x 128 over 49,
// ran at 48 GFLOP/s). The accumulators are independent of each other, so the FMAs
// overlap instead of waiting on one another. The remaining columns go one vector at a
// time; the last, partial vector (N not a multiple of W) reads `tail`, a zero-padded
// copy of those columns with row stride W, so it is a vector loop too; only its valid
// lanes are stored.
template <class T, int R>
void small_rows(int64_t N, int64_t K, const T* A, int64_t a_rs, int64_t a_cs, const T* B, int64_t b_rs,
                const T* tail, T* C, int64_t c_rs, int64_t c_cs, bool accumulate, Addend<T> bias) {
  static_assert(R <= 6, "R x 2 accumulators, 2 vectors of B and a broadcast must fit 16 registers");
  using V = typename Vec<T>::type;
  constexpr int W = Vec<T>::width;
  int64_t j = 0;
  for (; j + 2 * W <= N; j += 2 * W) {
    V acc[R][2];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = V{};
    for (int64_t k = 0; k < K; ++k) {
      V b0, b1;
      __builtin_memcpy(&b0, B + k * b_rs + j, sizeof(V));
      __builtin_memcpy(&b1, B + k * b_rs + j + W, sizeof(V));
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const V a = splat(A[r * a_rs + k * a_cs]);
        acc[r][0] += a * b0;
        acc[r][1] += a * b1;
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      store_small<T>(C + r * c_rs + j * c_cs, c_cs, r, j, W, acc[r][0], accumulate, bias);
      store_small<T>(C + r * c_rs + (j + W) * c_cs, c_cs, r, j + W, W, acc[r][1], accumulate, bias);
    }
  }
  for (; j < N; j += W) {
    const int64_t n = std::min<int64_t>(W, N - j);
    const T* b = n == W ? B + j : tail;
    const int64_t bs = n == W ? b_rs : W;
    V acc[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[r] = V{};
    for (int64_t k = 0; k < K; ++k) {
      V bv;
      __builtin_memcpy(&bv, b + k * bs, sizeof(V));
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[r] += splat(A[r * a_rs + k * a_cs]) * bv;
    }
    for (int r = 0; r < R; ++r) store_small<T>(C + r * c_rs + j * c_cs, c_cs, r, j, n, acc[r], accumulate, bias);
  }
}

// Rows of C are taken kSmallRows at a time (small_rows' R), the last few 4, 2, 1.
constexpr int64_t kSmallRows = 6;

// Rows [i0, i1) of C = or += A · B, B row-major: blocks of 6 rows, then 4, 2, 1.
template <class T>
void small_row_range(int64_t i0, int64_t i1, int64_t N, int64_t K, const T* A, int64_t a_rs, int64_t a_cs,
                     const T* B, int64_t b_rs, const T* tail, T* C, int64_t c_rs, int64_t c_cs, bool accumulate,
                     Addend<T> bias) {
  int64_t i = i0;
  for (; i + kSmallRows <= i1; i += kSmallRows)
    small_rows<T, kSmallRows>(N, K, A + i * a_rs, a_rs, a_cs, B, b_rs, tail, C + i * c_rs, c_rs, c_cs, accumulate,
                              bias.at(i, 0));
  if (i + 4 <= i1) {
    small_rows<T, 4>(N, K, A + i * a_rs, a_rs, a_cs, B, b_rs, tail, C + i * c_rs, c_rs, c_cs, accumulate,
                     bias.at(i, 0));
    i += 4;
  }
  if (i + 2 <= i1) {
    small_rows<T, 2>(N, K, A + i * a_rs, a_rs, a_cs, B, b_rs, tail, C + i * c_rs, c_rs, c_cs, accumulate,
                     bias.at(i, 0));
    i += 2;
  }
  if (i < i1)
    small_rows<T, 1>(N, K, A + i * a_rs, a_rs, a_cs, B, b_rs, tail, C + i * c_rs, c_rs, c_cs, accumulate,
                     bias.at(i, 0));
}

// R rows of C = or += R rows of A · B for a depth of KK (compile-time, at most
// kTinyDepth), B row-major: the R x KK values of A are broadcast once, then each vector
// of columns takes KK loads of B and R x KK multiply-adds. small_rows, with the depth a
// runtime loop, spent more on setting up its unrolled loop than on the arithmetic at
// these depths (a tensor ring's chain, 2048 products of 4 x 4 by 4 x 149: 0.8 ms on one
// thread, over 1500 cycles a product). The last, partial vector reads `tail`, the
// zero-padded copy of the last columns with row stride W.
template <class T, int R, int KK>
void tiny_depth_rows(int64_t N, const T* A, int64_t a_rs, int64_t a_cs, const T* B, int64_t b_rs, const T* tail,
                     T* C, int64_t c_rs, int64_t c_cs, bool accumulate, Addend<T> bias) {
  using V = typename Vec<T>::type;
  constexpr int W = Vec<T>::width;
  V a[R][KK];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int k = 0; k < KK; ++k) a[r][k] = splat(A[r * a_rs + k * a_cs]);
  for (int64_t j = 0; j < N; j += W) {
    const int64_t n = std::min<int64_t>(W, N - j);
    const T* b = n == W ? B + j : tail;
    const int64_t bs = n == W ? b_rs : W;
    V acc[R] = {};
#pragma GCC unroll 8
    for (int k = 0; k < KK; ++k) {
      V bv;
      __builtin_memcpy(&bv, b + k * bs, sizeof(V));
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[r] += a[r][k] * bv;
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) store_small<T>(C + r * c_rs + j * c_cs, c_cs, r, j, n, acc[r], accumulate, bias);
  }
}

// Depths up to this take tiny_depth_rows.
constexpr int64_t kTinyDepth = 8;

// Rows [i0, i1) of C = or += A · B for a depth KK: blocks of 4 rows, then 2, 1.
template <class T, int KK>
void tiny_depth_range(int64_t i0, int64_t i1, int64_t N, const T* A, int64_t a_rs, int64_t a_cs, const T* B,
                      int64_t b_rs, const T* tail, T* C, int64_t c_rs, int64_t c_cs, bool accumulate, Addend<T> bias) {
  int64_t i = i0;
  for (; i + 4 <= i1; i += 4)
    tiny_depth_rows<T, 4, KK>(N, A + i * a_rs, a_rs, a_cs, B, b_rs, tail, C + i * c_rs, c_rs, c_cs, accumulate,
                              bias.at(i, 0));
  if (i + 2 <= i1) {
    tiny_depth_rows<T, 2, KK>(N, A + i * a_rs, a_rs, a_cs, B, b_rs, tail, C + i * c_rs, c_rs, c_cs, accumulate,
                              bias.at(i, 0));
    i += 2;
  }
  if (i < i1)
    tiny_depth_rows<T, 1, KK>(N, A + i * a_rs, a_rs, a_cs, B, b_rs, tail, C + i * c_rs, c_rs, c_cs, accumulate,
                              bias.at(i, 0));
}

// The same with the depth K (1 <= K <= kTinyDepth) picked at run time.
template <class T>
void tiny_depth_range(int64_t K, int64_t i0, int64_t i1, int64_t N, const T* A, int64_t a_rs, int64_t a_cs,
                      const T* B, int64_t b_rs, const T* tail, T* C, int64_t c_rs, int64_t c_cs, bool accumulate,
                      Addend<T> bias) {
  switch (K) {
#define MU_TINY_DEPTH(KK) \
  case KK: return tiny_depth_range<T, KK>(i0, i1, N, A, a_rs, a_cs, B, b_rs, tail, C, c_rs, c_cs, accumulate, bias);
    MU_TINY_DEPTH(1) MU_TINY_DEPTH(2) MU_TINY_DEPTH(3) MU_TINY_DEPTH(4)
    MU_TINY_DEPTH(5) MU_TINY_DEPTH(6) MU_TINY_DEPTH(7) MU_TINY_DEPTH(8)
#undef MU_TINY_DEPTH
  }
  MU_FAIL("gemm: tiny_depth_range called with depth ", K, " outside [1, ", kTinyDepth, "]");
}

// dst (rows x cols, row-major) = the matrix at src (element (i, j) at src[i * rs + j * cs]);
// returns dst.
template <class T>
const T* dense_rows(int64_t rows, int64_t cols, const T* src, int64_t rs, int64_t cs, T* dst) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) dst[i * cols + j] = src[i * rs + j * cs];
  return dst;
}

// C = or += A · B without packing, for products whose B fits in L2 (see gemm_one). B is
// copied to row-major form first unless it already is.
template <class T>
void gemm_small(int64_t M, int64_t N, int64_t K, const T* A, int64_t a_rs, int64_t a_cs, const T* B, int64_t b_rs,
                int64_t b_cs, T* C, int64_t c_rs, int64_t c_cs, bool accumulate, int nt, Addend<T> bias = {}) {
  if (b_cs != 1) {
    B = dense_rows(K, N, B, b_rs, b_cs, packed_b_buffer<T>(K * N));
    b_rs = N;
  }
  constexpr int W = Vec<T>::width;
  const int64_t full = N / W * W;
  T* tail = nullptr;
  if (full < N) {
    tail = packed_a_buffer<T>(K * W);
    for (int64_t k = 0; k < K; ++k) copy_padded<W>(tail + k * W, B + k * b_rs + full, N - full);
  }
  if (K <= kTinyDepth) {  // threads take contiguous ranges of 4-row blocks
    split_range((M + 3) / 4, nt, [&](int64_t b0, int64_t b1) {
      tiny_depth_range<T>(K, std::min(M, b0 * 4), std::min(M, b1 * 4), N, A, a_rs, a_cs, B, b_rs, tail, C, c_rs, c_cs,
                          accumulate, bias);
    });
    return;
  }
  // Threads take contiguous ranges of row blocks.
  split_range((M + kSmallRows - 1) / kSmallRows, nt, [&](int64_t b0, int64_t b1) {
    small_row_range<T>(std::min(M, b0 * kSmallRows), std::min(M, b1 * kSmallRows), N, K, A, a_rs, a_cs, B, b_rs, tail,
                       C, c_rs, c_cs, accumulate, bias);
  });
}

// ---------------------------------------------------------------- tiny products

// Products of at most kTinyWork multiply-adds whose rows of C are at most two vectors
// (N <= 2 W) over a depth of at most kTinyMaxDepth: a tensor ring's per-token chains (an
// MLP-Mixer's TRμMoE blocks multiply 16384 pairs of 4 x 9 and 9 x 4 matrices). For them
// gemm_small's setup (B copied dense, its last columns padded into a buffer, the rows
// shared out in blocks) cost several times the arithmetic. Here R rows of C at a time
// take K steps, each broadcasting R values of A against B's row k, read with masked loads
// (lanes past N zero), from B itself where its rows are contiguous, else from a dense
// copy of B made once per product; C's rows are stored with masked stores.
constexpr int64_t kTinyMaxDepth = 64;

// The first n <= W lanes of v stored at dst (column stride c_cs), added to C when
// accumulating, else plus the bias: with a masked store where C's row is contiguous (the
// lane-by-lane store of store_small, whose vector GCC then kept in memory, took most of a
// tiny product's time).
template <class T>
inline void store_first(T* dst, int64_t c_cs, int64_t i, int64_t j, int64_t n, typename Vec<T>::type v,
                        bool accumulate, Addend<T> bias) {
#if defined(__AVX512F__) && defined(__x86_64__)
  if (c_cs == 1 && (!bias || bias.cs <= 1)) {
    if (accumulate) v += load_first(dst, n);
    else if (bias) v += bias.cs == 1 ? load_first(bias.p + i * bias.rs + j, n) : splat(bias.get(i, j));
    if constexpr (std::is_same_v<T, float> && Vec<T>::width == 16)
      return _mm512_mask_storeu_ps(dst, __mmask16((1u << n) - 1), __m512(v));
    else if constexpr (std::is_same_v<T, double> && Vec<T>::width == 8)
      return _mm512_mask_storeu_pd(dst, __mmask8((1u << n) - 1), __m512d(v));
  }
#endif
  store_small<T>(dst, c_cs, i, j, n, v, accumulate, bias);
}

// R rows of C (from row i0) = or += R rows of A · B over K depths, NV vectors of columns,
// the first n of them valid; B's row k at B + k * b_rs, unit column stride, read with
// masked loads (its lanes past n as zero).
template <class T, int R, int NV, class TA = T>
void tiny_rows(int64_t K, const TA* A, int64_t a_rs, int64_t a_cs, const T* B, int64_t b_rs, int64_t n, T* C,
               int64_t c_rs, int64_t c_cs, bool accumulate, Addend<T> bias, int64_t i0) {
  using V = typename Vec<T>::type;
  constexpr int W = Vec<T>::width;
  V acc[R][NV];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) acc[r][v] = V{};
  for (int64_t k = 0; k < K; ++k) {
    V b[NV];
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) b[v] = load_first(B + k * b_rs + v * W, std::min<int64_t>(W, n - v * W));
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const V a = splat(T(A[r * a_rs + k * a_cs]));  // a bfloat16 A widened exactly
#pragma GCC unroll 2
      for (int v = 0; v < NV; ++v) acc[r][v] += a * b[v];
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v)
      store_first<T>(C + r * c_rs + v * W * c_cs, c_cs, i0 + r, v * W, std::min<int64_t>(W, n - v * W), acc[r][v],
                     accumulate, bias);
}

template <class T, int NV>
void tiny_product_nv(int64_t M, int64_t N, int64_t K, const T* A, int64_t a_rs, int64_t a_cs, const T* B,
                     int64_t b_rs, T* C, int64_t c_rs, int64_t c_cs, bool accumulate, Addend<T> bias) {
  int64_t i = 0;
  for (; i + 4 <= M; i += 4)
    tiny_rows<T, 4, NV>(K, A + i * a_rs, a_rs, a_cs, B, b_rs, N, C + i * c_rs, c_rs, c_cs, accumulate, bias, i);
  for (; i + 2 <= M; i += 2)
    tiny_rows<T, 2, NV>(K, A + i * a_rs, a_rs, a_cs, B, b_rs, N, C + i * c_rs, c_rs, c_cs, accumulate, bias, i);
  for (; i < M; ++i)
    tiny_rows<T, 1, NV>(K, A + i * a_rs, a_rs, a_cs, B, b_rs, N, C + i * c_rs, c_rs, c_cs, accumulate, bias, i);
}

template <class T>
bool tiny_product_fits(int64_t M, int64_t N, int64_t K) {
  return double(M) * double(N) * double(K) <= kTinyWork && N <= 2 * Vec<T>::width && K <= kTinyMaxDepth;
}

// C = or += A · B for tiny_product_fits shapes, on the calling thread.
template <class T>
void tiny_product(int64_t M, int64_t N, int64_t K, const T* A, int64_t a_rs, int64_t a_cs, const T* B, int64_t b_rs,
                  int64_t b_cs, T* C, int64_t c_rs, int64_t c_cs, bool accumulate, Addend<T> bias) {
  constexpr int W = Vec<T>::width;
  alignas(64) T dense[kTinyMaxDepth * 2 * W];
  if (b_cs != 1) {  // B's rows gathered once, N values each (the lanes past N are not read)
    B = dense_rows(K, N, B, b_rs, b_cs, dense);
    b_rs = N;
  }
  if (N <= W) return tiny_product_nv<T, 1>(M, N, K, A, a_rs, a_cs, B, b_rs, C, c_rs, c_cs, accumulate, bias);
  tiny_product_nv<T, 2>(M, N, K, A, a_rs, a_cs, B, b_rs, C, c_rs, c_cs, accumulate, bias);
}

// The same for bfloat16 operands (autocast's tensor-ring chains), into a float32 C or a
// bfloat16 C rounded once: B widened into a dense float32 copy (exact), A's values widened
// as they are broadcast, the sums in float32, 4 rows at a time through a float32 buffer.
// Each product of two bfloat16 values is exact in float32, so this is the float32 product
// of the rounded operands. (One VDPBF16PS GEMM call per product cost 1.3-2.7x as much:
// its packing is made for products a thousand times larger.)
template <class TC>
void bf16_tiny_product(int64_t M, int64_t N, int64_t K, const bfloat16_t* A, int64_t a_rs, int64_t a_cs,
                       const bfloat16_t* B, int64_t b_rs, int64_t b_cs, TC* C, int64_t ldc) {
  constexpr int W = Vec<float>::width;
  alignas(64) float dense[kTinyMaxDepth * 2 * W];
  for (int64_t k = 0; k < K; ++k)
    for (int64_t j = 0; j < N; ++j) dense[k * N + j] = float(B[k * b_rs + j * b_cs]);
  alignas(64) float rows[4 * 2 * W];
  auto block = [&]<int R, int NV>(int64_t i) {
    tiny_rows<float, R, NV, bfloat16_t>(K, A + i * a_rs, a_rs, a_cs, dense, N, N, rows, 2 * W, 1, false, {}, i);
    for (int64_t r = 0; r < R; ++r)
      for (int64_t j = 0; j < N; ++j) C[(i + r) * ldc + j] = TC(rows[r * 2 * W + j]);
  };
  auto blocks = [&]<int NV>() {
    int64_t i = 0;
    for (; i + 4 <= M; i += 4) block.template operator()<4, NV>(i);
    for (; i + 2 <= M; i += 2) block.template operator()<2, NV>(i);
    for (; i < M; ++i) block.template operator()<1, NV>(i);
  };
  if (N <= W) blocks.template operator()<1>();
  else blocks.template operator()<2>();
}

// ---------------------------------------------------------------- few rows, transposed B

// Products of 1 to kFewRows rows of A against a transposed B (x · wᵀ with w's rows
// contiguous: a Linear layer's weight, the language-model head at a few sequences). The
// blocked path would pack the whole of B for them, a transposing copy of the weight
// written and read again for a handful of rows. Here each column of C is w's row j read
// once, in place, against the R rows of A: R x U vectors of partial sums along the depth
// (U independent chains per row when R is small, to cover the multiply-add's latency),
// whose lanes are added at the end. Consecutive columns are consecutive rows of w, so the
// weight is read as one stream. The rows of A are read again for every column, so the
// depth goes in chunks whose R rows of A stay in L1 (kFewRowsChunkBytes), each chunk's
// sums added onto C. Measured (2 threads, Zen 4, float32, one weight; medians of three
// runs), against the previous kernel (W columns at a time, W rows of w transposed in
// registers): GPT-2 mini's head (256 -> 50257) at 2, 4 and 8 rows 1.97 -> 1.04,
// 2.22 -> 1.21, 2.49 -> 1.8-2.7 ms; a 3072 -> 768 Linear 162 -> 82, 226 -> 133,
// 304 -> 298 us; 768 -> 3072 155 -> 72, 206 -> 119, 280 -> 266 us.
constexpr int64_t kFewRows = 16;
// Rows of A per pass over a block of w (dot_columns' register tile): past 8 rows the
// partial sums would not fit in the registers with their chains. 9 to 16 rows take two
// groups over w's rows while they are in cache: at 12 and 16 rows the shapes above and a
// 256 -> 1024 Linear took 0.45-0.87 of the packed path's time (the head 2.2 and 3.3 ms
// against 5.0 and 6.4); at 24 rows two of the four were slower, at 32 three.
constexpr int64_t kFewRowsGroup = 8;
// The columns a thread's range is taken in: their rows of w (one depth chunk of each)
// kept in L2 while every group of rows passes over them.
constexpr int64_t kFewRowsBlockBytes = 256 * 1024;
// 16 KB of A rows per depth chunk, half of Zen 4's L1: at 24 KB (or no chunks) a 3072 ->
// 768 Linear took 106 instead of 82 us at 2 rows, 150-220 instead of 128 at 4.
constexpr int64_t kFewRowsChunkBytes = 16 * 1024;

// W depths of one row of B as a vector of T, the first n <= W of them read, the rest
// zero; a bfloat16 B (autocast's weights, gemm_bf16_weight) widened in registers
// (load_as).
template <class T, class TB>
inline typename Vec<T>::type load_depths(const TB* src, int64_t n) {
  constexpr int W = Vec<T>::width;
  if constexpr (std::is_same_v<T, TB>) {
    return n == W ? load(src) : load_first(src, n);
  } else {
    if (n == W) return load_as<T>(src);
    TB line[W] = {};
    std::copy(src, src + n, line);
    return load_as<T>(line);
  }
}

// Columns [j0, j1) of C (R rows) = or += A · B over depths [0, K), B(k, j) at
// bt[j * ldb + k] of type TB (T, or bfloat16 for a float32 product: load_depths), A's
// rows contiguous (row stride a_rs). The bias, when given, is added as C is written.
template <class T, int R, int U, class TB>
void dot_columns(int64_t j0, int64_t j1, int64_t K, const T* A, int64_t a_rs, const TB* bt, int64_t ldb, T* C,
                 int64_t c_rs, int64_t c_cs, bool accumulate, Addend<T> bias) {
  using V = typename Vec<T>::type;
  constexpr int W = Vec<T>::width;
  for (int64_t j = j0; j < j1; ++j) {
    const TB* col = bt + j * ldb;
    V acc[R][U] = {};
    int64_t p0 = 0;
    for (; p0 + U * W <= K; p0 += U * W)
#pragma GCC unroll 8
      for (int u = 0; u < U; ++u) {
        const V b = load_depths<T>(col + p0 + u * W, W);
#pragma GCC unroll 8
        for (int m = 0; m < R; ++m) acc[m][u] += load<T>(A + m * a_rs + p0 + u * W) * b;
      }
    for (; p0 < K; p0 += W) {  // fewer than U vectors of depth left, the last maybe partial
      const int64_t depth = std::min<int64_t>(W, K - p0);
      const V b = load_depths<T>(col + p0, depth);
#pragma GCC unroll 8
      for (int m = 0; m < R; ++m) acc[m][0] += load_depths<T>(A + m * a_rs + p0, depth) * b;
    }
#pragma GCC unroll 8
    for (int m = 0; m < R; ++m) {
      V v = acc[m][0];
      for (int u = 1; u < U; ++u) v += acc[m][u];
      const T sum = lane_sum<T>(v);
      T& dst = C[m * c_rs + j * c_cs];
      dst = accumulate ? dst + sum : sum + (bias ? bias.get(m, j) : T(0));
    }
  }
}

// dot_columns for R = M rows, U chains per row: 4 for 1 or 2 rows, 2 up to 6, 1 for 7
// and 8 (R x U accumulators, at most 12 of the 32 vector registers).
template <class T, class TB>
void dot_columns(int64_t M, int64_t j0, int64_t j1, int64_t K, const T* A, int64_t a_rs, const TB* bt, int64_t ldb,
                 T* C, int64_t c_rs, int64_t c_cs, bool accumulate, Addend<T> bias) {
  switch (M) {
#define MU_FEW_ROWS(R, U) \
  case R: return dot_columns<T, R, U, TB>(j0, j1, K, A, a_rs, bt, ldb, C, c_rs, c_cs, accumulate, bias);
    MU_FEW_ROWS(1, 4) MU_FEW_ROWS(2, 4) MU_FEW_ROWS(3, 2) MU_FEW_ROWS(4, 2)
    MU_FEW_ROWS(5, 2) MU_FEW_ROWS(6, 2) MU_FEW_ROWS(7, 1) MU_FEW_ROWS(8, 1)
#undef MU_FEW_ROWS
  }
  MU_FAIL("gemm: a few-row product called with ", M, " rows, outside [1, ", kFewRowsGroup, "]");
}

// C (M x N, 1 <= M <= kFewRows) = or += A · B for B(k, j) at bt[j * ldb + k], N >= W,
// K >= W: threads take contiguous ranges of columns. Within a range, blocks of columns
// (their rows of w kept in L2, kFewRowsBlockBytes) are taken by every depth chunk, and
// within a chunk by every group of at most kFewRowsGroup rows of A, so that w is read from
// memory once however many groups there are. A with non-unit column stride is first
// copied dense (M x K values, next to B's N x K). Each element of C is summed in the same
// order on any number of threads.
template <class T, class TB = T>
void gemm_few_rows(int64_t M, int64_t N, int64_t K, const T* A, int64_t a_rs, int64_t a_cs, const TB* bt,
                   int64_t ldb, T* C, int64_t c_rs, int64_t c_cs, bool accumulate, int nt, Addend<T> bias) {
  constexpr int W = Vec<T>::width;
  if (a_cs != 1) {
    A = dense_rows(M, K, A, a_rs, a_cs, packed_a_buffer<T>(M * K));
    a_rs = K;
  }
  // Rows in groups of equal size (within one), each at most kFewRowsGroup.
  const int64_t groups = (M + kFewRowsGroup - 1) / kFewRowsGroup;
  const int64_t group_rows = (M + groups - 1) / groups;
  // Equal chunks of whole vectors, each at most kFewRowsChunkBytes of a group's rows of A.
  const int64_t chunks = (group_rows * K * int64_t(sizeof(T)) + kFewRowsChunkBytes - 1) / kFewRowsChunkBytes;
  const int64_t kc = ((K + chunks - 1) / chunks + W - 1) / W * W;
  const int64_t cb = std::max<int64_t>(W, kFewRowsBlockBytes / (kc * int64_t(sizeof(TB))));
  split_range(N, nt, [&](int64_t j0, int64_t j1) {
    for (int64_t jb = j0; jb < j1; jb += cb)
      for (int64_t k0 = 0; k0 < K; k0 += kc)
        for (int64_t i0 = 0; i0 < M; i0 += group_rows)
          dot_columns<T, TB>(std::min(group_rows, M - i0), jb, std::min(j1, jb + cb), std::min(kc, K - k0),
                             A + i0 * a_rs + k0, a_rs, bt + k0, ldb, C + i0 * c_rs, c_rs, c_cs, accumulate || k0 > 0,
                             k0 > 0 ? Addend<T>{} : bias.at(i0, 0));
  });
}

// ---------------------------------------------------------------- native entry

// C = the addend: the paths without a bias epilogue add the product onto it instead.
template <class T>
void fill_bias_rows(int64_t M, int64_t N, Addend<T> bias, T* C, int64_t c_rs, int64_t c_cs) {
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) C[i * c_rs + j * c_cs] = bias.get(i, j);
}

// One product on `nt` threads, K > 0: picks the path for its shape. A bias (not when
// accumulating) is added as the small, blocked and dot-product paths store C; the
// matrix-vector and deep paths accumulate onto C filled with it.
template <class T>
void gemm_one(int64_t M, int64_t N, int64_t K, const T* A, int64_t a_rs, int64_t a_cs, const T* B, int64_t b_rs,
              int64_t b_cs, T* C, int64_t c_rs, int64_t c_cs, bool accumulate, int nt, Addend<T> bias) {
  const double work = double(M) * double(N) * double(K);
  const bool small = (work <= kSmallWork && double(K) * double(N) * sizeof(T) <= kSmallBBytes && b_cs == 1) ||
                     work <= kTinyWork || (K <= kTinyDepth && double(K) * double(N) * sizeof(T) <= kSmallBBytes);
  if (bias && (N == 1 || M == 1 || (!small && deep_product(M, N, K)))) {
    fill_bias_rows(M, N, bias, C, c_rs, c_cs);
    accumulate = true;
    bias = {};
  }
  if (N == 1)  // C column = A · b column
    return gemv<T>(M, K, A, a_rs, a_cs, B, b_rs, C, c_rs, accumulate, nt);
  if (M > 1 && tiny_product_fits<T>(M, N, K))
    return tiny_product<T>(M, N, K, A, a_rs, a_cs, B, b_rs, b_cs, C, c_rs, c_cs, accumulate, bias);
  if (M > 1 && N < Vec<T>::width && K >= Vec<T>::width && a_cs == 1 && b_rs == 1) {
    // Narrower than a vector, with A's rows and B's columns both running along the depth
    // (a tensor ring's chain gradient: 2048 products of 4 x 4 over 149): one dot product
    // per element. The vector paths would copy B dense and pad it to a vector's width,
    // which cost ten times the arithmetic.
    split_range(M, nt, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i)
        for (int64_t j = 0; j < N; ++j) {
          const T v = dot<T>(K, A + i * a_rs, 1, B + j * b_cs, 1);
          T& dst = C[i * c_rs + j * c_cs];
          dst = accumulate ? dst + v : v + (bias ? bias.get(i, j) : T(0));
        }
    });
    return;
  }
  if (M == 1)  // C row = Bᵀ · a row
    return gemv<T>(N, K, B, b_cs, b_rs, A, a_cs, C, c_cs, accumulate, nt);
  if (M <= kFewRows && b_rs == 1 && b_cs != 1 && N >= Vec<T>::width && K >= Vec<T>::width && !small)
    return gemm_few_rows<T>(M, N, K, A, a_rs, a_cs, B, b_cs, C, c_rs, c_cs, accumulate, nt, bias);
  if (small) return gemm_small<T>(M, N, K, A, a_rs, a_cs, B, b_rs, b_cs, C, c_rs, c_cs, accumulate, nt, bias);
  if (deep_product(M, N, K)) return gemm_deep<T>(M, N, K, A, a_rs, a_cs, B, b_rs, b_cs, C, c_rs, c_cs, accumulate, nt);
  gemm_blocked<T>(M, N, K, A, a_rs, a_cs, B, b_rs, b_cs, C, c_rs, c_cs, accumulate, nt, bias);
}

template <class T>
void gemm_native(int64_t batch, int64_t M, int64_t N, int64_t K, MatrixRef<const T> A, MatrixRef<const T> B,
                 MatrixRef<T> C, bool accumulate, Addend<T> bias) {
  int nt = omp_in_parallel() ? 1 : omp_get_max_threads();
  if (2.0 * double(M) * double(N) * double(K) * double(batch) < kParallelFlops) nt = 1;
  auto one = [&](int64_t b, int threads) {
    gemm_one<T>(M, N, K, A.data + b * A.batch_stride, A.row_stride, A.col_stride, B.data + b * B.batch_stride,
                B.row_stride, B.col_stride, C.data + b * C.batch_stride, C.row_stride, C.col_stride, accumulate,
                threads, bias);
  };
  // Enough products to share out evenly: whole products per thread, no synchronisation.
  if (nt > 1 && batch >= nt && (batch % nt == 0 || batch >= 4 * nt)) {
    // Products handed out one at a time, so that a thread slowed by another process takes
    // fewer; tiny ones in runs of about kTinyRun flops each, since taking a product off the
    // shared counter costs more than a 4 x 4 x 149 product (a tensor ring's chain).
    const double flops = 2.0 * double(M) * double(N) * double(K);
    const int64_t run = std::clamp<int64_t>(int64_t(kTinyRun / flops), 1, std::max<int64_t>(1, batch / (8 * nt)));
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
    for (int64_t r0 = 0; r0 < batch; r0 += run)
      for (int64_t b = r0; b < std::min(batch, r0 + run); ++b) one(b, 1);
    return;
  }
  for (int64_t b = 0; b < batch; ++b) one(b, nt);
}

// ---------------------------------------------------------------- OpenBLAS

#ifdef MUMOE_OPENBLAS
// Whether Auto sends large products (M N K >= kBlasMinWork) to OpenBLAS. It does not:
// measured on this Zen 4 machine with OpenBLAS 0.3.21 (pthreads build), the native
// kernel is as fast or faster at every shape tried (1024^3: ~209 vs ~205 GFLOP/s on 2
// threads), and OpenBLAS runs its own thread pool, which contends with the OpenMP
// workers that spin after every elementwise op: a 512^3 product alternating with an
// OpenMP loop took 3.6 ms through OpenBLAS against 1.3 ms native. Flip this where a
// BLAS does better; MUMOE_GEMM=blas or set_gemm_backend(Blas) forces it anyway.
constexpr bool kAutoUsesBlas = false;
constexpr double kBlasMinWork = 128.0 * 128.0 * 128.0;

// How BLAS can read an operand of `rows` x `cols` with strides (rs, cs): row-major
// (NoTrans, leading dimension rs) or column-major (Trans, leading dimension cs). A size-1
// dimension's stride is never used, so it may take whatever value BLAS requires.
bool blas_layout(int64_t rows, int64_t cols, int64_t rs, int64_t cs, CBLAS_TRANSPOSE& trans, int64_t& ld) {
  if ((cs == 1 || cols == 1) && (rows == 1 || rs >= std::max<int64_t>(1, cols))) {
    trans = CblasNoTrans;
    ld = rows == 1 ? std::max<int64_t>(1, cols) : rs;
    return ld <= INT_MAX;
  }
  if ((rs == 1 || rows == 1) && (cols == 1 || cs >= std::max<int64_t>(1, rows))) {
    trans = CblasTrans;
    ld = cols == 1 ? std::max<int64_t>(1, rows) : cs;
    return ld <= INT_MAX;
  }
  return false;
}

void blas_gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, const float* A, int lda, const float* B,
               int ldb, float beta, float* C, int ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
}
void blas_gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, const double* A, int lda,
               const double* B, int ldb, double beta, double* C, int ldc) {
  cblas_dgemm(CblasRowMajor, ta, tb, M, N, K, 1.0, A, lda, B, ldb, beta, C, ldc);
}

// Runs the whole batch through OpenBLAS if every operand has a layout it accepts;
// returns false (having done nothing) otherwise.
template <class T>
bool blas_layouts(int64_t M, int64_t N, int64_t K, const MatrixRef<const T>& A, const MatrixRef<const T>& B,
                  const MatrixRef<T>& C, CBLAS_TRANSPOSE& ta, CBLAS_TRANSPOSE& tb, int64_t& lda, int64_t& ldb,
                  int64_t& ldc) {
  CBLAS_TRANSPOSE tc;
  if (M > INT_MAX || N > INT_MAX || K > INT_MAX) return false;
  if (!blas_layout(M, K, A.row_stride, A.col_stride, ta, lda)) return false;
  if (!blas_layout(K, N, B.row_stride, B.col_stride, tb, ldb)) return false;
  // C is written row-major, so it must be NoTrans.
  return blas_layout(M, N, C.row_stride, C.col_stride, tc, ldc) && tc == CblasNoTrans;
}

// Whether BLAS can run this product (the layouts it accepts).
template <class T>
bool blas_can(int64_t M, int64_t N, int64_t K, const MatrixRef<const T>& A, const MatrixRef<const T>& B,
              const MatrixRef<T>& C) {
  CBLAS_TRANSPOSE ta, tb;
  int64_t lda, ldb, ldc;
  return blas_layouts(M, N, K, A, B, C, ta, tb, lda, ldb, ldc);
}

template <class T>
bool try_blas(int64_t batch, int64_t M, int64_t N, int64_t K, MatrixRef<const T> A, MatrixRef<const T> B,
              MatrixRef<T> C, bool accumulate) {
  CBLAS_TRANSPOSE ta, tb;
  int64_t lda, ldb, ldc;
  if (!blas_layouts(M, N, K, A, B, C, ta, tb, lda, ldb, ldc)) return false;
  // OpenBLAS keeps its own thread pool: size it like the OpenMP team, once.
  static std::once_flag threads_set;
  std::call_once(threads_set, [] { openblas_set_num_threads(omp_get_max_threads()); });
  for (int64_t b = 0; b < batch; ++b)
    blas_gemm(ta, tb, int(M), int(N), int(K), A.data + b * A.batch_stride, int(lda), B.data + b * B.batch_stride,
              int(ldb), accumulate ? T(1) : T(0), C.data + b * C.batch_stride, int(ldc));
  return true;
}
#endif

// ---------------------------------------------------------------- backend choice

GemmBackend backend_from_env() {
  const char* s = std::getenv("MUMOE_GEMM");
  if (s == nullptr || *s == '\0') return GemmBackend::Auto;
  std::string v(s);
  if (v == "auto") return GemmBackend::Auto;
  if (v == "native") return GemmBackend::Native;
  if (v == "blas") {
    MU_CHECK(gemm_have_blas(), "MUMOE_GEMM=blas, but this build has no OpenBLAS (install libopenblas-dev and "
             "reconfigure, or set MUMOE_GEMM=native)");
    return GemmBackend::Blas;
  }
  MU_FAIL("MUMOE_GEMM must be auto, native or blas, got \"", v, "\"");
}

// -1 until the environment has been read.
std::atomic<int> g_backend{-1};

}  // namespace

bool gemm_have_blas() {
#ifdef MUMOE_OPENBLAS
  return true;
#else
  return false;
#endif
}

const char* gemm_backend_name(GemmBackend b) {
  switch (b) {
    case GemmBackend::Auto: return "auto";
    case GemmBackend::Native: return "native";
    case GemmBackend::Blas: return "blas";
  }
  return "?";
}

void set_gemm_backend(GemmBackend b) {
  MU_CHECK(b != GemmBackend::Blas || gemm_have_blas(),
           "set_gemm_backend(Blas): this build has no OpenBLAS (install libopenblas-dev and reconfigure)");
  g_backend.store(int(b));
}

GemmBackend gemm_backend() {
  int v = g_backend.load();
  if (v < 0) {
    v = int(backend_from_env());
    g_backend.store(v);
  }
  return GemmBackend(v);
}

template <class T>
void gemm(int64_t batch, int64_t M, int64_t N, int64_t K, MatrixRef<const T> A, MatrixRef<const T> B,
          MatrixRef<T> C, bool accumulate, const T* col_bias, const T* row_bias) {
  MU_CHECK(batch >= 0 && M >= 0 && N >= 0 && K >= 0, "gemm: negative size (batch ", batch, ", M ", M, ", N ", N,
           ", K ", K, ")");
  MU_CHECK(col_bias == nullptr || row_bias == nullptr, "gemm: a bias per column or one per row, not both");
  if (batch == 0 || M == 0 || N == 0) return;
  Addend<T> bias = col_bias ? Addend<T>{col_bias, 0, 1} : row_bias ? Addend<T>{row_bias, 1, 0} : Addend<T>{};
  if (accumulate) bias = {};  // documented: the bias goes with a product that writes C
  if (K == 0) {
    // An empty sum: C = 0 (or the bias), or C unchanged when accumulating.
    if (!accumulate)
      for (int64_t b = 0; b < batch; ++b)
        for (int64_t i = 0; i < M; ++i)
          for (int64_t j = 0; j < N; ++j)
            C.data[b * C.batch_stride + i * C.row_stride + j * C.col_stride] = bias ? bias.get(i, j) : T(0);
    return;
  }
#ifdef MUMOE_OPENBLAS
  const GemmBackend be = gemm_backend();
  // Inside someone else's parallel region OpenBLAS would add its own threads on top.
  const bool blas_wanted =
      !omp_in_parallel() && (be == GemmBackend::Blas || (be == GemmBackend::Auto && kAutoUsesBlas &&
                                                         double(M) * double(N) * double(K) >= kBlasMinWork));
  if (blas_wanted && bias && blas_can(M, N, K, A, B, C)) {
    // BLAS adds onto C (beta = 1) filled with the bias.
    for (int64_t b = 0; b < batch; ++b)
      fill_bias_rows(M, N, bias, C.data + b * C.batch_stride, C.row_stride, C.col_stride);
    accumulate = true;
    bias = {};
  }
  if (blas_wanted && !bias && try_blas<T>(batch, M, N, K, A, B, C, accumulate)) return;
#endif
  gemm_native<T>(batch, M, N, K, A, B, C, accumulate, bias);
}

bool bf16_weight_product_fits(int64_t M, int64_t N, int64_t K) {
  // With AVX512_BF16 these rows take gemm_bf16_few_rows (dot products on VDPBF16PS), whose
  // time grows with the rows, and more rows gemm_bf16, which computes up to 16 in the
  // time of one (its half-width tiles). Measured on 2 Zen 4 cores, the dot form against
  // gemm_bf16: GPT-2's 768 -> 3072 Linear at 8, 12 and 16 rows 110 / 210, 186 / 206,
  // 261 / 208 us (3072 -> 768 at 16: 298 / 233; 256 -> 1024 at 16: 53 / 28); GPT-2 mini's
  // head (256 -> 50257: 25.7 MB of weight, from memory) at 12 and 16 rows 1.65 / 1.83
  // and 1.58 / 2.20 ms.
  int64_t rows = kFewRows;
  if (gemm_bf16_available()) rows = N * K * int64_t(sizeof(bfloat16_t)) > (int64_t(16) << 20) ? 16 : 12;
  return M >= 1 && M <= rows && N >= Vec<float>::width && K >= Vec<float>::width;
}

void gemm_bf16_weight(int64_t M, int64_t N, int64_t K, const float* A, int64_t a_rs, int64_t a_cs,
                      const bfloat16_t* bt, int64_t ldb, float* C, int64_t c_rs, int64_t c_cs) {
  MU_CHECK(M >= 1 && M <= kFewRows && N >= Vec<float>::width && K >= Vec<float>::width, "gemm_bf16_weight: ", M, " x ", K, " by ", K, " x ", N,
           " is outside its shapes (1 to ", kFewRows, " rows; N and K at least ", Vec<float>::width, ")");
  int nt = omp_in_parallel() ? 1 : omp_get_max_threads();
  if (2.0 * double(M) * double(N) * double(K) < kParallelFlops) nt = 1;
  gemm_few_rows<float, bfloat16_t>(M, N, K, A, a_rs, a_cs, bt, ldb, C, c_rs, c_cs, false, nt, {});
}

bool gemm_tiny_product(int64_t M, int64_t N, int64_t K) { return M > 1 && tiny_product_fits<float>(M, N, K); }
void gemm_bf16_tiny(int64_t M, int64_t N, int64_t K, const bfloat16_t* A, int64_t a_rs, int64_t a_cs,
                    const bfloat16_t* B, int64_t b_rs, int64_t b_cs, float* C, int64_t ldc) {
  MU_CHECK(K >= 1 && gemm_tiny_product(M, N, K), "gemm_bf16_tiny: ", M, " x ", K, " by ", K, " x ", N,
           " is not a tiny product");
  bf16_tiny_product(M, N, K, A, a_rs, a_cs, B, b_rs, b_cs, C, ldc);
}
void gemm_bf16_tiny(int64_t M, int64_t N, int64_t K, const bfloat16_t* A, int64_t a_rs, int64_t a_cs,
                    const bfloat16_t* B, int64_t b_rs, int64_t b_cs, bfloat16_t* C, int64_t ldc) {
  MU_CHECK(K >= 1 && gemm_tiny_product(M, N, K), "gemm_bf16_tiny: ", M, " x ", K, " by ", K, " x ", N,
           " is not a tiny product");
  bf16_tiny_product(M, N, K, A, a_rs, a_cs, B, b_rs, b_cs, C, ldc);
}

template void gemm<float>(int64_t, int64_t, int64_t, int64_t, MatrixRef<const float>, MatrixRef<const float>,
                          MatrixRef<float>, bool, const float*, const float*);
template void gemm<double>(int64_t, int64_t, int64_t, int64_t, MatrixRef<const double>, MatrixRef<const double>,
                           MatrixRef<double>, bool, const double*, const double*);

}  // namespace mu::cpu
