// Shared plumbing of the fused per-parameter update loops (AdamW, SGD): dense working
// copies of strided parameters, and the element loop split over threads.
#pragma once
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "ops/cpu/loops.h"
#include "tensor/tensor.h"

namespace mu::optim::detail {

// The fused loops read raw CPU memory; other devices are refused with the usual message.
inline void require_cpu(const std::string& opt, const Tensor& p) {
  MU_CHECK(p.device().is_cpu(), opt, ": no CUDA kernel for this optimizer yet; parameter ", p.describe(),
           " is on ", p.device().str());
}

// A dense view of a parameter for an update loop. A contiguous parameter is updated in
// its own memory; a strided one (rare: a parameter made from a transposed view) through
// a dense copy that finish() writes back.
class DenseParam {
 public:
  explicit DenseParam(const Tensor& p) : param_(p), work_(p.is_contiguous() ? p : p.contiguous()) {}
  const Tensor& work() const { return work_; }
  // Writes a copy back and bumps the version, so autograd sees the in-place change.
  void finish() const {
    if (!work_.is_same(param_)) param_.copy_(work_);  // copy_ bumps the version itself
    else param_.bump_version();
  }

 private:
  mutable Tensor param_;  // copy_ is a method of a non-const handle; it writes the shared data
  Tensor work_;
};

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

}  // namespace mu::optim::detail
