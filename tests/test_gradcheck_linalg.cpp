// gradcheck of the matrix products: mm, bmm and every matmul case (1-D, 2-D, batched,
// broadcast batch), with transposed, strided and expanded operands made inside the
// checked function so that gradients also flow back through those views; on every test
// device, with operands drawn on the CPU.
#include "helpers.h"
#include "ops/cpu/gemm.h"

using namespace mu;
using autograd::TensorList;

namespace {

Tensor r(const Shape& s) { return randn(s, kFloat64); }

// gradcheck of `f` on `inputs` moved to dev (one already there stays as it is, views
// included), under every GEMM backend of this build on the CPU; elsewhere the backend
// does not apply, so once.
void check_all_backends(Device dev, const std::function<Tensor(const TensorList&)>& f, const TensorList& inputs) {
  TensorList moved;
  for (const Tensor& t : inputs) moved.push_back(on(t, dev));
  if (!dev.is_cpu()) {
    CHECK_GRAD(f, moved);
    return;
  }
  std::vector<cpu::GemmBackend> bes = {cpu::GemmBackend::Native};
  if (cpu::gemm_have_blas()) bes.push_back(cpu::GemmBackend::Blas);
  const cpu::GemmBackend saved = cpu::gemm_backend();
  for (cpu::GemmBackend be : bes) {
    cpu::set_gemm_backend(be);
    INFO("backend " << cpu::gemm_backend_name(be));
    CHECK_GRAD(f, moved);
  }
  cpu::set_gemm_backend(saved);
}

}  // namespace

TEST_CASE("gradcheck: mm and bmm") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(20);
    check_all_backends(dev, [](const TensorList& in) { return mm(in[0], in[1]); }, {r({3, 4}), r({4, 5})});
    check_all_backends(dev, [](const TensorList& in) { return mm(in[0], in[1]); }, {r({1, 7}), r({7, 1})});
    check_all_backends(dev, [](const TensorList& in) { return bmm(in[0], in[1]); }, {r({2, 3, 4}), r({2, 4, 5})});
    check_all_backends(dev, [](const TensorList& in) { return bmm(in[0], in[1]); }, {r({3, 1, 6}), r({3, 6, 2})});
  }
}

TEST_CASE("gradcheck: matmul with vector operands") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(21);
    auto mmf = [](const TensorList& in) { return matmul(in[0], in[1]); };
    check_all_backends(dev, mmf, {r({5}), r({5})});           // dot
    check_all_backends(dev, mmf, {r({3, 5}), r({5})});        // matrix · vector
    check_all_backends(dev, mmf, {r({5}), r({5, 4})});        // vector · matrix
    check_all_backends(dev, mmf, {r({2, 3, 5}), r({5})});     // batch · vector
    check_all_backends(dev, mmf, {r({5}), r({2, 5, 3})});     // vector · batch
  }
}

TEST_CASE("gradcheck: matmul with matrices and batches") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(22);
    auto mmf = [](const TensorList& in) { return matmul(in[0], in[1]); };
    check_all_backends(dev, mmf, {r({3, 5}), r({5, 4})});
    check_all_backends(dev, mmf, {r({2, 3, 5}), r({2, 5, 4})});        // equal batches
    check_all_backends(dev, mmf, {r({2, 2, 3, 5}), r({5, 4})});        // batch · matrix (rows folded)
    check_all_backends(dev, mmf, {r({2, 1, 3, 4}), r({3, 4, 2})});     // broadcast batch dims
    // One side a single matrix shared by the other's batch (expanded, its gradient summed
    // over the batch): on the left, with and without leading 1s, over 11 products and
    // 2-D batches; on the right.
    check_all_backends(dev, mmf, {r({3, 5}), r({2, 5, 4})});
    check_all_backends(dev, mmf, {r({1, 3, 4}), r({2, 1, 4, 2})});
    check_all_backends(dev, mmf, {r({3, 5}), r({11, 5, 4})});
    check_all_backends(dev, mmf, {r({1, 1, 3, 5}), r({2, 3, 5, 2})});
    check_all_backends(dev, mmf, {r({11, 3, 5}), r({1, 5, 4})});
    // The shared matrix's gradient Σ_b g[b] · b[b]ᵀ has the depth N: more than one vector
    // (float64: 8 lanes) and a tail, so that the batch-summed kernel runs its vector loop;
    // then a b whose rows are not contiguous along that depth (the kernel's other path).
    check_all_backends(dev, mmf, {r({3, 4}), r({5, 4, 19})});
    check_all_backends(dev, [](const TensorList& in) { return matmul(in[0], in[1].transpose(1, 2)); },
                       {r({2, 4}), r({6, 3, 4})});
  }
}

