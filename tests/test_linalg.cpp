// Matrix products: the CPU GEMM on raw strided buffers and matmul/mm/bmm on tensors,
// each against a brute-force triple loop in double, over odd sizes, every operand layout
// and both backends (native kernel, OpenBLAS when linked); then the error messages. The
// tensor ops run on every test device, with operands drawn on the CPU and moved there.
#include <omp.h>

#include <cmath>
#include <functional>
#include <random>

#include "helpers.h"
#include "ops/cpu/gemm.h"
#include "ops/kernels/linalg.h"
#include "ops/profile.h"

using namespace mu;
using cpu::GemmBackend;

namespace {

// Sets the GEMM backend for one scope and restores the previous one afterwards.
struct BackendScope {
  GemmBackend saved = cpu::gemm_backend();
  explicit BackendScope(GemmBackend b) { cpu::set_gemm_backend(b); }
  ~BackendScope() { cpu::set_gemm_backend(saved); }
};

// Every backend this build has: Auto, the native kernel, and OpenBLAS if linked.
std::vector<GemmBackend> backends() {
  std::vector<GemmBackend> v = {GemmBackend::Native, GemmBackend::Auto};
  if (cpu::gemm_have_blas()) v.push_back(GemmBackend::Blas);
  return v;
}

// The backends to sweep for ops on `dev`: all of them on the CPU; elsewhere the choice
// does not apply, so one pass.
std::vector<GemmBackend> backends(Device dev) {
  return dev.is_cpu() ? backends() : std::vector<GemmBackend>{GemmBackend::Auto};
}

// ---------------------------------------------------------------- raw GEMM

// How an operand of rows x cols is laid out in its buffer.
// Padded and PaddedTransposed: row-major and transposed with 5 unused elements after each
// row (column), as a slice of a wider matrix is: the unit stride of the two plain layouts,
// but rows (columns) that are neither adjacent nor vector-aligned.
enum class Layout { RowMajor, Transposed, Strided, Padded, PaddedTransposed };
const char* layout_name(Layout l) {
  switch (l) {
    case Layout::RowMajor: return "row-major";
    case Layout::Transposed: return "transposed";
    case Layout::Strided: return "strided";
    case Layout::Padded: return "row-major, padded rows";
    case Layout::PaddedTransposed: return "transposed, padded columns";
  }
  return "?";
}

// The strides of a rows x cols matrix in layout l.
void layout_strides(int64_t rows, int64_t cols, Layout l, int64_t& rs, int64_t& cs) {
  switch (l) {
    case Layout::RowMajor: rs = cols, cs = 1; break;
    case Layout::Transposed: rs = 1, cs = rows; break;
    case Layout::Strided: rs = 2 * cols + 3, cs = 2; break;
    case Layout::Padded: rs = cols + 5, cs = 1; break;
    case Layout::PaddedTransposed: rs = 1, cs = rows + 5; break;
  }
}

// The elements a rows x cols matrix with strides (rs, cs) spans, its padding included.
int64_t layout_span(int64_t rows, int64_t cols, int64_t rs, int64_t cs) { return std::max(rows * rs, cols * cs); }

// A batch of rows x cols matrices in a buffer with the requested layout. Strided: row-major
// with every other column skipped and padding after each row (neither stride is 1).
template <class T>
struct Operand {
  std::vector<T> buf;
  int64_t batch_stride = 0, rs = 0, cs = 0;
  T& at(int64_t b, int64_t i, int64_t j) { return buf[size_t(b * batch_stride + i * rs + j * cs)]; }
};

template <class T>
Operand<T> make_operand(int64_t batch, int64_t rows, int64_t cols, Layout l, bool broadcast_batch, std::mt19937& rng) {
  Operand<T> o;
  layout_strides(rows, cols, l, o.rs, o.cs);
  const int64_t per = layout_span(rows, cols, o.rs, o.cs);
  o.batch_stride = broadcast_batch ? 0 : per + 5;  // +5: batch entries need not be adjacent
  o.buf.assign(size_t(std::max<int64_t>(1, (broadcast_batch ? 1 : batch) * (per + 5))), T(0));
  std::normal_distribution<double> nd;
  for (auto& v : o.buf) v = T(nd(rng));
  return o;
}

// C (+)= A·B computed by brute force in double; also the sum of |a||b| per element,
// which bounds the rounding error of any summation order.
template <class T>
void check_gemm(int64_t batch, int64_t M, int64_t N, int64_t K, Layout la, Layout lb, bool bcast_a, bool bcast_b,
                bool accumulate, std::mt19937& rng, bool with_bias = false, bool bias_per_row = false) {
  INFO("batch " << batch << " M " << M << " N " << N << " K " << K << " A " << layout_name(la) << (bcast_a ? " (broadcast)" : "")
                << " B " << layout_name(lb) << (bcast_b ? " (broadcast)" : "") << " accumulate " << accumulate
                << " backend " << cpu::gemm_backend_name(cpu::gemm_backend()) << " " << sizeof(T) * 8 << "-bit"
                << (with_bias ? (bias_per_row ? " with a bias per row" : " with a bias per column") : ""));
  Operand<T> A = make_operand<T>(batch, M, K, la, bcast_a, rng);
  Operand<T> B = make_operand<T>(batch, K, N, lb, bcast_b, rng);
  Operand<T> C = make_operand<T>(batch, M, N, Layout::RowMajor, false, rng);
  std::vector<T> c0 = C.buf;
  std::vector<T> bias(static_cast<size_t>(bias_per_row ? M : N));
  std::normal_distribution<double> nd;
  for (auto& v : bias) v = T(nd(rng));
  cpu::gemm<T>(batch, M, N, K, {A.buf.data(), A.batch_stride, A.rs, A.cs}, {B.buf.data(), B.batch_stride, B.rs, B.cs},
               {C.buf.data(), C.batch_stride, C.rs, C.cs}, accumulate, with_bias && !bias_per_row ? bias.data() : nullptr,
               with_bias && bias_per_row ? bias.data() : nullptr);
  const double eps = sizeof(T) == 4 ? 1e-4 : 1e-12;
  double worst = 0;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double ref = 0, mag = 0;
        for (int64_t k = 0; k < K; ++k) {
          double p = double(A.at(b, i, k)) * double(B.at(b, k, j));
          ref += p;
          mag += std::abs(p);
        }
        const size_t at = size_t(b * C.batch_stride + i * C.rs + j);
        if (accumulate) ref += double(c0[at]), mag += std::abs(double(c0[at]));
        // The bias goes with a product that writes C; accumulating ignores it.
        else if (with_bias) {
          const double v = double(bias[size_t(bias_per_row ? i : j)]);
          ref += v, mag += std::abs(v);
        }
        double err = std::abs(double(C.buf[at]) - ref) - eps * (mag + 1);
        worst = std::max(worst, err);
      }
  CHECK(worst <= 0);
  // Padding between rows and batch entries of C must be untouched.
  bool padding_intact = true;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t t = M * N; t < C.batch_stride; ++t)
      padding_intact = padding_intact && C.buf[size_t(b * C.batch_stride + t)] == c0[size_t(b * C.batch_stride + t)];
  CHECK(padding_intact);
}

// The bfloat16 kernels against the brute-force product in double of the same values,
// a(i, k), b(k, j) and c(i, j) read through the accessors: how far the worst element of C
// lies past 1e-4 (Σ_k |a(i, k) b(k, j)| + 1) from it, <= 0 when every element is within.
template <class A, class B, class C>
double worst_excess(int64_t M, int64_t N, int64_t K, A a, B b, C c) {
  double worst = 0;
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double ref = 0, mag = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double p = double(a(i, k)) * double(b(k, j));
        ref += p, mag += std::abs(p);
      }
      worst = std::max(worst, std::abs(double(c(i, j)) - ref) - 1e-4 * (mag + 1));
    }
  return worst;
}

template <class T>
void gemm_sweep() {
  std::mt19937 rng(42);
  for (GemmBackend be : backends()) {
    BackendScope scope(be);
    // Every combination of a few odd sizes, around the tile sizes (12 x 32 on AVX-512).
    // N = 45 leaves the unpacked path's column pairs one whole vector and a partial one
    // on AVX2 (2 x 16 + 8 + 5).
    for (int64_t M : {1, 7, 13, 33})
      for (int64_t N : {1, 5, 33, 45, 65})
        for (int64_t K : {1, 7, 65})
          check_gemm<T>(1, M, N, K, Layout::RowMajor, Layout::RowMajor, false, false, false, rng);
    // Tiny products (a tensor ring's per-token chains: at most 32^3 multiply-adds, C's rows
    // at most two vectors, depth at most 64): rows in blocks of 4, 2 and 1, one vector of
    // columns and two, a row-major B read with masked loads and other layouts gathered,
    // a batch shared among the threads, accumulating and with a bias per column or row.
    for (int64_t M : {2, 3, 7})
      for (int64_t N : {3, 16, 17, 32})
        for (int64_t K : {1, 9, 64}) {
          for (Layout la : {Layout::RowMajor, Layout::Transposed})
            for (Layout lb : {Layout::RowMajor, Layout::Transposed, Layout::Strided})
              check_gemm<T>(40, M, N, K, la, lb, false, false, false, rng);
          check_gemm<T>(3, M, N, K, Layout::RowMajor, Layout::RowMajor, false, false, true, rng);
          for (bool per_row : {false, true})
            check_gemm<T>(3, M, N, K, Layout::RowMajor, Layout::Transposed, false, false, false, rng, true, per_row);
        }
    // Larger and odd, every layout. With a row-major B these take the unpacked path for
    // small products, with other layouts the packed one (several depth blocks at K = 600).
    struct Dims { int64_t M, N, K; };
    for (Dims d : {Dims{257, 129, 65}, Dims{129, 257, 300}, Dims{65, 33, 600}, Dims{200, 200, 129}}) {
      for (Layout la : {Layout::RowMajor, Layout::Transposed, Layout::Strided})
        for (Layout lb : {Layout::RowMajor, Layout::Transposed, Layout::Strided})
          check_gemm<T>(1, d.M, d.N, d.K, la, lb, false, false, false, rng);
      check_gemm<T>(1, d.M, d.N, d.K, Layout::RowMajor, Layout::Transposed, false, false, true, rng);
    }
    // Past the small-product limits with no more rows than one row block and a narrow
    // row-major B: B's full panels read in place, its last partial one packed; every
    // layout of A, accumulating, with a bias.
    for (Layout la : {Layout::RowMajor, Layout::Transposed, Layout::Strided}) {
      check_gemm<T>(1, 150, 200, 1000, la, Layout::RowMajor, false, false, la == Layout::Strided, rng);
      for (bool per_row : {false, true})
        check_gemm<T>(1, 150, 200, 1000, la, Layout::RowMajor, false, false, false, rng, true, per_row);
    }
    // Past the small-product limits with a row-major B: packed, more rows than one row
    // block, more depth than one depth block, the threads splitting rows and columns.
    for (Layout la : {Layout::RowMajor, Layout::Transposed})
      for (bool acc : {false, true}) check_gemm<T>(1, 300, 260, 600, la, Layout::RowMajor, false, false, acc, rng);
    // Deep products (depth >= 2048 and >= 8 times the output's sides, as weight
    // gradients): the depth cut into four uneven slabs (three, rounded up to a multiple of
    // four so that 2 or 4 threads share them evenly) whose partial products are
    // added in order; every layout, accumulating or not, and a batch of them.
    for (Layout la : {Layout::RowMajor, Layout::Transposed, Layout::Strided})
      for (Layout lb : {Layout::RowMajor, Layout::Transposed, Layout::Strided})
        check_gemm<T>(1, 13, 37, 2100, la, lb, false, false, la == lb, rng);
    check_gemm<T>(3, 40, 70, 2100, Layout::Transposed, Layout::RowMajor, false, true, true, rng);
    // Deep products 9 to 10 panels wide (150 columns are 9.4 panels of double's 16, 300
    // are 9.4 of float's 32 on AVX-512): each slab reads B's full panels in place up to
    // 16 of them (more than other products), its last partial panel packed.
    for (int64_t N : {150, 300})
      for (Layout la : {Layout::RowMajor, Layout::Transposed})
        for (bool acc : {false, true}) check_gemm<T>(1, 40, N, 2500, la, Layout::RowMajor, false, false, acc, rng);
    // Deeper than 64 slabs of 1024: the slab count stops at 64 and the slabs grow.
    check_gemm<T>(1, 5, 9, 70000, Layout::Transposed, Layout::RowMajor, false, false, false, rng);
    // A bias added as C is stored (a Linear layer's, per column, or one per row), on
    // every path: small, blocked with a packed or an in-place A and edge tiles, deep,
    // matrix-vector, K = 0, a batch; and ignored when accumulating.
    for (Dims d : {Dims{33, 65, 47}, Dims{33, 45, 47}, Dims{200, 40, 300}, Dims{13, 37, 2100}, Dims{1, 70, 90}, Dims{70, 1, 90},
                   Dims{9, 33, 0}})
      for (Layout la : {Layout::RowMajor, Layout::Transposed})
        for (Layout lb : {Layout::RowMajor, Layout::Transposed})
          for (bool acc : {false, true})
            for (bool per_row : {false, true}) check_gemm<T>(1, d.M, d.N, d.K, la, lb, false, false, acc, rng, true, per_row);
    for (bool per_row : {false, true}) {
      check_gemm<T>(1, 130, 100, 300, Layout::RowMajor, Layout::Transposed, false, false, false, rng, true, per_row);
      check_gemm<T>(3, 40, 70, 200, Layout::RowMajor, Layout::Transposed, false, true, false, rng, true, per_row);
    }
    // Narrower than a vector with A's rows and B's columns along the depth (dot
    // products): alone, accumulating, with a bias, in a batch; and the same shapes with
    // other layouts, which take the vector paths.
    for (Layout lb : {Layout::Transposed, Layout::RowMajor})
      for (bool acc : {false, true}) {
        check_gemm<T>(1, 13, 5, 149, Layout::RowMajor, lb, false, false, acc, rng);
        for (bool per_row : {false, true})
          check_gemm<T>(1, 13, 5, 149, Layout::RowMajor, lb, false, false, acc, rng, true, per_row);
      }
    check_gemm<T>(9, 4, 4, 149, Layout::RowMajor, Layout::Transposed, false, false, false, rng);
    check_gemm<T>(2, 4, 7, 8, Layout::RowMajor, Layout::Transposed, false, true, false, rng);
    // Two to eight rows against a transposed B (x · Wᵀ at a few rows, W's rows read in
    // place): every row count; a partial last vector of columns; a partial last vector of
    // depth, with depths in one chunk (300) and in several (1100 and 2100 past 8 rows of
    // 16 KB); one vector of columns; every layout of A (non-unit column strides copied
    // dense), accumulating, with a bias per column and per row; a batch with B broadcast;
    // 9 to 16 rows in two groups; and 17 rows, past the path's limit (packed).
    for (int64_t M : {2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 17})
      for (Dims d : {Dims{M, 300, 257}, Dims{M, 37, 1100}, Dims{M, 16, 2100}})
        for (Layout la : {Layout::RowMajor, Layout::Transposed, Layout::Strided}) {
          check_gemm<T>(1, d.M, d.N, d.K, la, Layout::Transposed, false, false, la == Layout::Strided, rng);
          for (bool per_row : {false, true})
            check_gemm<T>(1, d.M, d.N, d.K, la, Layout::Transposed, false, false, false, rng, true, per_row);
        }
    check_gemm<T>(5, 8, 70, 300, Layout::RowMajor, Layout::Transposed, false, true, false, rng, true, false);
    // Matrix-vector shapes, each operand layout.
    for (Dims d : {Dims{300, 1, 257}, Dims{1, 300, 257}, Dims{1, 1, 1000}, Dims{700, 1, 3}, Dims{1, 700, 3}})
      for (Layout la : {Layout::RowMajor, Layout::Transposed, Layout::Strided})
        for (Layout lb : {Layout::RowMajor, Layout::Transposed, Layout::Strided})
          for (bool acc : {false, true}) check_gemm<T>(1, d.M, d.N, d.K, la, lb, false, false, acc, rng);
    // Few rows and many columns (the threads split columns), more columns than one block
    // of the packed path (4096 floats).
    check_gemm<T>(1, 7, 500, 40, Layout::RowMajor, Layout::RowMajor, false, false, false, rng);
    check_gemm<T>(1, 13, 4200, 9, Layout::Transposed, Layout::Transposed, false, false, true, rng);
    check_gemm<T>(1, 13, 4200, 9, Layout::Transposed, Layout::RowMajor, false, false, true, rng);
    // Batches: odd count (threads share each product), even count (one product per
    // thread), many tiny products, broadcast operands (batch stride 0).
    for (int64_t batch : {3, 4, 9}) {
      check_gemm<T>(batch, 33, 65, 47, Layout::RowMajor, Layout::RowMajor, false, false, false, rng);
      check_gemm<T>(batch, 33, 65, 47, Layout::Transposed, Layout::RowMajor, true, false, false, rng);
      check_gemm<T>(batch, 33, 65, 47, Layout::RowMajor, Layout::Transposed, false, true, true, rng);
      check_gemm<T>(batch, 2, 3, 4, Layout::RowMajor, Layout::RowMajor, false, false, false, rng);
    }
    check_gemm<T>(64, 70, 40, 50, Layout::RowMajor, Layout::Transposed, false, false, false, rng);
    // Depths of 1 to 8 (the broadcast-once path): rows in blocks of 4, 2 and 1, a partial
    // last vector of columns, every layout of A and B, accumulating, with a bias; a tall
    // product the threads split by rows; a tensor ring's chain, many 4 x 4 by 4 x 149
    // products handed to the threads in runs, with A transposed as in its gradient.
    for (int64_t K = 1; K <= 8; ++K)
      for (Layout la : {Layout::RowMajor, Layout::Transposed, Layout::Strided})
        for (Layout lb : {Layout::RowMajor, Layout::Transposed, Layout::Strided})
          for (bool per_row : {false, true})
            check_gemm<T>(1, 7, 45, K, la, lb, false, false, la == lb, rng, la == Layout::RowMajor && la != lb, per_row);
    for (bool per_row : {false, true})
      check_gemm<T>(1, 3000, 37, 6, Layout::Transposed, Layout::RowMajor, false, false, false, rng, true, per_row);
    check_gemm<T>(300, 4, 149, 4, Layout::RowMajor, Layout::RowMajor, false, false, false, rng);
    check_gemm<T>(300, 4, 149, 4, Layout::Transposed, Layout::RowMajor, false, false, true, rng);
  }
}

