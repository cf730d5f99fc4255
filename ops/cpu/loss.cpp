// CPU kernels of cross_entropy with class-index targets (declared in ops/kernels/loss.h).
//
// One line of logits (the C class scores of one position) is handled by one thread:
//   forward:  the max, the sum of exp(x - max) and (with label smoothing) sum_c w[c] x[c];
//             the per-line loss and log-sum-exp are written, nothing of size (N, C).
//             Contiguous lines go in chunks of 1024 (L1-sized): each chunk's max, then its
//             exponentials read again from L1, the sums rescaled when a chunk raises the
//             max, so that the line comes from memory once and is read once.
//   backward: one pass reads x, writes dx = g (a exp(x - lse) - (s/C) w), then fixes up
//             the target's element; dx may be x itself (each logit is read before its
//             gradient is written).
// Lines are independent, so OpenMP splits them over threads. For (N, C, d1, ...) logits
// the line's elements are `inner` = d1 * d2 * ... apart: the kernels take that stride
// rather than transposing to (N * d, C) first, which would cost a full copy of the
// logits and another of the gradient. Consecutive lines of one thread are neighbours in
// memory (offsets differ by 1), so the cache lines a strided line touches are re-used by
// the next ones when C is small, the usual case for per-pixel or per-token losses.
// float32 sums are carried in double (C is long); exp is the vectorisable exp_lanes on
// contiguous lines (float32, and autocast's bfloat16 widened in registers), exp_vec on
// strided ones. float64 is the reference precision: scalar loops and std::exp.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "ops/cpu/loops.h"
#include "ops/cpu/simd.h"
#include "ops/cpu/vec_exp.h"
#include "ops/cpu/widen.h"
#include "ops/kernels/loss.h"

