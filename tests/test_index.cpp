// Indexing ops against brute-force loops over row-major copies of the operands, on every
// test device: operands (indices too) are drawn on the CPU and moved with on(); results
// are read back through to_vector / at, which copy to the host.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "helpers.h"

using namespace mu;

namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();

// Random int64 indices in [0, high) of the given shape.
Tensor rand_index(int64_t high, const Shape& shape) { return randint(0, high, shape); }

void check_equal(const Tensor& got, const Shape& shape, const std::vector<double>& want, double tol = 0) {
  REQUIRE(got.shape() == shape);
  std::vector<double> g = got.to_vector<double>();
  REQUIRE(g.size() == want.size());
  for (size_t i = 0; i < g.size(); ++i) {
    INFO("element " << i << ": got " << g[i] << ", want " << want[i]);
    if (std::isnan(want[i]))
      CHECK(std::isnan(g[i]));
    else
      CHECK(std::fabs(g[i] - want[i]) <= tol);
  }
}

std::vector<double> ref_gather(const Tensor& x, int64_t dim, const Tensor& index) {
  std::vector<double> xv = x.to_vector<double>(), out;
  std::vector<int64_t> iv = index.to_vector<int64_t>();
  for (int64_t f = 0; f < index.numel(); ++f) {
    std::vector<int64_t> at = unflat(index.shape(), f);
    at[size_t(dim)] = iv[size_t(f)];
    out.push_back(xv[size_t(flat(x.shape(), at))]);
  }
  return out;
}

std::vector<double> ref_scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src) {
  std::vector<double> out = x.to_vector<double>(), sv = src.to_vector<double>();
  std::vector<int64_t> iv = index.to_vector<int64_t>();
  for (int64_t f = 0; f < index.numel(); ++f) {
    std::vector<int64_t> at = unflat(index.shape(), f);
    double s = sv[size_t(flat(src.shape(), at))];
    at[size_t(dim)] = iv[size_t(f)];
    out[size_t(flat(x.shape(), at))] += s;
  }
  return out;
}

std::vector<double> ref_index_select(const Tensor& x, int64_t dim, const Tensor& index, Shape* out_shape) {
  std::vector<double> xv = x.to_vector<double>(), out;
  std::vector<int64_t> iv = index.to_vector<int64_t>();
  *out_shape = x.shape();
  (*out_shape)[size_t(dim)] = int64_t(iv.size());
  for (int64_t f = 0; f < numel_of(*out_shape); ++f) {
    std::vector<int64_t> at = unflat(*out_shape, f);
    at[size_t(dim)] = iv[size_t(at[size_t(dim)])];
    out.push_back(xv[size_t(flat(x.shape(), at))]);
  }
  return out;
}

// Running sums along dim, from the end when `reverse`.
std::vector<double> ref_cumsum(const Tensor& x, int64_t dim, bool reverse = false) {
  std::vector<double> xv = x.to_vector<double>(), out(xv.size());
  int64_t n = x.shape()[size_t(dim)];
  for (int64_t f = 0; f < x.numel(); ++f) {
    std::vector<int64_t> at = unflat(x.shape(), f);
    int64_t j = at[size_t(dim)];
    double s = 0;
    for (int64_t k = reverse ? j : 0; k < (reverse ? n : j + 1); ++k) {
      at[size_t(dim)] = k;
      s += xv[size_t(flat(x.shape(), at))];
    }
    out[size_t(f)] = s;
  }
  return out;
}

// The line of x through `at` along dim, as (value, position) pairs.
std::vector<std::pair<double, int64_t>> line(const std::vector<double>& xv, const Shape& shape, std::vector<int64_t> at,
                                             int64_t dim) {
  std::vector<std::pair<double, int64_t>> l;
  for (int64_t j = 0; j < shape[size_t(dim)]; ++j) {
    at[size_t(dim)] = j;
    l.push_back({xv[size_t(flat(shape, at))], j});
  }
  return l;
}

// Stable sort (or top k) of every line along dim, by insertion: equal keys never pass
// each other, and NaN counts as larger than every number.
void ref_sort(const Tensor& x, int64_t dim, bool descending, int64_t k, std::vector<double>* values,
              std::vector<double>* indices, Shape* out_shape) {
  std::vector<double> xv = x.to_vector<double>();
  *out_shape = x.shape();
  (*out_shape)[size_t(dim)] = k;
  values->assign(size_t(numel_of(*out_shape)), 0);
  indices->assign(size_t(numel_of(*out_shape)), 0);
  auto before = [descending](double a, double b) {  // a strictly precedes b
    if (std::isnan(a) || std::isnan(b)) return descending ? (std::isnan(a) && !std::isnan(b)) : (!std::isnan(a) && std::isnan(b));
    return descending ? a > b : a < b;
  };
  for (int64_t f = 0; f < x.numel(); ++f) {
    std::vector<int64_t> at = unflat(x.shape(), f);
    if (at[size_t(dim)] != 0) continue;  // one visit per line
    auto l = line(xv, x.shape(), at, dim);
    for (size_t i = 1; i < l.size(); ++i)
      for (size_t j = i; j > 0 && before(l[j].first, l[j - 1].first); --j) std::swap(l[j], l[j - 1]);
    for (int64_t j = 0; j < k; ++j) {
      at[size_t(dim)] = j;
      int64_t o = flat(*out_shape, at);
      (*values)[size_t(o)] = l[size_t(j)].first;
      (*indices)[size_t(o)] = double(l[size_t(j)].second);
    }
  }
}

}  // namespace

// ---------------------------------------------------------------- gather

