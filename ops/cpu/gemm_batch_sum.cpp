// C = Σ_b A[b] · B[b]: the gradient of a matrix shared by every entry of a batched
// product (an MLP-Mixer's token weights, W · X[b] for 128 images: dW = Σ_b G[b] · X[b]ᵀ).
//
// Computing the 128 products and then summing them costs twice: each product is small
// (64 x 49 over a depth of 128) and both of its operands run contiguously along the
// depth, the one layout the packed GEMM (gemm_packed.cpp) must transpose element by element to
// pack, for a product too small to pay the packing back; and the 128 partial matrices go
// through memory once more to be summed. Here, when A[b]'s rows and B[b]'s columns are
// contiguous along the depth, each output element is a dot product over (b, k): a block
// of R x S outputs keeps R·S vectors of partial sums, loads R vectors of A and S of B per
// step of depth and multiplies every pair, with no packing; the partial sums are added
// across their lanes once, at the very end. Other layouts go through the GEMM, one
// product at a time, accumulating into C.
//
// The order of every sum is fixed by the shapes alone, never by the number of threads: a
// small C is summed over a fixed number of slabs of the batch, one thread per slab, and
// the slabs' partial C added in slab order; a larger C is cut into bands of whole
// register blocks, each summed by one thread over the whole batch.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <vector>

#include "ops/cpu/gemm.h"
#include "ops/cpu/parallel.h"
#include "ops/cpu/simd.h"
#include "tensor/error.h"