// Random shapes drawn around the limits where gemm_one switches paths (tiny, shallow,
// small, few rows, narrow dot products, matrix-vector, blocked, deep, and the in-place
// reads of A and B inside the packed path), each with random layouts (the padded ones
// too: unit-stride operands whose rows or columns are not adjacent), batch, broadcast,
// accumulation and bias: `draws` products against the brute-force loop. The fixed list
// of gemm_sweep holds each path's known edges; this catches the shapes between them.
template <class T>
void gemm_random_sweep(int draws, uint32_t seed) {
  std::mt19937 rng(seed);
  auto pick = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  const Layout layouts[] = {Layout::RowMajor, Layout::Transposed, Layout::Strided, Layout::Padded,
                            Layout::PaddedTransposed};
  for (int draw = 0; draw < draws; ++draw) {
    int64_t M = 1, N = 1, K = 1, batch = 1;
    Layout la = layouts[pick(0, 4)], lb = layouts[pick(0, 4)];
    switch (pick(0, 7)) {
      case 0: M = pick(2, 9), N = pick(1, 70), K = pick(1, 70); break;                 // tiny, shallow
      case 1: M = pick(2, 260), N = pick(2, 260), K = pick(1, 260); break;             // small
      case 2:  // few rows against a transposed B
        M = pick(1, 18), N = pick(8, 600), K = pick(8, 1300);
        lb = pick(0, 1) ? Layout::Transposed : Layout::PaddedTransposed;
        break;
      case 3: M = pick(2, 40), N = pick(1, 17), K = pick(8, 400); break;               // narrow
      case 4: (pick(0, 1) ? M : N) = 1, (pick(0, 1) ? N : M) = pick(1, 900), K = pick(1, 900); break;  // vector
      case 5: M = pick(100, 420), N = pick(100, 420), K = pick(100, 800); break;       // blocked
      case 6: M = pick(1, 128), N = pick(1, 520), K = pick(2048, 5200); break;         // deep (if it fits)
      default: M = pick(12, 200), N = pick(200, 600), K = pick(257, 1100); break;      // one row block, wide
    }
    if (pick(0, 5) == 0) batch = pick(2, 5);
    const bool bcast_a = batch > 1 && pick(0, 3) == 0, bcast_b = batch > 1 && !bcast_a && pick(0, 3) == 0;
    const bool acc = pick(0, 2) == 0, bias = !acc && pick(0, 1) == 1, per_row = pick(0, 1) == 1;
    check_gemm<T>(batch, M, N, K, la, lb, bcast_a, bcast_b, acc, rng, bias, per_row);
  }
}

}  // namespace

TEST_CASE("gemm matches a brute-force product on random shapes around every path's limits") {
  for (GemmBackend be : backends()) {
    BackendScope scope(be);
    gemm_random_sweep<float>(40, 11);
    gemm_random_sweep<double>(20, 12);
  }
}

TEST_CASE("gemm float32 matches a brute-force product over sizes, layouts and backends") { gemm_sweep<float>(); }
TEST_CASE("gemm float64 matches a brute-force product over sizes, layouts and backends") { gemm_sweep<double>(); }

// The sums of every path depend on the shape alone, never on the thread count: a deep
// product (depth slabs), a blocked one (row and column blocks), a small one and one of
// few rows against a transposed B give the same bits on one thread and on four.
TEST_CASE("gemm results are bit-identical on 1 and 4 threads") {
  std::mt19937 rng(7);
  struct Dims { int64_t M, N, K; Layout lb = Layout::RowMajor; };
  for (Dims d : {Dims{64, 49, 4100}, Dims{200, 150, 400}, Dims{33, 65, 47}, Dims{3000, 37, 6},
                 Dims{8, 300, 257, Layout::Transposed}}) {
    INFO("M " << d.M << " N " << d.N << " K " << d.K << " B " << layout_name(d.lb));
    Operand<float> A = make_operand<float>(1, d.M, d.K, Layout::Transposed, false, rng);
    Operand<float> B = make_operand<float>(1, d.K, d.N, d.lb, false, rng);
    std::vector<std::vector<float>> results;
    for (int threads : {1, 4}) {
      const int saved = omp_get_max_threads();
      omp_set_num_threads(threads);
      std::vector<float> c(size_t(d.M * d.N));
      cpu::gemm<float>(1, d.M, d.N, d.K, {A.buf.data(), 0, A.rs, A.cs}, {B.buf.data(), 0, B.rs, B.cs},
                       {c.data(), 0, d.N, 1}, false);
      omp_set_num_threads(saved);
      results.push_back(c);
    }
    CHECK(results[0] == results[1]);
  }
}

// A float32 product by a transposed bfloat16 matrix, read in place (autocast's few-row
// Linears): against the brute-force product in double of the same values, for row counts
// in one group and in two, depths and columns below, at and past a vector (and past a
// depth chunk), A and C strided; then the shapes it refuses, by name.
TEST_CASE("gemm_bf16_weight matches a brute-force product and refuses other shapes") {
  std::mt19937 rng(11);
  std::normal_distribution<double> nd;
  for (int64_t M : {1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 16})
    for (int64_t K : {16, 37, 1100, 2100})
      for (int64_t N : {16, 300}) {
        INFO("M " << M << " K " << K << " N " << N);
        std::vector<bfloat16_t> bt(size_t(N * (K + 3)));  // rows of K, 3 values apart
        for (auto& v : bt) v = bfloat16_t(float(nd(rng)));
        // A with columns 2 apart (copied dense first), C with rows N + 5 apart.
        std::vector<float> a(size_t(M * K * 2)), c(size_t(M * (N + 5)), -7.0f);
        for (auto& v : a) v = float(nd(rng));
        cpu::gemm_bf16_weight(M, N, K, a.data(), 2 * K, 2, bt.data(), K + 3, c.data(), N + 5, 1);
        CHECK(worst_excess(
                  M, N, K, [&](int64_t i, int64_t k) { return a[size_t(i * 2 * K + 2 * k)]; },
                  [&](int64_t k, int64_t j) { return float(bt[size_t(j * (K + 3) + k)]); },
                  [&](int64_t i, int64_t j) { return c[size_t(i * (N + 5) + j)]; }) <= 0);
        bool padding_intact = true;
        for (int64_t i = 0; i < M; ++i)
          for (int64_t j = N; j < N + 5; ++j) padding_intact = padding_intact && c[size_t(i * (N + 5) + j)] == -7.0f;
        CHECK(padding_intact);
      }
  std::vector<bfloat16_t> bt(64 * 64);
  std::vector<float> a(17 * 64), c(17 * 64);
  CHECK_THROWS_MU(cpu::gemm_bf16_weight(17, 64, 64, a.data(), 64, 1, bt.data(), 64, c.data(), 64, 1),
                  "17 x 64 by 64 x 64 is outside its shapes (1 to 16 rows");
  CHECK_THROWS_MU(cpu::gemm_bf16_weight(2, 64, 4, a.data(), 4, 1, bt.data(), 4, c.data(), 64, 1),
                  "2 x 4 by 4 x 64 is outside its shapes");
}

// A rows x cols matrix of normal values rounded to bfloat16 in layout l, its strides
// returned in rs and cs (Strided: every other column, rows padded).
std::vector<bfloat16_t> bf16_matrix(int64_t rows, int64_t cols, Layout l, int64_t& rs, int64_t& cs, std::mt19937& rng) {
  std::normal_distribution<double> nd;
  layout_strides(rows, cols, l, rs, cs);
  std::vector<bfloat16_t> v(size_t(layout_span(rows, cols, rs, cs)));
  for (auto& x : v) x = bfloat16_t(float(nd(rng)));
  return v;
}

