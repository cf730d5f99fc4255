// cat, stack, split, chunk, tril, triu against element-by-element expectations.
#include <limits>

#include "helpers.h"

using namespace mu;

TEST_CASE("cat joins along any dim") {
  Tensor a = arange(0, 6, 1, kFloat64).reshape({2, 3});
  Tensor b = arange(10, 13, 1, kFloat64).reshape({1, 3});
  Tensor r = cat({a, b}, 0);
  CHECK(r.shape() == Shape{3, 3});
  CHECK(r.to_vector<double>() == std::vector<double>{0, 1, 2, 3, 4, 5, 10, 11, 12});
  Tensor c = cat({a, a.narrow(1, 0, 1)}, -1);
  CHECK(c.shape() == Shape{2, 4});
  CHECK(c.to_vector<double>() == std::vector<double>{0, 1, 2, 0, 3, 4, 5, 3});
  Tensor t = cat({a.t(), a.t()}, 1);  // non-contiguous inputs
  CHECK(t.shape() == Shape{3, 4});
  CHECK(t.at({2, 3}) == a.at({1, 2}));
  CHECK(cat({arange(2), arange(3)}).to_vector<int64_t>() == std::vector<int64_t>{0, 1, 0, 1, 2});
}

// torch's legacy rule: a 1-D tensor of size 0 joins tensors of any shape, adding nothing;
// its gradient is empty too.
TEST_CASE("cat skips 1-D empty tensors beside tensors of other shapes") {
  Tensor a = arange(0, 6, 1, kFloat64).reshape({2, 3}).requires_grad_();
  Tensor e = zeros({0}, kFloat64).requires_grad_();
  Tensor r = cat({e, a, e}, 1);
  CHECK(r.shape() == Shape{2, 3});
  CHECK(r.to_vector<double>() == a.to_vector<double>());
  (r * arange(0, 6, 1, kFloat64).reshape({2, 3})).sum().backward();
  CHECK(a.grad().to_vector<double>() == std::vector<double>{0, 1, 2, 3, 4, 5});
  REQUIRE(e.grad().defined());
  CHECK(e.grad().shape() == Shape{0});
  CHECK(cat({a, e, a.detach()}, 0).shape() == Shape{4, 3});
  CHECK(cat({e, e}).shape() == Shape{0});
  // Only a 1-D empty one is skipped: [0, 3] still has to match, and dtypes still agree.
  CHECK_THROWS_MU(cat({zeros({0, 2}, kFloat64), a}, 0), "cat: sizes must match except in dimension 0");
  CHECK_THROWS_MU(cat({zeros({0}, kFloat32), a}, 0), "cat: dtype mismatch");
}

// An empty dimension chunks into `chunks` empty pieces, as torch's chunk (q, k, v of an
// empty batch unpack); split by a size still gives one.
TEST_CASE("chunk of an empty dimension gives the asked number of empty pieces") {
  const Tensor e = zeros({0, 4}).requires_grad_();
  const std::vector<Tensor> parts = chunk(e, 3, 0);
  REQUIRE(parts.size() == 3);
  for (const Tensor& p : parts) CHECK(p.shape() == Shape{0, 4});
  CHECK(split(e, 2, 0).size() == 1);
  (parts[0].sum() + parts[2].sum()).backward();
  REQUIRE(e.grad().defined());
  CHECK(e.grad().shape() == Shape{0, 4});
  CHECK(chunk(zeros({3, 0}), 2, 1).size() == 2);
}

TEST_CASE("stack adds a new dim") {
  Tensor a = tensor({1.0, 2.0}), b = tensor({3.0, 4.0});
  Tensor s0 = stack({a, b});
  CHECK(s0.shape() == Shape{2, 2});
  CHECK(s0.to_vector<double>() == std::vector<double>{1, 2, 3, 4});
  Tensor s1 = stack({a, b}, 1);
  CHECK(s1.to_vector<double>() == std::vector<double>{1, 3, 2, 4});
  CHECK_THROWS_MU(stack({a, ones({3})}), "one shape");
  CHECK_THROWS_MU(stack({a, b.to(kInt64)}), "stack: dtype mismatch: float32 vs int64");
}

