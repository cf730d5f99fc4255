// CPU grouped matrix-product kernels (declared in ops/kernels/grouped_mm.h): the GEMM of
// ops/cpu/gemm.h once per group, on the operands' strides, without copies (bfloat16
// aside, widened to float32 and rounded once, as matmul does: ops/cpu/widen.h).
//
// Threads: a Mixture-of-Experts batch has few large groups or many small ones, often
// both. A group holding at least 1/threads of the work runs alone with every thread (the
// GEMM splits one product into blocks); the smaller groups are dealt out whole, one
// group per thread at a time (inside a parallel region the GEMM runs single-threaded),
// so that many tiny products do not each pay for a parallel region of their own.
#include <omp.h>

#include <algorithm>
#include <vector>

#include "ops/cpu/gemm.h"
#include "ops/cpu/parallel.h"
#include "ops/cpu/widen.h"
#include "ops/kernels/grouped_mm.h"

namespace mu::cpu {

namespace {

// Below this many FLOPs of small groups, one thread runs them all (a parallel region
// costs more than it saves); the GEMM's own threshold for splitting one product.
constexpr double kParallelFlops = 1 << 20;

// Runs one_group(g) for every g in `groups`, whose products take flops[g] FLOPs each.
template <class F>
void run_groups(const std::vector<int64_t>& groups, const std::vector<double>& flops, F&& one_group) {
  double total = 0;
  for (int64_t g : groups) total += flops[size_t(g)];
  const int nt = omp_in_parallel() ? 1 : omp_get_max_threads();
  std::vector<int64_t> big, small;
  double small_flops = 0;
  for (int64_t g : groups) {
    if (nt > 1 && flops[size_t(g)] * nt >= total && flops[size_t(g)] >= kParallelFlops) {
      big.push_back(g);
    } else {
      small.push_back(g);
      small_flops += flops[size_t(g)];
    }
  }
  for (int64_t g : big) one_group(g);
  // Largest first, so that a late large group does not leave the other threads idle.
  std::sort(small.begin(), small.end(), [&](int64_t a, int64_t b) { return flops[size_t(a)] > flops[size_t(b)]; });
  const int64_t n = int64_t(small.size());
  parallel_for(
      n, small_flops >= kParallelFlops ? nt : 1, [&](int64_t i) { one_group(small[size_t(i)]); }, Schedule::Dynamic);
}

template <class T>
void grouped_mm_typed(const Tensor& out, const Tensor& x, const Tensor& w, const std::vector<int64_t>& offsets) {
  const int64_t G = w.size(0), K = x.size(1), N = w.size(2);
  const T* xp = x.data_ptr<T>();
  const T* wp = w.data_ptr<T>();
  T* op = out.data_ptr<T>();
  std::vector<int64_t> groups;
  std::vector<double> flops(size_t(G), 0.0);
  for (int64_t g = 0; g < G; ++g) {
    const int64_t rows = offsets[size_t(g) + 1] - offsets[size_t(g)];
    if (rows == 0) continue;  // nothing to write
    groups.push_back(g);
    flops[size_t(g)] = 2.0 * double(rows) * double(N) * double(K);
  }
  run_groups(groups, flops, [&](int64_t g) {
    const int64_t r0 = offsets[size_t(g)], rows = offsets[size_t(g) + 1] - r0;
    // One matrix each (batch 1): x's and out's rows of the group, w's g-th matrix.
    MatrixRef<const T> A{xp + r0 * x.stride(0), 0, x.stride(0), x.stride(1)};
    MatrixRef<const T> B{wp + g * w.stride(0), 0, w.stride(1), w.stride(2)};
    MatrixRef<T> C{op + r0 * out.stride(0), 0, out.stride(0), out.stride(1)};
    gemm<T>(1, rows, N, K, A, B, C);  // K == 0: zeros
  });
}

template <class T>
void weight_grad_typed(const Tensor& dw, const Tensor& x, const Tensor& dy, const std::vector<int64_t>& offsets) {
  const int64_t G = dw.size(0), K = x.size(1), N = dy.size(1);
  const T* xp = x.data_ptr<T>();
  const T* dyp = dy.data_ptr<T>();
  T* dwp = dw.data_ptr<T>();
  // Every group, the empty ones included: the GEMM's empty sum writes their zeros.
  std::vector<int64_t> groups(static_cast<size_t>(G));
  std::vector<double> flops(static_cast<size_t>(G));
  for (int64_t g = 0; g < G; ++g) {
    groups[size_t(g)] = g;
    flops[size_t(g)] = 2.0 * double(offsets[size_t(g) + 1] - offsets[size_t(g)]) * double(K) * double(N);
  }
  run_groups(groups, flops, [&](int64_t g) {
    const int64_t r0 = offsets[size_t(g)], rows = offsets[size_t(g) + 1] - r0;
    // x_gᵀ (K x rows) is x_g read with its two strides swapped.
    MatrixRef<const T> A{xp + r0 * x.stride(0), 0, x.stride(1), x.stride(0)};
    MatrixRef<const T> B{dyp + r0 * dy.stride(0), 0, dy.stride(0), dy.stride(1)};
    MatrixRef<T> C{dwp + g * dw.stride(0), 0, dw.stride(1), dw.stride(2)};
    gemm<T>(1, K, N, rows, A, B, C);
  });
}

void grouped_mm(const Tensor& out, const Tensor& x, const Tensor& w, const std::vector<int64_t>& offsets) {
  if (x.dtype() == kBFloat16) {  // in float32, rounded once (ops/cpu/widen.h)
    Tensor wide = wide_like(out);
    grouped_mm(wide, widened(x), widened(w), offsets);
    narrow_into(out, wide);
    return;
  }
  MU_DISPATCH_FLOAT(x.dtype(), "grouped_mm", [&] { grouped_mm_typed<scalar_t>(out, x, w, offsets); });
}

void grouped_mm_weight_grad(const Tensor& dw, const Tensor& x, const Tensor& dy, const std::vector<int64_t>& offsets) {
  if (x.dtype() == kBFloat16) {
    Tensor wide = wide_like(dw);
    grouped_mm_weight_grad(wide, widened(x), widened(dy), offsets);
    narrow_into(dw, wide);
    return;
  }
  MU_DISPATCH_FLOAT(x.dtype(), "grouped_mm_weight_grad", [&] { weight_grad_typed<scalar_t>(dw, x, dy, offsets); });
}

}  // namespace

MU_REGISTER_KERNEL(kernels::grouped_mm, DeviceType::CPU, grouped_mm);
MU_REGISTER_KERNEL(kernels::grouped_mm_weight_grad, DeviceType::CPU, grouped_mm_weight_grad);

}  // namespace mu::cpu
