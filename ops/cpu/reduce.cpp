// CPU kernels of the reductions (declared in ops/kernels/reduce.h), each the per-run
// function of the skeleton in ops/cpu/reduce_loop.h.
#include <algorithm>
#include <optional>
#include <type_traits>
#include <vector>

#include "ops/cpu/reduce_loop.h"
#include "ops/cpu/simd.h"
#include "ops/cpu/widen.h"
#include "ops/functors.h"
#include "ops/kernels/reduce.h"

namespace mu::cpu {

// The sum of n contiguous values in sixteen interleaved partial sums (four vectors of
// double for float32), so that the adds do not wait on one another; the order is fixed
// by n alone, never by the thread count. Integer sums wrap around as two's complement
// (fn::wrapping_add; a signed overflow in C++ would be undefined).
template <class T, class A>
[[gnu::always_inline]] inline A sum_contiguous(const T* v, int64_t n) {
  using fn::wrapping_add;
  constexpr int kLanes = 16;
  A part[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) part[j] = wrapping_add(part[j], A(v[i + j]));
  A rest = 0;
  for (; i < n; ++i) rest = wrapping_add(rest, A(v[i]));
  for (int w = kLanes / 2; w >= 1; w /= 2)  // pairwise, in a fixed order
    for (int j = 0; j < w; ++j) part[j] = wrapping_add(part[j], part[j + w]);
  return wrapping_add(part[0], rest);
}

// Column sums, the shape of every bias gradient (a (rows, cols) gradient summed over its
// rows): the generic skeleton would walk each column down with a stride of `cols`, one
// element per cache line. Here rows are read whole and added into a strip of column
// accumulators, so every load is contiguous and the adds vectorise across columns.
// The work is cut into blocks of kRowBlock rows and kColStrip columns whose partial sums
// are combined in row-block order afterwards: each block's result, and so the sum, is
// the same whatever thread computes it.
struct ColumnSumLayout {
  std::vector<int64_t> bases;  // offset of each matrix (the kept dims other than the columns)
  int64_t cols = 0, rows = 0, row_stride = 0;
};

// The layout when x's kept dims end in a stride-1 dim of at least 8 elements and its
// reduced dims form one strided run; nullopt otherwise.
inline std::optional<ColumnSumLayout> column_sum_layout(const Tensor& x, const ReducePlan& p) {
  Shape head_shape, head_strides, tail_shape, tail_strides;
  for (int64_t d = 0; d < x.dim(); ++d) {
    (p.reduced[size_t(d)] ? tail_shape : head_shape).push_back(x.shape()[size_t(d)]);
    (p.reduced[size_t(d)] ? tail_strides : head_strides).push_back(x.strides()[size_t(d)]);
  }
  if (head_shape.empty() || tail_shape.empty()) return std::nullopt;
  auto T = coalesce<1>(tail_shape, {tail_strides});
  auto H = coalesce<1>(head_shape, {head_strides});
  if (T.shape.size() != 1 || T.strides[0][0] == 1 || H.strides[0].back() != 1 || H.shape.back() < 8)
    return std::nullopt;
  if (T.shape[0] == 0) return std::nullopt;  // no rows: the generic path writes the empty sums, zeros
  ColumnSumLayout L;
  L.cols = H.shape.back();
  L.rows = T.shape[0];
  L.row_stride = T.strides[0][0];
  // The offsets of the matrices: a row-major walk of the other head dims.
  const size_t nh = H.shape.size() - 1;
  int64_t count = 1;
  for (size_t d = 0; d < nh; ++d) count *= H.shape[d];
  L.bases.resize(size_t(count));
  for (int64_t m = 0; m < count; ++m) {
    int64_t rem = m, off = 0;
    for (size_t d = nh; d-- > 0;) {
      off += (rem % H.shape[d]) * H.strides[0][d];
      rem /= H.shape[d];
    }
    L.bases[size_t(m)] = off;
  }
  return L;
}

template <class T, class A, class O>
void column_sums(const T* x, const ColumnSumLayout& L, O* out) {
  constexpr int64_t kRowBlock = 256, kColStrip = 512;
  const int64_t nm = int64_t(L.bases.size());
  const int64_t nrb = (L.rows + kRowBlock - 1) / kRowBlock, ncs = (L.cols + kColStrip - 1) / kColStrip;
  // One partial row of `cols` accumulators per (matrix, row block).
  std::vector<A> part(size_t(nm * nrb * L.cols));
  const int64_t tasks = nm * nrb * ncs;
  const bool par = nm * L.rows * L.cols >= kParallelGrain && tasks > 1 && !omp_in_parallel();
  parallel_for_if(tasks, par, [&](int64_t t) {
    const int64_t m = t / (nrb * ncs), rb = (t / ncs) % nrb, cs = t % ncs;
    const int64_t r0 = rb * kRowBlock, r1 = std::min(L.rows, r0 + kRowBlock);
    const int64_t c0 = cs * kColStrip, w = std::min(L.cols, c0 + kColStrip) - c0;
    const T* src = x + L.bases[size_t(m)] + c0;
    A* acc = part.data() + (m * nrb + rb) * L.cols + c0;
    for (int64_t j = 0; j < w; ++j) acc[j] = 0;
    // Row r's strip as float32 or float64 values: in place, or for bfloat16 (autocast's
    // gradients) widened into a strip of the thread's own (simd.h: widen_run; GCC keeps
    // a plain loop's element-by-element conversions scalar), so that x is read as it is.
    constexpr bool kWiden = std::is_same_v<T, bfloat16_t>;
    using W = std::conditional_t<kWiden, float, T>;
    alignas(64) [[maybe_unused]] W wide[kWiden ? 4 : 1][kWiden ? kColStrip : 1];
    auto row = [&](int64_t rr, int k) -> const W* {
      if constexpr (kWiden) {
        widen_run(src + rr * L.row_stride, w, wide[k]);
        return wide[k];
      } else {
        (void)k;
        return src + rr * L.row_stride;
      }
    };
    int64_t r = r0;
    for (; r + 4 <= r1; r += 4) {  // four rows per pass over the strip: a quarter of its loads and stores
      const W *a = row(r, 0), *b = row(r + 1, 1), *c = row(r + 2, 2), *d = row(r + 3, 3);
      for (int64_t j = 0; j < w; ++j) acc[j] += (A(a[j]) + A(b[j])) + (A(c[j]) + A(d[j]));
    }
    for (; r < r1; ++r) {
      const W* a = row(r, 0);
      for (int64_t j = 0; j < w; ++j) acc[j] += A(a[j]);
    }
  });
  // Combine the row blocks of each matrix in order.
  const int64_t total = nm * L.cols;
  parallel_for_if(total, par && total >= 1024, [&](int64_t i) {
    const int64_t m = i / L.cols, c = i % L.cols;
    A s = part[size_t(m * nrb * L.cols + c)];
    for (int64_t rb = 1; rb < nrb; ++rb) s += part[size_t((m * nrb + rb) * L.cols + c)];
    out[i] = O(s);
  });
}

static void sum(const Tensor& out, const Tensor& x, const ReducePlan& p);

// A dense float x reduced over its trailing dims and over some dim before a kept one
// (the bias gradient of a token product: (B, H, D) summed to (H)): the generic skeleton
// would copy x into (kept, reduced) order first. Instead: the trailing reduced block of
// each row summed in the accumulator type (contiguous runs), then that smaller tensor
// summed over the remaining reduced dims by sum itself (column sums, for (B, H) -> (H)),
// and the result converted once. False when x is not of that form.
template <class T>
static bool sum_trailing_first(const Tensor& out, const Tensor& x, const ReducePlan& p) {
  using A = acc_t<T>;
  const int64_t nd = x.dim();
  if (!x.is_contiguous() || nd < 3 || !p.reduced[size_t(nd - 1)]) return false;
  int64_t first = nd - 1;  // the trailing block of reduced dims is [first, nd)
  while (first > 0 && p.reduced[size_t(first - 1)]) --first;
  bool reduced_before = false;
  for (int64_t d = 0; d < first; ++d) reduced_before = reduced_before || p.reduced[size_t(d)];
  if (!reduced_before) return false;  // one run per output: the skeleton reads it in place
  int64_t run = 1;
  for (int64_t d = first; d < nd; ++d) run *= x.size(d);
  const Shape head(x.shape().begin(), x.shape().begin() + first);
  Tensor partial = empty(head, TensorOptions(dtype_of<A>()));
  const T* src = x.data_ptr<T>();
  A* dst = partial.data_ptr<A>();
  const int64_t rows = partial.numel();
  parallel_for_if(rows, x.numel() >= kParallelGrain && !omp_in_parallel(), [&](int64_t r) {
    dst[r] = sum_contiguous<T, A>(src + r * run, run);
  });
  Shape dims;
  for (int64_t d = 0; d < first; ++d)
    if (p.reduced[size_t(d)]) dims.push_back(d);
  const ReducePlan rest = plan_reduce(partial, dims, false, "sum");
  if constexpr (std::is_same_v<A, T>) {
    sum(out, partial, rest);  // out is dense and holds the kept dims in row-major order
  } else {
    Tensor wide = empty(rest.out_shape, TensorOptions(dtype_of<A>()));
    sum(wide, partial, rest);
    const A* w = wide.data_ptr<A>();
    T* o = out.data_ptr<T>();
    for (int64_t i = 0; i < wide.numel(); ++i) o[i] = T(w[i]);
  }
  return true;
}

static void sum(const Tensor& out, const Tensor& x, const ReducePlan& p) {
  // A 16-bit float x sums in float32 into a float32 out. bfloat16 column sums (a bias
  // gradient under autocast) read x as it lies; other 16-bit sums widen it first (the plan
  // names dims and sizes, which the dense copy keeps).
  if (x.dtype() == kBFloat16 && out.dtype() == kFloat32)
    if (auto L = column_sum_layout(x, p))
      return column_sums<bfloat16_t, double, float>(x.data_ptr<bfloat16_t>(), *L, out.data_ptr<float>());
  if (is_16bit_float(x.dtype())) return sum(out, widened(x), p);
  if (x.dtype() == kFloat32 && sum_trailing_first<float>(out, x, p)) return;
  if (x.dtype() == kFloat64 && sum_trailing_first<double>(out, x, p)) return;
  MU_DISPATCH_ALL(x.dtype(), "sum", [&] {
    using A = acc_t<scalar_t>;
    using O = std::conditional_t<std::is_same_v<scalar_t, bool>, int64_t, scalar_t>;
    if constexpr (std::is_floating_point_v<scalar_t>) {
      if (auto L = column_sum_layout(x, p)) return column_sums<scalar_t, A, O>(x.data_ptr<scalar_t>(), *L, out.data_ptr<O>());
    }
    reduce_runs<scalar_t>(x, p, out.data_ptr<O>(), [](const scalar_t* v, int64_t n, int64_t st) {
      if (st == 1) return O(sum_contiguous<scalar_t, A>(v, n));
      A acc = 0;
      for (int64_t i = 0; i < n; ++i) acc = fn::wrapping_add(acc, A(v[i * st]));
      return O(acc);
    });
  });
}

// NaN wins every comparison, as in PyTorch: a max or min over a run holding NaN is NaN.
template <class T>
static bool better(T v, T best, bool take_max) {
  if (v != v) return best == best;  // the first NaN replaces any number, never another NaN
  return take_max ? v > best : v < best;
}

// The extremum of a contiguous float32 / float64 run on vectors, when it is a number
// other than zero: four accumulators of lane-wise winners, and a flag for NaN lanes
// (which lose every comparison there). A run holding NaN, or whose extremum is zero,
// returns nullopt: the scalar rule then decides (its first NaN; the first of its zeros,
// whose sign the lanes' order would otherwise pick). Any other extremum is the same
// value, bit for bit, whichever lane found it. (The scalar loop's compare and branch
// on the running winner: 1.2 ns an element on Zen 5.)
template <class T>
std::optional<T> vector_extremum(const T* v, int64_t n, bool take_max) {
  using V = typename Vec<T>::type;
  constexpr int W = Vec<T>::width;
  using Mask = decltype(V{} != V{});  // a lane is all ones where true
  V acc[4] = {load(v), load(v + W), load(v + 2 * W), load(v + 3 * W)};
  Mask nan = (acc[0] != acc[0]) | (acc[1] != acc[1]) | (acc[2] != acc[2]) | (acc[3] != acc[3]);
  int64_t i = 4 * W;
  auto step = [&](V& a, V x) {
    nan |= x != x;
    a = (take_max ? x > a : x < a) ? x : a;
  };
  for (; i + 4 * W <= n; i += 4 * W)
    for (int k = 0; k < 4; ++k) step(acc[k], load(v + i + k * W));
  for (; i + W <= n; i += W) step(acc[0], load(v + i));
  T best = acc[0][0];
  bool any_nan = false;
  for (int k = 0; k < 4; ++k)
    for (int l = 0; l < W; ++l) {
      any_nan |= nan[l] != 0;
      if (take_max ? acc[k][l] > best : acc[k][l] < best) best = acc[k][l];
    }
  for (; i < n; ++i) {
    any_nan |= v[i] != v[i];
    if (take_max ? v[i] > best : v[i] < best) best = v[i];
  }
  if (any_nan || best == T(0)) return std::nullopt;
  return best;
}

// The index of the first element of v[0, n) equal to m (one there is), a vector of
// comparisons at a time on AVX-512 (a loop that may stop early, which GCC 12 leaves
// scalar: half of argmax's time after vector_extremum).
template <class T>
int64_t first_equal(const T* v, int64_t n, T m) {
  int64_t i = 0;
#if defined(__AVX512F__) && defined(__x86_64__)
  if constexpr (std::is_same_v<T, float> && Vec<T>::width == 16) {
    const __m512 mv = _mm512_set1_ps(m);
    for (; i + 16 <= n; i += 16)
      if (_mm512_cmpeq_ps_mask(_mm512_loadu_ps(v + i), mv) != 0) break;
  } else if constexpr (std::is_same_v<T, double> && Vec<T>::width == 8) {
    const __m512d mv = _mm512_set1_pd(m);
    for (; i + 8 <= n; i += 8)
      if (_mm512_cmpeq_pd_mask(_mm512_loadu_pd(v + i), mv) != 0) break;
  }
#endif
  for (; i < n; ++i)
    if (v[i] == m) return i;
  return n;  // unreachable when m is in v
}

// Whether a float run of n elements with stride st takes vector_extremum.
template <class T>
bool vector_run(int64_t n, int64_t st) {
  return st == 1 && n >= 4 * Vec<T>::width;
}

static void extremum(const Tensor& out, const Tensor& x, const ReducePlan& p, bool take_max) {
  MU_DISPATCH_NUMERIC(x.dtype(), take_max ? "amax" : "amin", [&] {
    reduce_runs<scalar_t>(x, p, out.data_ptr<scalar_t>(), [take_max](const scalar_t* v, int64_t n, int64_t st) {
      if constexpr (std::is_floating_point_v<scalar_t>)
        if (vector_run<scalar_t>(n, st))
          if (std::optional<scalar_t> m = vector_extremum(v, n, take_max)) return *m;
      scalar_t best = v[0];
      for (int64_t i = 1; i < n; ++i)
        if (better(v[i * st], best, take_max)) best = v[i * st];
      return best;
    });
  });
}

static void arg_extremum(const Tensor& out, const Tensor& x, const ReducePlan& p, bool take_max) {
  MU_DISPATCH_NUMERIC(x.dtype(), take_max ? "argmax" : "argmin", [&] {
    reduce_runs<scalar_t>(x, p, out.data_ptr<int64_t>(), [take_max](const scalar_t* v, int64_t n, int64_t st) {
      if constexpr (std::is_floating_point_v<scalar_t>)
        if (vector_run<scalar_t>(n, st))
          if (std::optional<scalar_t> m = vector_extremum(v, n, take_max))
            return first_equal(v, n, *m);  // the first of equal values, as the scalar rule keeps
      int64_t at = 0;
      for (int64_t i = 1; i < n; ++i)
        if (better(v[i * st], v[at * st], take_max)) at = i;
      return at;
    });
  });
}

MU_REGISTER_KERNEL(kernels::sum, DeviceType::CPU, sum);
MU_REGISTER_KERNEL(kernels::extremum, DeviceType::CPU, extremum);
MU_REGISTER_KERNEL(kernels::arg_extremum, DeviceType::CPU, arg_extremum);

}  // namespace mu::cpu
