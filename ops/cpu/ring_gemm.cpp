// CPU kernel of the fused ring-contraction GEMM (declared in ops/kernels/ring_gemm.h):
// plain loops, one output row at a time (rows in parallel). For row m, the row of A
// (a[s P + p] = Σ_r c[m, p, r] h[m, r, s]) is formed in a buffer of S P entries, then
// out[m, :] = Σ_k a[k] w[k, :] is summed k-outer, so that the inner loop runs along a row
// of w (unit stride, vectorisable). Sums are carried in acc_t (double for float32);
// bfloat16 entries of A are rounded to bfloat16 as the CUDA kernel stores them for its
// tensor cores, the output rounded once.
#include <algorithm>
#include <type_traits>
#include <vector>

#include "ops/cpu/loops.h"
#include "ops/kernels/ring_gemm.h"

namespace mu::cpu {

namespace {

// A value of T in the type it is computed in: float for bfloat16 (the CPU has no
// bfloat16 arithmetic), T itself otherwise.
template <class T>
auto load(T x) {
  if constexpr (std::is_same_v<T, bfloat16_t>) return float(x);
  else return x;
}

template <class T>
void ring_gemm_rows(T* out, const T* c, const T* h, const T* w, int64_t M, int64_t P, int64_t R, int64_t S,
                    int64_t N) {
  constexpr bool kBf16 = std::is_same_v<T, bfloat16_t>;
  // float sums for bfloat16 (as a tensor-core kernel carries them), acc_t otherwise.
  using A = std::conditional_t<kBf16, float, acc_t<T>>;
  const int64_t K = S * P;
#pragma omp parallel if (M * N * std::max<int64_t>(K, 1) > 65536)
  {
    // Per thread: the row of A and the row of output sums.
    std::vector<A> arow(static_cast<size_t>(K)), acc(static_cast<size_t>(N));
#pragma omp for schedule(static)
    for (int64_t m = 0; m < M; ++m) {
      const T* cm = c + m * P * R;
      const T* hm = h + m * R * S;
      for (int64_t s = 0; s < S; ++s)
        for (int64_t p = 0; p < P; ++p) {
          A v = 0;
          for (int64_t r = 0; r < R; ++r) v += A(load(cm[p * R + r])) * A(load(hm[r * S + s]));
          // bfloat16: the entry as the tensor cores read it.
          arow[size_t(s * P + p)] = kBf16 ? A(float(bfloat16_t(float(v)))) : v;
        }
      std::fill(acc.begin(), acc.end(), A(0));
      for (int64_t k = 0; k < K; ++k) {
        const A x = arow[size_t(k)];
        const T* wr = w + k * N;
        for (int64_t n = 0; n < N; ++n) acc[size_t(n)] += x * A(load(wr[n]));
      }
      T* orow = out + m * N;
      for (int64_t n = 0; n < N; ++n) {
        if constexpr (kBf16) orow[n] = bfloat16_t(float(acc[size_t(n)]));
        else orow[n] = T(acc[size_t(n)]);
      }
    }
  }
}

void ring_gemm(const Tensor& out, const Tensor& c, const Tensor& h, const Tensor& w) {
  const int64_t M = out.size(0), N = out.size(1), P = c.size(1), R = c.size(2), S = h.size(2);
  if (M == 0 || N == 0) return;
  auto run = [&](auto tag) {
    using T = decltype(tag);
    ring_gemm_rows<T>(out.data_ptr<T>(), c.data_ptr<T>(), h.data_ptr<T>(), w.data_ptr<T>(), M, P, R, S, N);
  };
  switch (out.dtype()) {
    case DType::Float32: run(float{}); return;
    case DType::Float64: run(double{}); return;
    case DType::BFloat16: run(bfloat16_t{}); return;
    default: break;
  }
  MU_FAIL("ring_gemm: dtype ", dtype_name(out.dtype()), " is not supported (float32, float64 or bfloat16)");
}

}  // namespace

MU_REGISTER_KERNEL(kernels::ring_gemm, DeviceType::CPU, ring_gemm);

}  // namespace mu::cpu
