// CUDA kernels of cross_entropy with class-index targets (declared in ops/kernels/loss.h;
// the CPU twin is ops/cpu/loss.cpp). One group of threads per line of C logits, mapped as
// in ops/cuda/lines.cuh: a warp per line for C <= 1024 and a block per line above when
// the logits are (N, C); for (N, C, d1, ...) logits, whose C values of one position are
// `inner` apart, a column of a 2-d block per line with consecutive threads on
// neighbouring positions (consecutive addresses). The forward reads a line once (a
// running max with the sum of exponentials rescaled as it grows); the backward reads and
// writes it once; a contiguous line is read (and its gradient written) 16 bytes at a
// time. float32 sums are carried in double; the log-sum-exp is float64 whatever the
// logits' dtype. bfloat16 logits (autocast's) are read as they are and
// computed in float32, and their gradient is rounded once into bfloat16: no float32
// copy of a (tokens x vocabulary) matrix on either side.
#include "ops/cuda/dtypes.cuh"
#include "ops/cuda/lines.cuh"
#include "ops/cuda/packs.cuh"
#include "ops/kernels/loss.h"

namespace mu::cuda_kernels {

using cuda::acc_t;
using kernels::CrossEntropyLines;

// sum_c w[c] in double, in one block: the smoothing term's factor when a weight is given
// (C without one, which needs no kernel).
template <class T>
__global__ void weight_total_kernel(const T* w, int64_t C, double* out) {
  __shared__ alignas(8) unsigned char scratch[cuda::kScratchBytes];
  const cuda::BlockGroup g{int(threadIdx.x), int(blockDim.x), scratch};
  double s = 0;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) s += double(w[c]);
  s = g.reduce(s, cuda::SumOf{}, 0.0);
  if (threadIdx.x == 0) *out = s;
}

// Launches weight_total_kernel into ws when it is needed (weighted and smoothed);
// returns the device pointer to the total, or null.
template <class T>
static const double* weight_total(const T* w, const CrossEntropyLines& L, const cuda::Workspace& ws, cudaStream_t st) {
  if (!w || !(L.label_smoothing > 0)) return nullptr;
  weight_total_kernel<T><<<1, 256, 0, st>>>(w, L.classes, ws.as<double>());
  MU_CUDA_CHECK_LAUNCH("cross_entropy weight total");
  return ws.as<double>();
}

// A contiguous line read 16 bytes at a time: the elements before the first 16-byte
// boundary (head) and after the last whole pack (tail) one by one, the packs between as
// single accesses. A thread of a group holds one 16-byte load in flight where it held
// one element's (2 bytes for bfloat16): GPT-2's (8192 x 50257) logits were read at a
// fraction of the bandwidth. The group's threads call one(j) for the single elements and
// pack(j0) for the packs starting at element j0, each thread its own share, in no order.
template <class X>
constexpr int kVec = int(16 / sizeof(X));
template <class X>
using Pack16 = cuda::Pack<X, kVec<X>>;
template <class X, class G, class One, class PackFn>
__device__ __forceinline__ void walk_line(const G& g, const X* line, int64_t len, One one, PackFn pack) {
  const auto addr = reinterpret_cast<uintptr_t>(line);
  int64_t head = int64_t((16 - addr % 16) % 16 / sizeof(X));
  if (addr % sizeof(X) != 0 || head > len) head = len;  // never aligned, or too short: all single
  const int64_t packs = (len - head) / kVec<X>, tail = head + packs * kVec<X>;
  for (int64_t j = g.rank; j < head; j += g.size) one(j);
  for (int64_t q = g.rank; q < packs; q += g.size) pack(head + q * kVec<X>);
  for (int64_t j = tail + g.rank; j < len; j += g.size) one(j);
}

// T: the arithmetic type (float32 or float64); X: the logits' storage type (T, or
// bfloat16 with T float32).
template <class T, class X>
struct CrossEntropyForward {
  const X* x;
  const int64_t* target;
  const T* w;           // null: every class weighs 1
  const double* wsum_p;  // sum of w, on the device; null: C (no weight, or no smoothing)
  T* loss;
  double* lse;
  int64_t n;  // classes
  int64_t ignore_index;
  double eps;  // label smoothing

