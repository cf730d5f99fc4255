// CUDA kernels of sparsemax, entmax15 and entmax_bisect (declared in ops/kernels/entmax.h;
// the CPU twins, whose algorithms these follow step for step, are in ops/cpu/entmax.cpp).
// Every line is worked in double whatever the dtype.
//
// Mapping: one thread block per line of the dense (outer, n, inner) tensor along the
// middle axis (grid-stride over lines); the block's threads take the line's elements
// i = threadIdx.x, threadIdx.x + blockDim.x, ... . Lines are short in the models (the
// expert count), so a block is 32 to 256 threads, sized to the line. The line's work
// array (sorted candidates, or the bisection's shifted inputs) lives in shared memory
// for lines up to kSharedMax and in a per-block global workspace beyond.
//
// The sort is a bitonic network (exact: the sorted values equal std::sort's), and the
// short sequential scans that pick the support run on one thread in the CPU's order,
// so sparsemax and entmax15 equal the CPU's results bit for bit. The bisection's sums and
// the backward's sums are block reductions in a fixed order: equal up to rounding.
// Products whose sum the CPU rounds separately use __dmul_rn, which nvcc never fuses
// into an fma.
#include <cmath>

#include "ops/cuda/bitonic.cuh"
#include "ops/cuda/dtypes.cuh"
#include "ops/cuda/runtime.cuh"
#include "ops/kernels/entmax.h"

namespace mu::cuda_kernels {

namespace {

constexpr int64_t kSharedMax = 4096;  // longest line whose work array sits in shared memory (32 KiB)

// The maximum of every thread's v over the block (NaN-free inputs), returned to every
// thread; `scratch` holds 32 doubles in shared memory.
__device__ double block_max(double v, double* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int o = 16; o > 0; o >>= 1) {
    const double u = __shfl_xor_sync(0xffffffffu, v, o);
    v = u > v ? u : v;
  }
  __syncthreads();  // scratch may still be read by a previous reduction
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : -INFINITY;
  for (int o = 16; o > 0; o >>= 1) {
    const double u = __shfl_xor_sync(0xffffffffu, v, o);
    v = u > v ? u : v;
  }
  return v;
}

// t^(1/(α-1)) for t > 0 and 0 otherwise, the common exponents spelled out (the CPU's ClampPow).
__device__ double clamp_pow(double t, double e) {
  if (!(t > 0)) return 0.0;
  if (e == 1.0) return t;
  if (e == 2.0) return t * t;
  if (e == 4.0) return (t * t) * (t * t);
  if (e == 0.5) return sqrt(t);
  return pow(t, e);
}

// Σ_j clamp_pow(u_j - τ) over the line's n shifted inputs, the same in every thread.
__device__ double mass(const double* u, int64_t n, double tau, double e, double* scratch) {
  double part = 0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) part += clamp_pow(u[j] - tau, e);
  return cuda::block_sum(part, scratch);
}

