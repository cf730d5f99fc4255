// CPU kernel of the fused Hadamard of GEMMs (declared in ops/kernels/hadamard_gemm.h):
// plain loops, one output row at a time (rows in parallel). For row m, each factor's row
// (a_k[m, :] · b_k) is summed into a buffer of R accumulators, k-outer so that the inner
// loop runs along a row of b_k (unit stride, vectorisable), then multiplied into the
// running product; the product is scaled and stored once. Sums are carried in acc_t
// (double for float32); bfloat16 is widened to float32 and the result rounded once.
#include <algorithm>
#include <type_traits>
#include <vector>

#include "ops/cpu/loops.h"
#include "ops/kernels/hadamard_gemm.h"

namespace mu::cpu {

namespace {

// The type a T is computed in: float for bfloat16 (the CPU has no bfloat16 arithmetic).
template <class T> struct Compute { using type = T; };
template <> struct Compute<bfloat16_t> { using type = float; };

template <class T>
typename Compute<T>::type load(T x) {
  if constexpr (std::is_same_v<T, bfloat16_t>) return float(x);
  else return x;
}

template <class T, class W>
T store(W x) {
  if constexpr (std::is_same_v<T, bfloat16_t>) return bfloat16_t(float(x));
  else return T(x);
}

template <class T>
void hadamard_gemm_rows(T* out, const std::vector<const T*>& a, const std::vector<const T*>& b,
                        const std::vector<int64_t>& K, const T* scale, int64_t M, int64_t R) {
  using W = typename Compute<T>::type;
  // double for float32 (long sums); float for bfloat16, as a tensor-core kernel sums it.
  using A = std::conditional_t<std::is_same_v<T, bfloat16_t>, float, acc_t<W>>;
  const size_t n = a.size();
#pragma omp parallel if (M * R > 4096)
  {
    // Per thread: one factor's row of sums and the running product of the factors.
    std::vector<A> acc(static_cast<size_t>(R)), prod(static_cast<size_t>(R));
#pragma omp for schedule(static)
    for (int64_t m = 0; m < M; ++m) {
      for (size_t k = 0; k < n; ++k) {
        std::fill(acc.begin(), acc.end(), A(0));
        const T* ar = a[k] + m * K[k];
        for (int64_t j = 0; j < K[k]; ++j) {
          const A x = A(load(ar[j]));
          const T* br = b[k] + j * R;
          for (int64_t r = 0; r < R; ++r) acc[size_t(r)] += x * A(load(br[r]));
        }
        // The first factor starts the product; later ones multiply into it.
        for (int64_t r = 0; r < R; ++r) prod[size_t(r)] = k == 0 ? acc[size_t(r)] : prod[size_t(r)] * acc[size_t(r)];
      }
      T* orow = out + m * R;
      const T* srow = scale ? scale + m * R : nullptr;
      for (int64_t r = 0; r < R; ++r)
        orow[r] = store<T>(srow ? prod[size_t(r)] * A(load(srow[r])) : prod[size_t(r)]);
    }
  }
}

void hadamard_gemm(const Tensor& out, const std::vector<Tensor>& a, const std::vector<Tensor>& b,
                   const Tensor& scale) {
  const int64_t M = out.size(0), R = out.size(1);
  if (M == 0 || R == 0) return;
  auto run = [&](auto tag) {
    using T = decltype(tag);
    std::vector<const T*> ap, bp;
    std::vector<int64_t> K;
    for (size_t k = 0; k < a.size(); ++k) {
      ap.push_back(a[k].data_ptr<T>());
      bp.push_back(b[k].data_ptr<T>());
      K.push_back(a[k].size(1));
    }
    hadamard_gemm_rows<T>(out.data_ptr<T>(), ap, bp, K, scale.defined() ? scale.data_ptr<T>() : nullptr, M, R);
  };
  switch (out.dtype()) {
    case DType::Float32: run(float{}); return;
    case DType::Float64: run(double{}); return;
    case DType::BFloat16: run(bfloat16_t{}); return;
    default: break;
  }
  MU_FAIL("hadamard_gemm: dtype ", dtype_name(out.dtype()), " is not supported (float32, float64 or bfloat16)");
}

}  // namespace

MU_REGISTER_KERNEL(kernels::hadamard_gemm, DeviceType::CPU, hadamard_gemm);

}  // namespace mu::cpu
