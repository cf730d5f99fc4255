// CUDA kernels of the optimisers (declared in ops/kernels/optim.h; the CPU twins are in
// ops/cpu/optim.cpp): the fused AdamW and SGD updates of every parameter of a step in
// one launch (per 320 chunks of 64Ki elements: each block updates one chunk of one
// parameter, the pointers and sizes passed by value in the kernel's arguments), and the
// gradient-norm reduction of clipping over all gradients with one read-back.
//
// The updates round exactly where the CPU's do, so a step on the GPU equals a step on
// the CPU bit for bit: every multiply, add, divide and square root is an explicit
// round-to-nearest intrinsic (__fmul_rn, __fadd_rn, ...), which nvcc never contracts,
// and the CPU's fmadds (std::fma: the CPU build uses -march=native, whose x86-64 targets
// have FMA) are __fmaf_rn / __fma_rn. The step scalars are rounded to the dtype on the
// host, as the CPU kernel rounds them.
#include <array>
#include <cmath>
#include <vector>

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

// ---------------------------------------------------------------- lists of tensors

constexpr int kListTensors = 24;           // parameters per launch
constexpr int kListBlocks = 320;           // blocks per launch
constexpr int64_t kListChunk = 1 << 16;    // elements per block
constexpr int kListThreads = 512;

// What one launch updates: N pointers per parameter (param, grad, state buffers), each
// parameter's size, and for block b the parameter and the chunk of it that it takes.
// 5 pointers: 5·24·8 + 24·8 + 320 + 320·4 = 2752 bytes, within the 4 KiB of arguments.
template <int N>
struct TensorChunks {
  void* ptr[N][kListTensors];
  int64_t numel[kListTensors];
  unsigned char tensor[kListBlocks];
  int chunk[kListBlocks];
};

// Fills TensorChunks from the lists and calls launch(chunks, blocks) whenever the
// parameter slots or the blocks are full, and once at the end. A parameter cut by a
// launch continues in slot 0 of the next.
template <int N, class Launch>
void for_tensor_chunks(const std::vector<std::array<void*, N>>& ptrs, const std::vector<int64_t>& numels,
                       Launch launch) {
  TensorChunks<N> c{};
  int nt = 0, nb = 0;
  for (size_t i = 0; i < ptrs.size(); ++i) {
    if (numels[i] == 0) continue;
    for (int k = 0; k < N; ++k) c.ptr[k][nt] = ptrs[i][size_t(k)];
    c.numel[nt] = numels[i];
    const int64_t chunks = (numels[i] + kListChunk - 1) / kListChunk;
    for (int64_t ch = 0; ch < chunks; ++ch) {
      c.tensor[nb] = static_cast<unsigned char>(nt);
      c.chunk[nb] = int(ch);
      ++nb;
      const bool last = ch == chunks - 1;
      if (nb == kListBlocks || (last && nt == kListTensors - 1)) {
        launch(c, nb);
        nb = 0;
        if (last) {
          nt = -1;  // done; the next parameter takes slot 0
        } else {
          for (int k = 0; k < N; ++k) c.ptr[k][0] = c.ptr[k][nt];
          c.numel[0] = c.numel[nt];
          nt = 0;
        }
      }
    }
    ++nt;
  }
  if (nb > 0) launch(c, nb);
}

// The element range [begin, end) of block blockIdx.x's chunk, and its parameter's slot.
template <int N>
__device__ __forceinline__ int chunk_range(const TensorChunks<N>& c, int64_t& begin, int64_t& end) {
  const int t = c.tensor[blockIdx.x];
  begin = int64_t(c.chunk[blockIdx.x]) * kListChunk;
  end = begin + kListChunk < c.numel[t] ? begin + kListChunk : c.numel[t];
  return t;
}