// The bfloat16 product on VDPBF16PS (autocast's many-row products) against the
// brute-force product in double of the same values: row counts around the 12-row tile,
// columns around the 32-column tile, depths odd and even (the last pair half padding),
// every operand layout, C rows padded (the padding untouched); last panels of 16 lines
// or fewer (the half-width tiles) and of 17 to 31; B small enough to stay
// packed whole while A is packed panel by panel, and B past that (2.4 MB packed, at
// 30 x 600 by 2001); a transposed B (x · wᵀ) read in place below 256 rows and packed at
// 300. The bfloat16 C of the same product is, bit for bit, the float32 C
// rounded by bfloat16_t's own conversion (tensor/half.h); with a bias per column, per row or
// both, the float32 C plus the biases, rounded once.
TEST_CASE("gemm_bf16 matches a brute-force product over tile edges, odd depths and layouts") {
  if (!cpu::gemm_bf16_available()) {
    MESSAGE("skipped: this build's target has no AVX512_BF16 (autocast widens to float32 instead)");
    return;
  }
  std::mt19937 rng(13);
  std::normal_distribution<double> nd;
  struct Dims { int64_t M, N, K; };
  for (Dims d : {Dims{1, 1, 1}, Dims{11, 31, 3}, Dims{12, 32, 64}, Dims{13, 33, 257}, Dims{25, 100, 2},
                 Dims{40, 65, 300}, Dims{130, 200, 1000}, Dims{30, 600, 2001}, Dims{20, 50, 64}, Dims{52, 49, 10},
                 Dims{48, 48, 8}, Dims{300, 40, 66}})
    for (Layout la : {Layout::RowMajor, Layout::Transposed, Layout::Strided})
      for (Layout lb : {Layout::RowMajor, Layout::Transposed, Layout::Strided}) {
        INFO("M " << d.M << " N " << d.N << " K " << d.K << " A " << layout_name(la) << " B " << layout_name(lb));
        int64_t ars, acs, brs, bcs;
        const std::vector<bfloat16_t> a = bf16_matrix(d.M, d.K, la, ars, acs, rng),
                                      b = bf16_matrix(d.K, d.N, lb, brs, bcs, rng);
        const int64_t ldc = d.N + 3;
        std::vector<float> c(size_t(d.M * ldc), -7.0f);
        cpu::gemm_bf16(d.M, d.N, d.K, a.data(), ars, acs, b.data(), brs, bcs, c.data(), ldc);
        CHECK(worst_excess(
                  d.M, d.N, d.K, [&](int64_t i, int64_t k) { return float(a[size_t(i * ars + k * acs)]); },
                  [&](int64_t k, int64_t j) { return float(b[size_t(k * brs + j * bcs)]); },
                  [&](int64_t i, int64_t j) { return c[size_t(i * ldc + j)]; }) <= 0);
        bool padding_intact = true;
        for (int64_t i = 0; i < d.M; ++i)
          for (int64_t j = d.N; j < ldc; ++j) padding_intact = padding_intact && c[size_t(i * ldc + j)] == -7.0f;
        CHECK(padding_intact);
        std::vector<bfloat16_t> c16(size_t(d.M * ldc), bfloat16_t(-7.0f));
        cpu::gemm_bf16(d.M, d.N, d.K, a.data(), ars, acs, b.data(), brs, bcs, c16.data(), ldc);
        int64_t differing = 0;
        for (int64_t i = 0; i < d.M; ++i)
          for (int64_t j = 0; j < ldc; ++j) {
            const uint16_t want = j < d.N ? bfloat16_t(c[size_t(i * ldc + j)]).bits : bfloat16_t(-7.0f).bits;
            differing += c16[size_t(i * ldc + j)].bits != want;
          }
        CHECK(differing == 0);
        // With a bias per column (a Linear layer's), per row (the Mixer's token mixing) or
        // both, added to the sums before they are stored: bit for bit the float32 C above
        // plus the column's value, then the row's, and for a bfloat16 C that sum rounded
        // once, the padding still untouched.
        std::vector<float> col_bias(size_t(d.N)), row_bias(size_t(d.M));
        for (auto& x : col_bias) x = float(nd(rng));
        for (auto& x : row_bias) x = float(nd(rng));
        for (int which = 1; which <= 3; ++which) {
          const bool by_col = which & 1, by_row = which & 2;
          INFO((by_col ? "a bias per column " : "") << (by_row ? "a bias per row" : ""));
          std::vector<float> cb(size_t(d.M * ldc), -7.0f);
          std::vector<bfloat16_t> cb16(size_t(d.M * ldc), bfloat16_t(-7.0f));
          const float* cp = by_col ? col_bias.data() : nullptr;
          const float* rp = by_row ? row_bias.data() : nullptr;
          cpu::gemm_bf16(d.M, d.N, d.K, a.data(), ars, acs, b.data(), brs, bcs, cb.data(), ldc, cp, rp);
          cpu::gemm_bf16(d.M, d.N, d.K, a.data(), ars, acs, b.data(), brs, bcs, cb16.data(), ldc, cp, rp);
          int64_t differing_bias = 0;
          for (int64_t i = 0; i < d.M; ++i)
            for (int64_t j = 0; j < ldc; ++j) {
              float want = -7.0f;
              if (j < d.N) {
                want = c[size_t(i * ldc + j)];
                if (by_col) want += col_bias[size_t(j)];
                if (by_row) want += row_bias[size_t(i)];
              }
              differing_bias += cb[size_t(i * ldc + j)] != want;
              differing_bias += cb16[size_t(i * ldc + j)].bits != bfloat16_t(want).bits;
            }
          CHECK(differing_bias == 0);
        }
      }
  // An empty depth: each element of C is its column's bias plus its row's (zeros without).
  const std::vector<float> bias = {1.5f, -2.25f, 1.0f + 0x1p-9f}, row_bias = {0.5f, -0x1p-10f};
  std::vector<bfloat16_t> none;
  std::vector<float> c(2 * 3, -7.0f);
  std::vector<bfloat16_t> c16(2 * 3, bfloat16_t(-7.0f));
  cpu::gemm_bf16(2, 3, 0, none.data(), 0, 1, none.data(), 3, 1, c.data(), 3, bias.data());
  cpu::gemm_bf16(2, 3, 0, none.data(), 0, 1, none.data(), 3, 1, c16.data(), 3, bias.data());
  for (int64_t i = 0; i < 6; ++i) {
    CHECK(c[size_t(i)] == bias[size_t(i % 3)]);
    CHECK(c16[size_t(i)].bits == bfloat16_t(bias[size_t(i % 3)]).bits);
  }
  cpu::gemm_bf16(2, 3, 0, none.data(), 0, 1, none.data(), 3, 1, c16.data(), 3, bias.data(), row_bias.data());
  for (int64_t i = 0; i < 6; ++i)
    CHECK(c16[size_t(i)].bits == bfloat16_t(bias[size_t(i % 3)] + row_bias[size_t(i / 3)]).bits);
  cpu::gemm_bf16(2, 3, 0, none.data(), 0, 1, none.data(), 3, 1, c.data(), 3);
  for (float v : c) CHECK(v == 0.0f);
}

// The bfloat16 product on the float32 GEMM (autocast's products on CPUs without
// AVX512_BF16; on every CPU), against the brute-force product in double and against
// gemm<float> on float32 copies of the same values: shapes that take the packed paths
// (blocked, with edge tiles, and deep: the operands widened as they are packed) and the
// paths that read their operands in place (small, tiny, a few rows by a transposed B,
// matrix-vector: on float32 copies), every operand layout, C rows padded (the padding
// untouched), without a bias and with one per column or per row. The packed paths sum
// in gemm<float>'s order on operands laid out alike, so their results are the same bit
// for bit; so are the other paths' when both operands are row-major (their float32
// copies are laid out as the operands). A bfloat16 C (rows padded, and every other
// column) is the float32 C rounded, bit for bit, for the blocked products of depth up to
// 512 (their tiles round as they store, edge tiles included; whether a product is one
// is gemm_bf16_widening_rounds), and refused by name for the rest (callers round a
// float32 twin). A batch shares one B (batch stride 0) and
// writes each entry's own C.
TEST_CASE("gemm_bf16_widening matches gemm<float> on the widened operands and a brute-force product") {
  std::mt19937 rng(29);
  std::normal_distribution<double> nd;
  struct Dims { int64_t M, N, K; bool packed, rounds; };
  for (Dims d : {Dims{300, 300, 300, true, true}, Dims{400, 150, 512, true, true}, Dims{97, 1000, 200, true, true},
                 Dims{130, 200, 1000, true, false}, Dims{513, 77, 700, true, false}, Dims{20, 24, 4096, true, false},
                 Dims{33, 45, 65, false, false}, Dims{5, 40, 600, false, false}, Dims{4, 4, 9, false, false},
                 Dims{1, 70, 90, false, false}, Dims{70, 1, 90, false, false}})
    for (Layout la : {Layout::RowMajor, Layout::Transposed, Layout::Strided})
      for (Layout lb : {Layout::RowMajor, Layout::Transposed, Layout::Strided})
        for (int which = 0; which <= 2; ++which) {
          INFO("M " << d.M << " N " << d.N << " K " << d.K << " A " << layout_name(la) << " B "
                    << layout_name(lb) << (which == 1 ? " a bias per column" : which == 2 ? " a bias per row" : ""));
          int64_t ars, acs, brs, bcs;
          const std::vector<bfloat16_t> a = bf16_matrix(d.M, d.K, la, ars, acs, rng),
                                        b = bf16_matrix(d.K, d.N, lb, brs, bcs, rng);
          std::vector<float> af(a.size()), bf(b.size()), col_bias(size_t(d.N)), row_bias(size_t(d.M));
          for (size_t i = 0; i < a.size(); ++i) af[i] = float(a[i]);
          for (size_t i = 0; i < b.size(); ++i) bf[i] = float(b[i]);
          for (auto& x : col_bias) x = float(nd(rng));
          for (auto& x : row_bias) x = float(nd(rng));
          const float* cp = which == 1 ? col_bias.data() : nullptr;
          const float* rp = which == 2 ? row_bias.data() : nullptr;
          const int64_t ldc = d.N + 3;
          std::vector<float> c(size_t(d.M * ldc), -7.0f), want(size_t(d.M * ldc), -7.0f);
          cpu::gemm_bf16_widening(1, d.M, d.N, d.K, {a.data(), 0, ars, acs}, {b.data(), 0, brs, bcs},
                                  {c.data(), 0, ldc, 1}, cp, rp);
          cpu::gemm<float>(1, d.M, d.N, d.K, {af.data(), 0, ars, acs}, {bf.data(), 0, brs, bcs},
                           {want.data(), 0, ldc, 1}, false, cp, rp);
          CHECK(worst_excess(
                    d.M, d.N, d.K, [&](int64_t i, int64_t k) { return af[size_t(i * ars + k * acs)]; },
                    [&](int64_t k, int64_t j) { return bf[size_t(k * brs + j * bcs)]; },
                    [&](int64_t i, int64_t j) {
                      return double(c[size_t(i * ldc + j)]) - (cp ? cp[j] : 0.0) - (rp ? rp[i] : 0.0);
                    }) <= 0);
          int64_t differing = 0, padding = 0;
          for (int64_t i = 0; i < d.M; ++i)
            for (int64_t j = 0; j < ldc; ++j) {
              differing += c[size_t(i * ldc + j)] != want[size_t(i * ldc + j)];
              padding += j >= d.N && c[size_t(i * ldc + j)] != -7.0f;
            }
          if (d.packed || (la == Layout::RowMajor && lb == Layout::RowMajor)) CHECK(differing == 0);
          CHECK(padding == 0);
          // Shapes off the packed paths by a row-major B take the blocked one by a transposed
          // or strided B (33 x 45 x 65, 5 x 40 x 600): theirs is as the layout has it.
          const bool rounds = cpu::gemm_bf16_widening_rounds(d.M, d.N, d.K, acs, brs, bcs);
          if (d.packed) CHECK(rounds == d.rounds);
          for (const int64_t ccs : {1, 2}) {
            INFO("bfloat16 C, column stride " << ccs);
            const int64_t ld16 = ccs * d.N + 3;
            std::vector<bfloat16_t> c16(size_t(d.M * ld16), bfloat16_t(-7.0f));
            if (!rounds) {
              CHECK_THROWS_MU(cpu::gemm_bf16_widening(1, d.M, d.N, d.K, {a.data(), 0, ars, acs},
                                                      {b.data(), 0, brs, bcs}, {c16.data(), 0, ld16, ccs}, cp, rp),
                              "a bfloat16 C is for products whose tiles sum their whole depth");
              continue;
            }
            cpu::gemm_bf16_widening(1, d.M, d.N, d.K, {a.data(), 0, ars, acs}, {b.data(), 0, brs, bcs},
                                    {c16.data(), 0, ld16, ccs}, cp, rp);
            int64_t not_rounded = 0;
            for (int64_t i = 0; i < d.M; ++i)
              for (int64_t k = 0; k < ld16; ++k) {
                const bool element = k % ccs == 0 && k / ccs < d.N;
                const float w = element ? c[size_t(i * ldc + k / ccs)] : -7.0f;
                not_rounded += c16[size_t(i * ld16 + k)].bits != bfloat16_t(w).bits;
              }
            CHECK(not_rounded == 0);
          }
        }
  // A batch of 4 products sharing B (a Linear layer's weight), on the blocked path.
  const int64_t batch = 4, M = 256, K = 256, N = 300;
  int64_t ars, acs, brs, bcs;
  const std::vector<bfloat16_t> a = bf16_matrix(batch * M, K, Layout::RowMajor, ars, acs, rng),
                                b = bf16_matrix(K, N, Layout::Transposed, brs, bcs, rng);
  std::vector<float> af(a.size()), bf(b.size()), c(size_t(batch * M * N)), want(c.size());
  for (size_t i = 0; i < a.size(); ++i) af[i] = float(a[i]);
  for (size_t i = 0; i < b.size(); ++i) bf[i] = float(b[i]);
  cpu::gemm_bf16_widening(batch, M, N, K, {a.data(), M * ars, ars, acs}, {b.data(), 0, brs, bcs},
                          {c.data(), M * N, N, 1});
  cpu::gemm<float>(batch, M, N, K, {af.data(), M * ars, ars, acs}, {bf.data(), 0, brs, bcs}, {want.data(), M * N, N, 1});
  CHECK(c == want);
  std::vector<bfloat16_t> c16(c.size());
  cpu::gemm_bf16_widening(batch, M, N, K, {a.data(), M * ars, ars, acs}, {b.data(), 0, brs, bcs},
                          {c16.data(), M * N, N, 1});
  int64_t not_rounded = 0;
  for (size_t i = 0; i < c.size(); ++i) not_rounded += c16[i].bits != bfloat16_t(c[i]).bits;
  CHECK(not_rounded == 0);
  CHECK(worst_excess(
            batch * M, N, K, [&](int64_t i, int64_t k) { return af[size_t(i * ars + k * acs)]; },
            [&](int64_t k, int64_t j) { return bf[size_t(k * brs + j * bcs)]; },
            [&](int64_t i, int64_t j) { return c[size_t(i * N + j)]; }) <= 0);
  // An empty depth: C is the bias (zeros without); a negative size and two biases are refused.
  std::vector<float> c0(6, -7.0f);
  const std::vector<float> bias = {1.5f, -2.25f, 3.0f};
  cpu::gemm_bf16_widening(1, 2, 3, 0, {a.data(), 0, 0, 1}, {b.data(), 0, 3, 1}, {c0.data(), 0, 3, 1}, bias.data());
  for (int64_t i = 0; i < 6; ++i) CHECK(c0[size_t(i)] == bias[size_t(i % 3)]);
  std::vector<bfloat16_t> c0_16(6);
  cpu::gemm_bf16_widening(1, 2, 3, 0, {a.data(), 0, 0, 1}, {b.data(), 0, 3, 1}, {c0_16.data(), 0, 3, 1}, nullptr,
                          std::vector<float>{0.5f, -0.25f}.data());
  for (int64_t i = 0; i < 6; ++i) CHECK(float(c0_16[size_t(i)]) == (i < 3 ? 0.5f : -0.25f));
  CHECK_THROWS_MU(cpu::gemm_bf16_widening(1, -2, 3, 4, {a.data(), 0, 4, 1}, {b.data(), 0, 3, 1}, {c0.data(), 0, 3, 1}),
                  "gemm_bf16_widening: negative size (batch 1, M -2, N 3, K 4)");
  CHECK_THROWS_MU(cpu::gemm_bf16_widening(1, 2, 3, 4, {a.data(), 0, 4, 1}, {b.data(), 0, 3, 1}, {c0.data(), 0, 3, 1},
                                          bias.data(), bias.data()),
                  "a bias per column or one per row, not both");
}

