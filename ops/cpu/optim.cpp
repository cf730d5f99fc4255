// CPU kernels of the optimisers (declared in ops/kernels/optim.h): the fused AdamW and
// SGD update loops, and the gradient-norm reduction of clipping.
//
// CMakeLists.txt builds this file with -ffp-contract=off, so that only the explicit
// fmadds fuse: the updates round exactly where torch.optim's chains of in-place ops do.
#include <omp.h>

#include <cmath>
#include <limits>
#include <vector>

#include "ops/cpu/loops.h"
#include "ops/kernels/optim.h"

namespace mu::cpu {

namespace {

// a·b + c as torch's CPU add-with-alpha kernels compute it: one fused rounding where the
// CPU has FMA (torch then runs its AVX2/AVX-512 kernels, which use fmadd), else two.
template <class T>
inline T fmadd(T a, T b, T c) {
#ifdef __FMA__
  return std::fma(a, b, c);
#else
  return a * b + c;
#endif
}

// Calls body(begin, end) over [0, n) in chunks, on several threads when n is large.
// Each element is touched by one call only, so results do not depend on the thread count.
template <class Body>
void parallel_chunks(int64_t n, Body&& body) {
  const bool par = n >= cpu::kParallelGrain && !omp_in_parallel();
  if (!par) {
    body(int64_t(0), n);
    return;
  }
#pragma omp parallel
  {
    const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
    body(n * t / nt, n * (t + 1) / nt);
  }
}

// ---------------------------------------------------------------- AdamW

// The per-step scalars, each rounded once to the parameter's dtype as torch does when
// it hands a Python float to an in-place op on a float tensor.
template <class T>
struct AdamWScalars {
  T decay;      // 1 - lr * wd
  T beta1, one_minus_beta1;
  T beta2, one_minus_beta2;
  T bc2_sqrt;   // sqrt(1 - beta2^t)
  T eps;
  T neg_step;   // -lr / (1 - beta1^t)
  bool amsgrad, maximize;
};

// The update of elements [begin, end). Only the explicit fmadds fuse (p·decay + step
// must round twice, as torch's separate in-place ops do); with -fno-math-errno the loop
// vectorises, as std::sqrt need not set errno (v is never negative). amsgrad and
// maximize are template arguments: a branch and a conditional store inside the loop
// kept it scalar, which made the step about 5x slower.
template <class T, bool kAmsgrad, bool kMaximize>
void adamw_range(T* p, const T* g, T* m, T* v, T* vmax, int64_t begin, int64_t end, AdamWScalars<T> s) {
  for (int64_t i = begin; i < end; ++i) {
    // The same roundings as torch's chain of in-place ops: param.mul_(decay);
    // exp_avg.mul_(b1).add_(g, 1-b1) and exp_avg_sq.mul_(b2).addcmul_(g, g, 1-b2), whose
    // adds its CPU kernels fuse; denom = (exp_avg_sq.sqrt() / bc2_sqrt).add_(eps);
    // param.addcdiv_(exp_avg, denom, -step), i.e. (-step·m)/denom, then the add.
    // maximize: torch negates the gradient first (exact).
    const T gi = kMaximize ? -g[i] : g[i];
    T pi = p[i] * s.decay;
    T mi = fmadd(s.one_minus_beta1, gi, m[i] * s.beta1);
    T vi = fmadd(s.one_minus_beta2 * gi, gi, v[i] * s.beta2);
    T vd = vi;
    if constexpr (kAmsgrad) {
      // torch.maximum(max_exp_avg_sq, exp_avg_sq): NaN from either side propagates.
      const T vm = vmax[i];
      vd = vi != vi ? vi : vm != vm ? vm : vm > vi ? vm : vi;
      vmax[i] = vd;
    }
    T denom = std::sqrt(vd) / s.bc2_sqrt + s.eps;
    p[i] = pi + (s.neg_step * mi) / denom;
    m[i] = mi;
    v[i] = vi;
  }
}

template <class T, bool kAmsgrad, bool kMaximize>
void adamw_loop_as(T* p, const T* g, T* m, T* v, T* vmax, int64_t n, const AdamWScalars<T>& s) {
  parallel_chunks(n, [&](int64_t begin, int64_t end) {
    adamw_range<T, kAmsgrad, kMaximize>(p, g, m, v, vmax, begin, end, s);
  });
}

template <class T>
void adamw_loop(T* p, const T* g, T* m, T* v, T* vmax, int64_t n, const AdamWScalars<T>& s) {
  if (s.amsgrad) {
    s.maximize ? adamw_loop_as<T, true, true>(p, g, m, v, vmax, n, s) : adamw_loop_as<T, true, false>(p, g, m, v, vmax, n, s);
  } else {
    s.maximize ? adamw_loop_as<T, false, true>(p, g, m, v, vmax, n, s) : adamw_loop_as<T, false, false>(p, g, m, v, vmax, n, s);
  }
}

// ---------------------------------------------------------------- SGD

template <class T>
struct SGDScalars {
  T neg_lr;             // -lr
  T weight_decay;       // used only when has_decay
  T momentum;           // used only when has_momentum
  T one_minus_damp;     // 1 - dampening
  bool has_decay, has_momentum, nesterov;
  bool first;           // the buffer is created from this step's direction
};

template <class T>
void sgd_loop(T* p, const T* g, T* buf, int64_t n, SGDScalars<T> s) {
  // Captured by value: the compiler then knows the stores to p and buf cannot change the
  // scalars, keeps them in registers and moves the branches out of the loop.
  parallel_chunks(n, [=](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      T d = g[i];
      // torch skips the add when wd == 0, which matters for -0 and non-finite parameters.
      if (s.has_decay) d = fmadd(s.weight_decay, p[i], d);
      if (s.has_momentum) {
        // First update: the buffer is a copy of d (torch.clone(d_p)), not μ·0 + (1-damp)·d.
        T b = s.first ? d : fmadd(s.one_minus_damp, d, buf[i] * s.momentum);
        buf[i] = b;
        d = s.nesterov ? fmadd(s.momentum, b, d) : b;
      }
      p[i] = fmadd(s.neg_lr, d, p[i]);
    }
  });
}

// ---------------------------------------------------------------- gradient norms

// Fixed-size chunks make the summation order independent of the thread count, so the
// norm (and so a clipped step) is reproducible on any machine.
constexpr int64_t kChunk = 1 << 15;

// Σ |x|^p, or max |x| (NaN if any element is NaN) when p is infinite, over one chunk.
// `omp simd` lets the sums be vectorised (a fixed reassociation, the same on every run).
template <class T>
double reduce_chunk(const T* x, int64_t n, double p) {
  double acc = 0.0;
  if (std::isinf(p)) {
    bool nan = false;
#pragma omp simd reduction(max : acc) reduction(|| : nan)
    for (int64_t i = 0; i < n; ++i) {
      const double a = std::abs(double(x[i]));
      acc = a > acc ? a : acc;
      nan = nan || a != a;  // NaN is the one value unequal to itself
    }
    return nan ? std::numeric_limits<double>::quiet_NaN() : acc;
  }
  if (p == 2.0) {
#pragma omp simd reduction(+ : acc)
    for (int64_t i = 0; i < n; ++i) acc += double(x[i]) * double(x[i]);
  } else if (p == 1.0) {
#pragma omp simd reduction(+ : acc)
    for (int64_t i = 0; i < n; ++i) acc += std::abs(double(x[i]));
  } else {
    for (int64_t i = 0; i < n; ++i) acc += std::pow(std::abs(double(x[i])), p);
  }
  return acc;
}

// Σ |x|^p (or max |x| when p is infinite) over one dense gradient, in double.
template <class T>
double reduce_grad(const T* x, int64_t n, double p) {
  const bool inf = std::isinf(p);
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> part(size_t(chunks), 0.0);
  const bool par = n >= kParallelGrain && !omp_in_parallel();
  parallel_for_if(chunks, par, [&](int64_t c) {
    const int64_t begin = c * kChunk;
    part[size_t(c)] = reduce_chunk(x + begin, std::min(n, begin + kChunk) - begin, p);
  });
  double total = 0.0;
  for (double v : part) total = kernels::combine_norm_parts(total, v, inf);
  return total;
}

}  // namespace

