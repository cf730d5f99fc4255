// Tensor basics: creation, dtypes, views sharing storage, element access, printing, RNG.
#include <limits>
#include <sstream>

#include "helpers.h"

using namespace mu;

TEST_CASE("factories fill the values they promise") {
  Tensor z = zeros({2, 3});
  CHECK(z.shape() == Shape{2, 3});
  CHECK(z.dtype() == kFloat32);
  CHECK(z.numel() == 6);
  for (double v : z.to_vector<double>()) CHECK(v == 0.0);
  for (double v : ones({4}, kFloat64).to_vector<double>()) CHECK(v == 1.0);
  for (double v : full({2, 2}, 2.5).to_vector<double>()) CHECK(v == 2.5);
  CHECK(empty({0, 4}).numel() == 0);

  Tensor r = arange(5);
  CHECK(r.dtype() == kInt64);
  CHECK(r.to_vector<int64_t>() == std::vector<int64_t>{0, 1, 2, 3, 4});
  CHECK(arange(1, 2, 0.25, kFloat64).to_vector<double>() == std::vector<double>{1, 1.25, 1.5, 1.75});
  CHECK(arange(5, 0, -2).to_vector<int64_t>() == std::vector<int64_t>{5, 3, 1});

  Tensor e = eye(3, 4);
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 4; ++j) CHECK(e.at({i, j}) == (i == j ? 1.0 : 0.0));

  Tensor l = linspace(0, 1, 5, kFloat64);
  CHECK(l.to_vector<double>() == std::vector<double>{0, 0.25, 0.5, 0.75, 1});

  Tensor t = tensor({{1, 2, 3}, {4, 5, 6}});
  CHECK(t.shape() == Shape{2, 3});
  CHECK(t.at({1, 2}) == 6.0);
  CHECK(t.at({-1, -3}) == 4.0);
  CHECK(tensor({1, 2, 3}).dtype() == kInt64);
  CHECK(from_vector(std::vector<double>{1, 2, 3, 4}, {2, 2}).dtype() == kFloat64);
}

TEST_CASE("dtype conversion rounds toward zero into int64 and keeps values into float64") {
  Tensor f = tensor({1.75, -2.5, 3.0});
  CHECK(f.to(kInt64).to_vector<int64_t>() == std::vector<int64_t>{1, -2, 3});
  CHECK(f.to(kFloat64).to_vector<double>() == std::vector<double>{1.75, -2.5, 3.0});
  CHECK(f.to(kBool).to_vector<bool>() == std::vector<bool>{true, true, true});
  CHECK(tensor({0.0, 2.0}).to(kBool).to_vector<bool>() == std::vector<bool>{false, true});
}

TEST_CASE("views share storage and see each other's writes") {
  Tensor x = arange(0, 24, 1, kFloat64).reshape({2, 3, 4});
  CHECK(x.is_contiguous());
  CHECK(x.strides() == Shape{12, 4, 1});

  Tensor p = x.permute({2, 0, 1});
  CHECK(p.shape() == Shape{4, 2, 3});
  CHECK(p.strides() == Shape{1, 12, 4});
  CHECK(!p.is_contiguous());
  CHECK(p.storage() == x.storage());
  // p[k][i][j] == x[i][j][k]
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 3; ++j)
      for (int64_t k = 0; k < 4; ++k) CHECK(p.at({k, i, j}) == x.at({i, j, k}));

  Tensor tr = x.transpose(0, 2);
  CHECK(tr.shape() == Shape{4, 3, 2});
  CHECK(tr.at({3, 1, 0}) == x.at({0, 1, 3}));

  Tensor n = x.narrow(2, 1, 2);
  CHECK(n.shape() == Shape{2, 3, 2});
  CHECK(n.storage_offset() == 1);
  CHECK(n.at({1, 2, 1}) == x.at({1, 2, 2}));

  Tensor s = x.slice(1, 0, 3, 2);
  CHECK(s.shape() == Shape{2, 2, 4});
  CHECK(s.at({0, 1, 0}) == x.at({0, 2, 0}));

  Tensor sel = x.select(1, -1);
  CHECK(sel.shape() == Shape{2, 4});
  CHECK(sel.at({1, 3}) == x.at({1, 2, 3}));

  Tensor u = x.unsqueeze(1);
  CHECK(u.shape() == Shape{2, 1, 3, 4});
  CHECK(u.squeeze(1).shape() == Shape{2, 3, 4});
  CHECK(ones({1, 3, 1}).squeeze().shape() == Shape{3});
  CHECK(x.flatten().shape() == Shape{24});
  CHECK(x.flatten(1).shape() == Shape{2, 12});
  CHECK(x.flatten(0, 1).shape() == Shape{6, 4});
  CHECK(x.view({-1, 4}).shape() == Shape{6, 4});

  Tensor col = tensor({1.0, 2.0, 3.0}).reshape({3, 1});
  Tensor ex = col.expand({3, 5});
  CHECK(ex.strides()[1] == 0);
  CHECK(ex.at({2, 4}) == 3.0);

  // A write through one view is seen through the other.
  sel.set({0, 0}, 100.0);
  CHECK(x.at({0, 2, 0}) == 100.0);
  CHECK(p.at({0, 0, 2}) == 100.0);
}