// The tiny form (a tensor ring's per-token chains; on every CPU) against the brute-force
// product in double: 2 to 33 rows, 1 to 32 columns (one vector of float32 and two: up to
// 16 columns on AVX2, 32 on AVX-512, so the wider shapes run where they are tiny), depths
// 1 to 64, every operand layout, C rows padded (the padding untouched). The bfloat16 C is
// the float32 C rounded, bit for bit; with a bias per column or per row, the float32 C plus
// the bias, rounded once. A shape past the tiny bounds is refused by name.
TEST_CASE("gemm_bf16_tiny matches a brute-force product, with and without a bias") {
  std::mt19937 rng(19);
  std::normal_distribution<double> nd;
  struct Dims { int64_t M, N, K; };
  for (Dims d : {Dims{2, 1, 1}, Dims{3, 16, 7}, Dims{7, 9, 2}, Dims{33, 16, 62}, Dims{5, 17, 64}, Dims{33, 32, 31}}) {
    if (d.N > 16 && !cpu::gemm_tiny_product(d.M, d.N, d.K)) continue;  // AVX2: two vectors are 16 columns
    for (Layout la : {Layout::RowMajor, Layout::Transposed, Layout::Strided})
      for (Layout lb : {Layout::RowMajor, Layout::Transposed, Layout::Strided}) {
        REQUIRE(cpu::gemm_tiny_product(d.M, d.N, d.K));
        INFO("M " << d.M << " N " << d.N << " K " << d.K << " A " << layout_name(la) << " B " << layout_name(lb));
        int64_t ars, acs, brs, bcs;
        const std::vector<bfloat16_t> a = bf16_matrix(d.M, d.K, la, ars, acs, rng),
                                      b = bf16_matrix(d.K, d.N, lb, brs, bcs, rng);
        const int64_t ldc = d.N + 3;
        std::vector<float> bias(size_t(d.N)), row_bias(size_t(d.M));
        for (auto& x : bias) x = float(nd(rng));
        for (auto& x : row_bias) x = float(nd(rng));
        std::vector<float> c(size_t(d.M * ldc), -7.0f), cb(c), cr(c);
        std::vector<bfloat16_t> c16(size_t(d.M * ldc), bfloat16_t(-7.0f)), cb16(c16), cr16(c16);
        cpu::gemm_bf16_tiny(d.M, d.N, d.K, a.data(), ars, acs, b.data(), brs, bcs, c.data(), ldc);
        cpu::gemm_bf16_tiny(d.M, d.N, d.K, a.data(), ars, acs, b.data(), brs, bcs, c16.data(), ldc);
        cpu::gemm_bf16_tiny(d.M, d.N, d.K, a.data(), ars, acs, b.data(), brs, bcs, cb.data(), ldc, bias.data());
        cpu::gemm_bf16_tiny(d.M, d.N, d.K, a.data(), ars, acs, b.data(), brs, bcs, cb16.data(), ldc, bias.data());
        cpu::gemm_bf16_tiny(d.M, d.N, d.K, a.data(), ars, acs, b.data(), brs, bcs, cr.data(), ldc, nullptr,
                            row_bias.data());
        cpu::gemm_bf16_tiny(d.M, d.N, d.K, a.data(), ars, acs, b.data(), brs, bcs, cr16.data(), ldc, nullptr,
                            row_bias.data());
        CHECK(worst_excess(
                  d.M, d.N, d.K, [&](int64_t i, int64_t k) { return float(a[size_t(i * ars + k * acs)]); },
                  [&](int64_t k, int64_t j) { return float(b[size_t(k * brs + j * bcs)]); },
                  [&](int64_t i, int64_t j) { return c[size_t(i * ldc + j)]; }) <= 0);
        int64_t differing = 0;
        for (int64_t i = 0; i < d.M; ++i)
          for (int64_t j = 0; j < ldc; ++j) {
            const bool inside = j < d.N;
            const float sum = c[size_t(i * ldc + j)];
            const float with_bias = inside ? sum + bias[size_t(j)] : -7.0f;
            const float with_row_bias = inside ? sum + row_bias[size_t(i)] : -7.0f;
            differing += !inside && sum != -7.0f;
            differing += c16[size_t(i * ldc + j)].bits != bfloat16_t(sum).bits;
            differing += cb[size_t(i * ldc + j)] != with_bias;
            differing += cb16[size_t(i * ldc + j)].bits != bfloat16_t(with_bias).bits;
            differing += cr[size_t(i * ldc + j)] != with_row_bias;
            differing += cr16[size_t(i * ldc + j)].bits != bfloat16_t(with_row_bias).bits;
          }
        CHECK(differing == 0);
      }
  }
  std::vector<bfloat16_t> a(64 * 64), b(64 * 64);
  std::vector<float> c(64 * 64);
  CHECK_THROWS_MU(cpu::gemm_bf16_tiny(40, 64, 64, a.data(), 64, 1, b.data(), 64, 1, c.data(), 64),
                  "gemm_bf16_tiny: 40 x 64 by 64 x 64 is not a tiny product");
}

// The few-row dot-product form (a decoding step's rows by a weight read in place) against
// the brute-force product in double: 1 to 16 rows, depths below, at and past one vector
// of 32 pairs' worth and past one chunk of 1024 (the sums of later chunks added onto C),
// A's rows and C's rows padded (C's padding untouched), C also written transposed. The
// shapes it refuses are named in the error.
TEST_CASE("gemm_bf16_few_rows matches a brute-force product over rows, depth tails, chunks and strides") {
  if (!cpu::gemm_bf16_available()) {
    MESSAGE("skipped: this build's target has no AVX512_BF16 (the few rows are widened to float32 instead)");
    return;
  }
  std::mt19937 rng(17);
  std::normal_distribution<double> nd;
  for (int64_t M : {1, 2, 5, 8, 11, 12, 13, 16})
    for (int64_t K : {1, 31, 32, 33, 1100, 2100})
      for (int64_t N : {1, 17, 300})
        for (bool transposed_c : {false, true}) {
          INFO("M " << M << " K " << K << " N " << N << (transposed_c ? " C transposed" : ""));
          std::vector<bfloat16_t> a(size_t(M * (K + 3))), w(size_t(N * (K + 5)));
          for (auto& v : a) v = bfloat16_t(float(nd(rng)));
          for (auto& v : w) v = bfloat16_t(float(nd(rng)));
          const int64_t c_rs = transposed_c ? 1 : N + 2, c_cs = transposed_c ? M + 2 : 1;
          std::vector<float> c(size_t(transposed_c ? N * (M + 2) : M * (N + 2)), -7.0f);
          cpu::gemm_bf16_few_rows(M, N, K, a.data(), K + 3, w.data(), K + 5, c.data(), c_rs, c_cs);
          CHECK(worst_excess(
                    M, N, K, [&](int64_t i, int64_t k) { return float(a[size_t(i * (K + 3) + k)]); },
                    [&](int64_t k, int64_t j) { return float(w[size_t(j * (K + 5) + k)]); },
                    [&](int64_t i, int64_t j) { return c[size_t(i * c_rs + j * c_cs)]; }) <= 0);
          int64_t written = 0;
          for (float v : c) written += v != -7.0f;
          CHECK(written == M * N);  // the padding untouched
        }
  std::vector<bfloat16_t> a(17 * 64), w(64 * 64);
  std::vector<float> c(17 * 64);
  CHECK_THROWS_WITH_AS(cpu::gemm_bf16_few_rows(17, 64, 64, a.data(), 64, w.data(), 64, c.data(), 64, 1),
                       doctest::Contains("17 x 64 by 64 x 64 is outside its shapes (1 to 16 rows"), Error);
}

// The rounding of a bfloat16 C on the values where it can go wrong: products exactly
// half-way between two bfloat16 values (ties to even, both ways), past the largest
// finite (infinity), NaN from inf · 0 (the one quiet NaN 0x7fc0), zeros. With
// K = 1 each element of C is one exact product a_i b_j, so the expected bits come from
// bfloat16_t's conversion of the float product, outside the kernel.
TEST_CASE("gemm_bf16 rounds a bfloat16 C as bfloat16_t does: ties, overflow, NaN, zeros") {
  if (!cpu::gemm_bf16_available()) {
    MESSAGE("skipped: this build's target has no AVX512_BF16 (autocast widens to float32 instead)");
    return;
  }
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  // 1 + 2^-7 times 1.5 is 1.5 + 2^-7 + 2^-8: half-way, rounded up to the even 1.5 + 2^-6;
  // the ties the table holds are counted below.
  const std::vector<float> as = {1.0f + 0x1p-7f, 3.0e38f, -3.0e38f, inf, 0.0f, -0.0f, 1.0f, -1.5f, 0x1p-100f, 7.0f,
                                 1.0f + 0x1p-6f, -2.0f, 0.5f};
  const std::vector<float> bs = {1.5f, 1.25f, 2.0f, 0.0f, -0.0f, nan, 1.0f + 0x1p-7f, 3.0f, 0x1p-60f, -1.0f,
                                 1.0f + 0x1p-5f, 1.0f + 3 * 0x1p-7f, 5.0f, inf, -inf, 1e-3f, 1.0f + 0x1p-6f,
                                 -1.75f, 0.75f, 33.0f, 1.0f, 0.0f, 2.5f, -0.25f, 1.0f + 5 * 0x1p-7f, 4.0f,
                                 9.0f, 0x1p20f, -0x1p-20f, 1.5f, 1.125f, 1.0f + 0x1p-4f, 6.0f};
  const int64_t M = int64_t(as.size()), N = int64_t(bs.size());
  std::vector<bfloat16_t> a, b;
  for (float v : as) a.push_back(bfloat16_t(v));
  for (float v : bs) b.push_back(bfloat16_t(v));
  for (Layout lb : {Layout::RowMajor, Layout::Transposed}) {  // the weight-in-place path takes B transposed, K even
    for (int64_t K : {1, 2}) {
      INFO("K " << K << " B " << layout_name(lb));
      // K = 2 adds a zero depth (a 0 times each b), which leaves each sum the one product.
      std::vector<bfloat16_t> ak(size_t(M * K), bfloat16_t(0.0f)), bk(size_t(K * N), bfloat16_t(0.0f));
      for (int64_t i = 0; i < M; ++i) ak[size_t(i * K)] = a[size_t(i)];
      const int64_t brs = lb == Layout::RowMajor ? N : 1, bcs = lb == Layout::RowMajor ? 1 : K;
      for (int64_t j = 0; j < N; ++j) bk[size_t(j * bcs)] = b[size_t(j)];
      std::vector<bfloat16_t> c(size_t(M * N));
      cpu::gemm_bf16(M, N, K, ak.data(), K, 1, bk.data(), brs, bcs, c.data(), N);
      int64_t differing = 0, ties = 0;
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) {
          const float p = float(a[size_t(i)]) * float(b[size_t(j)]);  // exact: 8-bit by 8-bit significands
          uint32_t pb;
          std::memcpy(&pb, &p, sizeof(pb));
          ties += std::isfinite(p) && (pb & 0xffffu) == 0x8000u;
          // The instruction takes products below float32's normals as zero (so does the
          // kernel's float32 C): those are left out.
          if (p != 0.0f && std::abs(p) < std::numeric_limits<float>::min()) continue;
          // The sum starts from +0, so a product of -0 leaves +0 (as any dot product does).
          differing += c[size_t(i * N + j)].bits != bfloat16_t(0.0f + p).bits;
        }
      CHECK(differing == 0);
      CHECK(ties >= 4);  // the half-way cases above are really in the table
    }
  }
}

