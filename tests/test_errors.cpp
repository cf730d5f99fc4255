// Every class of user error gives a mu::Error whose message names the values involved.
#include "helpers.h"

using namespace mu;

TEST_CASE("shape mismatch names both shapes") {
  CHECK_THROWS_MU(ones({2, 3}) + ones({4}), "[2, 3] and [4]");
  CHECK_THROWS_MU(ones({2, 3}) * ones({3, 2}), "cannot be broadcast");
  CHECK_THROWS_MU(ones({6}).view({4, -1}), "invalid for input of shape [6]");
  CHECK_THROWS_MU(ones({2, 3}).expand({4, 3}), "must match");
  CHECK_THROWS_MU(cat({ones({2, 3}), ones({2, 4})}, 0), "[2, 4]");
  CHECK_THROWS_MU(masked_fill(ones({2}), ones({3}) > 0.0, 1.0), "cannot be broadcast");
  // copy_ broadcasts the source to the destination, never the other way round
  CHECK_THROWS_MU(zeros({3}).copy_(ones({1, 3})), "[1, 3] cannot be broadcast to destination shape [3]");
  CHECK_THROWS_MU(zeros({1, 3}).copy_(ones({3, 1})), "cannot be broadcast");
}

TEST_CASE("dtypes that cannot meet name both dtypes") {
  // In-place: the promoted result must fit the destination's dtype.
  Tensor i = arange(3);
  CHECK_THROWS_MU(i.add_(ones({3})), "add_: the result type float32 cannot be written into a tensor of dtype int64");
  CHECK_THROWS_MU(i.add_(0.5), "not an integer");
  CHECK_THROWS_MU(ones({2}).data_ptr<double>(), "float32");
  // An op that does not compute on a storage dtype names it (sum takes int16, as an int64
  // sum; mean needs floats).
  CHECK(ones({2}).to(kInt16).sum().dtype() == kInt64);
  CHECK_THROWS_MU(mean(ones({2}).to(kInt16)), "mean: needs a floating-point tensor, got int16");
  CHECK_THROWS_MU(matmul(ones({2, 2}), ones({2, 2}, kFloat64)), "float32 vs float64");
}

TEST_CASE("device mismatch and missing devices are reported, not crashed on") {
  if (cuda::device_count() == 0) {
    CHECK_THROWS_MU(ones({2}).to(Device::cuda()), "no CUDA device");
    CHECK_THROWS_MU(zeros({2}, Device::cuda()), "CUDA");
  } else {
    Tensor g = ones({2}).to(Device::cuda());
    CHECK_THROWS_MU(g + ones({2}), "device mismatch");
  }
}

TEST_CASE("dims and indices out of range") {
  Tensor x = ones({2, 3});
  CHECK_THROWS_MU(x.sum({2}), "dimension 2 out of range");
  CHECK_THROWS_MU(x.sum({-3}), "out of range");
  CHECK_THROWS_MU(x.transpose(0, 5), "out of range");
  CHECK_THROWS_MU(x.select(0, 2), "index 2 out of range");
  CHECK_THROWS_MU(x.narrow(1, 2, 2), "out of bounds");
  CHECK_THROWS_MU(x.permute({0, 0}), "repeated");
  CHECK_THROWS_MU(x.at({0, 3}), "index 3 out of range");
  CHECK_THROWS_MU(x.size(2), "out of range");
  CHECK_THROWS_MU(x.sum({1, 1}), "more than once");
}

TEST_CASE("backward misuse") {
  Tensor w = ones({3}).requires_grad_();
  Tensor y = w * 2.0;
  CHECK_THROWS_MU(y.backward(), "scalar");
  Tensor l = (w * w).sum();
  l.backward();
  CHECK_THROWS_MU(l.backward(), "second time");
  CHECK_THROWS_MU(ones({2}).sum().backward(), "does not require grad");
}

TEST_CASE("bad factory arguments") {
  CHECK_THROWS_MU(empty({2, -1}), "negative dimension");
  CHECK_THROWS_MU(arange(0, 5, 0), "step");
  CHECK_THROWS_MU(randint(5, 5, {2}), "empty range");
  CHECK_THROWS_MU(from_vector(std::vector<double>{1, 2, 3}, {2, 2}), "3 values");
  CHECK_THROWS_MU(gelu(ones({2}), "fast"), "approximate");
  CHECK_THROWS_MU(Tensor().shape(), "undefined tensor");
}
