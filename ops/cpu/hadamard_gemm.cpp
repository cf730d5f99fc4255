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
#include "ops/cpu/widen.h"
#include "ops/kernels/hadamard_gemm.h"

namespace mu::cpu {

namespace {

template <class T>
void hadamard_gemm_rows(T* out, const std::vector<const T*>& a, const std::vector<const T*>& b,
                        const std::vector<int64_t>& K, const T* scale, int64_t M, int64_t R) {
  using W = compute_t<T>;
  // double for float32 (long sums); float for bfloat16, as a tensor-core kernel sums it.
  using A = std::conditional_t<std::is_same_v<T, bfloat16_t>, float, acc_t<W>>;
  const size_t n = a.size();
  // Per thread: one factor's row of sums and the running product of the factors.
  struct RowState {
    std::vector<A> acc, prod;
  };
  parallel_for_with(
      M, M * R > 4096 ? omp_get_max_threads() : 1,
      [&] { return RowState{std::vector<A>(size_t(R)), std::vector<A>(size_t(R))}; },
      [&](RowState& st, int64_t m) {
        auto& [acc, prod] = st;
        for (size_t k = 0; k < n; ++k) {
          std::fill(acc.begin(), acc.end(), A(0));
          const T* ar = a[k] + m * K[k];
          for (int64_t j = 0; j < K[k]; ++j) {
            const A x = A(widen_value(ar[j]));
            const T* br = b[k] + j * R;
            for (int64_t r = 0; r < R; ++r) acc[size_t(r)] += x * A(widen_value(br[r]));
          }
          // The first factor starts the product; later ones multiply into it.
          for (int64_t r = 0; r < R; ++r) prod[size_t(r)] = k == 0 ? acc[size_t(r)] : prod[size_t(r)] * acc[size_t(r)];
        }
        T* orow = out + m * R;
        const T* srow = scale ? scale + m * R : nullptr;
        for (int64_t r = 0; r < R; ++r)
          orow[r] = narrow_value<T>(srow ? prod[size_t(r)] * A(widen_value(srow[r])) : prod[size_t(r)]);
      });
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
  dispatch_float_bf16(out.dtype(), "hadamard_gemm", run);
}

}  // namespace

MU_REGISTER_KERNEL(kernels::hadamard_gemm, DeviceType::CPU, hadamard_gemm);

}  // namespace mu::cpu