TEST_CASE("gather matches brute force along every dim, with views and negative dims") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(1);
    Tensor base = on(randn({4, 5, 6}, kFloat64), dev);
    for (Tensor x : {base, base.transpose(0, 2), base.slice(1, 0, 5, 2)}) {
      for (int64_t dim : {0, 1, 2, -1}) {
        int64_t d = dim < 0 ? dim + 3 : dim;
        // index smaller than x in the other dims, any size along dim
        Shape is = x.shape();
        for (auto& s : is) s = std::max<int64_t>(1, s - 1);
        is[size_t(d)] = 7;
        Tensor idx = on(rand_index(x.shape()[size_t(d)], is), dev);
        INFO("x " << shape_str(x.shape()) << " dim " << dim);
        check_equal(gather(x, dim, idx), is, ref_gather(x, d, idx));
        // a non-contiguous index
        Tensor idx_t = on(rand_index(x.shape()[size_t(d)], {is[2], is[1], is[0]}), dev).permute({2, 1, 0});
        check_equal(gather(x, dim, idx_t), is, ref_gather(x, d, idx_t));
      }
    }
    // float32 and int64 values
    Tensor xf = on(tensor({{1.5, 2.5}, {3.5, 4.5}}), dev);
    Tensor i = on(from_vector(std::vector<int64_t>{1, 1, 0, 1}, {2, 2}), dev);
    check_equal(gather(xf, 1, i), {2, 2}, {2.5, 2.5, 3.5, 4.5});
    check_equal(gather(xf.to(kInt64), 0, i), {2, 2}, {3, 4, 1, 4});
  }
}

TEST_CASE("gather of a large tensor (split over threads)") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(2);
    Tensor x = on(randn({300, 200}, kFloat32), dev);
    Tensor idx = on(rand_index(200, {300, 150}), dev);
    check_equal(gather(x, 1, idx), {300, 150}, ref_gather(x, 1, idx));
    Tensor idx0 = on(rand_index(300, {250, 200}), dev);
    check_equal(gather(x, 0, idx0), {250, 200}, ref_gather(x, 0, idx0));
  }
}

TEST_CASE("gather backward scatters the gradient, adding repeats") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    Tensor x = on(zeros({2, 3}, kFloat64).requires_grad_(), dev);
    Tensor idx = on(from_vector(std::vector<int64_t>{2, 2, 0, 1, 1, 1}, {2, 3}), dev);
    Tensor g = on(tensor({{1.0, 2.0, 3.0}, {4.0, 5.0, 6.0}}, kFloat64), dev);
    gather(x, 1, idx).backward(g);
    CHECK(x.grad().to_vector<double>() == std::vector<double>{3, 0, 3, 0, 15, 0});
  }
}

// ---------------------------------------------------------------- scatter_add

TEST_CASE("scatter_add matches brute force, duplicates accumulate") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(3);
    for (int64_t dim : {0, 1, 2}) {
      Tensor x = on(randn({3, 4, 5}, kFloat64), dev);
      Shape is = {2, 3, 4};
      is[size_t(dim)] = 9;  // more entries than the dim holds: duplicates are certain
      Tensor idx = on(rand_index(x.shape()[size_t(dim)], is), dev);
      Tensor src = randn({3, 9, 9}, kFloat64);  // larger than index: the extra is unused
      if (dim == 0) src = randn({9, 4, 5}, kFloat64);
      src = on(src, dev);
      INFO("dim " << dim);
      check_equal(scatter_add(x, dim, idx, src), x.shape(), ref_scatter_add(x, dim, idx, src), 1e-12);
      // transposed operands
      Tensor xt = x.transpose(0, 2).contiguous().transpose(0, 2);
      check_equal(scatter_add(xt, dim, idx, src), x.shape(), ref_scatter_add(x, dim, idx, src), 1e-12);
    }
    // The input is not modified.
    Tensor x = zeros({3}, TensorOptions().device(dev));
    Tensor y = scatter_add(x, 0, on(from_vector(std::vector<int64_t>{2, 2}, {2}), dev), on(tensor({1.0, 2.0}), dev));
    CHECK(y.to_vector<double>() == std::vector<double>{0, 0, 3});
    CHECK(x.to_vector<double>() == std::vector<double>{0, 0, 0});
  }
}

TEST_CASE("scatter_add of a large tensor is deterministic and matches brute force") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(4);
    Tensor x = zeros({50, 20}, TensorOptions(kFloat64).device(dev));
    Tensor idx = on(rand_index(20, {50, 2000}), dev);
    Tensor src = on(randn({50, 2000}, kFloat64), dev);
    Tensor a = scatter_add(x, 1, idx, src), b = scatter_add(x, 1, idx, src);
    check_equal(a, {50, 20}, ref_scatter_add(x, 1, idx, src), 1e-10);
    CHECK(a.to_vector<double>() == b.to_vector<double>());
  }
}

TEST_CASE("scatter_add gradients: x gets g, src gets g gathered at index (zero beyond it)") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    Tensor x = on(zeros({2, 3}, kFloat64).requires_grad_(), dev);
    Tensor src = on(ones({2, 4}, kFloat64).requires_grad_(), dev);
    Tensor idx = on(from_vector(std::vector<int64_t>{0, 2, 1, 0}, {2, 2}), dev);
    Tensor g = on(tensor({{1.0, 2.0, 3.0}, {4.0, 5.0, 6.0}}, kFloat64), dev);
    scatter_add(x, 1, idx, src).backward(g);
    CHECK(x.grad().to_vector<double>() == g.to_vector<double>());
    CHECK(src.grad().to_vector<double>() == std::vector<double>{1, 3, 0, 0, 5, 4, 0, 0});
  }
}

// ---------------------------------------------------------------- index_select, embedding

TEST_CASE("index_select matches brute force along every dim") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(5);
    Tensor base = on(randn({4, 5, 6}, kFloat32), dev);
    for (Tensor x : {base, base.permute({2, 0, 1})}) {
      for (int64_t dim : {0, 1, 2, -2}) {
        int64_t d = dim < 0 ? dim + 3 : dim;
        Tensor idx = on(rand_index(x.shape()[size_t(d)], {8}), dev);
        Shape os;
        std::vector<double> want = ref_index_select(x, d, idx, &os);
        INFO("x " << shape_str(x.shape()) << " dim " << dim);
        check_equal(index_select(x, dim, idx), os, want);
        // strided index
        Tensor idx2 = on(rand_index(x.shape()[size_t(d)], {16}), dev).slice(0, 0, 16, 2);
        want = ref_index_select(x, d, idx2, &os);
        check_equal(index_select(x, dim, idx2), os, want);
      }
    }
    // empty selection
    CHECK(index_select(base, 1, zeros({0}, TensorOptions(kInt64).device(dev))).shape() == Shape{4, 0, 6});
  }
}