// One thread per element of each chunk: the CPU's adamw_range, operation for operation.
template <class T, bool kAmsgrad, bool kMaximize>
__global__ void __launch_bounds__(kListThreads) adamw_kernel(TensorChunks<5> c, AdamWScalars<T> s) {
  int64_t begin, end;
  const int t = chunk_range(c, begin, end);
  T* p = static_cast<T*>(c.ptr[0][t]);
  const T* g = static_cast<const T*>(c.ptr[1][t]);
  T* m = static_cast<T*>(c.ptr[2][t]);
  T* v = static_cast<T*>(c.ptr[3][t]);
  T* vmax = static_cast<T*>(c.ptr[4][t]);
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
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
void launch_adamw(const std::vector<std::array<void*, 5>>& ptrs, const std::vector<int64_t>& numels,
                  const AdamWScalars<T>& s, cudaStream_t stream) {
  for_tensor_chunks<5>(ptrs, numels, [&](const TensorChunks<5>& c, int blocks) {
    adamw_kernel<T, kAmsgrad, kMaximize><<<unsigned(blocks), kListThreads, 0, stream>>>(c, s);
    MU_CUDA_CHECK_LAUNCH("AdamW");
  });
}

// ---------------------------------------------------------------- SGD

template <class T>
struct SGDScalars {
  T neg_lr, weight_decay, momentum, one_minus_damp;
  bool has_decay, has_momentum, nesterov, first;
};

// One thread per element of each chunk: the CPU's sgd_loop body.
template <class T>
__global__ void __launch_bounds__(kListThreads) sgd_kernel(TensorChunks<3> c, SGDScalars<T> s) {
  int64_t begin, end;
  const int t = chunk_range(c, begin, end);
  T* p = static_cast<T*>(c.ptr[0][t]);
  const T* g = static_cast<const T*>(c.ptr[1][t]);
  T* buf = static_cast<T*>(c.ptr[2][t]);
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
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

// Pass 2: one block of kNormTotalThreads combines one tensor's partials the same way
// into *out.
constexpr int kNormTotalThreads = 1024;
__global__ void __launch_bounds__(kNormTotalThreads)
    norm_total_kernel(const double* part, int64_t parts, bool inf, double* out) {
  __shared__ double scratch[32];
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < parts; i += blockDim.x) acc = combine(acc, part[i], inf);
  acc = block_combine(acc, inf, scratch);
  if (threadIdx.x == 0) *out = acc;
}

// Pass 3: the tensors' totals combined in list order (the CPU's order) into *out.
__global__ void norm_list_kernel(const double* totals, int64_t n, bool inf, double* out) {
  double acc = 0.0;
  for (int64_t i = 0; i < n; ++i) acc = combine(acc, totals[i], inf);
  *out = acc;
}

}  // namespace

static void adamw_update(const kernels::AdamWTensors& t, const kernels::AdamWStep& k) {
  if (t.params.empty()) return;
  const Tensor& first = t.params[0];
  std::vector<std::array<void*, 5>> ptrs;
  std::vector<int64_t> numels;
  for (size_t i = 0; i < t.params.size(); ++i) {
    ptrs.push_back({t.params[i].raw_data(), t.grads[i].raw_data(), t.exp_avgs[i].raw_data(),
                    t.exp_avg_sqs[i].raw_data(), k.amsgrad ? t.max_exp_avg_sqs[i].raw_data() : nullptr});
    numels.push_back(t.params[i].numel());
  }
  cudaStream_t stream = cuda::stream(first);
  cuda::dispatch_float(first.dtype(), "AdamW", [&](auto tag) {
    using T = decltype(tag);
    const AdamWScalars<T> s{T(k.decay),           T(k.beta1),    T(k.one_minus_beta1), T(k.beta2),
                            T(k.one_minus_beta2), T(k.bc2_sqrt), T(k.eps),             T(k.neg_step)};
    if (k.amsgrad) {
      k.maximize ? launch_adamw<T, true, true>(ptrs, numels, s, stream)
                 : launch_adamw<T, true, false>(ptrs, numels, s, stream);
    } else {
      k.maximize ? launch_adamw<T, false, true>(ptrs, numels, s, stream)
                 : launch_adamw<T, false, false>(ptrs, numels, s, stream);
    }
  });
}