TEST_CASE("reshape copies only when a view is impossible") {
  Tensor x = arange(0, 6, 1, kFloat32).reshape({2, 3});
  Tensor v = x.reshape({3, 2});
  CHECK(v.storage() == x.storage());
  Tensor t = x.t();
  Tensor r = t.reshape({6});  // transposed memory cannot be read as one run
  CHECK(r.storage() != x.storage());
  CHECK(r.to_vector<double>() == std::vector<double>{0, 3, 1, 4, 2, 5});
  CHECK_THROWS_MU(t.view({6}), "not compatible");
  // A view of a transposed tensor that keeps runs intact is allowed.
  Tensor y = arange(0, 24, 1, kFloat32).reshape({2, 3, 4}).permute({1, 0, 2});
  CHECK(y.view({3, 2, 2, 2}).storage() == y.storage());
}

TEST_CASE("contiguous copies non-contiguous tensors in row-major order") {
  Tensor x = arange(0, 12, 1, kFloat64).reshape({3, 4});
  Tensor c = x.t().contiguous();
  CHECK(c.is_contiguous());
  std::vector<double> want;
  for (int j = 0; j < 4; ++j)
    for (int i = 0; i < 3; ++i) want.push_back(i * 4 + j);
  CHECK(c.to_vector<double>() == want);
  CHECK(x.contiguous().storage() == x.storage());
  Tensor cl = x.clone();
  CHECK(cl.storage() != x.storage());
  CHECK(cl.to_vector<double>() == x.to_vector<double>());
}

TEST_CASE("item and element access") {
  CHECK(scalar_tensor(3.5).item() == 3.5);
  CHECK(tensor({7}).item<int64_t>() == 7);
  // Integer items are exact past 2^53 (a double in between would round them), from views
  // and narrow integer dtypes too; a float item truncates toward zero.
  const int64_t odd = (int64_t(1) << 53) + 1, most = std::numeric_limits<int64_t>::max();
  CHECK(from_vector(std::vector<int64_t>{odd}, {1}).item<int64_t>() == odd);
  CHECK(from_vector(std::vector<int64_t>{3, most}, {2}).select(0, 1).item<int64_t>() == most);
  CHECK(full({}, -123456789.0, DType::Int32).item<int32_t>() == -123456789);
  CHECK(full({}, -2.75).item<int64_t>() == -2);
  CHECK_THROWS_MU(ones({2}, kInt64).item<int64_t>(), "one-element");
  CHECK_THROWS_MU(ones({2}).item(), "one-element");
  CHECK_THROWS_MU(ones({2, 2}).at({2, 0}), "out of range");
  CHECK_THROWS_MU(ones({2, 2}).at({0}), "indices");
}

TEST_CASE("in-place ops write through and bump the version") {
  Tensor x = zeros({2, 3});
  uint64_t v0 = x.version();
  x.fill_(2.0);
  CHECK(x.version() > v0);
  x.add_(ones({3}));
  x.mul_(2.0);
  for (double v : x.to_vector<double>()) CHECK(v == 6.0);
  Tensor y = zeros({3, 2});
  y.copy_(x.t());
  for (double v : y.to_vector<double>()) CHECK(v == 6.0);
  // copy_ from an overlapping view of itself reads the source before writing
  Tensor a = arange(0, 4, 1, kFloat64).reshape({2, 2});
  a.copy_(a.t());
  CHECK(a.to_vector<double>() == std::vector<double>{0, 2, 1, 3});
}

// int64 values past 2^53 print as stored (through double they printed as a neighbour),
// and an int64 arange with whole start and step counts in integers there.
TEST_CASE("int64 past 2^53: printed exactly, and arange counts exactly") {
  const int64_t big = (int64_t(1) << 53) + 1;
  const Tensor a = from_vector(std::vector<int64_t>{big, -big, INT64_MAX, INT64_MIN}, {4});
  const std::string s = a.str();
  INFO(s);
  CHECK(s.find("9007199254740993") != std::string::npos);
  CHECK(s.find("-9007199254740993") != std::string::npos);
  CHECK(s.find("9223372036854775807") != std::string::npos);
  CHECK(s.find("-9223372036854775808") != std::string::npos);
  const Tensor r = arange(9007199254740990.0, 9007199254740994.0, 1.0, TensorOptions(kInt64));
  CHECK(r.to_vector<int64_t>() ==
        std::vector<int64_t>{9007199254740990, 9007199254740991, 9007199254740992, 9007199254740993});
  CHECK(arange(10.0, 0.0, -3.0, TensorOptions(kInt64)).to_vector<int64_t>() == std::vector<int64_t>{10, 7, 4, 1});
  // A fractional step on an integer dtype still goes through double, then converts.
  CHECK(arange(0.0, 2.0, 0.5, TensorOptions(kInt64)).numel() == 4);
}