TEST_CASE("index_add adds each slice of src at its index, repeats summed, along every dim") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(15);
    const Tensor x = randn({4, 5, 6}, kFloat64);
    for (int64_t d : {0, 1, 2}) {
      const int64_t n = x.shape()[size_t(d)];
      const Tensor index = rand_index(n, {9});  // 9 entries of n: repeats guaranteed
      Shape ss = x.shape();
      ss[size_t(d)] = 9;
      const Tensor src = randn(ss, kFloat64);
      // Brute force: every element of src added to x at its index along d.
      std::vector<double> want = x.contiguous().to_vector<double>(), s = src.contiguous().to_vector<double>();
      const std::vector<int64_t> iv = index.to_vector<int64_t>();
      const Shape& xs = x.shape();
      for (int64_t a = 0; a < ss[0]; ++a)
        for (int64_t b = 0; b < ss[1]; ++b)
          for (int64_t c = 0; c < ss[2]; ++c) {
            int64_t at[3] = {a, b, c};
            at[d] = iv[size_t(at[d])];
            want[size_t((at[0] * xs[1] + at[1]) * xs[2] + at[2])] += s[size_t((a * ss[1] + b) * ss[2] + c)];
          }
      INFO("dim " << d);
      check_equal(index_add(on(x, dev), d, on(index, dev), on(src, dev)).cpu(), xs, want, 1e-12);
    }
    CHECK_THROWS_MU(index_add(on(x, dev), 0, on(from_vector<int64_t>({0, 1}, {2}), dev), on(randn({3, 5, 6}, kFloat64), dev)),
                    "index_add: src must have shape [2, 5, 6]");
    CHECK_THROWS_MU(index_add(on(x, dev), 0, on(from_vector<int64_t>({0, 4}, {2}), dev), on(randn({2, 5, 6}, kFloat64), dev)),
                    "index_add");
  }
}

TEST_CASE("index_select backward adds each selected slice back") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    Tensor x = on(zeros({3, 2}, kFloat64).requires_grad_(), dev);
    Tensor idx = on(from_vector(std::vector<int64_t>{2, 0, 2}, {3}), dev);
    Tensor g = on(tensor({{1.0, 2.0}, {3.0, 4.0}, {5.0, 6.0}}, kFloat64), dev);
    index_select(x, 0, idx).backward(g);
    CHECK(x.grad().to_vector<double>() == std::vector<double>{3, 4, 0, 0, 6, 8});
    Tensor y = on(zeros({2, 3}, kFloat64).requires_grad_(), dev);
    index_select(y, 1, idx).backward(g.t().contiguous());
    CHECK(y.grad().to_vector<double>() == std::vector<double>{3, 0, 6, 4, 0, 8});
  }
}

TEST_CASE("embedding picks rows for ids of any shape; backward adds rows") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(6);
    int64_t V = 7, D = 3;
    Tensor w = on(randn({V, D}, kFloat64).requires_grad_(), dev);
    Tensor ids = on(from_vector(std::vector<int64_t>{6, 0, 3, 3, 1, 6, 6, 2}, {2, 4}), dev);
    Tensor y = embedding(w, ids);
    REQUIRE(y.shape() == Shape{2, 4, 3});
    std::vector<double> wv = w.to_vector<double>(), yv = y.to_vector<double>();
    std::vector<int64_t> iv = ids.to_vector<int64_t>();
    for (size_t n = 0; n < iv.size(); ++n)
      for (int64_t c = 0; c < D; ++c) CHECK(yv[n * size_t(D) + size_t(c)] == wv[size_t(iv[n] * D + c)]);
    Tensor g = randn({2, 4, 3}, kFloat64);
    y.backward(on(g, dev));
    std::vector<double> gv = g.to_vector<double>(), want(size_t(V * D), 0.0);
    for (size_t n = 0; n < iv.size(); ++n)
      for (int64_t c = 0; c < D; ++c) want[size_t(iv[n] * D + c)] += gv[n * size_t(D) + size_t(c)];
    check_equal(w.grad(), {V, D}, want, 1e-12);
    // 0-dim ids give one row; 1-D ids a matrix.
    CHECK(embedding(w.detach(), full({}, 4, TensorOptions(kInt64).device(dev))).shape() == Shape{D});
    CHECK(embedding(w.detach(), on(from_vector(std::vector<int64_t>{1, 2}, {2}), dev)).shape() == Shape{2, D});
  }
}

TEST_CASE("embedding backward for many ids (split over threads) matches brute force") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(7);
    int64_t V = 50, D = 300, N = 400;
    Tensor w = on(zeros({V, D}, kFloat32).requires_grad_(), dev);
    Tensor ids = rand_index(V, {N});
    Tensor g = randn({N, D}, kFloat32);
    embedding(w, on(ids, dev)).backward(on(g, dev));
    std::vector<double> gv = g.to_vector<double>(), want(size_t(V * D), 0.0);
    std::vector<int64_t> iv = ids.to_vector<int64_t>();
    for (int64_t n = 0; n < N; ++n)
      for (int64_t c = 0; c < D; ++c) want[size_t(iv[size_t(n)] * D + c)] += gv[size_t(n * D + c)];
    check_equal(w.grad(), {V, D}, want, 1e-4);
  }
}

// ---------------------------------------------------------------- cumsum

TEST_CASE("cumsum matches brute force; its gradient is the reversed cumsum") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(8);
    Tensor base = on(randn({3, 4, 5}, kFloat64), dev);
    for (Tensor x : {base, base.transpose(0, 1)}) {
      for (int64_t dim : {0, 1, 2, -1}) {
        int64_t d = dim < 0 ? dim + 3 : dim;
        INFO("x " << shape_str(x.shape()) << " dim " << dim);
        check_equal(cumsum(x, dim), x.shape(), ref_cumsum(x, d), 1e-12);
        Tensor xl = x.detach().requires_grad_();
        Tensor g = randn(x.shape(), kFloat64);
        cumsum(xl, dim).backward(on(g, dev));
        check_equal(xl.grad(), x.shape(), ref_cumsum(g, d, true), 1e-12);
      }
    }
    // integers and bools stay exact integers
    Tensor xi = on(from_vector(std::vector<int64_t>{1, 2, 3, 4}, {4}), dev);
    CHECK(cumsum(xi, 0).dtype() == kInt64);
    CHECK(cumsum(xi, 0).to_vector<int64_t>() == std::vector<int64_t>{1, 3, 6, 10});
    Tensor xb = gt(on(tensor({1.0, -1.0, 2.0}), dev), zeros({3}, TensorOptions().device(dev)));
    CHECK(cumsum(xb, 0).to_vector<int64_t>() == std::vector<int64_t>{1, 1, 2});
    // float32 accumulates in double: the 1 survives next to 1e8 (a float32 sum loses it)
    Tensor f = on(tensor({1e8, 1.0, -1e8}, kFloat32), dev);
    CHECK(cumsum(f, 0).at({2}) == 1.0);
  }
}

