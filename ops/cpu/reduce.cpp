// CPU kernels of the reductions (declared in ops/kernels/reduce.h), each the per-run
// function of the skeleton in ops/cpu/reduce_loop.h.
#include <type_traits>

#include "ops/cpu/reduce_loop.h"
#include "ops/cpu/widen.h"
#include "ops/kernels/reduce.h"

namespace mu::cpu {

static void sum(const Tensor& out, const Tensor& x, const ReducePlan& p) {
  // A 16-bit float x sums in float32 into a float32 out: widened first (the plan
  // names dims and sizes, which the dense copy keeps).
  if (x.dtype() == kBFloat16 || x.dtype() == kFloat16) return sum(out, widened(x), p);
  MU_DISPATCH_ALL(x.dtype(), "sum", [&] {
    using A = acc_t<scalar_t>;
    using O = std::conditional_t<std::is_same_v<scalar_t, bool>, int64_t, scalar_t>;
    reduce_runs<scalar_t>(x, p, out.data_ptr<O>(), [](const scalar_t* v, int64_t n, int64_t st) {
      A acc = 0;
      if (st == 1)
        for (int64_t i = 0; i < n; ++i) acc += A(v[i]);
      else
        for (int64_t i = 0; i < n; ++i) acc += A(v[i * st]);
      return O(acc);
    });
  });
}

// NaN wins every comparison, as in PyTorch: a max or min over a run holding NaN is NaN.
template <class T>
static bool better(T v, T best, bool take_max) {
  if (v != v) return best == best;  // the first NaN replaces any number, never another NaN
  return take_max ? v > best : v < best;
}

static void extremum(const Tensor& out, const Tensor& x, const ReducePlan& p, bool take_max) {
  MU_DISPATCH_NUMERIC(x.dtype(), take_max ? "amax" : "amin", [&] {
    reduce_runs<scalar_t>(x, p, out.data_ptr<scalar_t>(), [take_max](const scalar_t* v, int64_t n, int64_t st) {
      scalar_t best = v[0];
      for (int64_t i = 1; i < n; ++i)
        if (better(v[i * st], best, take_max)) best = v[i * st];
      return best;
    });
  });
}

static void arg_extremum(const Tensor& out, const Tensor& x, const ReducePlan& p, bool take_max) {
  MU_DISPATCH_NUMERIC(x.dtype(), take_max ? "argmax" : "argmin", [&] {
    reduce_runs<scalar_t>(x, p, out.data_ptr<int64_t>(), [take_max](const scalar_t* v, int64_t n, int64_t st) {
      int64_t at = 0;
      for (int64_t i = 1; i < n; ++i)
        if (better(v[i * st], v[at * st], take_max)) at = i;
      return at;
    });
  });
}

MU_REGISTER_KERNEL(kernels::sum, DeviceType::CPU, sum);
MU_REGISTER_KERNEL(kernels::extremum, DeviceType::CPU, extremum);
MU_REGISTER_KERNEL(kernels::arg_extremum, DeviceType::CPU, arg_extremum);

}  // namespace mu::cpu