namespace mu::cpu {
namespace {

// Register block: R x S vectors of partial sums plus R + S operand vectors must fit in
// the register file (4 x 4 + 8 = 24 of 32 zmm; 3 x 3 + 6 = 15 of 16 ymm / xmm).
constexpr int kR = kVecRegs == 32 ? 4 : 3;
constexpr int kS = kR;
// A thread works through the batch in chunks whose operands (its rows of A and all of B)
// stay in its L2 cache while every block of its outputs passes over them.
constexpr int64_t kChunkBytes = 256 * 1024;
// Outputs are summed in tiles of at most kTile x kTile, whole register blocks.
constexpr int64_t kTile = 16 * kR;
static_assert(kTile % kR == 0 && kTile % kS == 0);
// C of at most kSlabOutput elements is summed in kSlabs slabs of the batch, one thread
// each (a number fixed so that the sums do not depend on the thread count; 4 shares out
// evenly on 2 or 4 threads).
constexpr int64_t kSlabOutput = 16 * 1024;
constexpr int64_t kSlabs = 4;

// The dot step per operand type E: the sums are kept in vectors of A (float32 for
// bfloat16 operands), and each step of depth loads W depths of a row of A[b] and of a
// column of B[b] and adds their products lane by lane. float32 and float64: a vector of
// each, multiplied and added. bfloat16 where the CPU has AVX512_BF16: 32 depths per
// vector, VDPBF16PS adding the products of each lane's two depths into its float32 sum
// (each rounded once as it is added; gemm_bf16.cpp); elsewhere a vector of float32
// depths, each bfloat16 widened exactly in registers (load_as), multiplied and added as
// float32 (no float32 copies of the operands).
template <class E>
struct DotStep {
  using A = E;
  using Sum = typename Vec<E>::type;
  using Operand = typename Vec<E>::type;
  static constexpr int W = Vec<E>::width;
  static constexpr bool kMaskedTail = false;  // the last K mod W depths: a scalar tail
  static Operand load_operand(const E* p) { return load(p); }
  static Sum madd(Sum c, Operand a, Operand b) { return c + a * b; }
};
#if defined(__AVX512BF16__) && defined(__AVX512F__) && defined(__x86_64__)
template <>
struct DotStep<bfloat16_t> {
  using A = float;
  using Sum = Vec<float>::type;
  typedef int16_t Operand __attribute__((vector_size(64)));
  static constexpr int W = 32;
  // The last K mod 32 depths: one more step on vectors zero past the depth (which add 0).
  static constexpr bool kMaskedTail = true;
  static Operand load_operand(const bfloat16_t* p) {
    Operand v;
    std::memcpy(&v, p, sizeof(v));
    return v;
  }
  static Operand load_operand(const bfloat16_t* p, int64_t n) {
    return Operand(_mm512_maskz_loadu_epi16(__mmask32((uint64_t(1) << n) - 1), p));
  }
  static Sum madd(Sum c, Operand a, Operand b) {
    return Sum(_mm512_dpbf16_ps(__m512(c), __m512bh(a), __m512bh(b)));
  }
};
#else
template <>
struct DotStep<bfloat16_t> {
  using A = float;
  using Sum = Vec<float>::type;
  using Operand = Vec<float>::type;
  static constexpr int W = Vec<float>::width;
  static constexpr bool kMaskedTail = false;  // the last K mod W depths: a scalar tail
  static Operand load_operand(const bfloat16_t* p) { return load_as<float>(p); }
  static Sum madd(Sum c, Operand a, Operand b) { return c + a * b; }
};
#endif

// The operands of one call, in elements: A[b] row i at a + b * a_bs + i * a_rs (depth
// contiguous), B[b] column j at b + b * b_bs + j * b_cs (depth contiguous).
template <class T>
struct DotOperands {
  const T* a;
  int64_t a_bs, a_rs;
  const T* b;
  int64_t b_bs, b_cs;
  int64_t K;
};

// Adds Σ_{b in [b0, b1)} Σ_k A[b][i + r][k] B[b][k][j + s] for r < R, s < S into the
// partial-sum vectors acc[r * acc_rs + s] (the whole vectors of the depth) and the scalars
// tail[r * acc_rs + s] (the last K mod W steps of each product).
template <class T, int R, int S>
void dot_block(const DotOperands<T>& op, int64_t i, int64_t j, int64_t b0, int64_t b1, bool prefetch_a,
               bool prefetch_b, typename DotStep<T>::Sum* acc, typename DotStep<T>::A* tail, int64_t acc_rs) {
  using D = DotStep<T>;
  using V = typename D::Sum;
  using Acc = typename D::A;
  constexpr int W = D::W;
  const int64_t K = op.K, kv = K / W * W;
  V c[R][S];
  for (int r = 0; r < R; ++r)
    for (int s = 0; s < S; ++s) c[r][s] = acc[r * acc_rs + s];
  for (int64_t bi = b0; bi < b1; ++bi) {
    const T* a = op.a + bi * op.a_bs + i * op.a_rs;
    const T* b = op.b + bi * op.b_bs + j * op.b_cs;
    // One pointer per row and column, advanced together: indexing from two bases with
    // runtime strides ran out of general registers, and GCC then reloaded each vector of
    // A for every multiply (twice the loads, half the speed).
    const T* ap[R];
    const T* bp[S];
    for (int r = 0; r < R; ++r) ap[r] = a + r * op.a_rs;
    for (int s = 0; s < S; ++s) bp[s] = b + s * op.b_cs;
    // The first pass over a chunk reads its operands from memory: it asks for the next
    // item's rows ahead (A's in the first column block, B's in the first row block);
    // later passes find them in cache. Runs of 128 values are too short for the
    // hardware's prefetcher to take them up in time.
    const bool ahead = bi + 1 < b1 && (prefetch_a || prefetch_b);
    for (int64_t k = 0; k < kv; k += W) {
      if (ahead) {
        if (prefetch_a)
          for (int r = 0; r < R; ++r) __builtin_prefetch(ap[r] + op.a_bs + k);
        if (prefetch_b)
          for (int s = 0; s < S; ++s) __builtin_prefetch(bp[s] + op.b_bs + k);
      }
      typename D::Operand av[R], bv[S];
      for (int r = 0; r < R; ++r) av[r] = D::load_operand(ap[r] + k);
      for (int s = 0; s < S; ++s) bv[s] = D::load_operand(bp[s] + k);
      // Pinned to registers (as in attention.cpp): left free, GCC folds a load into every
      // multiply-add and so loads each vector R or S times; the loop then runs on the
      // load ports (74 -> 136 GFLOP/s on one Zen 5 core for the Mixer's 64 x 49 sum).
      for (int r = 0; r < R; ++r) asm("" : "+v"(av[r]));
      for (int s = 0; s < S; ++s) asm("" : "+v"(bv[s]));
      for (int r = 0; r < R; ++r)
        for (int s = 0; s < S; ++s) c[r][s] = D::madd(c[r][s], av[r], bv[s]);
    }
    if constexpr (D::kMaskedTail) {
      if (kv < K) {
        typename D::Operand av[R], bv[S];
        for (int r = 0; r < R; ++r) av[r] = D::load_operand(ap[r] + kv, K - kv);
        for (int s = 0; s < S; ++s) bv[s] = D::load_operand(bp[s] + kv, K - kv);
        for (int r = 0; r < R; ++r)
          for (int s = 0; s < S; ++s) c[r][s] = D::madd(c[r][s], av[r], bv[s]);
      }
    } else if (kv < K)
      for (int r = 0; r < R; ++r)
        for (int s = 0; s < S; ++s) {
          Acc t = 0;
          for (int64_t k = kv; k < K; ++k) t += Acc(a[r * op.a_rs + k]) * Acc(b[s * op.b_cs + k]);
          tail[r * acc_rs + s] += t;
        }
  }
  for (int r = 0; r < R; ++r)
    for (int s = 0; s < S; ++s) acc[r * acc_rs + s] = c[r][s];
}

// dot_block for a block of r <= R rows and s <= S columns (the edges of C), each size a
// compile-time constant so that the partial sums stay in registers.
template <class T, int R, int S>
void dot_block_upto(int r, int s, const DotOperands<T>& op, int64_t i, int64_t j, int64_t b0, int64_t b1,
                    bool prefetch_a, bool prefetch_b, typename DotStep<T>::Sum* acc, typename DotStep<T>::A* tail,
                    int64_t acc_rs) {
  if constexpr (R > 1)
    if (r < R) return dot_block_upto<T, R - 1, S>(r, s, op, i, j, b0, b1, prefetch_a, prefetch_b, acc, tail, acc_rs);
  if constexpr (S > 1)
    if (s < S) return dot_block_upto<T, R, S - 1>(r, s, op, i, j, b0, b1, prefetch_a, prefetch_b, acc, tail, acc_rs);
  dot_block<T, R, S>(op, i, j, b0, b1, prefetch_a, prefetch_b, acc, tail, acc_rs);
}

// C[m0, m1) x [n0, n1) = the sum over the items [item0, item1), on the calling thread,
// for a rectangle of at most kTile x kTile outputs (its partial sums: 256 KB of AVX-512
// vectors).
template <class T>
void dot_tile(const DotOperands<T>& op, int64_t item0, int64_t item1, int64_t m0, int64_t m1, int64_t n0,
              int64_t n1, typename DotStep<T>::A* C, int64_t c_rs, int64_t c_cs) {
  using V = typename DotStep<T>::Sum;
  using Acc = typename DotStep<T>::A;
  constexpr int W = Vec<Acc>::width;
  const int64_t rows = m1 - m0, cols = n1 - n0;
  if (rows <= 0 || cols <= 0) return;
  // Grown once per thread, reused by later calls (a Mixer step makes eight of them).
  thread_local std::vector<V> acc_buffer;
  thread_local std::vector<Acc> tail_buffer;
  acc_buffer.assign(size_t(rows * cols), V{});
  tail_buffer.assign(size_t(rows * cols), Acc(0));
  V* acc = acc_buffer.data();
  Acc* tail = tail_buffer.data();
  const int64_t item_bytes = (rows + cols) * op.K * int64_t(sizeof(T));
  const int64_t chunk = std::clamp<int64_t>(kChunkBytes / std::max<int64_t>(1, item_bytes), 1, item1 - item0);
  for (int64_t b0 = item0; b0 < item1; b0 += chunk) {
    const int64_t b1 = std::min(item1, b0 + chunk);
    // A block's R rows of A (over the chunk) stay in L1 while the columns pass.
    for (int64_t i = m0; i < m1; i += kR)
      for (int64_t j = n0; j < n1; j += kS) {
        const int r = int(std::min<int64_t>(kR, m1 - i)), s = int(std::min<int64_t>(kS, n1 - j));
        const int64_t at = (i - m0) * cols + (j - n0);
        dot_block_upto<T, kR, kS>(r, s, op, i, j, b0, b1, j == n0, i == m0, acc + at, tail + at, cols);
      }
  }
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      const V& v = acc[i * cols + j];
      Acc sum = 0;
      for (int w = 0; w < W; ++w) sum += v[w];
      C[(m0 + i) * c_rs + (n0 + j) * c_cs] = sum + tail[i * cols + j];
    }
}

// The same for any rectangle, tile by tile: the partial sums of a whole band of a large C
// (a vector per output) would take 16 times its size.
template <class T>
void dot_rectangle(const DotOperands<T>& op, int64_t item0, int64_t item1, int64_t m0, int64_t m1, int64_t n0,
                   int64_t n1, typename DotStep<T>::A* C, int64_t c_rs, int64_t c_cs) {
  for (int64_t i = m0; i < m1; i += kTile)
    for (int64_t j = n0; j < n1; j += kTile)
      dot_tile<T>(op, item0, item1, i, std::min(m1, i + kTile), j, std::min(n1, j + kTile), C, c_rs, c_cs);
}

// The dot form of gemm_batch_sum (both operands contiguous along the depth) for operands
// of type T, C in DotStep<T>::A.
template <class T>
void batch_sum_dot(int64_t batch, int64_t M, int64_t N, int64_t K, MatrixRef<const T> A, MatrixRef<const T> B,
                   MatrixRef<typename DotStep<T>::A> C) {
  using Acc = typename DotStep<T>::A;
  const DotOperands<T> op{A.data, A.batch_stride, A.row_stride, B.data, B.batch_stride, B.col_stride, K};
  int nt = omp_in_parallel() ? 1 : omp_get_max_threads();
  if (2.0 * double(batch) * double(M) * double(N) * double(K) < kParallelFlops) nt = 1;
  if (M * N <= kSlabOutput && batch >= kSlabs) {
    // A small C: the batch is cut into kSlabs slabs, each summed whole by one thread into
    // its own partial C, and the partials added in slab order. Each thread then streams
    // whole items (a few contiguous runs of memory) that no other thread reads.
    thread_local std::vector<Acc> partial_buffer;  // of the calling thread: the workers only write into it
    partial_buffer.resize(size_t(kSlabs * M * N));
    Acc* partial = partial_buffer.data();
    parallel_for(
        kSlabs, nt,
        [&](int64_t sl) {
          dot_rectangle<T>(op, batch * sl / kSlabs, batch * (sl + 1) / kSlabs, 0, M, 0, N, partial + sl * M * N, N, 1);
        },
        Schedule::Dynamic);
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        Acc sum = partial[i * N + j];
        for (int64_t sl = 1; sl < kSlabs; ++sl) sum += partial[sl * M * N + i * N + j];
        C.data[i * C.row_stride + j * C.col_stride] = sum;
      }
    return;
  }
  // A larger C: each thread takes a band of whole register blocks along its longer side.
  const bool by_rows = M >= N;
  const int64_t blocks = by_rows ? (M + kR - 1) / kR : (N + kS - 1) / kS;
  nt = int(std::min<int64_t>(nt, blocks));
  // One band per thread (n == nt: the static schedule gives each thread one).
  parallel_for(nt, nt, [&](int64_t t) {
    const int64_t lo = blocks * t / nt, hi = blocks * (t + 1) / nt;
    if (by_rows)
      dot_rectangle<T>(op, 0, batch, lo * kR, std::min(M, hi * kR), 0, N, C.data, C.row_stride, C.col_stride);
    else
      dot_rectangle<T>(op, 0, batch, 0, M, lo * kS, std::min(N, hi * kS), C.data, C.row_stride, C.col_stride);
  });
}

}  // namespace