// Rows summed eight at a time, each row a few steps behind the one before (the CPU's
// cumsum over the last dim): groups of eight with rows left over (19 = 2 x 8 + 3), rows
// shorter than the stagger of the eight (5) and longer (300, and 4096, a power of two),
// forward and from the end (the gradient), float32 (summed in double) and int64 (exact,
// wrapping past the largest value, as torch's).
TEST_CASE("cumsum over the last dim of many long rows matches brute force, from either end") {
  for (Device dev : test_devices())
    for (int64_t n : {5, 300, 4096}) {
      INFO(dev.str() << ", rows of " << n);
      manual_seed(uint64_t(n));
      // float32 sums are carried in double and rounded once: within an ulp of the double
      // reference (which may add in another order: the exact sums differ in double's last
      // bits at most).
      auto within_ulp = [](const Tensor& got, const std::vector<double>& want) {
        std::vector<double> gv = got.to_vector<double>();
        REQUIRE(gv.size() == want.size());
        int64_t wrong = 0, first = -1;
        for (size_t i = 0; i < gv.size(); ++i)
          if (!(std::fabs(gv[i] - want[i]) <= std::fabs(want[i]) * 0x1p-23) && wrong++ == 0) first = int64_t(i);
        INFO("first element off: " << first);
        CHECK(wrong == 0);
      };
      Tensor x = randn({19, n}, kFloat64).to(kFloat32).to(kFloat64);  // float32 values
      within_ulp(cumsum(on(x.to(kFloat32), dev), 1), ref_cumsum(x, 1));
      Tensor xl = on(x.to(kFloat32), dev).requires_grad_();
      Tensor g = randn({19, n}, kFloat64).to(kFloat32).to(kFloat64);
      cumsum(xl, 1).backward(on(g.to(kFloat32), dev));
      within_ulp(xl.grad(), ref_cumsum(g, 1, true));
      // int64: each row's running sum, exactly; row 4's first element starts near the top
      // so that its sum wraps (two's complement, as torch's).
      std::vector<int64_t> iv(size_t(19 * n)), want(iv.size());
      for (size_t i = 0; i < iv.size(); ++i) iv[i] = int64_t(i % 1000) - 500;
      iv[size_t(4 * n)] = std::numeric_limits<int64_t>::max() - 100;
      for (int64_t r = 0; r < 19; ++r) {
        uint64_t s = 0;
        for (int64_t j = 0; j < n; ++j) want[size_t(r * n + j)] = int64_t(s += uint64_t(iv[size_t(r * n + j)]));
      }
      CHECK(cumsum(on(from_vector(iv, {19, n}), dev), 1).to_vector<int64_t>() == want);
    }
}

// Storage dtypes on every device, empty tensors included: cumsum sums the narrow
// integers as int64 and the 16-bit floats in float32, each prefix rounded once (as torch);
// gather and index_select move any dtype's elements unchanged; scatter_add and index_add
// add in the compute dtype and round once.
TEST_CASE("cumsum, gather, index_select, scatter_add and index_add of 16-bit floats and narrow integers") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(12);
    const Tensor base = mul(randn({3, 5}), full({}, 20.0));
    const Tensor idx = from_vector(std::vector<int64_t>{4, 0, 4}, {3});
    const Tensor gidx = from_vector(std::vector<int64_t>{1, 0, 2, 2, 1, 0}, {3, 2});
    for (DType dt : {kBFloat16, DType::Float16, DType::Int32, DType::Int16, DType::Int8, DType::UInt8}) {
      INFO(dtype_name(dt));
      const Tensor x = on((dt == DType::UInt8 ? abs(base) : base).to(dt), dev);
      const std::vector<double> v = x.cpu().to(kFloat64).to_vector<double>();  // 3 x 5, row-major
      Tensor c = cumsum(x, 1);
      CHECK(c.dtype() == (is_floating(dt) ? dt : kInt64));
      std::vector<double> want(v.size());
      for (size_t r = 0; r < 3; ++r) {
        double run = 0;
        for (size_t k = 0; k < 5; ++k) {
          run += v[r * 5 + k];
          // a float prefix is the exact sum rounded to the narrow dtype
          want[r * 5 + k] = is_floating(dt) ? tensor({run}, kFloat64).to(dt).to(kFloat64).item() : run;
        }
      }
      CHECK(c.cpu().to(kFloat64).to_vector<double>() == want);
      Tensor sel = index_select(x, 1, on(idx, dev));
      CHECK(sel.dtype() == dt);
      std::vector<double> want_sel;
      for (size_t r = 0; r < 3; ++r)
        for (int64_t j : {4, 0, 4}) want_sel.push_back(v[r * 5 + size_t(j)]);
      CHECK(sel.cpu().to(kFloat64).to_vector<double>() == want_sel);
      Tensor got = gather(x, 1, on(gidx, dev));
      CHECK(got.dtype() == dt);
      const std::vector<int64_t> gi = gidx.to_vector<int64_t>();
      std::vector<double> want_g;
      for (size_t r = 0; r < 3; ++r)
        for (size_t j = 0; j < 2; ++j) want_g.push_back(v[r * 5 + size_t(gi[r * 2 + j])]);
      CHECK(got.cpu().to(kFloat64).to_vector<double>() == want_g);
      // scatter_add of x into itself at gidx: out[r][gi] += x[r][j], summed exactly (the
      // values are integers or few-digit floats) and rounded once to the dtype.
      Tensor sa = scatter_add(x, 1, on(gidx, dev), x.slice(1, 0, 2));
      CHECK(sa.dtype() == dt);
      std::vector<double> want_sa = v;
      for (size_t r = 0; r < 3; ++r)
        for (size_t j = 0; j < 2; ++j) want_sa[r * 5 + size_t(gi[r * 2 + j])] += v[r * 5 + j];
      std::vector<double> rounded;
      for (double e : want_sa) rounded.push_back(tensor({e}, kFloat64).to(dt).to(kFloat64).item());
      CHECK(sa.cpu().to(kFloat64).to_vector<double>() == rounded);
      if (is_floating(dt)) {  // index_add: row 0 of x added into rows 2 and 0
        Tensor ia = index_add(x, 0, on(from_vector(std::vector<int64_t>{2, 0}, {2}), dev), x.slice(0, 0, 2));
        CHECK(ia.dtype() == dt);
        std::vector<double> want_ia = v;
        for (size_t k = 0; k < 5; ++k) want_ia[10 + k] += v[k], want_ia[k] += v[5 + k];
        std::vector<double> r_ia;
        for (double e : want_ia) r_ia.push_back(tensor({e}, kFloat64).to(dt).to(kFloat64).item());
        CHECK(ia.cpu().to(kFloat64).to_vector<double>() == r_ia);
      } else {
        CHECK_THROWS_MU(index_add(x, 0, on(zeros({1}, kInt64), dev), x.slice(0, 0, 1)),
                        std::string("index_add: needs a floating-point tensor, got ") + dtype_name(dt));
      }
      // Empty: the same dtypes as above, on every device.
      const Tensor none = on(zeros({0, 5}).to(dt), dev);
      CHECK(cumsum(none, 1).dtype() == c.dtype());
      CHECK(index_select(none, 1, on(idx, dev)).shape() == Shape{0, 3});
    }
  }
}

