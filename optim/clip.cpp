// Gradient norms and clipping: one reduction pass per gradient, in double.
#include "optim/clip.h"

#include <omp.h>

#include <cmath>
#include <limits>

#include "autograd/grad_mode.h"
#include "ops/cpu/loops.h"

namespace mu::optim {

namespace {

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

// Combines two partial results: sums add; maxima keep the larger, and NaN once seen.
double combine(double a, double b, bool inf) {
  if (!inf) return a + b;
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<double>::quiet_NaN();
  return std::max(a, b);
}

// Σ |x|^p (or max |x| when p is infinite) over one dense gradient, in double.
template <class T>
double reduce_grad(const T* x, int64_t n, double p) {
  const bool inf = std::isinf(p);
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> part(size_t(chunks), 0.0);
  const bool par = n >= cpu::kParallelGrain && !omp_in_parallel();
#pragma omp parallel for if (par) schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t begin = c * kChunk;
    part[size_t(c)] = reduce_chunk(x + begin, std::min(n, begin + kChunk) - begin, p);
  }
  double total = 0.0;
  for (double v : part) total = combine(total, v, inf);
  return total;
}

std::vector<Tensor> defined_grads(const std::vector<Tensor>& params) {
  std::vector<Tensor> grads;
  for (const Tensor& p : params) {
    MU_CHECK(p.defined(), "clip_grad_norm: an undefined tensor was passed as a parameter");
    Tensor g = p.grad();
    if (g.defined()) grads.push_back(g);
  }
  return grads;
}

double total_norm(const std::vector<Tensor>& grads, double norm_type, const char* who) {
  // Negated test so that NaN is refused too.
  MU_CHECK(norm_type > 0.0, who, ": norm_type must be > 0 or INFINITY, got ", norm_type);
  const bool inf = std::isinf(norm_type);
  double acc = 0.0;
  for (const Tensor& g : grads) {
    MU_CHECK(g.device().is_cpu(), who, ": no CUDA kernel yet; gradient ", g.describe(), " is on ", g.device().str());
    Tensor d = g.contiguous();
    double r = 0.0;
    MU_DISPATCH_FLOAT(d.dtype(), who, [&] { r = reduce_grad<scalar_t>(d.data_ptr<scalar_t>(), d.numel(), norm_type); });
    acc = combine(acc, r, inf);
  }
  if (inf) return acc;
  return norm_type == 2.0 ? std::sqrt(acc) : norm_type == 1.0 ? acc : std::pow(acc, 1.0 / norm_type);
}

}  // namespace

double grad_norm(const std::vector<Tensor>& params, double norm_type) {
  return total_norm(defined_grads(params), norm_type, "grad_norm");
}

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm, double norm_type) {
  // Negated test so that NaN is refused too; a negative bound would flip the gradients.
  MU_CHECK(max_norm >= 0.0, "clip_grad_norm: max_norm must be >= 0, got ", max_norm);
  std::vector<Tensor> grads = defined_grads(params);
  if (grads.empty()) return 0.0;
  const double total = total_norm(grads, norm_type, "clip_grad_norm");
  const double coef = max_norm / (total + 1e-6);
  // torch multiplies by min(coef, 1); multiplying by 1 changes nothing, so only coef < 1
  // scales. A NaN coef (NaN total) fails `coef >= 1` and scales, spreading the NaN as torch does.
  if (!(coef >= 1.0)) {
    NoGradGuard no_grad;
    for (const Tensor& g : grads) {
      Tensor gm = g;  // mul_ is a method of a non-const handle; it writes the shared gradient
      gm.mul_(coef);
    }
  }
  return total;
}

}  // namespace mu::optim