// ---------------------------------------------------------------- batch-summed GEMM

namespace {

// C = Σ_b A[b]·B[b] against the brute-force sum in double, C written with padding
// between its rows (which must stay untouched).
// An operand's value in double (bfloat16 by way of the float32 it stands for).
template <class T>
double value_of(T x) {
  if constexpr (std::is_same_v<T, bfloat16_t>) return double(float(x));
  else return double(x);
}

// bfloat16 operands (gemm_batch_sum_bf16) sum into float32.
template <class T>
using BatchSumOut = std::conditional_t<std::is_same_v<T, bfloat16_t>, float, T>;

template <class T>
void check_batch_sum(int64_t batch, int64_t M, int64_t N, int64_t K, Layout la, Layout lb, bool bcast_a,
                     std::mt19937& rng) {
  using TC = BatchSumOut<T>;
  INFO("batch-summed: batch " << batch << " M " << M << " N " << N << " K " << K << " A " << layout_name(la)
                              << (bcast_a ? " (broadcast)" : "") << " B " << layout_name(lb) << " "
                              << (std::is_same_v<T, bfloat16_t> ? "bfloat16" : sizeof(T) == 4 ? "32-bit" : "64-bit"));
  Operand<T> A = make_operand<T>(batch, M, K, la, bcast_a, rng);
  Operand<T> B = make_operand<T>(batch, K, N, lb, false, rng);
  const int64_t ldc = N + 3;
  std::vector<TC> c(size_t(std::max<int64_t>(1, M * ldc)), TC(-7));
  if constexpr (std::is_same_v<T, bfloat16_t>)
    cpu::gemm_batch_sum_bf16(batch, M, N, K, {A.buf.data(), A.batch_stride, A.rs, A.cs},
                             {B.buf.data(), B.batch_stride, B.rs, B.cs}, {c.data(), 0, ldc, 1});
  else
    cpu::gemm_batch_sum<T>(batch, M, N, K, {A.buf.data(), A.batch_stride, A.rs, A.cs},
                           {B.buf.data(), B.batch_stride, B.rs, B.cs}, {c.data(), 0, ldc, 1});
  const double eps = sizeof(TC) == 4 ? 1e-4 : 1e-12;
  double worst = 0;
  bool padding_intact = true;
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t j = 0; j < N; ++j) {
      double ref = 0, mag = 0;
      for (int64_t b = 0; b < batch; ++b)
        for (int64_t k = 0; k < K; ++k) {
          const double p = value_of(A.at(b, i, k)) * value_of(B.at(b, k, j));
          ref += p;
          mag += std::abs(p);
        }
      worst = std::max(worst, std::abs(double(c[size_t(i * ldc + j)]) - ref) - eps * (mag + 1));
    }
    for (int64_t j = N; j < ldc && i * ldc + j < int64_t(c.size()); ++j)
      padding_intact = padding_intact && c[size_t(i * ldc + j)] == TC(-7);
  }
  CHECK(worst <= 0);
  CHECK(padding_intact);
}

template <class T>
void batch_sum_sweep() {
  std::mt19937 rng(11);
  struct Dims { int64_t batch, M, N, K; };
  // A Mixer's token-weight gradients (both orientations); odd edges and depth tails
  // (K mod 16 and mod 8 nonzero, K below one vector, K = 1); fewer items than slabs; a C
  // too large for slabs, split along its rows and along its columns.
  const Dims dims[] = {{128, 64, 49, 128}, {128, 49, 64, 128}, {7, 5, 3, 37}, {9, 13, 11, 70}, {6, 6, 7, 5},
                       {5, 9, 2, 1},       {2, 4, 4, 16},      {3, 1, 1, 19}, {3, 150, 130, 20}, {3, 20, 900, 33}};
  for (const Dims& d : dims)
    for (Layout la : {Layout::RowMajor, Layout::Transposed, Layout::Strided})
      for (Layout lb : {Layout::Transposed, Layout::RowMajor, Layout::Strided}) {
        // Every layout on the small shapes; the large ones in the depth-contiguous layout
        // (row-major A, transposed B) that takes the vector path, and one other. bfloat16
        // takes that layout alone (with AVX512_BF16 the depth in pairs, 32 per vector: K mod
        // 32 a masked tail; without, widened vectors of float32 and a scalar tail).
        const bool large = d.batch * d.M * d.N * d.K > 2'000'000;
        const bool dot_layout = la == Layout::RowMajor && lb == Layout::Transposed;
        if (std::is_same_v<T, bfloat16_t> && !dot_layout) continue;
        if (large && !dot_layout && !(la == Layout::Transposed && lb == Layout::RowMajor)) continue;
        check_batch_sum<T>(d.batch, d.M, d.N, d.K, la, lb, false, rng);
        if (dot_layout) check_batch_sum<T>(d.batch, d.M, d.N, d.K, la, lb, true, rng);  // A shared too
      }
}

}  // namespace

TEST_CASE("gemm_batch_sum float32 matches the brute-force sum of the batch's products") { batch_sum_sweep<float>(); }
TEST_CASE("gemm_batch_sum float64 matches the brute-force sum of the batch's products") { batch_sum_sweep<double>(); }
TEST_CASE("gemm_batch_sum_bf16 matches the brute-force sum of the batch's products, refuses other layouts") {
  batch_sum_sweep<bfloat16_t>();
  std::mt19937 rng(12);
  Operand<bfloat16_t> A = make_operand<bfloat16_t>(3, 4, 5, Layout::Transposed, false, rng);
  Operand<bfloat16_t> B = make_operand<bfloat16_t>(3, 5, 6, Layout::Transposed, false, rng);
  std::vector<float> c(24);
  CHECK_THROWS_MU(cpu::gemm_batch_sum_bf16(3, 4, 6, 5, {A.buf.data(), A.batch_stride, A.rs, A.cs},
                                           {B.buf.data(), B.batch_stride, B.rs, B.cs}, {c.data(), 0, 6, 1}),
                  "gemm_batch_sum_bf16: A's rows and B's columns must be contiguous along the depth "
                  "(column stride of A 4, row stride of B 1)");
}

// Slabs of the batch for a small C, bands of rows or columns for a large one: the same
// bits on one thread and on four, for float32 and bfloat16 operands.
template <class T>
void check_batch_sum_threads(int64_t batch, int64_t M, int64_t N, int64_t K, std::mt19937& rng) {
  Operand<T> A = make_operand<T>(batch, M, K, Layout::RowMajor, false, rng);
  Operand<T> B = make_operand<T>(batch, K, N, Layout::Transposed, false, rng);
  std::vector<std::vector<float>> results;
  for (int threads : {1, 4}) {
    const int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
    std::vector<float> c(size_t(M * N));
    if constexpr (std::is_same_v<T, bfloat16_t>)
      cpu::gemm_batch_sum_bf16(batch, M, N, K, {A.buf.data(), A.batch_stride, A.rs, A.cs},
                               {B.buf.data(), B.batch_stride, B.rs, B.cs}, {c.data(), 0, N, 1});
    else
      cpu::gemm_batch_sum<float>(batch, M, N, K, {A.buf.data(), A.batch_stride, A.rs, A.cs},
                                 {B.buf.data(), B.batch_stride, B.rs, B.cs}, {c.data(), 0, N, 1});
    omp_set_num_threads(saved);
    results.push_back(c);
  }
  CHECK(results[0] == results[1]);
}

TEST_CASE("gemm_batch_sum results are bit-identical on 1 and 4 threads") {
  std::mt19937 rng(8);
  struct Dims { int64_t batch, M, N, K; };
  for (Dims d : {Dims{128, 64, 49, 128}, Dims{3, 150, 130, 20}, Dims{3, 20, 900, 33}, Dims{10, 7, 9, 300}}) {
    INFO("batch " << d.batch << " M " << d.M << " N " << d.N << " K " << d.K);
    check_batch_sum_threads<float>(d.batch, d.M, d.N, d.K, rng);
    check_batch_sum_threads<bfloat16_t>(d.batch, d.M, d.N, d.K, rng);
  }
}

TEST_CASE("gemm_batch_sum of an empty batch or depth is zero; an empty C is not written") {
  std::vector<float> c(6, 7.0f);
  float dummy = 1.0f;
  cpu::gemm_batch_sum<float>(0, 2, 3, 4, {&dummy, 0, 4, 1}, {&dummy, 0, 1, 4}, {c.data(), 0, 3, 1});
  CHECK(c == std::vector<float>(6, 0.0f));
  c.assign(6, 7.0f);
  cpu::gemm_batch_sum<float>(5, 2, 3, 0, {&dummy, 0, 0, 1}, {&dummy, 0, 1, 0}, {c.data(), 0, 3, 1});
  CHECK(c == std::vector<float>(6, 0.0f));
  c.assign(6, 7.0f);
  cpu::gemm_batch_sum<float>(5, 0, 3, 4, {&dummy, 0, 4, 1}, {&dummy, 0, 1, 4}, {c.data(), 0, 3, 1});
  CHECK(c == std::vector<float>(6, 7.0f));
}

TEST_CASE("gemm with an empty dimension") {
  for (GemmBackend be : backends()) {
    BackendScope scope(be);
    // K = 0: C = 0, or unchanged when accumulating.
    std::vector<float> c(6, 7.0f);
    float dummy = 1.0f;
    cpu::gemm<float>(1, 2, 3, 0, {&dummy, 0, 0, 1}, {&dummy, 0, 3, 1}, {c.data(), 0, 3, 1}, true);
    CHECK(c == std::vector<float>(6, 7.0f));
    cpu::gemm<float>(1, 2, 3, 0, {&dummy, 0, 0, 1}, {&dummy, 0, 3, 1}, {c.data(), 0, 3, 1}, false);
    CHECK(c == std::vector<float>(6, 0.0f));
    // M = 0, N = 0 or batch = 0: nothing is written.
    std::vector<double> d(4, 3.0);
    double dd = 1.0;
    cpu::gemm<double>(1, 0, 2, 5, {&dd, 0, 5, 1}, {&dd, 0, 2, 1}, {d.data(), 0, 2, 1});
    cpu::gemm<double>(1, 2, 0, 5, {&dd, 0, 5, 1}, {&dd, 0, 0, 1}, {d.data(), 0, 0, 1});
    cpu::gemm<double>(0, 2, 2, 5, {&dd, 0, 5, 1}, {&dd, 0, 2, 1}, {d.data(), 0, 2, 1});
    CHECK(d == std::vector<double>(4, 3.0));
  }
}

TEST_CASE("gemm backend selection") {
  CHECK(std::string(cpu::gemm_backend_name(GemmBackend::Native)) == "native");
  CHECK(std::string(cpu::gemm_backend_name(GemmBackend::Blas)) == "blas");
  {
    BackendScope scope(GemmBackend::Native);
    CHECK(cpu::gemm_backend() == GemmBackend::Native);
  }
  if (!cpu::gemm_have_blas()) CHECK_THROWS_MU(cpu::set_gemm_backend(GemmBackend::Blas), "no OpenBLAS");
}

// ---------------------------------------------------------------- matmul on tensors