// int64 cumsum and scatter_add wrap around as two's complement when they overflow, as
// torch's do: against running sums in uint64, whose arithmetic is modular.
TEST_CASE("int64 cumsum and scatter_add that overflow wrap around") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    const int64_t big = std::numeric_limits<int64_t>::max() / 2 + 7;
    const std::vector<int64_t> v = {big, big, -3, big, big, big};
    std::vector<int64_t> want;
    uint64_t run = 0;
    for (int64_t e : v) want.push_back(int64_t(run += uint64_t(e)));
    CHECK(cumsum(on(from_vector(v, {6}), dev), 0).cpu().to_vector<int64_t>() == want);
    // All six into element 0 of a zero tensor: their wrapped total.
    Tensor out = scatter_add(on(zeros({2}, kInt64), dev), 0, on(zeros({6}, kInt64), dev), on(from_vector(v, {6}), dev));
    CHECK(out.cpu().to_vector<int64_t>() == std::vector<int64_t>{want.back(), 0});
  }
}

TEST_CASE("cumsum of a large tensor (split over threads) along either dim") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(9);
    Tensor x = on(randn({200, 300}, kFloat64), dev);
    check_equal(cumsum(x, 0), x.shape(), ref_cumsum(x, 0), 1e-10);
    check_equal(cumsum(x, 1), x.shape(), ref_cumsum(x, 1), 1e-10);
  }
}

// ---------------------------------------------------------------- sort, topk

TEST_CASE("sort matches a stable brute-force sort, both directions, every dim") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(10);
    // Few distinct values, so ties are everywhere and stability is tested.
    Tensor base = on(randint(0, 4, {4, 5, 6}).to(kFloat64), dev);
    for (Tensor x : {base, base.transpose(0, 2), on(randn({3, 7}, kFloat32), dev)}) {
      for (int64_t dim = 0; dim < x.dim(); ++dim) {
        for (bool desc : {false, true}) {
          INFO("x " << shape_str(x.shape()) << " dim " << dim << " descending " << desc);
          std::vector<double> vals, idx;
          Shape os;
          ref_sort(x, dim, desc, x.shape()[size_t(dim)], &vals, &idx, &os);
          ValuesIndices s = sort(x, dim, desc);
          CHECK(s.indices.dtype() == kInt64);
          check_equal(s.values, os, vals);
          check_equal(s.indices, os, idx);
        }
      }
    }
  }
}

TEST_CASE("sort: stability on ties and NaN placement") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    Tensor x = on(tensor({2.0, 1.0, 2.0, kNaN, 1.0, 3.0}), dev);
    ValuesIndices a = sort(x);
    CHECK(a.indices.to_vector<int64_t>() == std::vector<int64_t>{1, 4, 0, 2, 5, 3});
    CHECK(std::isnan(a.values.at({5})));
    ValuesIndices d = sort(x, 0, true);
    CHECK(d.indices.to_vector<int64_t>() == std::vector<int64_t>{3, 5, 0, 2, 1, 4});
    CHECK(std::isnan(d.values.at({0})));
    CHECK(d.values.at({1}) == 3);
    // sort of a large batch of rows (split over threads)
    manual_seed(11);
    Tensor big = on(randn({500, 70}, kFloat64), dev);
    std::vector<double> vals, idx;
    Shape os;
    ref_sort(big, 1, false, 70, &vals, &idx, &os);
    ValuesIndices s = sort(big, 1);
    check_equal(s.values, os, vals);
    check_equal(s.indices, os, idx);
  }
}

TEST_CASE("sort values carry the gradient back to the original positions") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    Tensor x = on(tensor({3.0, 1.0, 2.0}, kFloat64).requires_grad_(), dev);
    ValuesIndices s = sort(x);
    s.values.backward(on(tensor({10.0, 20.0, 30.0}, kFloat64), dev));
    // sorted order is x[1], x[2], x[0]
    CHECK(x.grad().to_vector<double>() == std::vector<double>{30, 10, 20});
  }
}

TEST_CASE("topk: k largest and k smallest, sorted, as torch.topk") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(12);
    Tensor base = on(randint(0, 5, {4, 6, 3}).to(kFloat64), dev);
    for (Tensor x : {base, base.permute({1, 2, 0}), on(randn({5, 9}, kFloat32), dev)}) {
      for (int64_t dim : {0, 1, -1}) {
        int64_t d = dim < 0 ? dim + x.dim() : dim;
        int64_t n = x.shape()[size_t(d)];
        for (int64_t k : {int64_t(0), int64_t(1), n / 2, n}) {
          for (bool largest : {true, false}) {
            INFO("x " << shape_str(x.shape()) << " dim " << dim << " k " << k << " largest " << largest);
            std::vector<double> vals, idx;
            Shape os;
            ref_sort(x, d, largest, k, &vals, &idx, &os);
            ValuesIndices t = topk(x, k, dim, largest);
            check_equal(t.values, os, vals);
            check_equal(t.indices, os, idx);
          }
        }
      }
    }
    Tensor v = on(tensor({1.0, 5.0, kNaN, 3.0}), dev);
    CHECK(topk(v, 2).indices.to_vector<int64_t>() == std::vector<int64_t>{2, 1});
    CHECK(topk(v, 2, 0, false).indices.to_vector<int64_t>() == std::vector<int64_t>{0, 3});
    Tensor xl = on(tensor({1.0, 5.0, 4.0, 3.0}, kFloat64).requires_grad_(), dev);
    topk(xl, 2).values.backward(on(tensor({1.0, 2.0}, kFloat64), dev));
    CHECK(xl.grad().to_vector<double>() == std::vector<double>{0, 1, 2, 0});
  }
}

