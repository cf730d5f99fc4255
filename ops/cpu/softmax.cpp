// CPU kernels of softmax and log_softmax (declared in ops/kernels/softmax.h): one
// numerically stable pass per line, the line's max subtracted before exp, sums carried
// in double for float32. exp is the vectorisable exp_fast (ops/cpu/vec_exp.h), or
// exp_lanes on whole vectors for float32 lines of unit stride (softmax over the last dim);
// every loop is one the compiler vectorises. The sampler's softmax over GPT-2's 50257
// logits took 225 µs with the library's scalar exp, one element at a time.
#include <cmath>
#include <limits>
#include <type_traits>

#include "ops/cpu/lines.h"
#include "ops/cpu/simd.h"
#include "ops/cpu/vec_exp.h"
#include "ops/kernels/softmax.h"

namespace mu::cpu {

// Σ exp(x[j] - m) over a float32 line of unit stride, each exponential also stored to y
// when y is given. On whole vectors, as the cross-entropy lines (loss.cpp): exp_lanes,
// whose clamps are one instruction each, and the sum's lanes widened by widen_to_double;
// GCC's vectorisation of the generic loop blends each clamp and splits each widening
// into 128-bit pieces. The last partial vector is padded with -inf (exp 0).
static double exp_sum_unit(const float* x, float* y, int64_t n, float m) {
  using VF = Vec<float>::type;
  using VD = Vec<double>::type;
  constexpr int W = Vec<float>::width;
  VD lo{}, hi{};
  const int64_t whole = n / W * W;
  for (int64_t j = 0; j < whole; j += W) {
    const VF e = exp_lanes(load(x + j) - m);
    if (y) store(y + j, e);
    lo += low_to_double(e);
    hi += high_to_double(e);
  }
  if (whole < n) {
    float xp[W], e[W];
    for (int l = 0; l < W; ++l) xp[l] = whole + l < n ? x[whole + l] : -std::numeric_limits<float>::infinity();
    const VF ev = exp_lanes(load(xp) - m);
    store(e, ev);
    if (y)
      for (int64_t l = 0; whole + l < n; ++l) y[whole + l] = e[l];
    lo += low_to_double(ev);
    hi += high_to_double(ev);
  }
  return lane_sum<double, Vec<double>::width>(lo + hi);
}

// One line of n elements, `stride` apart (1 when Unit).
template <class T, bool Unit>
static void softmax_line(const T* xl, T* yl, int64_t n, int64_t stride, bool log) {
  using A = acc_t<T>;
  const int64_t st = Unit ? 1 : stride;
  T m = -std::numeric_limits<T>::infinity();
  // A NaN never compares greater, so m is the max of the numbers; NaN still reaches
  // the sum through exp(NaN - m).
#pragma omp simd reduction(max : m)
  for (int64_t j = 0; j < n; ++j) m = xl[j * st] > m ? xl[j * st] : m;
  constexpr bool kVec = Unit && std::is_same_v<T, float>;  // exp_sum_unit's lines
  A s = 0;
  if (log) {
    if constexpr (kVec) {
      s = exp_sum_unit(xl, nullptr, n, m);
    } else {
#pragma omp simd reduction(+ : s)
      for (int64_t j = 0; j < n; ++j) s += A(exp_fast<T>(xl[j * st] - m));
    }
    const T ls = T(std::log(s));
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) yl[j * st] = xl[j * st] - m - ls;
  } else {
    // exp once: keep it in y, then scale by the sum.
    if constexpr (kVec) {
      s = exp_sum_unit(xl, yl, n, m);
    } else {
#pragma omp simd reduction(+ : s)
      for (int64_t j = 0; j < n; ++j) {
        const T e = exp_fast<T>(xl[j * st] - m);
        yl[j * st] = e;
        s += A(e);
      }
    }
    const A inv = A(1) / s;
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) yl[j * st] = T(A(yl[j * st]) * inv);
  }
}