static void sgd_update(const kernels::SGDTensors& t, const kernels::SGDStep& k) {
  if (t.params.empty()) return;
  const Tensor& first = t.params[0];
  std::vector<std::array<void*, 3>> ptrs;
  std::vector<int64_t> numels;
  for (size_t i = 0; i < t.params.size(); ++i) {
    ptrs.push_back({t.params[i].raw_data(), t.grads[i].raw_data(),
                    k.has_momentum ? t.momentum_buffers[i].raw_data() : nullptr});
    numels.push_back(t.params[i].numel());
  }
  cudaStream_t stream = cuda::stream(first);
  cuda::dispatch_float(first.dtype(), "SGD", [&](auto tag) {
    using T = decltype(tag);
    const SGDScalars<T> s{T(k.neg_lr),  T(k.weight_decay), T(k.momentum), T(k.one_minus_damp),
                          k.has_decay, k.has_momentum,    k.nesterov,    k.first};
    for_tensor_chunks<3>(ptrs, numels, [&](const TensorChunks<3>& c, int blocks) {
      sgd_kernel<T><<<unsigned(blocks), kListThreads, 0, stream>>>(c, s);
      MU_CUDA_CHECK_LAUNCH("SGD");
    });
  });
}

static double norm_power_sum(const std::vector<Tensor>& xs, double p) {
  if (xs.empty()) return 0.0;
  const bool inf = std::isinf(p);
  const int mode = inf ? 3 : p == 2.0 ? 0 : p == 1.0 ? 1 : 2;
  // Each tensor's partials (a fixed partition of its elements), then its total, then the
  // totals in list order: the CPU's order of combination, one value read back.
  int64_t parts_all = 0;
  for (const Tensor& x : xs) parts_all += (x.numel() + kNormChunk - 1) / kNormChunk;
  const int64_t n = int64_t(xs.size());
  cudaStream_t s = cuda::stream(xs[0]);
  cuda::Workspace ws(size_t(parts_all + n + 1) * sizeof(double), xs[0].device().index);
  double* part = ws.as<double>();
  double* totals = part + parts_all;
  int64_t at = 0;
  for (int64_t i = 0; i < n; ++i) {
    const Tensor& x = xs[size_t(i)];
    const int64_t parts = (x.numel() + kNormChunk - 1) / kNormChunk;
    if (parts > 0) {
      cuda::dispatch_float(x.dtype(), "clip_grad_norm", [&](auto tag) {
        using T = decltype(tag);
        norm_parts_kernel<T><<<unsigned(parts), kNormThreads, 0, s>>>(static_cast<const T*>(x.raw_data()), x.numel(),
                                                                       p, mode, part + at);
        MU_CUDA_CHECK_LAUNCH("clip_grad_norm (parts)");
      });
    }
    // An empty tensor's total is 0 (the one-block pass over no partials).
    norm_total_kernel<<<1, kNormTotalThreads, 0, s>>>(part + at, parts, inf, totals + i);
    MU_CUDA_CHECK_LAUNCH("clip_grad_norm (total)");
    at += parts;
  }
  norm_list_kernel<<<1, 1, 0, s>>>(totals, n, inf, totals + n);
  MU_CUDA_CHECK_LAUNCH("clip_grad_norm (list)");
  double total = 0.0;
  MU_CUDA_CHECK(cudaMemcpyAsync(&total, totals + n, sizeof(double), cudaMemcpyDeviceToHost, s));
  MU_CUDA_CHECK(cudaStreamSynchronize(s));
  return total;
}

MU_REGISTER_KERNEL(kernels::adamw_update, DeviceType::CUDA, adamw_update);
MU_REGISTER_KERNEL(kernels::sgd_update, DeviceType::CUDA, sgd_update);
MU_REGISTER_KERNEL(kernels::norm_power_sum, DeviceType::CUDA, norm_power_sum);

}  // namespace mu::cuda_kernels