// ---------------------------------------------------------------- errors

TEST_CASE("index errors name the op, the value, the dim and its size") {
  Tensor x = zeros({3, 5});
  Tensor bad = from_vector(std::vector<int64_t>{0, 7, 1}, {1, 3});
  CHECK_THROWS_MU(gather(x, 1, bad), "gather: index 7 is out of bounds for dimension 1 with size 5");
  CHECK_THROWS_MU(gather(x, 1, from_vector(std::vector<int64_t>{-1}, {1, 1})),
                  "gather: index -1 is out of bounds for dimension 1 with size 5");
  CHECK_THROWS_MU(gather(x, 1, zeros({1, 3})), "gather: index must be an int64 tensor, got float32");
  CHECK_THROWS_MU(gather(x, 1, zeros({3}, kInt64)), "gather: index has 1 dimensions");
  CHECK_THROWS_MU(gather(x, 1, zeros({4, 2}, kInt64)), "is larger than the input of shape [3, 5] in dimension 0");
  CHECK_THROWS_MU(gather(x, 2, zeros({1, 1}, kInt64)), "gather: dimension 2 out of range");
  CHECK_THROWS_MU(scatter_add(x, 0, from_vector(std::vector<int64_t>{3}, {1, 1}), ones({1, 1})),
                  "scatter_add: index 3 is out of bounds for dimension 0 with size 3");
  CHECK_THROWS_MU(scatter_add(x, 0, zeros({2, 2}, kInt64), ones({1, 2})), "is larger than src");
  CHECK_THROWS_MU(scatter_add(x, 0, zeros({1, 1}, kInt64), ones({1, 1}, kFloat64)), "scatter_add: dtype mismatch");
  CHECK_THROWS_MU(index_select(x, 0, from_vector(std::vector<int64_t>{0, 3}, {2})),
                  "index_select: index 3 is out of bounds for dimension 0 with size 3");
  CHECK_THROWS_MU(index_select(x, 1, zeros({2, 2}, kInt64)), "index_select: index must be 1-D");
  CHECK_THROWS_MU(index_select(x, 0, zeros({2}, kFloat64)), "index_select: index must be an int64 tensor, got float64");
  CHECK_THROWS_MU(embedding(x, from_vector(std::vector<int64_t>{1, 9}, {2})),
                  "embedding: index 9 is out of bounds for dimension 0 with size 3");
  CHECK_THROWS_MU(embedding(zeros({3}), zeros({2}, kInt64)), "embedding: weight must be 2-D");
  CHECK_THROWS_MU(embedding(x, zeros({2})), "embedding: index must be an int64 tensor");
  CHECK_THROWS_MU(topk(x, 6), "topk: k = 6 is out of range for dimension 1 of size 5");
  CHECK_THROWS_MU(topk(x, -1, 0), "topk: k = -1 is out of range");
  CHECK_THROWS_MU(sort(x, 2), "sort: dimension 2 out of range");
  CHECK_THROWS_MU(cumsum(x, -3), "cumsum: dimension -3 out of range");
}

// ---------------------------------------------------------------- long lines and wide rows
// Shapes that take the other paths of the CUDA kernels (ops/cuda/index.cu): scatter_add
// on a few long lines (a sort by destination), index_add_rows with rows wider than a
// block and several outer slices, cumsum's block scan of few long lines, and sorts of
// lines too long for shared memory. On the CPU they check the same kernels on sizes
// where they split over threads.

TEST_CASE("scatter_add on a few long lines with strided operands equals brute force and the CPU bit for bit") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(20);
    // Three lines of 700 entries along dim 0, index and src transposed views (src larger).
    Tensor x = randn({40, 3}, kFloat32);
    Tensor idx_c = rand_index(40, {3, 700}), src_c = randn({3, 800}, kFloat32);
    Tensor idx = on(idx_c, dev).t(), src = on(src_c, dev).t();
    REQUIRE_FALSE(idx.is_contiguous());
    Tensor got = scatter_add(on(x, dev), 0, idx, src);
    check_equal(got, {40, 3}, ref_scatter_add(x, 0, idx_c.t(), src_c.t()), 1e-4);
    // The additions into each element run in the CPU's order: the same float32 bits.
    Tensor cpu = scatter_add(x, 0, idx_c.t(), src_c.t());
    CHECK(got.to_vector<float>() == cpu.to_vector<float>());
    // int64 along the last dim: exact.
    Tensor xi = randint(-5, 5, {5, 30}), ii = rand_index(30, {5, 1000}), si = randint(-9, 9, {5, 1000});
    check_equal(scatter_add(on(xi, dev), 1, on(ii, dev), on(si, dev)), {5, 30}, ref_scatter_add(xi, 1, ii, si));
  }
}

TEST_CASE("index_select backward with repeated indices, rows wider than a block and several outer slices") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(21);
    const int64_t outer = 3, n = 40, m = 500, inner = 300;
    Tensor x = on(zeros({outer, n, inner}, kFloat32).requires_grad_(), dev);
    Tensor idx = rand_index(n, {m});  // 500 draws from 40 rows: every row repeats
    Tensor g = randn({outer, m, inner}, kFloat32);
    index_select(x, 1, on(idx, dev)).backward(on(g, dev));
    std::vector<double> gv = g.to_vector<double>(), want(size_t(outer * n * inner), 0.0);
    std::vector<int64_t> iv = idx.to_vector<int64_t>();
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t j = 0; j < m; ++j)
        for (int64_t c = 0; c < inner; ++c)
          want[size_t((o * n + iv[size_t(j)]) * inner + c)] += gv[size_t((o * m + j) * inner + c)];
    check_equal(x.grad(), {outer, n, inner}, want, 1e-4);
    // The CPU adds the rows in the same order: the same float32 bits.
    Tensor xc = zeros({outer, n, inner}, kFloat32).requires_grad_();
    index_select(xc, 1, idx).backward(g);
    CHECK(x.grad().to_vector<float>() == xc.grad().to_vector<float>());
    // Rows of one column (inner = 1): a block per row run, one active thread.
    Tensor y = on(zeros({n}, kFloat64).requires_grad_(), dev);
    Tensor gy = randn({m}, kFloat64);
    index_select(y, 0, on(idx, dev)).backward(on(gy, dev));
    std::vector<double> want_y(size_t(n), 0.0), gyv = gy.to_vector<double>();
    for (int64_t j = 0; j < m; ++j) want_y[size_t(iv[size_t(j)])] += gyv[size_t(j)];
    check_equal(y.grad(), {n}, want_y, 1e-12);
  }
}

