// The one definition of every kernel table (see MU_DECLARE_KERNEL in ops/dispatch.h):
// each header under ops/kernels/ is included here with MU_DEFINE_KERNEL_TABLES set.
#define MU_DEFINE_KERNEL_TABLES
#include "ops/kernels/attention.h"
#include "ops/kernels/copy.h"
#include "ops/kernels/dropout.h"
#include "ops/kernels/entmax.h"
#include "ops/kernels/grouped_mm.h"
#include "ops/kernels/hadamard_gemm.h"
#include "ops/kernels/index.h"
#include "ops/kernels/linalg.h"
#include "ops/kernels/loss.h"
#include "ops/kernels/map.h"
#include "ops/kernels/norm.h"
#include "ops/kernels/optim.h"
#include "ops/kernels/reduce.h"
#include "ops/kernels/ring_gemm.h"
#include "ops/kernels/softmax.h"

#include <array>

namespace mu::kernels {

template <class F>
KernelTable<MapFn<F>>& map() {
  // Built on first use (a registration or a call), whatever the order of static
  // initialisation.
  static KernelTable<MapFn<F>> table{F::name};
  return table;
}

// Emits map<F>() for every functor, here in the library: taking each one's address makes
// the compiler keep an out-of-line definition that programs linking the library reach.
template <class... F>
auto map_table_getters(fn::FunctorList<F...>) {
  return std::array<const void*, sizeof...(F)>{reinterpret_cast<const void*>(&map<F>)...};
}
extern const auto all_map_table_getters = map_table_getters(fn::AllFunctors{});

}  // namespace mu::kernels