  template <class G>
  __device__ void operator()(const G& g, int64_t off, int64_t st, int64_t line, bool active) const {
    using A = acc_t<T>;
    const int64_t t = active ? target[line] : ignore_index;
    // An ignored line still joins the group's reductions (the column scheme shares them),
    // over no elements.
    const bool live = t != ignore_index;
    const int64_t len = live ? n : 0;
    const X* xl = x + off;
    // One pass: each thread keeps the largest logit it has seen, mt, and s = sum
    // exp(x - mt) over its elements, rescaling s when mt grows; then the group's max m
    // and the sum of every thread's s exp(mt - m).
    const bool smooth = eps > 0;
    T mt = -cuda::dev_inf<T>();
    A s = 0, sx = 0;  // sum exp(x - mt), sum w x (with smoothing)
    // Element j of value v: mt rises to v when v > mt (never for NaN, which reaches s
    // through exp(NaN - mt)); an -inf adds nothing (its exp(-inf - mt) is 0, or NaN
    // while mt is -inf).
    auto add = [&](int64_t j, T v) {
      if (v != -cuda::dev_inf<T>()) s += A(cuda::dev_exp(T(v - mt)));
      if (smooth) sx += w ? A(w[j]) * A(v) : A(v);
    };
    auto rise = [&](T v) {
      if (v > mt) {
        s *= A(cuda::dev_exp(T(mt - v)));  // 0 while mt is still -inf (s is 0 then)
        mt = v;
      }
    };
    auto one = [&](int64_t j) {
      const T v = T(cuda::widen(xl[j * st]));
      rise(v);
      add(j, v);
    };
    if (st == 1) {
      // Contiguous: 16-byte packs, each raising mt once to its largest element.
      walk_line(g, xl, len, one, [&](int64_t j0) {
        const Pack16<X> p = *reinterpret_cast<const Pack16<X>*>(xl + j0);
        T v[kVec<X>];
        T top = -cuda::dev_inf<T>();
#pragma unroll
        for (int e = 0; e < kVec<X>; ++e) {
          v[e] = T(cuda::widen(p.v[e]));
          top = v[e] > top ? v[e] : top;
        }
        rise(top);
#pragma unroll
        for (int e = 0; e < kVec<X>; ++e) add(j0 + e, v[e]);
      });
    } else {
      for (int64_t j = g.rank; j < len; j += g.size) one(j);
    }
    const T m = g.reduce(mt, cuda::MaxOf{}, -cuda::dev_inf<T>());
    // This thread's terms in units of the line's max (nothing when it saw only -inf).
    if (mt != -cuda::dev_inf<T>()) s *= A(cuda::dev_exp(T(mt - m)));
    s = g.reduce(s, cuda::SumOf{}, A(0));
    if (smooth) sx = g.reduce(sx, cuda::SumOf{}, A(0));
    // A line of only -inf: exp(-inf - -inf) is NaN, its loss NaN, as on the CPU.
    if (len > 0 && m == -cuda::dev_inf<T>()) s = A(NAN);
    // One thread per line writes: rank 0 of the group (the line's own thread in the
    // column scheme, where the rank is the row of the block).
    if (g.rank != 0 || !active) return;
    if (!live) {
      loss[line] = T(0);
      lse[line] = 0;
      return;
    }
    const A l = A(m) + cuda::dev_log(s);
    const A wt = w ? A(w[t]) : A(1);
    // (1 - s) w[t] (lse - x[t]) + (s / C) (sum_c w[c] lse - sum_c w[c] x[c])
    A val = (1 - eps) * wt * (l - A(cuda::widen(xl[t * st])));
    if (smooth) val += eps / double(n) * ((wsum_p ? *wsum_p : double(n)) * l - sx);
    loss[line] = T(val);
    lse[line] = l;
  }
};

template <class T, class X>
struct CrossEntropyBackward {
  const T* grad;
  int64_t grad_numel;
  double scale;
  const X* x;
  const int64_t* target;
  const T* w;
  const double* wsum_p;
  const double* lse;
  X* dx;
  int64_t n;
  int64_t ignore_index;
  double eps;

