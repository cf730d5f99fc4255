// CUDA device plumbing. Skipped (exit code 77, which ctest reports as skipped) with the
// reason printed when this machine has no CUDA device or the build has no CUDA.
#include <cstdio>
#include <cstdlib>

#include "helpers.h"

using namespace mu;

static const bool kHaveDevice = [] {
  if (cuda::device_count() == 0) {
    std::printf("SKIPPED: no CUDA device on this machine%s; the CUDA tests need one\n",
#ifdef MUMOE_CUDA
                " (the CUDA backend is compiled in)"
#else
                " (and this build has no CUDA backend)"
#endif
    );
    std::fflush(stdout);
    std::exit(77);
  }
  return true;
}();

TEST_CASE("host -> device -> host round trip keeps every value") {
  manual_seed(0);
  Tensor x = randn({257, 33}, kFloat64);
  Tensor d = x.to(Device::cuda());
  CHECK(d.device() == Device::cuda());
  CHECK(d.shape() == x.shape());
  Tensor back = d.cpu();
  CHECK(back.to_vector<double>() == x.to_vector<double>());
  // a non-contiguous source is made dense on the way
  Tensor t = x.t().to(Device::cuda()).cpu();
  CHECK(t.to_vector<double>() == x.t().contiguous().to_vector<double>());
}

TEST_CASE("factories on the device") {
  Tensor z = zeros({4, 5}, Device::cuda());
  CHECK(z.device().is_cuda());
  for (double v : z.cpu().to_vector<double>()) CHECK(v == 0.0);
  Tensor f = full({3}, 2.5, TensorOptions(kFloat32).device(Device::cuda()));
  CHECK(f.cpu().to_vector<float>() == std::vector<float>{2.5f, 2.5f, 2.5f});
  CHECK(f.at({1}) == 2.5);
  CHECK(f.str().find("device=cuda:0") != std::string::npos);
}

TEST_CASE("gradients flow back across devices") {
  Tensor x = tensor({1.0, 2.0}, kFloat64).requires_grad_();
  Tensor y = x.to(Device::cuda()).to(Device::cpu());
  (y * y).sum().backward();
  CHECK(x.grad().to_vector<double>() == std::vector<double>{2.0, 4.0});
}

TEST_CASE("errors for device indices that do not exist and ops without a CUDA kernel") {
  CHECK_THROWS_MU(zeros({2}, Device::cuda(cuda::device_count())), "out of range");
  Tensor d = ones({2}).to(Device::cuda());
  CHECK_THROWS_MU(d + d, "CUDA");
}