// One parameter after another, each loop parallel over its own elements.
static void adamw_update(const kernels::AdamWTensors& t, const kernels::AdamWStep& k) {
  for (size_t i = 0; i < t.params.size(); ++i) {
    MU_DISPATCH_FLOAT(t.params[i].dtype(), "AdamW", [&] {
      using T = scalar_t;
      AdamWScalars<T> s{T(k.decay), T(k.beta1),    T(k.one_minus_beta1), T(k.beta2), T(k.one_minus_beta2),
                        T(k.bc2_sqrt), T(k.eps), T(k.neg_step),        k.amsgrad,   k.maximize};
      T* vmax = k.amsgrad ? t.max_exp_avg_sqs[i].data_ptr<T>() : nullptr;
      adamw_loop<T>(t.params[i].data_ptr<T>(), t.grads[i].data_ptr<T>(), t.exp_avgs[i].data_ptr<T>(),
                    t.exp_avg_sqs[i].data_ptr<T>(), vmax, t.params[i].numel(), s);
    });
  }
}

static void sgd_update(const kernels::SGDTensors& t, const kernels::SGDStep& k) {
  for (size_t i = 0; i < t.params.size(); ++i) {
    MU_DISPATCH_FLOAT(t.params[i].dtype(), "SGD", [&] {
      using T = scalar_t;
      SGDScalars<T> s{T(k.neg_lr), T(k.weight_decay), T(k.momentum), T(k.one_minus_damp),
                      k.has_decay, k.has_momentum,    k.nesterov,     k.first};
      T* buf = k.has_momentum ? t.momentum_buffers[i].data_ptr<T>() : nullptr;
      sgd_loop<T>(t.params[i].data_ptr<T>(), t.grads[i].data_ptr<T>(), buf, t.params[i].numel(), s);
    });
  }
}

static double norm_power_sum(const std::vector<Tensor>& xs, double p) {
  const bool inf = std::isinf(p);
  double total = 0.0;
  for (const Tensor& x : xs) {
    double r = 0.0;
    MU_DISPATCH_FLOAT(x.dtype(), "clip_grad_norm",
                      [&] { r = reduce_grad<scalar_t>(x.data_ptr<scalar_t>(), x.numel(), p); });
    total = kernels::combine_norm_parts(total, r, inf);
  }
  return total;
}

MU_REGISTER_KERNEL(kernels::adamw_update, DeviceType::CPU, adamw_update);
MU_REGISTER_KERNEL(kernels::sgd_update, DeviceType::CPU, sgd_update);
MU_REGISTER_KERNEL(kernels::norm_power_sum, DeviceType::CPU, norm_power_sum);

}  // namespace mu::cpu