template <class T>
__global__ void entmax_forward_kernel(T* y, const T* x, int64_t lines, int64_t n, int64_t inner,
                                      kernels::EntmaxKind kind, double alpha, int n_iter, int64_t P, double* gwork) {
  extern __shared__ double sbuf[];
  __shared__ double red[32];
  __shared__ double tau_s;
  double* s = gwork != nullptr ? gwork + int64_t(blockIdx.x) * P : sbuf;
  for (int64_t l = blockIdx.x; l < lines; l += gridDim.x) {
    const int64_t o = l / inner, c = l - o * inner;
    const T* xl = x + o * n * inner + c;
    T* yl = y + o * n * inner + c;
    // The line's maximum; a NaN or +inf, or only -inf, leaves no finite shift: NaN out.
    double mx = -INFINITY;
    int bad = 0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const double v = double(xl[j * inner]);
      bad |= v != v;
      mx = v > mx ? v : mx;
    }
    mx = block_max(mx, red);
    bad = __syncthreads_or(bad);
    if (bad || !isfinite(mx)) {  // the same in every thread of the block
      for (int64_t j = threadIdx.x; j < n; j += blockDim.x) yl[j * inner] = T(NAN);
      continue;
    }

    if (kind == kernels::EntmaxKind::Bisect) {
      // u = (α-1)(x - max); Σ p(τ) falls from >= 1 at τ = -1 to <= 1 at τ = -(1/n)^(α-1);
      // τ is halved into that bracket n_iter times, p at the last midpoint rescaled.
      const double am1 = alpha - 1, e = 1 / am1;
      for (int64_t j = threadIdx.x; j < n; j += blockDim.x) s[j] = (double(xl[j * inner]) - mx) * am1;
      __syncthreads();
      double lo = -1.0, hi = -pow(1.0 / double(n), am1);
      double dm = hi - lo, f_lo = mass(s, n, lo, e, red) - 1, tau = lo;
      for (int it = 0; it < n_iter; ++it) {
        dm /= 2;
        tau = lo + dm;
        // Every thread holds the same sum, so every thread takes the same branch.
        if ((mass(s, n, tau, e, red) - 1) * f_lo >= 0) lo = tau;
      }
      const double sum = mass(s, n, tau, e, red);
      for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
        yl[j * inner] = T(clamp_pow(__dmul_rn(double(xl[j * inner]) - mx, am1) - tau, e) / sum);
      __syncthreads();  // s is rewritten by the next line
      continue;
    }

    // Sparsemax and entmax15: the candidates z = scale (x - max) > -1 (the others are
    // never on the support), the rest -inf, sorted decreasingly.
    const double scale = kind == kernels::EntmaxKind::Sparsemax ? 1.0 : 0.5;
    for (int64_t i = threadIdx.x; i < P; i += blockDim.x) {
      double z = -INFINITY;
      if (i < n) {
        z = (double(xl[i * inner]) - mx) * scale;
        z = z > -1 ? z : -INFINITY;
      }
      s[i] = z;
    }
    cuda::block_bitonic_sort(s, P, [](double a, double b) { return a > b; });
    if (threadIdx.x == 0) {
      // The CPU's sequential pass over the c candidates (those > -1 come first).
      int64_t k_sup = 0;
      if (kind == kernels::EntmaxKind::Sparsemax) {
        // The support is the set of k with k z_k > S_k - 1; τ = (S_K - 1) / K.
        double cum = 0;
        for (int64_t k = 0; k < P && s[k] > -1; ++k) {
          cum += s[k];
          k_sup += double(k + 1) * s[k] > cum - 1 ? 1 : 0;
        }
        double top = 0;
        for (int64_t k = 0; k < k_sup; ++k) top += s[k];
        tau_s = (top - 1) / double(k_sup);
      } else {
        // Welford's running mean and squared deviations; τ_k = mean_k - sqrt((1 - ss_k)/k),
        // stored over s[k] once s[k] has been used (the last passing one is τ).
        double mean = 0, ss = 0;
        for (int64_t k = 0; k < P && s[k] > -1; ++k) {
          const double sk = s[k];
          const double d = sk - mean;
          mean += d / double(k + 1);
          ss += __dmul_rn(d, sk - mean);
          const double delta = (1 - ss) / double(k + 1);
          const double tk = mean - sqrt(delta > 0 ? delta : 0.0);
          k_sup += tk <= sk ? 1 : 0;
          s[k] = tk;
        }
        tau_s = s[k_sup - 1];  // k = 1 always passes, so k_sup >= 1
      }
    }
    __syncthreads();
    const double tau = tau_s;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const double v = double(xl[j * inner]) - mx;
      // z - τ <= 0 gives an exact 0.
      if (kind == kernels::EntmaxKind::Sparsemax) {
        const double t = v - tau;
        yl[j * inner] = T(t > 0 ? t : 0.0);
      } else {
        const double t = __dmul_rn(v, 0.5) - tau;
        yl[j * inner] = T(t > 0 ? t * t : 0.0);
      }
    }
    // The next line's block_max synchronises before s or tau_s are written again.
  }
}

