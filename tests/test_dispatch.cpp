// The kernel seam (ops/dispatch.h): a missing entry is one error naming the kernel and
// the device; every kernel the library declares has its CPU entry.
#include "helpers.h"
#include "ops/kernels/attention.h"
#include "ops/kernels/copy.h"
#include "ops/kernels/entmax.h"
#include "ops/kernels/grouped_mm.h"
#include "ops/kernels/index.h"
#include "ops/kernels/linalg.h"
#include "ops/kernels/loss.h"
#include "ops/kernels/map.h"
#include "ops/kernels/norm.h"
#include "ops/kernels/optim.h"
#include "ops/kernels/reduce.h"
#include "ops/kernels/softmax.h"

using namespace mu;

namespace {
int twice(int v) { return 2 * v; }

template <class... F>
bool all_map_kernels_on_cpu(fn::FunctorList<F...>) {
  return (kernels::map<F>().has(DeviceType::CPU) && ...);
}
}  // namespace

TEST_CASE("a kernel with no entry for a device raises one error naming the kernel and the device") {
  KernelTable<int(int)> table{"demo_kernel"};
  CHECK_FALSE(table.has(DeviceType::CPU));
  CHECK_THROWS_MU(table(Device::cpu(), 1), "demo_kernel: no CPU kernel for this op (tensor on cpu)");
  table.set(DeviceType::CPU, &twice);
  CHECK(table(Device::cpu(), 21) == 42);
  CHECK_THROWS_MU(table(Device::cuda(0), 1), "demo_kernel: no CUDA kernel for this op (tensor on cuda:0)");
}

TEST_CASE("every declared kernel has a CPU entry") {
  CHECK(all_map_kernels_on_cpu(fn::AllFunctors{}));
  CHECK(kernels::copy.has(DeviceType::CPU));
  CHECK(kernels::fill.has(DeviceType::CPU));
  CHECK(kernels::sum.has(DeviceType::CPU));
  CHECK(kernels::extremum.has(DeviceType::CPU));
  CHECK(kernels::arg_extremum.has(DeviceType::CPU));
  CHECK(kernels::gather.has(DeviceType::CPU));
  CHECK(kernels::scatter_add.has(DeviceType::CPU));
  CHECK(kernels::index_select.has(DeviceType::CPU));
  CHECK(kernels::index_add_rows.has(DeviceType::CPU));
  CHECK(kernels::cumsum.has(DeviceType::CPU));
  CHECK(kernels::sort_indices.has(DeviceType::CPU));
  CHECK(kernels::softmax_forward.has(DeviceType::CPU));
  CHECK(kernels::softmax_backward.has(DeviceType::CPU));
  CHECK(kernels::entmax_forward.has(DeviceType::CPU));
  CHECK(kernels::entmax_backward.has(DeviceType::CPU));
  CHECK(kernels::matmul.has(DeviceType::CPU));
  CHECK(kernels::grouped_mm.has(DeviceType::CPU));
  CHECK(kernels::grouped_mm_weight_grad.has(DeviceType::CPU));
  CHECK(kernels::adamw_update.has(DeviceType::CPU));
  CHECK(kernels::sgd_update.has(DeviceType::CPU));
  CHECK(kernels::norm_power_sum.has(DeviceType::CPU));
  CHECK(kernels::layer_norm_forward.has(DeviceType::CPU));
  CHECK(kernels::layer_norm_backward.has(DeviceType::CPU));
  CHECK(kernels::batch_norm_forward.has(DeviceType::CPU));
  CHECK(kernels::batch_norm_backward.has(DeviceType::CPU));
  CHECK(kernels::cross_entropy_forward.has(DeviceType::CPU));
  CHECK(kernels::cross_entropy_backward.has(DeviceType::CPU));
  CHECK(kernels::attention_forward.has(DeviceType::CPU));
  CHECK(kernels::attention_backward.has(DeviceType::CPU));
#ifdef MUMOE_CUDA
  // The CUDA build registers the map and copy kernels from ops/cuda/.
  CHECK(kernels::map<fn::Exp>().has(DeviceType::CUDA));
  CHECK(kernels::copy.has(DeviceType::CUDA));
  // ... and the reductions, softmax, cross_entropy and normalisation kernels.
  CHECK(kernels::sum.has(DeviceType::CUDA));
  CHECK(kernels::extremum.has(DeviceType::CUDA));
  CHECK(kernels::arg_extremum.has(DeviceType::CUDA));
  CHECK(kernels::softmax_forward.has(DeviceType::CUDA));
  CHECK(kernels::softmax_backward.has(DeviceType::CUDA));
  CHECK(kernels::cross_entropy_forward.has(DeviceType::CUDA));
  CHECK(kernels::cross_entropy_backward.has(DeviceType::CUDA));
  CHECK(kernels::layer_norm_forward.has(DeviceType::CUDA));
  CHECK(kernels::layer_norm_backward.has(DeviceType::CUDA));
  CHECK(kernels::batch_norm_forward.has(DeviceType::CUDA));
  CHECK(kernels::batch_norm_backward.has(DeviceType::CUDA));
  // ... and the grouped products (cuBLAS per group).
  CHECK(kernels::grouped_mm.has(DeviceType::CUDA));
  CHECK(kernels::grouped_mm_weight_grad.has(DeviceType::CUDA));
#endif
}