// Lines side by side taken together (below), at most kCols of them.
constexpr int64_t kCols = 64;
// Below 8 lines side by side the strided lines are faster: a row of 2 or 4 columns is
// part of a vector, and each row's sums, loaded and stored again in part-vectors, wait on
// the previous row's store ([4096, 64, 4] over dim 1: 0.84 ms strided, 8.0 ms in columns;
// [4096, 32, 8]: 1.05 and 0.75 ms).
constexpr int64_t kColumnsFrom = 8;

// Lines along a dim other than the last lie side by side, inner elements apart: walked
// one line at a time, every element is a cache line of its own. Instead a task takes up
// to kCols neighbouring lines of one o and walks them row by row, each row a contiguous
// run of columns, the per-line max and sum kept in arrays: the same three passes (max,
// exp and sum, scale) as softmax_line, every loop a vector loop over columns. Calls
// body(o, first column, number of columns).
template <class F>
static void for_each_column_block(int64_t outer, int64_t n, int64_t inner, F body) {
  const int64_t blocks = (inner + kCols - 1) / kCols, tasks = outer * blocks;
  const bool par = outer * n * inner >= kParallelGrain && tasks > 1 && !omp_in_parallel();
  parallel_for_if(tasks, par, [&](int64_t t) {
    const int64_t o = t / blocks, c0 = t % blocks * kCols;
    body(o, c0, std::min(kCols, inner - c0));
  });
}

template <class T>
static void softmax_columns(const T* x, T* y, int64_t outer, int64_t n, int64_t inner, bool log) {
  using A = acc_t<T>;
  for_each_column_block(outer, n, inner, [=](int64_t o, int64_t c0, int64_t w) {
    const T* xb = x + o * n * inner + c0;
    T* yb = y + o * n * inner + c0;
    T m[kCols];
    A s[kCols];
    for (int64_t c = 0; c < w; ++c) m[c] = -std::numeric_limits<T>::infinity(), s[c] = 0;
    // NaN never compares greater: m is each line's max of its numbers, and a NaN reaches
    // the line's sum through exp(NaN - m), as in softmax_line.
    for (int64_t j = 0; j < n; ++j) {
      const T* xr = xb + j * inner;
#pragma omp simd
      for (int64_t c = 0; c < w; ++c) m[c] = xr[c] > m[c] ? xr[c] : m[c];
    }
    for (int64_t j = 0; j < n; ++j) {
      const T* xr = xb + j * inner;
      T* yr = yb + j * inner;
#pragma omp simd
      for (int64_t c = 0; c < w; ++c) {
        const T e = exp_fast<T>(xr[c] - m[c]);
        if (!log) yr[c] = e;  // exp once: kept in y, then scaled by the sum
        s[c] += A(e);
      }
    }
    if (log) {
      T ls[kCols];
      for (int64_t c = 0; c < w; ++c) ls[c] = T(std::log(s[c]));
      for (int64_t j = 0; j < n; ++j) {
        const T* xr = xb + j * inner;
        T* yr = yb + j * inner;
#pragma omp simd
        for (int64_t c = 0; c < w; ++c) yr[c] = xr[c] - m[c] - ls[c];
      }
    } else {
      A inv[kCols];
      for (int64_t c = 0; c < w; ++c) inv[c] = A(1) / s[c];
      for (int64_t j = 0; j < n; ++j) {
        T* yr = yb + j * inner;
#pragma omp simd
        for (int64_t c = 0; c < w; ++c) yr[c] = T(A(yr[c]) * inv[c]);
      }
    }
  });
}

template <class T>
static void softmax_lines(const T* x, T* y, int64_t outer, int64_t n, int64_t inner, bool log) {
  if (inner >= kColumnsFrom) return softmax_columns(x, y, outer, n, inner, log);
  for_each_line(outer, n, inner, [=](int64_t off, int64_t st) {
    if (st == 1) softmax_line<T, true>(x + off, y + off, n, 1, log);
    else softmax_line<T, false>(x + off, y + off, n, st, log);
  });
}