  // No reduction: each thread writes the elements it owns.
  template <class G>
  __device__ void operator()(const G& g, int64_t off, int64_t st, int64_t line, bool active) const {
    if (!active) return;
    const X* xl = x + off;
    X* dl = dx + off;
    const int64_t t = target[line];
    if (t == ignore_index) {  // no loss, no gradient
      for (int64_t j = g.rank; j < n; j += g.size) dl[j * st] = cuda::narrow<X>(T(0));
      return;
    }
    // One upstream value per line (Reduction::None) or one for all (a reduced loss).
    const double gl = scale * double(grad[grad_numel == 1 ? 0 : line]);
    const bool smooth = eps > 0;
    const double wt = w ? double(w[t]) : 1.0, wsum = wsum_p ? *wsum_p : double(n);
    const double ad = gl * ((1 - eps) * wt + eps / double(n) * wsum), bd = gl * eps / double(n);
    const T a = T(ad), b = T(bd);
    // lse = hi + lo in T: (x - hi) - lo keeps the lse's accuracy in T arithmetic.
    const double l = lse[line];
    const T hi = T(l), lo = T(l - double(hi));
    auto grad_of = [&](int64_t j, X x_stored) -> X {
      const T xv = T(cuda::widen(x_stored));
      if (j == t) {
        // The target's element is a difference of two nearly equal terms when its
        // probability is near 1: done in double, so that T's rounding of the first does
        // not dominate it.
        const double pt = exp(double(xv) - l);
        return cuda::narrow<X>(T(ad * pt - (smooth ? bd * wt : 0.0) - gl * (1 - eps) * wt));
      }
      T v = a * cuda::dev_exp(T(T(xv - hi) - lo));
      if (smooth) v -= w ? b * w[j] : b;
      return cuda::narrow<X>(v);
    };
    // Contiguous logits and gradient on the same 16-byte phase: 16-byte packs both ways.
    if (st == 1 && (reinterpret_cast<uintptr_t>(xl) - reinterpret_cast<uintptr_t>(dl)) % 16 == 0) {
      walk_line(
          g, xl, n, [&](int64_t j) { dl[j] = grad_of(j, xl[j]); },
          [&](int64_t j0) {
            const Pack16<X> in = *reinterpret_cast<const Pack16<X>*>(xl + j0);
            Pack16<X> out;
#pragma unroll
            for (int e = 0; e < kVec<X>; ++e) out.v[e] = grad_of(j0 + e, in.v[e]);
            *reinterpret_cast<Pack16<X>*>(dl + j0) = out;
          });
      return;
    }
    for (int64_t j = g.rank; j < n; j += g.size) dl[j * st] = grad_of(j, xl[j * st]);
  }
};

// Calls body(T{}, X{}): the arithmetic and storage types of the logits' dtype.
template <class Body>
static void dispatch_logits(DType dtype, const char* op, Body&& body) {
  if (dtype == DType::BFloat16) return body(float{}, cuda::bf16{});
  cuda::dispatch_float(dtype, op, [&](auto tag) { body(tag, tag); });
}

static void cross_entropy_forward(const Tensor& logits, const Tensor& target, const Tensor& weight,
                                  const Tensor& loss, const Tensor& lse, const CrossEntropyLines& L) {
  if (L.outer * L.inner == 0) return;
  dispatch_logits(logits.dtype(), "cross_entropy", [&](auto tag, auto storage) {
    using T = decltype(tag);
    using X = decltype(storage);
    const cudaStream_t st = cuda::stream(logits);
    const T* w = weight.defined() ? static_cast<const T*>(weight.raw_data()) : nullptr;
    const cuda::Workspace ws(sizeof(double), logits.device().index);
    const CrossEntropyForward<T, X> body{static_cast<const X*>(logits.raw_data()),
                                      static_cast<const int64_t*>(target.raw_data()),
                                      w,
                                      weight_total(w, L, ws, st),
                                      static_cast<T*>(loss.raw_data()),
                                      static_cast<double*>(lse.raw_data()),
                                      L.classes,
                                      L.ignore_index,
                                      L.label_smoothing};
    cuda::launch_lines(L.outer, L.classes, L.inner, st, "cross_entropy_forward", body);
  });
}

static void cross_entropy_backward(const Tensor& grad, double scale, const Tensor& logits, const Tensor& target,
                                   const Tensor& weight, const Tensor& lse, const Tensor& dlogits,
                                   const CrossEntropyLines& L) {
  if (L.outer * L.inner == 0 || L.classes == 0) return;  // nothing to write
  dispatch_logits(logits.dtype(), "cross_entropy backward", [&](auto tag, auto storage) {
    using T = decltype(tag);
    using X = decltype(storage);
    const cudaStream_t st = cuda::stream(logits);
    const T* w = weight.defined() ? static_cast<const T*>(weight.raw_data()) : nullptr;
    const cuda::Workspace ws(sizeof(double), logits.device().index);
    const CrossEntropyBackward<T, X> body{static_cast<const T*>(grad.raw_data()),
                                       grad.numel(),
                                       scale,
                                       static_cast<const X*>(logits.raw_data()),
                                       static_cast<const int64_t*>(target.raw_data()),
                                       w,
                                       weight_total(w, L, ws, st),
                                       static_cast<const double*>(lse.raw_data()),
                                       static_cast<X*>(dlogits.raw_data()),
                                       L.classes,
                                       L.ignore_index,
                                       L.label_smoothing};
    cuda::launch_lines(L.outer, L.classes, L.inner, st, "cross_entropy_backward", body);
  });
}

MU_REGISTER_KERNEL(kernels::cross_entropy_forward, DeviceType::CUDA, cross_entropy_forward);
MU_REGISTER_KERNEL(kernels::cross_entropy_backward, DeviceType::CUDA, cross_entropy_backward);

}  // namespace mu::cuda_kernels