TEST_CASE("split and chunk return views covering the tensor") {
  Tensor x = arange(0, 10, 1, kFloat64);
  auto p = split(x, 4);
  REQUIRE(p.size() == 3);
  CHECK(p[2].to_vector<double>() == std::vector<double>{8, 9});
  CHECK(p[1].storage() == x.storage());
  auto q = split(x, std::vector<int64_t>{2, 3, 5});
  CHECK(q[1].to_vector<double>() == std::vector<double>{2, 3, 4});
  auto c = chunk(x, 3);  // sizes 4, 4, 2 like torch.chunk
  REQUIRE(c.size() == 3);
  CHECK(c[0].numel() == 4);
  CHECK(c[2].numel() == 2);
  CHECK_THROWS_MU(split(x, std::vector<int64_t>{2, 3}), "add up to 5");
}

TEST_CASE("tril and triu keep the right triangle for every diagonal offset") {
  Tensor x = arange(1, 13, 1, kFloat64).reshape({3, 4});
  const int64_t kMax = std::numeric_limits<int64_t>::max(), kMin = std::numeric_limits<int64_t>::min();
  for (int64_t k : {kMin, int64_t(-1000), int64_t(-4), int64_t(-3), int64_t(-2), int64_t(-1), int64_t(0), int64_t(1),
                    int64_t(2), int64_t(3), int64_t(4), int64_t(5), int64_t(1000), kMax}) {
    INFO("diagonal " << k);
    Tensor lo = tril(x, k), up = triu(x, k);
    for (int64_t i = 0; i < 3; ++i)
      for (int64_t j = 0; j < 4; ++j) {
        CHECK(lo.at({i, j}) == (j - i <= k ? x.at({i, j}) : 0.0));  // j - i never overflows here
        CHECK(up.at({i, j}) == (j - i >= k ? x.at({i, j}) : 0.0));
      }
  }
  Tensor batched = ones({2, 3, 3});
  CHECK(tril(batched).sum().item() == 12.0);
}

TEST_CASE("eye: n x m, square by default; a negative size is refused") {
  Tensor e = eye(2, 3, kFloat64);
  CHECK(e.to_vector<double>() == std::vector<double>{1, 0, 0, 0, 1, 0});
  CHECK(eye(2).shape() == Shape{2, 2});
  CHECK_THROWS_MU(eye(2, -2), "eye: negative number of columns -2");
  CHECK_THROWS_MU(eye(-1), "eye: negative size -1");
}

TEST_CASE("squeeze(dim) of a 0-dim tensor takes 0 and -1 and refuses any other dim, as torch") {
  const Tensor s = scalar_tensor(1.5);
  for (int64_t d : {0, -1}) {
    const Tensor q = s.squeeze(d);
    CHECK(q.dim() == 0);
    CHECK(q.item<double>() == 1.5);
  }
  // torch.tensor(1.5).squeeze(3): "Dimension out of range (expected to be in range of [-1, 0], but got 3)".
  CHECK_THROWS_MU(s.squeeze(3), "squeeze: dimension 3 out of range for a tensor with 0 dimensions (expected in [-1, 0])");
  CHECK_THROWS_MU(s.squeeze(-2), "squeeze: dimension -2 out of range");
  // A dimension of size other than 1 stays; of size 1 goes.
  CHECK(ones({2, 1, 3}).squeeze(1).shape() == Shape{2, 3});
  CHECK(ones({2, 1, 3}).squeeze(0).shape() == Shape{2, 1, 3});
  CHECK_THROWS_MU(ones({2, 1, 3}).squeeze(3), "squeeze: dimension 3 out of range for a tensor with 3 dimensions");
}
