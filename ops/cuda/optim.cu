// CUDA kernels of the optimisers (declared in ops/kernels/optim.h; the CPU twins are in
// ops/cpu/optim.cpp): the fused AdamW and SGD updates, one thread per element in a
// grid-stride loop, and the gradient-norm reduction of clipping.
//
// The updates round exactly where the CPU's do, so a step on the GPU equals a step on
// the CPU bit for bit: every multiply, add, divide and square root is an explicit
// round-to-nearest intrinsic (__fmul_rn, __fadd_rn, ...), which nvcc never contracts,
// and the CPU's fmadds (std::fma: the CPU build uses -march=native, whose x86-64 targets
// have FMA) are __fmaf_rn / __fma_rn. The step scalars are rounded to the dtype on the
// host, as the CPU kernel rounds them.
#include <cmath>

#include "ops/cuda/dtypes.cuh"
#include "ops/cuda/runtime.cuh"
#include "ops/kernels/optim.h"

namespace mu::cuda_kernels {

namespace {

// Correctly rounded arithmetic, one rounding per call, never fused with a neighbour.
__device__ __forceinline__ float mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double add(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ float div(float a, float b) { return __fdiv_rn(a, b); }
__device__ __forceinline__ double div(double a, double b) { return __ddiv_rn(a, b); }
__device__ __forceinline__ float root(float a) { return __fsqrt_rn(a); }
__device__ __forceinline__ double root(double a) { return __dsqrt_rn(a); }
__device__ __forceinline__ float fmadd(float a, float b, float c) { return __fmaf_rn(a, b, c); }
__device__ __forceinline__ double fmadd(double a, double b, double c) { return __fma_rn(a, b, c); }

// ---------------------------------------------------------------- AdamW

// The CPU's AdamWScalars: each step scalar rounded once to T.
template <class T>
struct AdamWScalars {
  T decay, beta1, one_minus_beta1, beta2, one_minus_beta2, bc2_sqrt, eps, neg_step;
};

// One thread per element: the CPU's adamw_range, operation for operation.
template <class T, bool kAmsgrad, bool kMaximize>
__global__ void adamw_kernel(T* p, const T* g, T* m, T* v, T* vmax, int64_t n, AdamWScalars<T> s) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const T gi = kMaximize ? -g[i] : g[i];  // negation is exact
    const T pi = mul(p[i], s.decay);
    const T mi = fmadd(s.one_minus_beta1, gi, mul(m[i], s.beta1));
    const T vi = fmadd(mul(s.one_minus_beta2, gi), gi, mul(v[i], s.beta2));
    T vd = vi;
    if constexpr (kAmsgrad) {
      // torch.maximum: NaN from either side propagates.
      const T vm = vmax[i];
      vd = vi != vi ? vi : vm != vm ? vm : vm > vi ? vm : vi;
      vmax[i] = vd;
    }
    const T denom = add(div(root(vd), s.bc2_sqrt), s.eps);
    p[i] = add(pi, div(mul(s.neg_step, mi), denom));
    m[i] = mi;
    v[i] = vi;
  }
}

template <class T, bool kAmsgrad, bool kMaximize>
void launch_adamw(const Tensor& param, T* p, const T* g, T* m, T* v, T* vmax, int64_t n, const AdamWScalars<T>& s) {
  adamw_kernel<T, kAmsgrad, kMaximize><<<cuda::grid_for(n, 256), 256, 0, cuda::stream(param)>>>(p, g, m, v, vmax, n, s);
  MU_CUDA_CHECK_LAUNCH("AdamW");
}

// ---------------------------------------------------------------- SGD

template <class T>
struct SGDScalars {
  T neg_lr, weight_decay, momentum, one_minus_damp;
  bool has_decay, has_momentum, nesterov, first;
};

// One thread per element: the CPU's sgd_loop body.
template <class T>
__global__ void sgd_kernel(T* p, const T* g, T* buf, int64_t n, SGDScalars<T> s) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    T d = g[i];
    // torch skips the add when wd == 0, which matters for -0 and non-finite parameters.
    if (s.has_decay) d = fmadd(s.weight_decay, p[i], d);
    if (s.has_momentum) {
      // First update: the buffer is a copy of d, not μ·0 + (1-damp)·d.
      const T b = s.first ? d : fmadd(s.one_minus_damp, d, mul(buf[i], s.momentum));
      buf[i] = b;
      d = s.nesterov ? fmadd(s.momentum, b, d) : b;
    }
    p[i] = fmadd(s.neg_lr, d, p[i]);
  }
}

// ---------------------------------------------------------------- gradient norms

constexpr int kNormThreads = 256;
constexpr int64_t kNormChunk = 1 << 15;  // elements per first-pass block: a fixed partition

// |x|^p, or |x| for the max (p infinite).
template <class T>
__device__ double norm_term(T x, double p, int mode) {
  const double a = fabs(double(x));
  return mode == 0 ? a * a : mode == 1 ? a : mode == 2 ? pow(a, p) : a;
}

// The combination of two partials: sums add; maxima keep the larger, NaN once seen.
__device__ double combine(double a, double b, bool inf) {
  if (!inf) return a + b;
  if (a != a || b != b) return a != a ? a : b;
  return a > b ? a : b;
}

// A fixed-order tree over the block (shuffles, then the warps' partials): the same
// result on every run whatever the GPU.
__device__ double block_combine(double v, bool inf, double* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int o = 16; o > 0; o >>= 1) v = combine(v, __shfl_xor_sync(0xffffffffu, v, o), inf);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : 0.0;  // 0 is neutral for sums and for maxima of |x|
  for (int o = 16; o > 0; o >>= 1) v = combine(v, __shfl_xor_sync(0xffffffffu, v, o), inf);
  return v;
}