template <class T>
void gemm_batch_sum(int64_t batch, int64_t M, int64_t N, int64_t K, MatrixRef<const T> A, MatrixRef<const T> B,
                    MatrixRef<T> C) {
  MU_CHECK(batch >= 0 && M >= 0 && N >= 0 && K >= 0, "gemm_batch_sum: negative size (batch ", batch, ", M ", M,
           ", N ", N, ", K ", K, ")");
  if (M == 0 || N == 0) return;
  if (batch == 0 || K == 0) {  // an empty sum
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) C.data[i * C.row_stride + j * C.col_stride] = T(0);
    return;
  }
  const bool depth_contiguous = (A.col_stride == 1 || K == 1) && (B.row_stride == 1 || K == 1);
  if (!depth_contiguous) {
    // One product at a time through the GEMM, the first writing C and the rest adding.
    for (int64_t b = 0; b < batch; ++b)
      gemm<T>(1, M, N, K, {A.data + b * A.batch_stride, 0, A.row_stride, A.col_stride},
              {B.data + b * B.batch_stride, 0, B.row_stride, B.col_stride}, {C.data, 0, C.row_stride, C.col_stride},
              b > 0);
    return;
  }
  batch_sum_dot<T>(batch, M, N, K, A, B, C);
}

template void gemm_batch_sum<float>(int64_t, int64_t, int64_t, int64_t, MatrixRef<const float>,
                                    MatrixRef<const float>, MatrixRef<float>);
template void gemm_batch_sum<double>(int64_t, int64_t, int64_t, int64_t, MatrixRef<const double>,
                                     MatrixRef<const double>, MatrixRef<double>);

void gemm_batch_sum_bf16(int64_t batch, int64_t M, int64_t N, int64_t K, MatrixRef<const bfloat16_t> A,
                         MatrixRef<const bfloat16_t> B, MatrixRef<float> C) {
  MU_CHECK(batch >= 0 && M >= 0 && N >= 0 && K >= 0, "gemm_batch_sum_bf16: negative size (batch ", batch, ", M ", M,
           ", N ", N, ", K ", K, ")");
  MU_CHECK((A.col_stride == 1 || K <= 1) && (B.row_stride == 1 || K <= 1),
           "gemm_batch_sum_bf16: A's rows and B's columns must be contiguous along the depth (column stride of A ",
           A.col_stride, ", row stride of B ", B.row_stride, ")");
  if (M == 0 || N == 0) return;
  if (batch == 0 || K == 0) {
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) C.data[i * C.row_stride + j * C.col_stride] = 0.0f;
    return;
  }
  batch_sum_dot<bfloat16_t>(batch, M, N, K, A, B, C);
}

}  // namespace mu::cpu