namespace {

// torch.matmul by brute force in double: promote 1-D operands, broadcast batch dims by
// index arithmetic, triple loop, drop the promoted dims.
Tensor ref_matmul(const Tensor& a, const Tensor& b) {
  Shape sa = a.shape(), sb = b.shape();
  if (a.dim() == 1) sa.insert(sa.begin(), 1);
  if (b.dim() == 1) sb.push_back(1);
  const int64_t M = sa[sa.size() - 2], K = sa.back(), N = sb.back();
  REQUIRE(sb[sb.size() - 2] == K);
  Shape ba(sa.begin(), sa.end() - 2), bb(sb.begin(), sb.end() - 2);
  Shape batch = broadcast_shapes(ba, bb, "ref_matmul");
  std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  const int64_t nb = numel_of(batch);
  std::vector<double> out(size_t(nb * M * N), 0.0);
  for (int64_t flat = 0; flat < nb; ++flat) {
    // Offsets of this batch entry's matrix in a and b.
    int64_t r = flat, oa = 0, ob = 0, mul_a = M * K, mul_b = K * N;
    for (int64_t d = int64_t(batch.size()) - 1; d >= 0; --d) {
      const int64_t i = r % batch[size_t(d)];
      r /= batch[size_t(d)];
      const int64_t la = d - int64_t(batch.size() - ba.size()), lb = d - int64_t(batch.size() - bb.size());
      if (la >= 0) {
        if (ba[size_t(la)] != 1) oa += i * mul_a;
        mul_a *= ba[size_t(la)];
      }
      if (lb >= 0) {
        if (bb[size_t(lb)] != 1) ob += i * mul_b;
        mul_b *= bb[size_t(lb)];
      }
    }
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double s = 0;
        for (int64_t k = 0; k < K; ++k) s += x[size_t(oa + i * K + k)] * y[size_t(ob + k * N + j)];
        out[size_t(flat * M * N + i * N + j)] = s;
      }
  }
  Shape os = batch;
  if (a.dim() > 1) os.push_back(M);
  if (b.dim() > 1) os.push_back(N);
  return from_vector<double>(out, os, kFloat64);
}

void check_matmul(const Tensor& a, const Tensor& b, const Shape& expected_shape) {
  INFO("matmul of " << shape_str(a.shape()) << " (strides " << shape_str(a.strides()) << ") and "
                    << shape_str(b.shape()) << " (strides " << shape_str(b.strides()) << "), "
                    << dtype_name(a.dtype()) << " on " << a.device().str() << ", backend "
                    << cpu::gemm_backend_name(cpu::gemm_backend()));
  Tensor y = matmul(a, b);
  CHECK(y.shape() == expected_shape);
  CHECK(y.dtype() == a.dtype());
  Tensor ref = ref_matmul(a, b);
  REQUIRE(ref.shape() == expected_shape);
  const double tol = a.dtype() == kFloat32 ? 1e-4 * (1 + std::sqrt(double(a.size(-1)))) : 1e-11;
  CHECK(max_abs_diff(y, ref) <= tol);
  // The method form is the same op. (max_abs_diff reads both through host copies.)
  CHECK(max_abs_diff(a.matmul(b), y) == 0);
}

}  // namespace

TEST_CASE("matmul follows torch.matmul's rules for every rank combination") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(1);
    for (GemmBackend be : backends(dev)) {
      BackendScope scope(be);
      for (DType dt : {kFloat32, kFloat64}) {
        auto r = [dt, dev](const Shape& s) { return on(randn(s, dt), dev); };
        check_matmul(r({7}), r({7}), {});                           // dot: 0-dim
        check_matmul(r({5, 7}), r({7}), {5});                       // matrix · vector
        check_matmul(r({7}), r({7, 4}), {4});                       // vector · matrix
        check_matmul(r({5, 7}), r({7, 4}), {5, 4});                 // matrix · matrix
        check_matmul(r({3, 5, 7}), r({7}), {3, 5});                 // batch · vector
        check_matmul(r({7}), r({3, 7, 4}), {3, 4});                 // vector · batch
        check_matmul(r({2, 3, 5, 7}), r({7, 4}), {2, 3, 5, 4});     // batch · matrix (folded)
        check_matmul(r({5, 7}), r({2, 3, 7, 4}), {2, 3, 5, 4});     // matrix · batch
        check_matmul(r({3, 5, 7}), r({3, 7, 4}), {3, 5, 4});        // equal batches
        check_matmul(r({2, 1, 5, 16}), r({3, 16, 6}), {2, 3, 5, 6});  // broadcast batch
        check_matmul(r({4, 1, 3, 5, 7}), r({2, 1, 7, 4}), {4, 2, 3, 5, 4});
        check_matmul(r({1, 5, 7}), r({6, 7, 4}), {6, 5, 4});
        // Empty dimensions: K = 0 gives zeros, M = 0 or a batch of 0 an empty result.
        Tensor z = matmul(r({3, 0}), r({0, 4}));
        CHECK(z.shape() == Shape{3, 4});
        CHECK(max_abs_diff(z, zeros({3, 4}, kFloat64)) == 0);
        check_matmul(r({0, 7}), r({7, 4}), {0, 4});
        check_matmul(r({2, 0, 5, 7}), r({7, 4}), {2, 0, 5, 4});
        check_matmul(r({0, 5, 7}), r({1, 7, 4}), {0, 5, 4});
        CHECK(matmul(r({0}), r({0})).item() == 0.0);
        // Larger odd sizes.
        check_matmul(r({65, 129}), r({129, 33}), {65, 33});
        check_matmul(r({129, 257}), r({257, 65}), {129, 65});
        check_matmul(r({3, 33, 65}), r({3, 65, 17}), {3, 33, 17});
      }
    }
  }
}

TEST_CASE("matmul on transposed, strided, expanded and permuted operands") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(2);
    for (GemmBackend be : backends(dev)) {
      BackendScope scope(be);
      for (DType dt : {kFloat32, kFloat64}) {
        auto r = [dt, dev](const Shape& s) { return on(randn(s, dt), dev); };
        // Transposed views: read in place.
        check_matmul(r({33, 65}).t(), r({33, 17}), {65, 17});
        check_matmul(r({65, 33}), r({17, 33}).t(), {65, 17});
        check_matmul(r({33, 65}).t(), r({17, 33}).t(), {65, 17});
        check_matmul(r({3, 33, 65}).transpose(1, 2), r({3, 17, 33}).transpose(1, 2), {3, 65, 17});
        // Every other column or row: neither stride is 1 or the rows skip, copied or read strided.
        check_matmul(r({33, 130}).slice(1, 0, 130, 2), r({65, 17}), {33, 17});
        check_matmul(r({33, 65}), r({130, 34}).slice(0, 0, 130, 2).slice(1, 0, 34, 2), {33, 17});
        check_matmul(r({3, 66, 65}).slice(1, 0, 66, 2), r({3, 65, 9}), {3, 33, 9});
        // Expanded operands (stride 0 inside the matrix and along the batch).
        check_matmul(r({1, 65}).expand({33, 65}), r({65, 17}), {33, 17});
        check_matmul(r({33, 65}), r({65, 1}).expand({65, 17}), {33, 17});
        check_matmul(r({33, 65}).expand({4, 33, 65}), r({4, 65, 17}), {4, 33, 17});
        check_matmul(r({4, 33, 65}), r({65, 17}).expand({4, 65, 17}), {4, 33, 17});
        // Stride 0 inside each matrix of a real batch: packed per batch entry on CUDA.
        check_matmul(r({4, 1, 65}).expand({4, 33, 65}), r({4, 65, 17}), {4, 33, 17});
        check_matmul(r({4, 33, 65}), r({4, 65, 1}).expand({4, 65, 17}), {4, 33, 17});
        // Both operands broadcast along the batch, one of them transposed too.
        check_matmul(r({33, 65}).expand({5, 33, 65}), r({17, 65}).t().expand({5, 65, 17}), {5, 33, 17});
        // K = 1 (an outer product) and N = 1, M = 1 (a single column or row of output).
        check_matmul(r({33, 1}), r({1, 17}), {33, 17});
        check_matmul(r({3, 33, 65}), r({3, 65, 1}), {3, 33, 1});
        check_matmul(r({3, 1, 65}), r({3, 65, 17}).transpose(1, 2).contiguous().transpose(1, 2), {3, 1, 17});
        // Permuted batch dims and a transposed matrix, with batch broadcasting.
        check_matmul(r({5, 2, 7, 3}).permute({1, 3, 0, 2}), r({3, 7, 4}), {2, 3, 5, 4});
        // The vector operand itself strided.
        check_matmul(r({5, 7}), r({14}).slice(0, 0, 14, 2), {5});
        check_matmul(r({21}).slice(0, 0, 21, 3), r({3, 7, 4}), {3, 4});
      }
    }
  }
}

// Large bfloat16 products on CUDA (float32 under TF32) copy a matrix whose start, leading
// dimension or batch stride is not a multiple of 16 bytes through a padded buffer
// (ops/cuda/matmul.cu); MUMOE_MATMUL_PAD=always does it for any product, float32 too:
// odd widths and depths, transposed and offset views, batched and broadcast operands,
// against the brute-force product.
TEST_CASE("matmul on CUDA through padded buffers matches the brute-force product") {
  const std::vector<Device>& devs = test_devices();
  if (std::none_of(devs.begin(), devs.end(), [](Device d) { return d.is_cuda(); })) return;
  const Device dev = Device::cuda();
  manual_seed(5);
  ::setenv("MUMOE_MATMUL_PAD", "always", 1);
  for (DType dt : {kFloat32, kBFloat16}) {
    INFO(dtype_name(dt));
    auto r = [dt, dev](const Shape& s) { return on(randn(s, kFloat64).to(dt), dev); };
    const std::vector<std::pair<Tensor, Tensor>> cases = {
        {r({37, 65}), r({65, 51})},                                       // odd N and K: both misaligned
        {r({65, 37}).t(), r({65, 51})},                                   // a column-major, ld 37
        {r({37, 65}), r({51, 65}).t()},                                   // b column-major, ld 65
        {r({37, 66}).slice(1, 1, 66), r({65, 48})},                       // a starting one element in
        {r({3, 37, 65}), r({3, 65, 51})},                                 // batched, odd batch strides
        {r({37, 65}).expand({3, 37, 65}), r({3, 51, 65}).transpose(1, 2)}  // broadcast a, transposed b
    };
    for (const auto& [a, b] : cases) {
      INFO("a " << shape_str(a.shape()) << " strides " << shape_str(a.strides()) << ", b " << shape_str(b.shape())
                << " strides " << shape_str(b.strides()));
      Tensor y = matmul(a, b);
      Tensor ref = ref_matmul(a.cpu().to(kFloat64), b.cpu().to(kFloat64));
      // float32 sums; bfloat16: one rounding of each output (2^-9 relative) past them.
      const double tol = dt == kFloat32 ? 1e-4 * (1 + std::sqrt(double(a.size(-1)))) : 2e-2 * std::sqrt(double(a.size(-1)));
      CHECK(max_abs_diff(y.cpu().to(kFloat64), ref) <= tol);
    }
  }
  ::unsetenv("MUMOE_MATMUL_PAD");
}

TEST_CASE("mm and bmm") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(3);
    for (GemmBackend be : backends(dev)) {
      BackendScope scope(be);
      Tensor a = on(randn({13, 33}), dev), b = on(randn({33, 7}), dev);
      CHECK(max_abs_diff(mm(a, b), ref_matmul(a, b)) < 1e-4);
      Tensor x = on(randn({5, 13, 33}, kFloat64), dev), y = on(randn({5, 33, 7}, kFloat64), dev);
      CHECK(max_abs_diff(bmm(x, y), ref_matmul(x, y)) < 1e-11);
      CHECK(max_abs_diff(bmm(x, y.transpose(1, 2).contiguous().transpose(1, 2)), ref_matmul(x, y)) < 1e-11);
    }
  }
}

TEST_CASE("matmul gradients: shapes, values and no gradient for inputs that need none") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(4);
    Tensor a = on(randn({3, 5, 7}, kFloat64).requires_grad_(), dev);
    Tensor b = on(randn({7, 4}, kFloat64).requires_grad_(), dev);
    matmul(a, b).sum().backward();
    // d(sum(a·b))/da[i,k] = sum_j b[k,j]; d/db[k,j] = sum over batch and rows of a[., ., k];
    // both summed on the CPU.
    Tensor ga = b.detach().cpu().sum({1}).reshape({1, 1, 7}).expand({3, 5, 7});
    Tensor gb = a.detach().cpu().sum({0, 1}).reshape({7, 1}).expand({7, 4});
    CHECK(max_abs_diff(a.grad(), ga) < 1e-12);
    CHECK(max_abs_diff(b.grad(), gb) < 1e-12);

    Tensor c = on(randn({4, 6}, kFloat64).requires_grad_(), dev), d = on(randn({6, 2}, kFloat64), dev);
    matmul(c, d).sum().backward();
    CHECK(c.grad().defined());
    CHECK_FALSE(d.grad().defined());
    CHECK(matmul(d.t(), d).requires_grad() == false);
  }
}

TEST_CASE("matmul with TF32 allowed stays within TF32's precision; float64 and disallowed TF32 stay exact") {
  struct Tf32Scope {  // restores the switch whatever happens
    bool saved = cuda::allow_tf32();
    ~Tf32Scope() { cuda::set_allow_tf32(saved); }
  } scope;
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(6);
    Tensor a = on(randn({64, 256}), dev), b = on(randn({256, 48}), dev);
    Tensor ref = ref_matmul(a, b);
    cuda::set_allow_tf32(true);
    // TF32 keeps a 10-bit mantissa of each input (2^-11 relative, 2^-10 if truncated):
    // about 1e-3 per product of order 1, a random walk over K = 256 of them (sd ~ 1.6e-2
    // at worst), max over 3072 outputs; the results themselves are of order 16.
    CHECK(max_abs_diff(matmul(a, b), ref) <= 0.1);
    Tensor a64 = a.to(kFloat64), b64 = b.to(kFloat64);
    CHECK(max_abs_diff(matmul(a64, b64), ref_matmul(a64, b64)) <= 1e-11);  // float64 ignores the switch
    cuda::set_allow_tf32(false);
    CHECK(max_abs_diff(matmul(a, b), ref) <= 1e-4 * (1 + std::sqrt(256.0)));
  }
}