namespace mu::cpu {

namespace {

using kernels::CrossEntropyLines;

// The element offset of line l's first logit and the stride between its logits.
inline int64_t line_offset(const CrossEntropyLines& L, int64_t l) {
  return (l / L.inner) * L.classes * L.inner + l % L.inner;
}

// Runs f(l) for every line, on several threads when the logits are large enough.
template <class F>
void for_lines(const CrossEntropyLines& L, F f) {
  int64_t lines = L.outer * L.inner;
  bool par = lines > 1 && lines * L.classes >= kParallelGrain && !omp_in_parallel();
  parallel_for_if(lines, par, f);
}

// sum_c w[c] in double: what the smoothing term's lse is multiplied by (C without weights).
template <class T>
double weight_total(const T* w, int64_t C) {
  if (!w) return double(C);
  double s = 0;
  for (int64_t c = 0; c < C; ++c) s += double(w[c]);
  return s;
}

// One line's forward. Unit: the line is contiguous (stride 1), so the compiler sees a
// unit-stride loop it can vectorise. Smooth: label smoothing > 0, so sum_c w[c] x[c] is
// needed. Weighted: a class weight is given.
template <class T, bool Unit, bool Smooth, bool Weighted>
void forward_line(const T* x, int64_t stride, const T* w, int64_t C, int64_t t, double eps, double wsum, T* loss,
                  double* lse) {
  using A = acc_t<T>;
  const int64_t st = Unit ? 1 : stride;
  T m = -std::numeric_limits<T>::infinity();
  // A NaN never wins the max, but still reaches the sum through exp(NaN - m), so the loss
  // is NaN; a line of only -inf gives -inf - -inf = NaN too, as in PyTorch.
#pragma omp simd reduction(max : m)
  for (int64_t j = 0; j < C; ++j) m = x[j * st] > m ? x[j * st] : m;
  A s = 0, sx = 0;
  // Two loops rather than one with an unused reduction: GCC leaves a loop scalar when
  // one of its simd reductions is never updated.
  if constexpr (Smooth) {
#pragma omp simd reduction(+ : s, sx)
    for (int64_t j = 0; j < C; ++j) {
      T v = x[j * st];
      s += A(exp_fast<T>(v - m));
      sx += Weighted ? A(w[j]) * A(v) : A(v);
    }
  } else {
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < C; ++j) s += A(exp_fast<T>(x[j * st] - m));
  }
  A l = A(m) + std::log(s);
  A wt = Weighted ? A(w[t]) : A(1);
  // (1 - s) w[t] (lse - x[t]) + (s / C) (sum_c w[c] lse - sum_c w[c] x[c])
  A val = (1 - eps) * wt * (l - A(x[t * st]));
  if constexpr (Smooth) val += eps / double(C) * (wsum * l - sx);
  *loss = T(val);
  *lse = l;
}

// One line's backward: dx = g (a exp(x - lse) - (s/C) w) - g (1 - s) w[t] onehot(t).
template <class T, bool Unit, bool Smooth, bool Weighted>
void backward_line(const T* x, T* dx, int64_t stride, const T* w, int64_t C, int64_t t, double eps, double wsum,
                   double g, double lse) {
  const int64_t st = Unit ? 1 : stride;
  double wt = Weighted ? double(w[t]) : 1.0;
  double ad = g * ((1 - eps) * wt + eps / double(C) * wsum), bd = g * eps / double(C);
  T a = T(ad), b = T(bd);
  // lse = hi + lo in T: (x - hi) - lo keeps the lse's accuracy in T arithmetic (one
  // rounded T lse would put |lse| ulp/2, several 1e-7, into every probability).
  T hi = T(lse), lo = T(lse - double(hi));
  // Read before the loop: dx may be x itself (the op writes the gradient over logits that
  // nothing else holds), and the loop overwrites it.
  const double xt = double(x[t * st]);
#pragma omp simd
  for (int64_t j = 0; j < C; ++j) {
    T v = a * exp_fast<T>((x[j * st] - hi) - lo);
    if constexpr (Smooth) v -= Weighted ? b * w[j] : b;
    dx[j * st] = v;
  }
  // The target's element is a difference of two nearly equal terms when its probability
  // is near 1: redone in double so that T's rounding of the first does not dominate it.
  double pt = std::exp(xt - lse);
  dx[t * st] = T(ad * pt - (Smooth ? bd * wt : 0.0) - g * (1 - eps) * wt);
}

// Contiguous float32 and bfloat16 lines (X, read as they lie: load_as widens autocast's
// bfloat16 in registers) run on whole vectors (ops/cpu/simd.h), with exp_lanes: a loop of
// scalar exp_vec calls vectorises, but GCC turns its clamps into blends (vec_exp.h).
using VF = Vec<float>::type;
constexpr int kW = Vec<float>::width;
using VD = Vec<double>::type;  // half a float vector's lanes, in double (low_to_double, high_to_double)

// A forward line's running state: the max so far (NaN never wins it, as in the scalar
// loop), and in double, on vector lanes, sum exp(x - ref) for ref = m (0 while m is
// -inf, where every element so far is -inf or NaN: their terms are then 0 or NaN) and
// sum_c w[c] x[c].
struct LineSums {
  float m = -std::numeric_limits<float>::infinity();
  VD s_lo{}, s_hi{}, sx_lo{}, sx_hi{};
  void add_exp(VF e) {
    s_lo += low_to_double(e);
    s_hi += high_to_double(e);
  }
};

// The next n elements of a line (n a multiple of kW) into the sums, x from memory or
// from a padded copy (xe: -inf in its padding, which adds exp(-inf) = 0; xs: 0, which
// adds 0 to sum w x). Chunks of 1024 go through the cache once: their max, then their
// exponentials from L1 (one pass over the line in memory instead of two).
// The exponentials of two vectors are added in float before the double sums (in a scratch
// comparison of the line alone over 1024 x 50257 float32 logits on 2 Zen 4 cores, 9.5
// against 13 ms; the op's forward went from 14.4 to 11.1 ms in all); the pair's
// rounding, u/2 relative, is random like exp's own, and left the log-sum-exp within 3e-9
// relative of a long-double sum (5e-10 without it).
template <bool Smooth, bool Weighted, class X>
void add_chunk(LineSums& ls, const X* xe, const X* xs, const float* w, int64_t n) {
  VF mv = VF{} + ls.m;
  for (int64_t j = 0; j < n; j += kW) {
    const VF v = load_as<float>(xe + j);
    mv = v > mv ? v : mv;
  }
  float mb = ls.m;
  for (int l = 0; l < kW; ++l) mb = mv[l] > mb ? mv[l] : mb;
  if (mb > ls.m) {  // a new max: the sums so far rescaled to it (nothing to scale while m is -inf)
    if (ls.m != -std::numeric_limits<float>::infinity()) {
      const double f = std::exp(double(ls.m) - double(mb));
      ls.s_lo *= f;
      ls.s_hi *= f;
    }
    ls.m = mb;
  }
  const float ref = ls.m == -std::numeric_limits<float>::infinity() ? 0.0f : ls.m;
  int64_t j = 0;
  for (; j + 2 * kW <= n; j += 2 * kW)
    ls.add_exp(exp_lanes(load_as<float>(xe + j) - ref) + exp_lanes(load_as<float>(xe + j + kW) - ref));
  if (j < n) ls.add_exp(exp_lanes(load_as<float>(xe + j) - ref));
  if constexpr (Smooth) {
    for (j = 0; j < n; j += kW) {
      const VF v = load_as<float>(xs + j);
      VD lo = low_to_double(v), hi = high_to_double(v);
      if constexpr (Weighted) {
        const VF wv = load(w + j);
        lo *= low_to_double(wv);
        hi *= high_to_double(wv);
      }
      ls.sx_lo += lo;
      ls.sx_hi += hi;
    }
  }
}

// One contiguous line's forward on vectors: the loss and log-sum-exp of forward_line.
template <bool Smooth, bool Weighted, class X>
void forward_line_vec(const X* x, const float* w, int64_t C, int64_t t, double eps, double wsum, float* loss,
                      double* lse) {
  constexpr int64_t kChunk = 1024;
  LineSums ls;
  const int64_t whole = C / kW * kW;
  for (int64_t j = 0; j < whole; j += kChunk) {
    const int64_t n = std::min(kChunk, whole - j);
    add_chunk<Smooth, Weighted>(ls, x + j, x + j, w ? w + j : nullptr, n);
  }
  if (whole < C) {  // the last partial vector, padded
    X xe[kW], xs[kW];
    float wp[kW] = {};
    for (int l = 0; l < kW; ++l) {
      const bool in = whole + l < C;
      xe[l] = in ? x[whole + l] : X(-std::numeric_limits<float>::infinity());
      xs[l] = in ? x[whole + l] : X(0.0f);
      if (Weighted && in) wp[l] = w[whole + l];
    }
    add_chunk<Smooth, Weighted>(ls, xe, xs, wp, kW);
  }
  double s = lane_sum<double, kW / 2>(ls.s_lo + ls.s_hi);
  // A line of only -inf (or NaN) has log-sum-exp NaN, as -inf - -inf gives in the scalar
  // loop and the CUDA kernels, and a NaN loss, as in PyTorch.
  if (ls.m == -std::numeric_limits<float>::infinity()) s = std::numeric_limits<double>::quiet_NaN();
  const double l = double(ls.m) + std::log(s);
  const double wt = Weighted ? double(w[t]) : 1.0;
  double val = (1 - eps) * wt * (l - double(float(x[t])));
  if constexpr (Smooth) val += eps / double(C) * (wsum * l - lane_sum<double, kW / 2>(ls.sx_lo + ls.sx_hi));
  *loss = float(val);
  *lse = l;
}

// One contiguous line's backward on vectors: backward_line's gradient, each vector
// rounded to X as it is stored (store_as for bfloat16: bfloat16_t(float)'s bits).
template <bool Smooth, bool Weighted, class X>
void backward_line_vec(const X* x, X* dx, const float* w, int64_t C, int64_t t, double eps, double wsum, double g,
                       double lse) {
  const double wt = Weighted ? double(w[t]) : 1.0;
  const double ad = g * ((1 - eps) * wt + eps / double(C) * wsum), bd = g * eps / double(C);
  const float a = float(ad), b = float(bd);
  const float hi = float(lse), lo = float(lse - double(hi));  // as in backward_line
  const double xt = double(float(x[t]));  // before the loop: dx may be x itself
  auto grad = [&](VF v, const float* wj) {
    VF d = a * exp_lanes((v - hi) - lo);
    if constexpr (Smooth) d -= Weighted ? b * load(wj) : VF{} + b;
    return d;
  };
  const int64_t whole = C / kW * kW;
  for (int64_t j = 0; j < whole; j += kW) store_as(dx + j, grad(load_as<float>(x + j), w ? w + j : nullptr));
  if (whole < C) {
    X xp[kW] = {};
    float wp[kW] = {}, res[kW];
    for (int64_t l = 0; whole + l < C; ++l) {
      xp[l] = x[whole + l];
      if (Weighted) wp[l] = w[whole + l];
    }
    store(res, grad(load_as<float>(xp), wp));
    for (int64_t l = 0; whole + l < C; ++l) dx[whole + l] = X(res[l]);
  }
  const double pt = std::exp(xt - lse);  // the target's element, redone in double as in backward_line
  dx[t] = X(float(ad * pt - (Smooth ? bd * wt : 0.0) - g * (1 - eps) * wt));
}

template <class T, class X, bool Unit, bool Smooth, bool Weighted>
void forward_lines(const X* x, const int64_t* target, const T* w, T* loss, double* lse, const CrossEntropyLines& L) {
  static_assert(std::is_same_v<X, T> || Unit, "bfloat16 logits: contiguous lines only");
  double wsum = weight_total(w, L.classes);
  for_lines(L, [&](int64_t l) {
    int64_t t = target[l];
    if (t == L.ignore_index) {
      loss[l] = T(0);
      lse[l] = 0;
      return;
    }
    const X* xl = x + line_offset(L, l);
    if constexpr (Unit && std::is_same_v<T, float>)
      forward_line_vec<Smooth, Weighted>(xl, w, L.classes, t, L.label_smoothing, wsum, loss + l, lse + l);
    else
      forward_line<T, Unit, Smooth, Weighted>(xl, L.inner, w, L.classes, t, L.label_smoothing, wsum, loss + l, lse + l);
  });
}

template <class T, class X, bool Unit, bool Smooth, bool Weighted>
void backward_lines(const T* g, int64_t g_numel, double scale, const X* x, const int64_t* target, const T* w,
                    const double* lse, X* dx, const CrossEntropyLines& L) {
  static_assert(std::is_same_v<X, T> || Unit, "bfloat16 logits: contiguous lines only");
  double wsum = weight_total(w, L.classes);
  for_lines(L, [&](int64_t l) {
    int64_t t = target[l], off = line_offset(L, l);
    if (t == L.ignore_index) {  // no loss, no gradient
      for (int64_t j = 0; j < L.classes; ++j) dx[off + j * L.inner] = X(0.0f);
      return;
    }
    // One upstream value per line (Reduction::None) or one for all (a reduced loss).
    double gl = scale * double(g[g_numel == 1 ? 0 : l]);
    if constexpr (Unit && std::is_same_v<T, float>)
      backward_line_vec<Smooth, Weighted>(x + off, dx + off, w, L.classes, t, L.label_smoothing, wsum, gl, lse[l]);
    else
      backward_line<T, Unit, Smooth, Weighted>(x + off, dx + off, L.inner, w, L.classes, t, L.label_smoothing, wsum,
                                               gl, lse[l]);
  });
}

// Picks the instantiation for the runtime flags: 8 specialised loops per dtype, so the
// hot (N, C) case without smoothing or weights carries no dead work in its inner loop.
template <class T, class Go>
void specialise(const CrossEntropyLines& L, bool weighted, Go go) {
  bool unit = L.inner == 1, smooth = L.label_smoothing > 0;
  auto with_w = [&](auto u, auto s) {
    if (weighted)
      go.template operator()<decltype(u)::value, decltype(s)::value, true>();
    else
      go.template operator()<decltype(u)::value, decltype(s)::value, false>();
  };
  auto with_s = [&](auto u) {
    if (smooth)
      with_w(u, std::true_type{});
    else
      with_w(u, std::false_type{});
  };
  if (unit)
    with_s(std::true_type{});
  else
    with_s(std::false_type{});
}

template <class T>
const T* optional_ptr(const Tensor& t) {
  return t.defined() ? t.data_ptr<T>() : nullptr;
}

void cross_entropy_forward(const Tensor& logits, const Tensor& target, const Tensor& weight, const Tensor& loss,
                           const Tensor& lse, const CrossEntropyLines& L) {
  // bfloat16 logits (autocast's): computed in float32 (the CPU has no bfloat16
  // arithmetic), line by line when the lines are contiguous, else on a float32 copy; the
  // loss is float32 already.
  if (logits.dtype() == kBFloat16 && L.inner == 1 && logits.is_contiguous()) {
    const float* w = optional_ptr<float>(weight);
    specialise<float>(L, w != nullptr, [&]<bool U, bool S, bool W>() {
      if constexpr (U)
        forward_lines<float, bfloat16_t, true, S, W>(logits.data_ptr<bfloat16_t>(), target.data_ptr<int64_t>(), w,
                                                     loss.data_ptr<float>(), lse.data_ptr<double>(), L);
    });
    return;
  }
  if (logits.dtype() == kBFloat16) return cross_entropy_forward(widened(logits), target, weight, loss, lse, L);
  MU_DISPATCH_FLOAT(logits.dtype(), "cross_entropy_forward", [&] {
    const scalar_t *x = logits.data_ptr<scalar_t>(), *w = optional_ptr<scalar_t>(weight);
    const int64_t* t = target.data_ptr<int64_t>();
    scalar_t* pl = loss.data_ptr<scalar_t>();
    double* pe = lse.data_ptr<double>();
    specialise<scalar_t>(L, w != nullptr, [&]<bool U, bool S, bool W>() {
      forward_lines<scalar_t, scalar_t, U, S, W>(x, t, w, pl, pe, L);
    });
  });
}

void cross_entropy_backward(const Tensor& grad, double scale, const Tensor& logits, const Tensor& target,
                            const Tensor& weight, const Tensor& lse, const Tensor& dlogits,
                            const CrossEntropyLines& L) {
  if (logits.dtype() == kBFloat16 && L.inner == 1 && logits.is_contiguous() && dlogits.is_contiguous()) {
    const float* w = optional_ptr<float>(weight);
    specialise<float>(L, w != nullptr, [&]<bool U, bool S, bool W>() {
      if constexpr (U)
        backward_lines<float, bfloat16_t, true, S, W>(grad.data_ptr<float>(), grad.numel(), scale,
                                                      logits.data_ptr<bfloat16_t>(), target.data_ptr<int64_t>(), w,
                                                      lse.data_ptr<double>(), dlogits.data_ptr<bfloat16_t>(), L);
    });
    return;
  }
  if (logits.dtype() == kBFloat16) {  // computed in float32, the gradient rounded once
    Tensor wide = wide_like(dlogits);
    cross_entropy_backward(grad, scale, widened(logits), target, weight, lse, wide, L);
    return narrow_into(dlogits, wide);
  }
  MU_DISPATCH_FLOAT(logits.dtype(), "cross_entropy_backward", [&] {
    const scalar_t *x = logits.data_ptr<scalar_t>(), *w = optional_ptr<scalar_t>(weight);
    const scalar_t* g = grad.data_ptr<scalar_t>();
    const double* pe = lse.data_ptr<double>();
    const int64_t* t = target.data_ptr<int64_t>();
    scalar_t* dx = dlogits.data_ptr<scalar_t>();
    int64_t gn = grad.numel();
    specialise<scalar_t>(L, w != nullptr, [&]<bool U, bool S, bool W>() {
      backward_lines<scalar_t, scalar_t, U, S, W>(g, gn, scale, x, t, w, pe, dx, L);
    });
  });
}

}  // namespace

MU_REGISTER_KERNEL(kernels::cross_entropy_forward, DeviceType::CPU, cross_entropy_forward);
MU_REGISTER_KERNEL(kernels::cross_entropy_backward, DeviceType::CPU, cross_entropy_backward);

}  // namespace mu::cpu