TEST_CASE("gradcheck: matmul on non-contiguous views") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(23);
    // Transposed leaves (gradcheck keeps the inputs' strides), transposed on dev.
    check_all_backends(dev, [](const TensorList& in) { return matmul(in[0], in[1]); },
                       {on(r({5, 3}), dev).t(), on(r({4, 5}), dev).t()});
    // Views made inside the function: transposes, every other column, expand, permute.
    check_all_backends(dev, [](const TensorList& in) { return matmul(in[0].t(), in[1].transpose(0, 1)); },
                       {r({5, 3}), r({4, 5})});
    check_all_backends(dev, [](const TensorList& in) { return matmul(in[0].slice(1, 0, 10, 2), in[1]); },
                       {r({3, 10}), r({5, 4})});
    check_all_backends(dev, [](const TensorList& in) { return matmul(in[0].expand({3, 5}), in[1].expand({2, 5, 4})); },
                       {r({1, 5}), r({5, 4})});
    check_all_backends(
        dev, [](const TensorList& in) { return matmul(in[0].permute({1, 0, 2}), in[1].transpose(1, 2)); },
        {r({3, 2, 4}), r({2, 5, 4})});
    check_all_backends(dev, [](const TensorList& in) { return bmm(in[0].transpose(1, 2), in[1]); },
                       {r({2, 4, 3}), r({2, 4, 5})});
    // Both operands the same tensor: the two gradient contributions add up.
    check_all_backends(dev, [](const TensorList& in) { return matmul(in[0], in[0].t()); }, {r({3, 4})});
  }
}

TEST_CASE("gradcheck: matmul_with_one, batched and strided inputs, a weight that is a view") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    check_all_backends(dev, [](const TensorList& in) { return matmul_with_one(in[0], in[1]); }, {r({4, 3}), r({4, 5})});
    check_all_backends(dev, [](const TensorList& in) { return matmul_with_one(in[0], in[1]); }, {r({2, 3, 3}), r({4, 5})});
    check_all_backends(dev, [](const TensorList& in) { return matmul_with_one(in[0].transpose(0, 1), in[1]); },
                       {r({3, 4}), r({4, 5})});
    // A transposed weight, and K = 0 (the bias row alone).
    check_all_backends(dev, [](const TensorList& in) { return matmul_with_one(in[0], in[1].t()); }, {r({4, 3}), r({5, 4})});
    check_all_backends(dev, [](const TensorList& in) { return matmul_with_one(in[0], in[1]); }, {r({4, 0}), r({1, 5})});
    // The input also used elsewhere: both gradient contributions add up.
    check_all_backends(dev, [](const TensorList& in) { return matmul_with_one(in[0], in[1]) * in[0].sum({1}, true); },
                       {r({4, 3}), r({4, 5})});
  }
}

TEST_CASE("gradcheck: matmul_row_bias, a 2-D and a batched right operand, transposed and strided") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    auto f = [](const TensorList& in) { return matmul_row_bias(in[0], in[1], in[2]); };
    check_all_backends(dev, f, {r({4, 3}), r({3, 5}), r({4})});
    check_all_backends(dev, f, {r({4, 3}), r({2, 3, 5}), r({4})});
    check_all_backends(dev, [](const TensorList& in) { return matmul_row_bias(in[0].t(), in[1].transpose(1, 2), in[2]); },
                       {r({3, 4}), r({2, 5, 3}), r({4})});
    // b also used elsewhere: both gradient contributions add up.
    check_all_backends(dev, [](const TensorList& in) { return matmul_row_bias(in[0], in[1], in[2]) * in[1].sum({1}, true); },
                       {r({3, 3}), r({2, 3, 5}), r({3})});
  }
}

TEST_CASE("gradcheck: linear with and without bias, batched and strided inputs") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    check_all_backends(dev, [](const TensorList& in) { return linear(in[0], in[1], in[2]); }, {r({4, 3}), r({5, 3}), r({5})});
    check_all_backends(dev, [](const TensorList& in) { return linear(in[0], in[1], in[2]); },
                       {r({2, 3, 3}), r({5, 3}), r({5})});
    check_all_backends(dev, [](const TensorList& in) { return linear(in[0].transpose(0, 1), in[1], in[2]); },
                       {r({3, 4}), r({5, 3}), r({5})});
    check_all_backends(dev, [](const TensorList& in) { return linear(in[0], in[1]); }, {r({4, 3}), r({5, 3})});
    check_all_backends(dev, [](const TensorList& in) { return linear(in[0], in[1], in[2]); }, {r({3}), r({5, 3}), r({5})});
  }
}