// linear(x, w, b) = x · wᵀ + b: against a brute-force loop in double over the operands'
// values, for every leading shape (none, one, two dims), a strided input, no bias, and an
// empty batch. With a bias, one kernel (matmul_bias) on every device; bfloat16 within one
// rounding of the exact result.
TEST_CASE("linear matches x · wᵀ + b by brute force") {
  for (Device dev : test_devices()) {
    for (DType dt : {kFloat32, kFloat64, kBFloat16}) {
      INFO(dev.str() << " " << dtype_name(dt));
      manual_seed(21);
      Tensor w = randn({7, 5}).to(dt), b = randn({7}).to(dt), base = randn({3, 4, 10}).to(dt);
      for (Tensor x : {randn({5}).to(dt), randn({6, 5}).to(dt), randn({2, 3, 5}).to(dt), base.slice(2, 0, 10, 2),
                       randn({0, 5}).to(dt)}) {
        for (bool with_bias : {true, false}) {
          INFO("x " << shape_str(x.shape()) << (with_bias ? " with bias" : " without bias"));
          Tensor y = linear(on(x, dev), on(w, dev), with_bias ? on(b, dev) : Tensor());
          Shape want_shape(x.shape().begin(), x.shape().end() - 1);
          want_shape.push_back(7);
          REQUIRE(y.shape() == want_shape);
          std::vector<double> xv = x.contiguous().to_vector<double>(), wv = w.to_vector<double>(), bv = b.to_vector<double>();
          std::vector<double> want;
          for (size_t r = 0; r < xv.size() / 5; ++r)
            for (size_t o = 0; o < 7; ++o) {
              double acc = with_bias ? bv[o] : 0;
              for (size_t i = 0; i < 5; ++i) acc += xv[r * 5 + i] * wv[o * 5 + i];
              want.push_back(acc);
            }
          // bfloat16: the exact value rounded once (half a unit in the last of 8 bits) and
          // the float32 sums' error.
          check_close_or_nan(y, want_shape, want, dt == kFloat32 ? 1e-5 : dt == kFloat64 ? 1e-12 : 1.0 / 256);
        }
      }
    }
  }
}

// x = [1, 2^-8] by w = [1, 1] is 1 + 2^-8, half way between the bfloat16 neighbours 1 and
// 1 + 2^-7: rounded alone it goes to the even one, 1, and adding the bias 2^-12 then
// leaves 1; added to the float32 sum first, the bias tips it to 1 + 2^-7. So a result of
// 1 + 2^-7 says the bias was added before the one rounding (matmul_bias's contract), on
// bfloat16 tensors and under autocast, for row counts that take the CPU's few-row and
// many-row products; on CUDA through cuBLASLt's epilogue and through the composed path
// (MUMOE_CUBLASLT=off) alike.
TEST_CASE("linear with a bias rounds a bfloat16 result once: the bias joins the float32 sums") {
  const double one_up = 1.0 + 1.0 / 128;
  for (Device dev : test_devices())
    for (const char* lt : {"on", "off"}) {
      if (dev.is_cpu() && std::string(lt) == "off") continue;
      ::setenv("MUMOE_CUBLASLT", lt, 1);
      for (int64_t M : {1, 3, 64}) {
        INFO(dev.str() << ", cuBLASLt " << lt << ", " << M << " rows");
        const int64_t K = 16, N = 24;
        Tensor x = zeros({M, K}), w = zeros({N, K});
        x.select(1, 0).fill_(1.0);
        x.select(1, 1).fill_(1.0 / 256);
        w.select(1, 0).fill_(1.0);
        w.select(1, 1).fill_(1.0);
        const Tensor b = full({N}, 1.0 / 4096);
        const Tensor y16 = linear(on(x, dev).to(kBFloat16), on(w, dev).to(kBFloat16), on(b, dev).to(kBFloat16));
        Tensor ya;
        {
          AutocastGuard amp;
          ya = linear(on(x, dev), on(w, dev), on(b, dev));
        }
        for (const Tensor& y : {y16, ya}) {
          REQUIRE(y.dtype() == kBFloat16);
          const std::vector<double> got = y.cpu().to_vector<double>();
          CHECK(*std::min_element(got.begin(), got.end()) == one_up);
          CHECK(*std::max_element(got.begin(), got.end()) == one_up);
        }
      }
      ::unsetenv("MUMOE_CUBLASLT");
    }
}

// A Linear with a bias is one product-and-bias kernel on every device, not a matmul and an
// add (the kernel profiler's rows, which list a kernel's inner table calls too), in float32
// and bfloat16; on CUDA one cuBLASLt call (the composed path would show its matmul and add
// inside). The CPU's bfloat16 kernel adds the bias as its GEMM stores each row: 33 x 40 by
// 40 x 16 is a tiny product (every CPU), 33 x 40 by 40 x 48 is many rows (gemm_bf16, where
// the CPU has AVX512_BF16; elsewhere the product is widened to float32 and the bias added by
// the add kernel, one rounding either way, so there only the matmul is ruled out).
TEST_CASE("linear with a bias runs one kernel, the bias added as the product is stored") {
  for (Device dev : test_devices())
    for (DType dt : {kFloat32, kBFloat16})
      for (int64_t outputs : {16, 48}) {
        INFO(dev.str() << " " << dtype_name(dt) << " " << outputs << " outputs");
        manual_seed(23);
        const Tensor x = on(randn({33, 40}), dev).to(dt), w = on(randn({outputs, 40}), dev).to(dt),
                     b = on(randn({outputs}), dev).to(dt);
        profile::enable();
        const Tensor y = linear(x, w, b);
        const std::vector<profile::KernelTime> ran = profile::report();
        profile::disable();
        const bool cpu_widens = dev.is_cpu() && dt == kBFloat16 && outputs == 48 && !cpu::gemm_bf16_available();
        int64_t fused = 0;
        for (const profile::KernelTime& kt : ran) {
          INFO("kernel " << kt.kernel);
          if (!cpu_widens) CHECK(kt.kernel != "add");
          CHECK(kt.kernel != "matmul");
          CHECK(kt.kernel != "matmul_accumulate");
          if (kt.kernel == "matmul_bias") fused += kt.calls;
        }
        CHECK(fused == 1);
        // And the sum: the composed ops' result, within one bfloat16 rounding of each.
        const Tensor want = (matmul(x.to(kFloat64), w.to(kFloat64).t()) + b.to(kFloat64)).cpu();
        CHECK(max_abs_diff(y.to(kFloat64).cpu(), want) <= (dt == kFloat32 ? 1e-4 : 0.1));
      }
}

// Under autocast, op(inputs) against composed(inputs) (the same ops written out on the
// bfloat16 casts): op returns bfloat16, and the float32 inputs get float32 gradients of
// (y · g).sum() equal to the composed ones to bfloat16's rounding.
void check_autocast_gradients(Device dev, const std::vector<Tensor>& inputs, const Tensor& g0,
                              const std::function<Tensor(const std::vector<Tensor>&)>& op,
                              const std::function<Tensor(const std::vector<Tensor>&)>& composed) {
  std::vector<Tensor> in, in2;
  for (const Tensor& t : inputs) {
    in.push_back(on(t, dev).requires_grad_());
    in2.push_back(on(t, dev).requires_grad_());
  }
  const Tensor g = on(g0, dev);
  Tensor y, y2;
  {
    AutocastGuard amp;
    y = op(in);
    y2 = composed(in2);
  }
  REQUIRE(y.dtype() == kBFloat16);
  (y.to(kFloat32) * g).sum().backward();
  (y2.to(kFloat32) * g).sum().backward();
  for (size_t k = 0; k < in.size(); ++k) {
    INFO("input " << k);
    REQUIRE(in[k].grad().defined());
    CHECK(in[k].grad().dtype() == kFloat32);
    CHECK(allclose(in[k].grad().cpu(), in2[k].grad().cpu(), 1e-2, 1e-2));
  }
}

// Under autocast linear's node takes the bfloat16 casts as its inputs: the float32
// input, weight and bias get their gradients through the casts' nodes, equal to those of
// the composed ops (matmul of the casts, plus the cast bias) to bfloat16's rounding of the
// products; gradients arrive in float32.
TEST_CASE("linear under autocast: float32 gradients through the casts, as the composed ops give them") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(24);
    check_autocast_gradients(
        dev, {randn({2, 9, 40}), randn({24, 40}), randn({24})}, randn({2, 9, 24}),
        [](const std::vector<Tensor>& in) { return linear(in[0], in[1], in[2]); },
        [](const std::vector<Tensor>& in) {
          return matmul(in[0].to(kBFloat16), in[1].to(kBFloat16).t()) + in[2].to(kBFloat16);
        });
  }
}

// matmul_with_one(x, w) = [x, 1] · w: against a brute-force loop in double (the 1 put at
// the end of every row by hand), for leading shapes of none, one and two dims, a strided
// input, an empty batch; and its gradients against those of cat([x, 1]) · w.
TEST_CASE("matmul_with_one matches [x, 1] · w by brute force, and its gradients those of the appended 1") {
  for (Device dev : test_devices()) {
    for (DType dt : {kFloat32, kFloat64}) {
      INFO(dev.str() << " " << dtype_name(dt));
      manual_seed(22);
      Tensor w = randn({6, 7}, dt), base = randn({3, 4, 10}, dt);
      for (Tensor x : {randn({5}, dt), randn({6, 5}, dt), randn({2, 3, 5}, dt), base.slice(2, 0, 10, 2), randn({0, 5}, dt)}) {
        INFO("x " << shape_str(x.shape()));
        Tensor y = matmul_with_one(on(x, dev), on(w, dev));
        Shape want_shape(x.shape().begin(), x.shape().end() - 1);
        want_shape.push_back(7);
        REQUIRE(y.shape() == want_shape);
        std::vector<double> xv = x.contiguous().to_vector<double>(), wv = w.to_vector<double>(), want;
        for (size_t r = 0; r < xv.size() / 5; ++r)
          for (size_t o = 0; o < 7; ++o) {
            double acc = wv[5 * 7 + o];  // the appended 1 times the last row
            for (size_t i = 0; i < 5; ++i) acc += xv[r * 5 + i] * wv[i * 7 + o];
            want.push_back(acc);
          }
        check_close_or_nan(y, want_shape, want, dt == kFloat32 ? 1e-5 : 1e-12);
      }
      Tensor x = on(randn({9, 5}, dt), dev).requires_grad_(), wd = on(w, dev).requires_grad_();
      Tensor g = on(randn({9, 7}, dt), dev);
      (matmul_with_one(x, wd) * g).sum().backward();
      Tensor x2 = x.detach().requires_grad_(), w2 = wd.detach().requires_grad_();
      (cat({x2, ones({9, 1}, TensorOptions(dt).device(x2.device()))}, 1).matmul(w2) * g).sum().backward();
      const double tol = dt == kFloat32 ? 1e-5 : 1e-12;
      CHECK(allclose(x.grad().cpu(), x2.grad().cpu(), tol, tol));
      CHECK(allclose(wd.grad().cpu(), w2.grad().cpu(), tol, tol));
    }
  }
}

// matmul_row_bias(a, b, bias) = a · b + bias[:, None]: against a brute-force loop in
// double, for a 2-D and a batched b, a transposed and a strided one, an empty batch; its
// gradients against those of matmul(a, b) + bias.unsqueeze(1); and its errors.
TEST_CASE("matmul_row_bias matches a · b + bias per row by brute force, and its gradients the composed ones") {
  for (Device dev : test_devices()) {
    for (DType dt : {kFloat32, kFloat64}) {
      INFO(dev.str() << " " << dtype_name(dt));
      manual_seed(23);
      Tensor a = randn({6, 5}, dt), bias = randn({6}, dt), base = randn({3, 5, 14}, dt);
      for (Tensor b : {randn({5, 7}, dt), randn({3, 5, 7}, dt), randn({3, 7, 5}, dt).transpose(1, 2),
                       base.slice(2, 0, 14, 2), randn({0, 5, 7}, dt)}) {
        INFO("b " << shape_str(b.shape()) << (b.is_contiguous() ? "" : " (a view)"));
        Tensor y = matmul_row_bias(on(a, dev), on(b, dev), on(bias, dev));
        const int64_t B = b.dim() == 3 ? b.size(0) : 1;
        Shape want_shape = b.dim() == 3 ? Shape{B, 6, 7} : Shape{6, 7};
        REQUIRE(y.shape() == want_shape);
        std::vector<double> av = a.to_vector<double>(), bv = b.contiguous().to_vector<double>(),
                            cv = bias.to_vector<double>(), want;
        for (int64_t n = 0; n < B; ++n)
          for (size_t i = 0; i < 6; ++i)
            for (size_t j = 0; j < 7; ++j) {
              double acc = cv[i];
              for (size_t k = 0; k < 5; ++k) acc += av[i * 5 + k] * bv[size_t(n) * 35 + k * 7 + j];
              want.push_back(acc);
            }
        check_close_or_nan(y, want_shape, want, dt == kFloat32 ? 1e-5 : 1e-12);
      }
      for (Shape bs : {Shape{5, 7}, Shape{4, 5, 7}}) {
        INFO("gradients, b " << shape_str(bs));
        Tensor ad = on(a, dev).requires_grad_(), bd = on(randn(bs, dt), dev).requires_grad_(),
               cd = on(bias, dev).requires_grad_();
        Shape gs = bs;
        gs[gs.size() - 2] = 6;
        Tensor g = on(randn(gs, dt), dev);
        (matmul_row_bias(ad, bd, cd) * g).sum().backward();
        Tensor a2 = ad.detach().requires_grad_(), b2 = bd.detach().requires_grad_(), c2 = cd.detach().requires_grad_();
        ((matmul(a2, b2) + c2.unsqueeze(1)) * g).sum().backward();
        const double tol = dt == kFloat32 ? 1e-5 : 1e-12;
        CHECK(allclose(ad.grad().cpu(), a2.grad().cpu(), tol, tol));
        CHECK(allclose(bd.grad().cpu(), b2.grad().cpu(), tol, tol));
        CHECK(allclose(cd.grad().cpu(), c2.grad().cpu(), tol, tol));
      }
    }
  }
  CHECK_THROWS_MU(matmul_row_bias(randn({2, 3}), randn({4, 5}), randn({2})),
                  "matmul_row_bias: shapes [2, 3] and [4, 5] cannot be multiplied (3 != 4)");
  CHECK_THROWS_MU(matmul_row_bias(randn({2, 3}), randn({3, 5}), randn({3})),
                  "matmul_row_bias: bias must have shape (2), one value per row of a, got [3]");
  CHECK_THROWS_MU(matmul_row_bias(randn({2, 2, 3}), randn({3, 5}), randn({2})),
                  "matmul_row_bias: a must be 2-D (M, K), got shape [2, 2, 3]");
  CHECK_THROWS_MU(matmul_row_bias(randn({2, 3}), randn({3}), randn({2})),
                  "matmul_row_bias: b must be (K, N) or (B, K, N), got shape [3]");
  CHECK_THROWS_MU(matmul_row_bias(randn({2, 3}), randn({3, 5}), randn({2}, kFloat64)),
                  "matmul_row_bias: bias is float64 on cpu but a is float32 on cpu");
}