TEST_CASE("printing shows values, shape and dtype, and summarises large tensors") {
  std::string s = tensor({{1.5, 2.0}, {3.0, 4.25}}).str();
  CHECK(s == "tensor([[1.5000, 2.0000],\n        [3.0000, 4.2500]], shape=[2, 2], dtype=float32)");
  CHECK(tensor({1, 2, 3}).str() == "tensor([1, 2, 3], shape=[3], dtype=int64)");
  // Every integer dtype prints integers (as torch).
  CHECK(tensor({-3, 100}).to(kInt8).str() == "tensor([ -3, 100], shape=[2], dtype=int8)");
  CHECK(tensor({200, 0}).to(kUInt8).str() == "tensor([200,   0], shape=[2], dtype=uint8)");
  CHECK(tensor({1.0, 2.0}, kFloat64).str() == "tensor([1., 2.], shape=[2], dtype=float64)");
  CHECK(scalar_tensor(2.0).str() == "tensor(2., shape=[], dtype=float32)");
  std::string big = arange(0, 2000, 1, kFloat32).str();
  CHECK(big == "tensor([   0.,    1.,    2.,  ..., 1997., 1998., 1999.], shape=[2000], dtype=float32)");
  std::ostringstream os;
  os << (tensor({1.0, 2.0}) > 1.5);
  CHECK(os.str() == "tensor([False,  True], shape=[2], dtype=bool)");
  Tensor g = ones({2}).requires_grad_();
  CHECK(g.str().find("requires_grad=True") != std::string::npos);
  CHECK((g * 2.0).str().find("grad_fn=<MulBackward>") != std::string::npos);
}

TEST_CASE("manual_seed makes random draws repeat") {
  manual_seed(42);
  Tensor a = randn({100});
  Tensor u = rand({100});
  Tensor i = randint(3, 9, {100});
  manual_seed(42);
  CHECK(randn({100}).to_vector<float>() == a.to_vector<float>());
  CHECK(rand({100}).to_vector<float>() == u.to_vector<float>());
  CHECK(randint(3, 9, {100}).to_vector<int64_t>() == i.to_vector<int64_t>());
  for (double v : u.to_vector<double>()) CHECK((v >= 0 && v < 1));
  for (int64_t v : i.to_vector<int64_t>()) CHECK((v >= 3 && v < 9));
  manual_seed(43);
  CHECK(randn({100}).to_vector<float>() != a.to_vector<float>());
  // randperm is a permutation
  std::vector<int64_t> p = randperm(50).to_vector<int64_t>();
  std::sort(p.begin(), p.end());
  for (int64_t k = 0; k < 50; ++k) CHECK(p[size_t(k)] == k);
}

TEST_CASE("randn has the moments of a standard normal and rand of U[0,1)") {
  manual_seed(1);
  std::vector<double> n = randn({200000}, kFloat64).to_vector<double>();
  double m = 0, v = 0;
  for (double x : n) m += x;
  m /= double(n.size());
  for (double x : n) v += (x - m) * (x - m);
  v /= double(n.size());
  CHECK(std::abs(m) < 0.01);
  CHECK(std::abs(v - 1) < 0.01);
  std::vector<double> u = rand({200000}, kFloat64).to_vector<double>();
  double mu_ = 0;
  for (double x : u) mu_ += x;
  CHECK(std::abs(mu_ / double(u.size()) - 0.5) < 0.01);
}

TEST_CASE("generator state round-trips") {
  manual_seed(7);
  randn({3});  // leaves a spare normal in the generator
  std::string st = default_generator().state();
  Tensor a = randn({10});
  default_generator().set_state(st);
  CHECK(randn({10}).to_vector<float>() == a.to_vector<float>());
  CHECK_THROWS_MU(default_generator().set_state("garbage"), "malformed");
}

TEST_CASE("the caching allocator reuses freed blocks and tracks the peak") {
  if (!cpu_allocator::caching_enabled()) return;  // sanitizer builds turn caching off
  cpu_allocator::empty_cache();
  void* first;
  {
    Tensor a = empty({1 << 16});
    first = a.raw_data();
  }
  Tensor b = empty({1 << 16});
  CHECK(b.raw_data() == first);
  CHECK(cpu_allocator::stats().peak_bytes >= (1 << 18));
}