TEST_CASE("cumsum of a few long lines, both directions, float and int64") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(22);
    Tensor x = on(randn({2, 5000}, kFloat64), dev);
    check_equal(cumsum(x, 1), x.shape(), ref_cumsum(x, 1), 1e-10);
    // The gradient is the reversed cumsum of g.
    Tensor xl = x.detach().requires_grad_();
    Tensor g = randn({2, 5000}, kFloat64);
    cumsum(xl, 1).backward(on(g, dev));
    check_equal(xl.grad(), x.shape(), ref_cumsum(g, 1, true), 1e-10);
    // float32 sums carried in double: each output is the double sum rounded once.
    Tensor xf = on(randn({3000}, kFloat32), dev);
    check_equal(cumsum(xf, 0), {3000}, ref_cumsum(xf, 0), 1e-4);
    // int64: exact.
    Tensor xi = on(randint(-1000, 1000, {7000}), dev);
    check_equal(cumsum(xi, 0), {7000}, ref_cumsum(xi, 0));
  }
}

TEST_CASE("sort and topk of lines longer than 2048 (and exactly 2048): stable on ties, NaN placed") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(23);
    // Few distinct values: ties everywhere. A few NaNs in each line.
    Tensor a = randint(0, 50, {2, 3000}).to(kFloat64);
    for (int64_t r = 0; r < 2; ++r)
      for (int64_t j : {7, 1500, 2999}) a.set({r, j}, kNaN);
    Tensor b = randint(0, 9, {2500, 2}).to(kFloat32);  // lines along dim 0: inner stride 2
    b.set({100, 1}, kNaN);
    Tensor c = randn({2, 2048}, kFloat64);
    for (auto [x, dim] : {std::pair<Tensor, int64_t>{a, 1}, {b, 0}, {c, 1}}) {
      Tensor xd = on(x, dev);
      int64_t n = x.shape()[size_t(dim)];
      for (bool desc : {false, true}) {
        INFO("x " << shape_str(x.shape()) << " dim " << dim << " descending " << desc);
        std::vector<double> vals, idx;
        Shape os;
        ref_sort(x, dim, desc, n, &vals, &idx, &os);
        ValuesIndices s = sort(xd, dim, desc);
        check_equal(s.values, os, vals);
        check_equal(s.indices, os, idx);
        // k of 1, 3 and 10: the CPU's one-pass selection (at least 256 elements per one
        // asked for) on every line but the shortest at 10, where partial_sort serves.
        for (int64_t k : {1, 3, 10}) {
          INFO("k " << k);
          ref_sort(x, dim, desc, k, &vals, &idx, &os);
          ValuesIndices t = topk(xd, k, dim, desc);
          check_equal(t.values, os, vals);
          check_equal(t.indices, os, idx);
        }
      }
    }
  }
}

// The first k positions of each row of the 2-D x by a stable sort of the row's (value,
// position) pairs, NaN above every number (-0 and +0 equal).
std::vector<int64_t> ref_topk_rows(const Tensor& x, int64_t k, bool descending) {
  const int64_t rows = x.size(0), n = x.size(1);
  const std::vector<double> xv = x.to_vector<double>();
  std::vector<int64_t> out;
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<int64_t> pos(static_cast<size_t>(n));
    std::iota(pos.begin(), pos.end(), int64_t(0));
    const double* v = xv.data() + r * n;
    std::stable_sort(pos.begin(), pos.end(), [&](int64_t a, int64_t b) {
      const double p = v[a], q = v[b];
      if (std::isnan(p) || std::isnan(q)) return descending ? std::isnan(p) && !std::isnan(q) : !std::isnan(p) && std::isnan(q);
      return descending ? p > q : p < q;
    });
    out.insert(out.end(), pos.begin(), pos.begin() + k);
  }
  return out;
}

