// CUDA kernels of softmax and log_softmax (declared in ops/kernels/softmax.h; the CPU
// twin is ops/cpu/softmax.cpp). Threads map to lines as in ops/cuda/lines.cuh: a warp or
// a block per line when the line is contiguous (inner == 1), a column of a 2-d block per
// line otherwise, with consecutive threads on neighbouring lines. Each group reads its
// line three times (max, sum, write); the max is subtracted before exp, and float32 sums
// are carried in double, as on the CPU.
#include "ops/cuda/dtypes.cuh"
#include "ops/cuda/lines.cuh"
#include "ops/kernels/softmax.h"

namespace mu::cuda_kernels {

using cuda::acc_t;

template <class T>
struct SoftmaxForward {
  const T* x;
  T* y;
  int64_t n;
  bool log;

  template <class G>
  __device__ void operator()(const G& g, int64_t off, int64_t st, int64_t, bool active) const {
    using A = acc_t<T>;
    const T* xl = x + off;
    T* yl = y + off;
    const int64_t len = active ? n : 0;
    // A NaN never compares greater, so m is the max of the numbers (-inf for a line of
    // only -inf); NaN still reaches the sum through exp(NaN - m), and -inf - -inf is NaN.
    T m = -cuda::dev_inf<T>();
    for (int64_t j = g.rank; j < len; j += g.size) m = xl[j * st] > m ? xl[j * st] : m;
    m = g.reduce(m, cuda::MaxOf{}, -cuda::dev_inf<T>());
    A s = 0;
    if (log) {
      for (int64_t j = g.rank; j < len; j += g.size) s += A(cuda::dev_exp(T(xl[j * st] - m)));
      s = g.reduce(s, cuda::SumOf{}, A(0));
      const T ls = T(cuda::dev_log(s));
      for (int64_t j = g.rank; j < len; j += g.size) yl[j * st] = xl[j * st] - m - ls;
    } else {
      // exp once: kept in y, then scaled by the sum. Each thread reads back only the
      // elements it wrote itself, so no barrier is needed between the passes.
      for (int64_t j = g.rank; j < len; j += g.size) {
        const T e = cuda::dev_exp(T(xl[j * st] - m));
        yl[j * st] = e;
        s += A(e);
      }
      s = g.reduce(s, cuda::SumOf{}, A(0));
      const A inv = A(1) / s;
      for (int64_t j = g.rank; j < len; j += g.size) yl[j * st] = T(A(yl[j * st]) * inv);
    }
  }
};

template <class T>
struct SoftmaxBackward {
  const T *g_, *y;
  T* dx;
  int64_t n;
  bool log;

  template <class G>
  __device__ void operator()(const G& g, int64_t off, int64_t st, int64_t, bool active) const {
    using A = acc_t<T>;
    const T *gl = g_ + off, *yl = y + off;
    T* dl = dx + off;
    const int64_t len = active ? n : 0;
    A s = 0;
    if (log) {
      // dx = g - exp(y) sum(g); exp in the accumulator type, as on the CPU.
      for (int64_t j = g.rank; j < len; j += g.size) s += A(gl[j * st]);
      s = g.reduce(s, cuda::SumOf{}, A(0));
      for (int64_t j = g.rank; j < len; j += g.size) dl[j * st] = T(A(gl[j * st]) - cuda::dev_exp(A(yl[j * st])) * s);
    } else {
      // dx = y (g - sum(g y)).
      for (int64_t j = g.rank; j < len; j += g.size) s += A(gl[j * st]) * A(yl[j * st]);
      s = g.reduce(s, cuda::SumOf{}, A(0));
      for (int64_t j = g.rank; j < len; j += g.size) dl[j * st] = T(A(yl[j * st]) * (A(gl[j * st]) - s));
    }
  }
};

static void softmax_forward(const Tensor& x, const Tensor& y, int64_t outer, int64_t n, int64_t inner, bool log) {
  if (x.numel() == 0) return;
  cuda::dispatch_float(x.dtype(), log ? "log_softmax" : "softmax", [&](auto tag) {
    using T = decltype(tag);
    const SoftmaxForward<T> body{static_cast<const T*>(x.raw_data()), static_cast<T*>(y.raw_data()), n, log};
    cuda::launch_lines(outer, n, inner, cuda::stream(x), "softmax_forward", body);
  });
}

static void softmax_backward(const Tensor& g, const Tensor& y, const Tensor& dx, int64_t outer, int64_t n,
                             int64_t inner, bool log) {
  if (y.numel() == 0) return;
  cuda::dispatch_float(y.dtype(), log ? "log_softmax backward" : "softmax backward", [&](auto tag) {
    using T = decltype(tag);
    const SoftmaxBackward<T> body{static_cast<const T*>(g.raw_data()), static_cast<const T*>(y.raw_data()),
                                  static_cast<T*>(dx.raw_data()), n, log};
    cuda::launch_lines(outer, n, inner, cuda::stream(y), "softmax_backward", body);
  });
}

MU_REGISTER_KERNEL(kernels::softmax_forward, DeviceType::CUDA, softmax_forward);
MU_REGISTER_KERNEL(kernels::softmax_backward, DeviceType::CUDA, softmax_backward);

}  // namespace mu::cuda_kernels