// The gradient of one line of n elements, `stride` apart (1 when Unit): vector loops, as
// the forward's, the sums as omp simd reductions and exp(y) (y <= 0, the
// log-probabilities) by exp_fast, whose float32 form is exact to about an ulp. (With
// std::exp in double, one element at a time, and the stride a run-time value,
// log_softmax's backward over 1024 x 50257 took 210 ms on 2 cores, against its
// forward's 33.)
template <class T, bool Unit>
static void softmax_backward_line(const T* gl, const T* yl, T* dl, int64_t n, int64_t stride, bool log) {
  using A = acc_t<T>;
  const int64_t st = Unit ? 1 : stride;
  A s = 0;
  if (log) {
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < n; ++j) s += A(gl[j * st]);
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) dl[j * st] = T(A(gl[j * st]) - A(exp_fast<T>(yl[j * st])) * s);
  } else {
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < n; ++j) s += A(gl[j * st]) * A(yl[j * st]);
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) dl[j * st] = T(A(yl[j * st]) * (A(gl[j * st]) - s));
  }
}

// The gradient of lines side by side, kCols of them at a time, as the forward's
// softmax_columns.
template <class T>
static void softmax_backward_columns(const T* g, const T* y, T* dx, int64_t outer, int64_t n, int64_t inner,
                                     bool log) {
  using A = acc_t<T>;
  for_each_column_block(outer, n, inner, [=](int64_t o, int64_t c0, int64_t w) {
    const int64_t base = o * n * inner + c0;
    A s[kCols];
    for (int64_t c = 0; c < w; ++c) s[c] = 0;
    for (int64_t j = 0; j < n; ++j) {
      const T *gr = g + base + j * inner, *yr = y + base + j * inner;
#pragma omp simd
      for (int64_t c = 0; c < w; ++c) s[c] += log ? A(gr[c]) : A(gr[c]) * A(yr[c]);
    }
    for (int64_t j = 0; j < n; ++j) {
      const T *gr = g + base + j * inner, *yr = y + base + j * inner;
      T* dr = dx + base + j * inner;
      if (log) {
#pragma omp simd
        for (int64_t c = 0; c < w; ++c) dr[c] = T(A(gr[c]) - A(exp_fast<T>(yr[c])) * s[c]);
      } else {
#pragma omp simd
        for (int64_t c = 0; c < w; ++c) dr[c] = T(A(yr[c]) * (A(gr[c]) - s[c]));
      }
    }
  });
}

template <class T>
static void softmax_backward_lines(const T* g, const T* y, T* dx, int64_t outer, int64_t n, int64_t inner, bool log) {
  if (inner >= kColumnsFrom) return softmax_backward_columns(g, y, dx, outer, n, inner, log);
  for_each_line(outer, n, inner, [=](int64_t off, int64_t st) {
    if (st == 1) softmax_backward_line<T, true>(g + off, y + off, dx + off, n, 1, log);
    else softmax_backward_line<T, false>(g + off, y + off, dx + off, n, st, log);
  });
}

static void softmax_forward(const Tensor& x, const Tensor& y, int64_t outer, int64_t n, int64_t inner, bool log) {
  MU_DISPATCH_FLOAT(x.dtype(), "softmax_forward", [&] {
    softmax_lines(x.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), outer, n, inner, log);
  });
}

static void softmax_backward(const Tensor& g, const Tensor& y, const Tensor& dx, int64_t outer, int64_t n,
                             int64_t inner, bool log) {
  MU_DISPATCH_FLOAT(y.dtype(), "softmax_backward", [&] {
    softmax_backward_lines(g.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), dx.data_ptr<scalar_t>(), outer, n, inner,
                           log);
  });
}

MU_REGISTER_KERNEL(kernels::softmax_forward, DeviceType::CPU, softmax_forward);
MU_REGISTER_KERNEL(kernels::softmax_backward, DeviceType::CPU, softmax_backward);

}  // namespace mu::cpu