TEST_CASE("topk of long lines, k up to 2048: ties at the k-th place, signed zeros, infinities, int64 extremes") {
  // Lines longer than 2048 with k <= 2048: on CUDA a radix selection of the k and a sort of
  // those alone (the CPU: its one-pass selection or partial_sort), against a stable sort.
  const double inf = std::numeric_limits<double>::infinity();
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(31);
    struct Case {
      const char* what;
      Tensor x;  // 2-D
      int64_t dim;
      std::vector<int64_t> ks;
    };
    std::vector<Case> cases;
    // GPT-2's vocabulary: distinct values, the selection ends within the key's bytes.
    cases.push_back({"float32 logits", randn({3, 50257}, kFloat32) * 3.0, 1, {1, 50, 2048}});
    // Seven values only: every k-th place a tie, broken by position.
    {
      const std::vector<double> pool = {-0.0, 0.0, inf, -inf, kNaN, 1.0, -1.0};
      const std::vector<int64_t> pick = randint(0, 7, {2 * 5000}).to_vector<int64_t>();
      std::vector<double> v;
      for (int64_t p : pick) v.push_back(pool[size_t(p)]);
      cases.push_back({"float64 of seven values", from_vector(v, {2, 5000}), 1, {1, 7, 2047, 2048}});
    }
    {
      std::vector<int64_t> z = randint(-1000, 1000, {2, 4100}).to_vector<int64_t>();
      z[17] = std::numeric_limits<int64_t>::min();
      z[4000] = z[4100] = std::numeric_limits<int64_t>::max();
      cases.push_back({"int64 with its extremes", from_vector(z, {2, 4100}), 1, {1, 100, 2048}});
    }
    // Lines along dim 0, inner stride 3.
    cases.push_back({"float32 of four values, dim 0", randint(0, 4, {3000, 3}).to(kFloat32), 0, {1, 999, 2048}});
    // Every value equal: the first k positions; 70000 positions take three bytes.
    cases.push_back({"float32 all equal, 70000", full({1, 70000}, 2.5, kFloat32), 1, {1, 2048}});
    cases.push_back({"float32 of two values, 70000", randint(0, 2, {1, 70000}).to(kFloat32), 1, {1, 1500, 2048}});
    for (const Case& cs : cases) {
      const Tensor rows = cs.dim == 1 ? cs.x : cs.x.t().contiguous();  // the lines as rows
      const Tensor xd = on(cs.x, dev);
      for (int64_t k : cs.ks)
        for (bool desc : {false, true}) {
          INFO(cs.what << ", k " << k << ", descending " << desc);
          ValuesIndices t = topk(xd, k, cs.dim, desc);
          Tensor ti = cs.dim == 1 ? t.indices : t.indices.t().contiguous();
          Tensor tv = cs.dim == 1 ? t.values : t.values.t().contiguous();
          const std::vector<int64_t> want = ref_topk_rows(rows, k, desc), got = ti.to_vector<int64_t>();
          REQUIRE(got.size() == want.size());
          int64_t wrong = 0, first = -1;
          for (size_t i = 0; i < got.size(); ++i)
            if (got[i] != want[i] && wrong++ == 0) first = int64_t(i);
          INFO(wrong << " positions differ, the first at " << first);
          CHECK(wrong == 0);
          // The values are the rows' own at those positions (the sign of a zero too).
          const std::vector<double> rv = rows.to_vector<double>(), tvv = tv.to_vector<double>();
          int64_t bad = 0;
          for (size_t i = 0; i < tvv.size(); ++i) {
            const double w = rv[size_t(int64_t(i) / k * rows.size(1) + got[i])];
            bad += !(std::isnan(w) ? std::isnan(tvv[i]) : tvv[i] == w && std::signbit(tvv[i]) == std::signbit(w));
          }
          CHECK(bad == 0);
        }
    }
  }
}

TEST_CASE("more elements or lines than one pass of a CUDA grid: gather, scatter_add, index_select, cumsum, sort") {
  // A CUDA grid holds at most 4224 blocks: 1,081,344 threads of 256, 540,672 of 128, or
  // 4224 lines of one block each; beyond that the kernels loop.
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(24);
    // gather: 1.2M elements, read directly.
    const int64_t R = 1200, C = 1000;
    Tensor x = randn({R, C}, kFloat32), idx = rand_index(C, {R, C});
    std::vector<float> xv = x.to_vector<float>(), got = gather(on(x, dev), 1, on(idx, dev)).to_vector<float>();
    std::vector<int64_t> iv = idx.to_vector<int64_t>();
    int64_t bad = 0;
    for (int64_t r = 0; r < R; ++r)
      for (int64_t c = 0; c < C; ++c) bad += got[size_t(r * C + c)] != xv[size_t(r * C + iv[size_t(r * C + c)])];
    CHECK(bad == 0);
    // index_select of 1200 rows of 1000: 1.2M elements.
    Tensor rows = rand_index(R, {R});
    std::vector<float> sel = index_select(on(x, dev), 0, on(rows, dev)).to_vector<float>();
    std::vector<int64_t> rv = rows.to_vector<int64_t>();
    bad = 0;
    for (int64_t r = 0; r < R; ++r)
      for (int64_t c = 0; c < C; ++c) bad += sel[size_t(r * C + c)] != xv[size_t(rv[size_t(r)] * C + c)];
    CHECK(bad == 0);
    // scatter_add and cumsum on 600,000 lines of two.
    const int64_t L = 600000;
    Tensor z = zeros({L, 2}, kFloat64), si = rand_index(2, {L, 2}), ss = randn({L, 2}, kFloat64);
    std::vector<double> sv = ss.to_vector<double>(), want(size_t(2 * L), 0.0);
    std::vector<int64_t> siv = si.to_vector<int64_t>();
    for (int64_t l = 0; l < L; ++l)
      for (int64_t j = 0; j < 2; ++j) want[size_t(2 * l + siv[size_t(2 * l + j)])] += sv[size_t(2 * l + j)];
    CHECK(scatter_add(on(z, dev), 1, on(si, dev), on(ss, dev)).to_vector<double>() == want);
    Tensor cs = on(ss.t().contiguous(), dev);  // (2, L): lines along dim 0, L of them
    std::vector<double> cv = cumsum(cs, 0).to_vector<double>();
    bad = 0;
    for (int64_t l = 0; l < L; ++l)
      bad += cv[size_t(l)] != sv[size_t(2 * l)] || cv[size_t(L + l)] != sv[size_t(2 * l)] + sv[size_t(2 * l + 1)];
    CHECK(bad == 0);
    // sort of 5000 lines of 8 (more lines than blocks), few distinct values.
    Tensor so = randint(0, 3, {5000, 8}).to(kFloat64);
    std::vector<double> vals, sidx;
    Shape os;
    ref_sort(so, 1, true, 8, &vals, &sidx, &os);
    ValuesIndices s = sort(on(so, dev), 1, true);
    check_equal(s.values, os, vals);
    check_equal(s.indices, os, sidx);
  }
}

TEST_CASE("cumsum, sort and topk of a 0-dim tensor: dims 0 and -1, errors that count its 0 dimensions") {
  Tensor s = scalar_tensor(2.0);
  CHECK(cumsum(s, 0).item<double>() == 2.0);
  CHECK(cumsum(s, -1).dim() == 0);
  CHECK_THROWS_MU(cumsum(s, 1), "cumsum: dimension 1 out of range for a tensor with 0 dimensions");
  CHECK(topk(s, 1).values.dim() == 0);
  CHECK(topk(s, 1).values.item<double>() == 2.0);
  // k = 0 of a 0-dim tensor: nothing, as an empty 1-D tensor.
  ValuesIndices none = topk(s, 0);
  CHECK(none.values.shape() == Shape{0});
  CHECK(none.indices.shape() == Shape{0});
  CHECK_THROWS_MU(topk(s, 2), "topk: k = 2 is out of range for dimension 0 of size 1");
  CHECK_THROWS_MU(sort(s, 2), "sort: dimension 2 out of range for a tensor with 0 dimensions");
}
