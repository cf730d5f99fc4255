// The torch-style method forms of Tensor (x.softmax(1), x.max(0), x[i], x.to_long(), ...):
// each must give exactly what its free function gives (the free functions have their own
// tests against brute-force loops and torch), and every accessor of an undefined tensor
// must be a clear error rather than a crash.
#include "helpers.h"

using namespace mu;

namespace {

// Equal shapes, dtypes and bits.
void check_same(const Tensor& a, const Tensor& b) {
  REQUIRE(a.shape() == b.shape());
  REQUIRE(a.dtype() == b.dtype());
  const std::vector<double> va = a.to_vector<double>(), vb = b.to_vector<double>();
  for (size_t i = 0; i < va.size(); ++i) CHECK(va[i] == vb[i]);
}

}  // namespace

TEST_CASE("method forms give what their free functions give") {
  manual_seed(3);
  const Tensor x = randn({4, 5});
  check_same(x.tanh(), tanh(x));
  check_same(x.sigmoid(), sigmoid(x));
  check_same(x.relu(), relu(x));
  check_same(x.clamp(-0.5, 0.25), clamp(x, -0.5, 0.25));
  check_same(x.softmax(1), softmax(x, 1));
  check_same(x.log_softmax(0), log_softmax(x, 0));
  check_same(x.max(), max(x));
  check_same(x.min(), min(x));
  check_same(x.argmax(), argmax(x));
  check_same(x.argmin(), argmin(x));
  check_same(x.argmax(1), argmax(x, 1));
  check_same(x.argmin(0, true), argmin(x, 0, true));
  const Tensor index = tensor({3, 0, 3});
  check_same(x.index_select(0, index), index_select(x, 0, index));
  check_same(x.index_select(1, index), index_select(x, 1, index));

  auto [values, indices] = x.max(1);  // torch's values, indices = x.max(1)
  check_same(values, max(x, 1).values);
  check_same(indices, max(x, 1).indices);
  check_same(x.min(0, true).values, min(x, 0, true).values);
  check_same(x.min(0, true).indices, min(x, 0, true).indices);
  check_same(x.topk(2).values, topk(x, 2).values);
  check_same(x.topk(3, 0, false).indices, topk(x, 3, 0, false).indices);
}

TEST_CASE("argmin over all elements is the flattened index of the smallest") {
  // Brute force over the values, first occurrence on ties (as torch.argmin).
  const Tensor x = tensor({{3.0, -1.0, 2.0}, {-1.0, 7.0, -1.0}});
  CHECK(argmin(x).item<int64_t>() == 1);
  CHECK(x.argmin().dim() == 0);
  CHECK(tensor({5, 9, 2, 2}).argmin().item<int64_t>() == 2);
  CHECK_THROWS_MU(zeros({0}).argmin(), "argmin");
}

TEST_CASE("x[i] selects along dim 0 and x[index] gathers rows") {
  const Tensor x = arange(12).reshape({3, 4});
  check_same(x[1], x.select(0, 1));
  CHECK(x[-1].to_vector<int64_t>() == std::vector<int64_t>{8, 9, 10, 11});
  CHECK(x[2][3].item<int64_t>() == 11);
  CHECK(x[tensor({2, 0})].to_vector<int64_t>() == std::vector<int64_t>{8, 9, 10, 11, 0, 1, 2, 3});
  CHECK_THROWS_MU(x[3], "select");
  CHECK_THROWS_MU(x[tensor({0, 3})], "3");
  // Autograd flows through both: the selected elements get the gradient.
  Tensor w = zeros({3, 2}).requires_grad_();
  (w[1].sum() * 2.0 + w[tensor({0, 0})].sum()).backward();
  CHECK(w.grad().to_vector<double>() == std::vector<double>{2, 2, 2, 2, 0, 0});
}

TEST_CASE("to_float, to_double and to_long are torch's float(), double() and long()") {
  const Tensor x = tensor({1.75, -2.5, 3.0});
  CHECK(x.to_double().dtype() == kFloat64);
  CHECK(x.to_long().dtype() == kInt64);
  CHECK(x.to_long().to_vector<int64_t>() == std::vector<int64_t>{1, -2, 3});  // toward zero, as torch
  CHECK(tensor({1, 2}).to_float().dtype() == kFloat32);
  check_same(x.to_double().to_float(), x);
}

TEST_CASE("every accessor and method of an undefined tensor is a clear error") {
  const Tensor u;
  CHECK_FALSE(u.defined());
  CHECK(u.str() == "tensor(undefined)");
  CHECK(u.describe() == "Tensor[undefined]");
  const char* why = "undefined tensor";
  CHECK_THROWS_MU(u.dim(), why);
  CHECK_THROWS_MU(u.shape(), why);
  CHECK_THROWS_MU(u.sizes(), why);
  CHECK_THROWS_MU(u.size(0), why);
  CHECK_THROWS_MU(u.strides(), why);
  CHECK_THROWS_MU(u.stride(0), why);
  CHECK_THROWS_MU(u.storage_offset(), why);
  CHECK_THROWS_MU(u.numel(), why);
  CHECK_THROWS_MU(u.dtype(), why);
  CHECK_THROWS_MU(u.device(), why);
  CHECK_THROWS_MU(u.is_contiguous(), why);
  CHECK_THROWS_MU(u.is_floating_point(), why);
  CHECK_THROWS_MU(u.storage(), why);
  CHECK_THROWS_MU(u.version(), why);
  CHECK_THROWS_MU(u.data_ptr<float>(), why);
  CHECK_THROWS_MU(u.raw_data(), why);
  CHECK_THROWS_MU(u.item(), why);
  CHECK_THROWS_MU(u.at({0}), why);
  CHECK_THROWS_MU(u.set({0}, 1.0), why);
  CHECK_THROWS_MU(u.to_vector<float>(), why);
  CHECK_THROWS_MU(u.to(kFloat64), why);
  CHECK_THROWS_MU(u.cpu(), why);
  CHECK_THROWS_MU(u.contiguous(), why);
  CHECK_THROWS_MU(u.clone(), why);
  CHECK_THROWS_MU(u.detach(), why);
  CHECK_THROWS_MU(u.requires_grad(), why);
  CHECK_THROWS_MU(u.is_leaf(), why);
  CHECK_THROWS_MU(u.grad_fn(), why);
  CHECK_THROWS_MU(u.grad(), why);
  CHECK_THROWS_MU(u.zero_grad(), why);
  CHECK_THROWS_MU(u.backward(), why);
  CHECK_THROWS_MU(u.view({1}), why);
  CHECK_THROWS_MU(u.reshape({1}), why);
  CHECK_THROWS_MU(u.transpose(0, 1), why);
  CHECK_THROWS_MU(u.unsqueeze(0), why);
  CHECK_THROWS_MU(u.flatten(), why);
  CHECK_THROWS_MU(u[0], why);
  CHECK_THROWS_MU(u[tensor({0})], why);
  CHECK_THROWS_MU(u.sum(), why);
  CHECK_THROWS_MU(u.softmax(0), why);
  CHECK_THROWS_MU(u.max(), why);
  CHECK_THROWS_MU(u.argmax(0), why);
  CHECK_THROWS_MU(u.topk(1), why);
  CHECK_THROWS_MU(u.relu(), why);
  CHECK_THROWS_MU(u.to_long(), why);
  Tensor v;
  CHECK_THROWS_MU(v.requires_grad_(), why);
  CHECK_THROWS_MU(v.fill_(1.0), why);
  CHECK_THROWS_MU(v.add_(1.0), why);
}