// matmul_row_bias in bfloat16 (the MLP-Mixer's token mixing under autocast) adds the bias
// to the product's float32 sums and rounds once, as linear does. a's rows are [1, 1, 0...],
// b's first two rows 1 and 2^-8: every product is 1 + 2^-8, a tie that rounds to 1 alone;
// with a row's bias of +2^-12 added first it must round to 1 + 2^-7, with -2^-12 to 1 (odd
// rows), so the rows' results also say the bias went by row. Every form of the CPU's
// kernel: tiny products (6 x 16 by 16 x 7), many rows (64 x 16 by 16 x 48, and a batch of
// 40 x 40 products), a few rows by a transposed b (3 x 16 by 16 x 40: a float32 twin and
// the add); bfloat16 tensors and float32 ones under autocast (bfloat16 out, as linear's).
// Then random operands in each form against a double loop, within bfloat16's rounding.
TEST_CASE("matmul_row_bias in bfloat16 adds the bias to the float32 sums and rounds once, in every form") {
  struct Form { int64_t M, K, N, B; bool transposed; };
  for (Device dev : test_devices())
    for (Form f : {Form{6, 16, 7, 0, false}, Form{6, 16, 7, 3, false}, Form{64, 16, 48, 0, false},
                   Form{40, 16, 40, 3, false}, Form{3, 16, 40, 0, true}})
      for (bool amp : {false, true}) {
        INFO(dev.str() << " " << f.M << " x " << f.K << " by " << f.K << " x " << f.N << ", batch " << f.B
                       << (f.transposed ? ", b transposed" : "") << (amp ? ", autocast" : ", bfloat16"));
        const Shape bs = f.B ? Shape{f.B, f.K, f.N} : Shape{f.K, f.N};
        auto b_of = [&](const Tensor& dense) {  // dense (.., K, N), or the same values in a transposed view
          return f.transposed ? dense.transpose(-2, -1).contiguous().transpose(-2, -1) : dense;
        };
        auto run = [&](const Tensor& a, const Tensor& b, const Tensor& bias) {
          const DType dt = amp ? kFloat32 : kBFloat16;
          const Tensor ad = on(a, dev).to(dt), bd = b_of(on(b, dev).to(dt)), cd = on(bias, dev).to(dt);
          if (!amp) return matmul_row_bias(ad, bd, cd);
          AutocastGuard guard;
          return matmul_row_bias(ad, bd, cd);
        };
        Tensor a = zeros({f.M, f.K}), b = zeros(bs), bias = empty({f.M});
        a.select(1, 0).fill_(1.0);
        a.select(1, 1).fill_(1.0);
        b.select(-2, 0).fill_(1.0);
        b.select(-2, 1).fill_(1.0 / 256);
        for (int64_t i = 0; i < f.M; ++i) bias.select(0, i).fill_(i % 2 ? -1.0 / 4096 : 1.0 / 4096);
        const Tensor y = run(a, b, bias);
        REQUIRE(y.dtype() == kBFloat16);
        const Tensor rows = y.cpu().to(kFloat64).reshape({-1, f.M, f.N});
        int64_t wrong = 0;
        for (int64_t i = 0; i < f.M; ++i) {
          const double want = i % 2 ? 1.0 : 1.0 + 1.0 / 128;
          const std::vector<double> got = rows.select(1, i).contiguous().to_vector<double>();
          for (double v : got) wrong += v != want;
        }
        CHECK(wrong == 0);

        manual_seed(31);
        const Tensor ra = randn({f.M, f.K}).to(kBFloat16).to(kFloat32), rb = randn(bs).to(kBFloat16).to(kFloat32),
                     rc = randn({f.M}).to(kBFloat16).to(kFloat32);
        const Tensor ry = run(ra, rb, rc).cpu().to(kFloat64).reshape({-1, f.M, f.N});
        const Tensor want = (matmul(ra.to(kFloat64), rb.to(kFloat64)) + rc.to(kFloat64).unsqueeze(1)).reshape({-1, f.M, f.N});
        // One rounding of a float32 sum: within 2^-8 of its size (plus float32's error).
        CHECK(((ry - want).abs() - want.abs() * (1.0 / 256) - 1e-4).max().item<double>() <= 0);
      }
}

// Under autocast matmul_row_bias's node takes the bfloat16 casts as its inputs, as
// linear's does: float32 gradients for a, b and the bias through the casts' nodes, equal to
// those of the composed ops on the casts to bfloat16's rounding.
TEST_CASE("matmul_row_bias under autocast: float32 gradients through the casts, as the composed ops give them") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(25);
    check_autocast_gradients(
        dev, {randn({24, 40}), randn({3, 40, 36}), randn({24})}, randn({3, 24, 36}),
        [](const std::vector<Tensor>& in) { return matmul_row_bias(in[0], in[1], in[2]); },
        [](const std::vector<Tensor>& in) {
          return matmul(in[0].to(kBFloat16), in[1].to(kBFloat16)) + in[2].to(kBFloat16).unsqueeze(1);
        });
  }
}

// The matmul_accumulate kernel (out += a · b: linear_cross_entropy's chunks, a composed
// bfloat16 Linear's float32 twin) on every device against out's old values plus the
// product in double: float32, float64 and bfloat16 into their own dtype, bfloat16 into
// float32; a row-major and a transposed b; an empty inner size leaves out as it was.
TEST_CASE("matmul_accumulate adds the product to what out holds, in every dtype pair") {
  struct Pair { DType operands, out; };
  for (Device dev : test_devices())
    for (Pair p : {Pair{kFloat32, kFloat32}, Pair{kFloat64, kFloat64}, Pair{kBFloat16, kBFloat16},
                   Pair{kBFloat16, kFloat32}})
      for (int64_t K : {0, 37})
        for (bool transposed : {false, true}) {
          INFO(dev.str() << " " << dtype_name(p.operands) << " into " << dtype_name(p.out) << ", K " << K
                         << (transposed ? ", b transposed" : ""));
          manual_seed(41);
          const Tensor a = randn({19, K}).to(p.operands), b0 = randn({K, 23}).to(p.operands),
                       c0 = randn({19, 23}).to(p.out);
          const Tensor b = transposed ? b0.t().contiguous().t() : b0;
          Tensor out = on(c0, dev).clone();
          kernels::matmul_accumulate(out.device(), out, on(a, dev), on(b, dev));
          // Expected: a brute-force loop in double over the operands' values.
          const Tensor ad = a.to(kFloat64).contiguous(), bd = b0.to(kFloat64).contiguous(),
                       cd = c0.to(kFloat64).contiguous(), got = out.cpu().to(kFloat64).contiguous();
          const double tol = p.out == kBFloat16 ? 1.0 / 128 : p.operands == kFloat64 ? 1e-12 : 1e-4;
          double worst = 0;
          for (int64_t i = 0; i < 19; ++i)
            for (int64_t j = 0; j < 23; ++j) {
              double want = cd.data_ptr<double>()[i * 23 + j];
              for (int64_t k = 0; k < K; ++k)
                want += ad.data_ptr<double>()[i * K + k] * bd.data_ptr<double>()[k * 23 + j];
              worst = std::max(worst, std::abs(got.data_ptr<double>()[i * 23 + j] - want) - (std::abs(want) + 1) * tol);
            }
          CHECK(worst <= 0);
        }
}

TEST_CASE("matmul errors") {
  Tensor a = randn({2, 3}), b = randn({4, 5});
  CHECK_THROWS_MU(matmul(a, b), "matmul: shapes [2, 3] and [4, 5] cannot be multiplied (3 != 4)");
  CHECK_THROWS_MU(a.matmul(b), "cannot be multiplied (3 != 4)");
  CHECK_THROWS_MU(matmul(randn({3}), randn({4})), "shapes [3] and [4] cannot be multiplied (3 != 4)");
  CHECK_THROWS_MU(matmul(randn({2, 5, 3}), randn({4})), "shapes [2, 5, 3] and [4] cannot be multiplied (3 != 4)");
  CHECK_THROWS_MU(matmul(randn({2, 3, 4}), randn({3, 5, 6})), "(4 != 5)");
  CHECK_THROWS_MU(matmul(randn({2, 3, 4}), randn({3, 4, 6})), "batch dimensions of shapes [2, 3, 4] and [3, 4, 6]");
  CHECK_THROWS_MU(matmul(randn({2, 3}), randn({3, 2}, kFloat64)), "dtype mismatch: float32 vs float64");
  CHECK_THROWS_MU(matmul(randn({}), randn({3})), "at least 1 dimension");
  CHECK_THROWS_MU(matmul(randn({3}), randn({})), "at least 1 dimension");
  CHECK_THROWS_MU(matmul(ones({2, 3}, kInt64), ones({3, 2}, kInt64)), "int64 tensors are not supported");
  CHECK_THROWS_MU(matmul(ones({2, 3}, kBool), ones({3, 2}, kBool)), "bool tensors are not supported");
  CHECK_THROWS_MU(mm(randn({2, 3, 4}), randn({4, 5})), "mm: expects two 2-D tensors");
  CHECK_THROWS_MU(mm(randn({2, 3}), randn({4, 5})), "mm: shapes [2, 3] and [4, 5] cannot be multiplied (3 != 4)");
  CHECK_THROWS_MU(bmm(randn({2, 3}), randn({3, 2})), "bmm: expects two 3-D tensors");
  CHECK_THROWS_MU(bmm(randn({2, 3, 4}), randn({3, 4, 5})), "bmm: batch sizes differ (2 != 3)");
  CHECK_THROWS_MU(bmm(randn({2, 3, 4}), randn({2, 5, 5})), "bmm: shapes [2, 3, 4] and [2, 5, 5] cannot be multiplied (4 != 5)");
  CHECK_THROWS_MU(linear(randn({2, 3}), randn({4, 5})), "linear: input of shape [2, 3] does not end in the weight's in_features 5");
  CHECK_THROWS_MU(linear(randn({2, 3}), randn({3})), "linear: weight must be 2-D");
  CHECK_THROWS_MU(linear(randn({2, 3}), randn({4, 3}), randn({3})), "linear: bias must have shape (4), got [3]");
  CHECK_THROWS_MU(linear(randn({2, 3}), randn({4, 3}), randn({4}, kFloat64)),
                  "linear: dtype mismatch: input float32, weight float32, bias float64");
  CHECK_THROWS_MU(linear(randn({2, 3}, kFloat64), randn({4, 3})), "linear: dtype mismatch: input float64, weight float32");
  CHECK_THROWS_MU(matmul_with_one(randn({2, 3}), randn({3, 5})),
                  "matmul_with_one: input of shape [2, 3] does not end in 2, the weight's rows less the bias row (weight shape [3, 5])");
  CHECK_THROWS_MU(matmul_with_one(randn({2, 3}), randn({4})), "matmul_with_one: weight must be 2-D (K + 1, N), got shape [4]");
  CHECK_THROWS_MU(matmul_with_one(randn({2, 3}), randn({0, 4})), "matmul_with_one: weight must be 2-D (K + 1, N), got shape [0, 4]");
  CHECK_THROWS_MU(matmul_with_one(randn({2, 3}), randn({4, 5}, kFloat64)), "matmul_with_one: dtype mismatch: float32 vs float64");
  if (cuda::device_count() > 0) {
    Tensor g = randn({3, 2}).to(Device::cuda(0));
    CHECK_THROWS_MU(matmul(a, g), "device mismatch");
  }
}