// Pass 1: block b reduces elements [b·kNormChunk, (b+1)·kNormChunk), each thread a fixed
// strided subset in order, into part[b]. mode: 0 p = 2, 1 p = 1, 2 other p, 3 infinite.
template <class T>
__global__ void norm_parts_kernel(const T* x, int64_t n, double p, int mode, double* part) {
  __shared__ double scratch[32];
  const bool inf = mode == 3;
  const int64_t begin = int64_t(blockIdx.x) * kNormChunk;
  const int64_t end = begin + kNormChunk < n ? begin + kNormChunk : n;
  double acc = 0.0;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) acc = combine(acc, norm_term(x[i], p, mode), inf);
  acc = block_combine(acc, inf, scratch);
  if (threadIdx.x == 0) part[blockIdx.x] = acc;
}

// Pass 2: one block combines the partials the same way into part[0]'s slot `out`.
__global__ void norm_total_kernel(const double* part, int64_t parts, bool inf, double* out) {
  __shared__ double scratch[32];
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < parts; i += blockDim.x) acc = combine(acc, part[i], inf);
  acc = block_combine(acc, inf, scratch);
  if (threadIdx.x == 0) *out = acc;
}

}  // namespace

static void adamw_update(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                         const Tensor& max_exp_avg_sq, const kernels::AdamWStep& k) {
  const int64_t n = param.numel();
  if (n == 0) return;
  cuda::dispatch_float(param.dtype(), "AdamW", [&](auto tag) {
    using T = decltype(tag);
    const AdamWScalars<T> s{T(k.decay),           T(k.beta1),    T(k.one_minus_beta1), T(k.beta2),
                            T(k.one_minus_beta2), T(k.bc2_sqrt), T(k.eps),             T(k.neg_step)};
    T* p = static_cast<T*>(param.raw_data());
    const T* g = static_cast<const T*>(grad.raw_data());
    T* m = static_cast<T*>(exp_avg.raw_data());
    T* v = static_cast<T*>(exp_avg_sq.raw_data());
    T* vmax = k.amsgrad ? static_cast<T*>(max_exp_avg_sq.raw_data()) : nullptr;
    if (k.amsgrad) {
      k.maximize ? launch_adamw<T, true, true>(param, p, g, m, v, vmax, n, s)
                 : launch_adamw<T, true, false>(param, p, g, m, v, vmax, n, s);
    } else {
      k.maximize ? launch_adamw<T, false, true>(param, p, g, m, v, vmax, n, s)
                 : launch_adamw<T, false, false>(param, p, g, m, v, vmax, n, s);
    }
  });
}

static void sgd_update(const Tensor& param, const Tensor& grad, const Tensor& momentum_buffer,
                       const kernels::SGDStep& k) {
  const int64_t n = param.numel();
  if (n == 0) return;
  cuda::dispatch_float(param.dtype(), "SGD", [&](auto tag) {
    using T = decltype(tag);
    const SGDScalars<T> s{T(k.neg_lr),  T(k.weight_decay), T(k.momentum), T(k.one_minus_damp),
                          k.has_decay, k.has_momentum,    k.nesterov,    k.first};
    T* buf = k.has_momentum ? static_cast<T*>(momentum_buffer.raw_data()) : nullptr;
    sgd_kernel<T><<<cuda::grid_for(n, 256), 256, 0, cuda::stream(param)>>>(
        static_cast<T*>(param.raw_data()), static_cast<const T*>(grad.raw_data()), buf, n, s);
    MU_CUDA_CHECK_LAUNCH("SGD");
  });
}

static double norm_power_sum(const Tensor& x, double p) {
  const int64_t n = x.numel();
  if (n == 0) return 0.0;
  const bool inf = std::isinf(p);
  const int mode = inf ? 3 : p == 2.0 ? 0 : p == 1.0 ? 1 : 2;
  const int64_t parts = (n + kNormChunk - 1) / kNormChunk;
  cudaStream_t s = cuda::stream(x);
  // The partials, then the total in the slot after them.
  cuda::Workspace ws(size_t(parts + 1) * sizeof(double), x.device().index);
  double* part = ws.as<double>();
  cuda::dispatch_float(x.dtype(), "clip_grad_norm", [&](auto tag) {
    using T = decltype(tag);
    norm_parts_kernel<T><<<unsigned(parts), kNormThreads, 0, s>>>(static_cast<const T*>(x.raw_data()), n, p, mode,
                                                                   part);
    MU_CUDA_CHECK_LAUNCH("clip_grad_norm (parts)");
  });
  norm_total_kernel<<<1, 1024, 0, s>>>(part, parts, inf, part + parts);
  MU_CUDA_CHECK_LAUNCH("clip_grad_norm (total)");
  double total = 0.0;
  MU_CUDA_CHECK(cudaMemcpyAsync(&total, part + parts, sizeof(double), cudaMemcpyDeviceToHost, s));
  MU_CUDA_CHECK(cudaStreamSynchronize(s));
  return total;
}

MU_REGISTER_KERNEL(kernels::adamw_update, DeviceType::CUDA, adamw_update);
MU_REGISTER_KERNEL(kernels::sgd_update, DeviceType::CUDA, sgd_update);
MU_REGISTER_KERNEL(kernels::norm_power_sum, DeviceType::CUDA, norm_power_sum);

}  // namespace mu::cuda_kernels