// The shared gradient: with q = y^e on the support and 0 off it, dx = q g - q (Σ q g)/(Σ q).
__device__ double support_power(double p, double e) {
  return !(p > 0) ? 0.0 : e == 0.0 ? 1.0 : e == 0.5 ? sqrt(p) : pow(p, e);
}

template <class T>
__global__ void entmax_backward_kernel(T* dx, const T* g, const T* y, int64_t lines, int64_t n, int64_t inner,
                                       double e) {
  __shared__ double red[32];
  for (int64_t l = blockIdx.x; l < lines; l += gridDim.x) {
    const int64_t off = (l / inner) * n * inner + l % inner;
    const T *gl = g + off, *yl = y + off;
    T* dl = dx + off;
    double sq = 0, sqg = 0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const double q = support_power(double(yl[j * inner]), e);
      sq += q;
      sqg += __dmul_rn(q, double(gl[j * inner]));
    }
    sq = cuda::block_sum(sq, red);
    sqg = cuda::block_sum(sqg, red);
    const double cc = sqg / sq;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      // The CPU keeps q in dx (rounded to T) until the sums are known: the same rounding.
      const double q = double(T(support_power(double(yl[j * inner]), e)));
      dl[j * inner] = T(q * (double(gl[j * inner]) - cc));
    }
  }
}

// Threads per block: about one per element, or one per compared pair of a sort of P,
// a multiple of 32 between 32 and 256.
int threads_for(int64_t P) { return int(P < 64 ? 32 : P / 2 > 256 ? 256 : P / 2); }

}  // namespace

static void entmax_forward(const Tensor& y, const Tensor& x, int64_t outer, int64_t n, int64_t inner,
                           kernels::EntmaxKind kind, double alpha, int n_iter) {
  const int64_t lines = outer * inner;
  if (lines * n == 0) return;
  cudaStream_t s = cuda::stream(x);
  const int64_t P = cuda::next_pow2(n);
  const int threads = threads_for(P);
  cuda::dispatch_float(x.dtype(), "entmax", [&](auto tag) {
    using T = decltype(tag);
    T* py = static_cast<T*>(y.raw_data());
    const T* px = static_cast<const T*>(x.raw_data());
    if (P <= kSharedMax) {
      entmax_forward_kernel<T><<<cuda::grid_for(lines, 1), threads, size_t(P) * sizeof(double), s>>>(
          py, px, lines, n, inner, kind, alpha, n_iter, P, nullptr);
      MU_CUDA_CHECK_LAUNCH("entmax");
    } else {
      // Long lines: a work array of P doubles per block in global memory (up to two
      // blocks per SM, fewer where that would take more than 256 MiB).
      const unsigned grid = cuda::work_grid(lines, P * int64_t(sizeof(double)));
      cuda::Workspace ws(size_t(grid) * size_t(P) * sizeof(double), x.device().index);
      entmax_forward_kernel<T><<<grid, threads, 0, s>>>(py, px, lines, n, inner, kind, alpha, n_iter, P,
                                                        ws.as<double>());
      MU_CUDA_CHECK_LAUNCH("entmax (long lines)");
    }
  });
}

static void entmax_backward(const Tensor& dx, const Tensor& g, const Tensor& y, int64_t outer, int64_t n,
                            int64_t inner, double e) {
  const int64_t lines = outer * inner;
  if (lines * n == 0) return;
  const int threads = threads_for(cuda::next_pow2(n) * 2);  // about one thread per element
  cuda::dispatch_float(y.dtype(), "entmax_backward", [&](auto tag) {
    using T = decltype(tag);
    entmax_backward_kernel<T><<<cuda::grid_for(lines, 1), threads, 0, cuda::stream(y)>>>(
        static_cast<T*>(dx.raw_data()), static_cast<const T*>(g.raw_data()), static_cast<const T*>(y.raw_data()),
        lines, n, inner, e);
    MU_CUDA_CHECK_LAUNCH("entmax_backward");
  });
}

MU_REGISTER_KERNEL(kernels::entmax_forward, DeviceType::CUDA, entmax_forward);
MU_REGISTER_KERNEL(kernels::entmax_backward, DeviceType::CUDA, entmax_backward);

}  // namespace mu::cuda_kernels
