// Reductions against brute-force loops in double: every input element is dropped into
// the bucket of the output element it reduces into, and each bucket is reduced by hand.
// Every case runs on each test device: inputs are drawn on the CPU and moved, results
// are read back on the host (check_close_or_nan and the buckets go through to_vector).
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

#include "helpers.h"

using namespace mu;

namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();

// The elements of x grouped by output position (row-major over the kept dims); within
// a bucket, in row-major order of the reduced dims.
struct Buckets {
  Shape out_shape;
  std::vector<std::vector<double>> b;
};

Buckets bucketize(const Tensor& x, Shape dims, bool keepdim) {
  int64_t nd = x.dim();
  std::vector<bool> red(size_t(nd), dims.empty());
  for (int64_t d : dims) red[size_t(d < 0 ? d + nd : d)] = true;
  Buckets r;
  for (int64_t d = 0; d < nd; ++d) {
    if (!red[size_t(d)]) r.out_shape.push_back(x.shape()[size_t(d)]);
    else if (keepdim) r.out_shape.push_back(1);
  }
  int64_t outer = 1;
  for (int64_t d = 0; d < nd; ++d)
    if (!red[size_t(d)]) outer *= x.shape()[size_t(d)];
  r.b.resize(size_t(outer));
  std::vector<double> v = x.to_vector<double>();
  for (int64_t flat = 0; flat < int64_t(v.size()); ++flat) {
    // multi-index of flat, then the row-major position among the kept dims
    std::vector<int64_t> idx = unflat(x.shape(), flat);
    int64_t o = 0;
    for (int64_t d = 0; d < nd; ++d)
      if (!red[size_t(d)]) o = o * x.shape()[size_t(d)] + idx[size_t(d)];
    r.b[size_t(o)].push_back(v[size_t(flat)]);
  }
  return r;
}

using Reducer = std::function<double(const std::vector<double>&)>;

double ref_sum(const std::vector<double>& v) {
  double s = 0;
  for (double a : v) s += a;
  return s;
}
double ref_mean(const std::vector<double>& v) { return ref_sum(v) / double(v.size()); }
Reducer ref_var(int64_t corr) {
  return [corr](const std::vector<double>& v) {
    double m = ref_mean(v), s = 0;
    for (double a : v) s += (a - m) * (a - m);
    return s / double(int64_t(v.size()) - corr);
  };
}
Reducer ref_std(int64_t corr) {
  return [corr](const std::vector<double>& v) { return std::sqrt(ref_var(corr)(v)); };
}
// Position of the first NaN, else of the first max (min).
int64_t ref_arg(const std::vector<double>& v, bool take_max) {
  for (size_t i = 0; i < v.size(); ++i)
    if (std::isnan(v[i])) return int64_t(i);
  int64_t at = 0;
  for (size_t i = 1; i < v.size(); ++i)
    if (take_max ? v[i] > v[size_t(at)] : v[i] < v[size_t(at)]) at = int64_t(i);
  return at;
}
double ref_max(const std::vector<double>& v) { return v[size_t(ref_arg(v, true))]; }
double ref_min(const std::vector<double>& v) { return v[size_t(ref_arg(v, false))]; }

std::vector<double> reduce_ref(const Buckets& b, const Reducer& f) {
  std::vector<double> out;
  for (const auto& v : b.b) out.push_back(f(v));
  return out;
}

// The inputs every test sweeps: dense, transposed and strided views, in both float dtypes,
// drawn on the CPU and viewed on `dev`.
std::vector<std::pair<std::string, Tensor>> inputs(DType dt, Device dev) {
  manual_seed(42);
  Tensor base = on(randn({4, 6, 5}, dt), dev);
  return {{"dense", base},
          {"transposed", base.transpose(0, 2)},
          {"permuted", base.permute({1, 2, 0})},
          {"sliced", base.slice(1, 1, 6, 2)},
          {"expanded", on(randn({4, 1, 5}, dt), dev).expand({4, 3, 5})}};
}

const std::vector<Shape> kDimSets = {{0}, {1}, {2}, {-1}, {-3}, {0, 2}, {2, 0}, {1, 2}, {0, 1, 2}, {}};

}  // namespace

TEST_CASE("sum, mean, var, std, amax, amin match brute force over every dim set") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    for (DType dt : {kFloat64, kFloat32}) {
      double tol = dt == kFloat64 ? 1e-12 : 2e-5;
      for (auto& [name, x] : inputs(dt, dev)) {
        for (const Shape& dims : kDimSets) {
          for (bool keep : {false, true}) {
            INFO(name << " " << dtype_name(dt) << " dims " << shape_str(dims) << " keepdim " << keep);
            Buckets b = bucketize(x, dims, keep);
            check_close_or_nan(sum(x, dims, keep), b.out_shape, reduce_ref(b, ref_sum), tol);
            check_close_or_nan(mean(x, dims, keep), b.out_shape, reduce_ref(b, ref_mean), tol);
            check_close_or_nan(var(x, dims, 1, keep), b.out_shape, reduce_ref(b, ref_var(1)), tol * 10);
            check_close_or_nan(var(x, dims, 0, keep), b.out_shape, reduce_ref(b, ref_var(0)), tol * 10);
            check_close_or_nan(mu::std(x, dims, 1, keep), b.out_shape, reduce_ref(b, ref_std(1)), tol * 10);
            check_close_or_nan(mu::std(x, dims, 2, keep), b.out_shape, reduce_ref(b, ref_std(2)), tol * 10);
            check_close_or_nan(amax(x, dims, keep), b.out_shape, reduce_ref(b, ref_max), 0);
            check_close_or_nan(amin(x, dims, keep), b.out_shape, reduce_ref(b, ref_min), 0);
          }
        }
      }
    }
  }
}

TEST_CASE("16-bit floats sum in float32 and round once; their gradient is float32 ones rounded back") {
  manual_seed(12);
  const Tensor x0 = randn({7, 300});
  for (Device dev : test_devices()) {
    INFO(dev.str());
    for (DType t : {kBFloat16, kFloat16}) {
      INFO(dtype_name(t));
      Tensor x = on(x0.to(t), dev).requires_grad_();
      Tensor s = x.sum({1});
      CHECK(s.dtype() == t);
      // The reference: the rounded values summed in double, then rounded to t.
      std::vector<double> v = x0.to(t).to_vector<double>(), got = s.to_vector<double>();
      for (int64_t r = 0; r < 7; ++r) {
        double acc = 0;
        for (int64_t j = 0; j < 300; ++j) acc += v[size_t(r * 300 + j)];
        CHECK(got[size_t(r)] == tensor({acc}, kFloat64).to(t).item());
      }
      s.to(kFloat32).sum().backward();
      CHECK(x.grad().dtype() == t);
      CHECK(x.grad().to_vector<double>() == std::vector<double>(2100, 1.0));
    }
  }
}

// Column sums of bfloat16 (a bias gradient under autocast: (B, T, C) summed to (C)), which
// the CPU reads as they lie, widening a strip of rows at a time: more rows than one block
// of 256 and not a multiple of 4, more columns than one strip of 512, and the sum over
// the leading dim alone (one matrix of columns per kept row).
TEST_CASE("bfloat16 column sums: the rounded values summed in double, rounded once") {
  manual_seed(13);
  const int64_t B = 3, T = 301, C = 600;
  const Tensor x0 = randn({B, T, C});
  const std::vector<double> v = x0.to(kBFloat16).to_vector<double>();
  std::vector<double> cols(size_t(C), 0.0), lead(size_t(T * C), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < C; ++c) {
        const double e = v[size_t((b * T + t) * C + c)];
        cols[size_t(c)] += e;
        lead[size_t(t * C + c)] += e;
      }
  auto rounded = [](const std::vector<double>& r) {
    return from_vector(r, {int64_t(r.size())}, kFloat64).to(kBFloat16).to_vector<double>();
  };
  for (Device dev : test_devices()) {
    INFO(dev.str());
    const Tensor x = on(x0.to(kBFloat16), dev);
    const Tensor s01 = x.sum({0, 1}), s0 = x.sum({0});
    CHECK(s01.dtype() == kBFloat16);
    CHECK(s01.to_vector<double>() == rounded(cols));
    CHECK(s0.to_vector<double>() == rounded(lead));
  }
}

TEST_CASE("max/min/argmax/argmin along one dim match brute force") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    for (DType dt : {kFloat64, kFloat32}) {
      for (auto& [name, x] : inputs(dt, dev)) {
        for (int64_t d : {0, 1, 2, -1, -2}) {
          for (bool keep : {false, true}) {
            INFO(name << " " << dtype_name(dt) << " dim " << d << " keepdim " << keep);
            Buckets b = bucketize(x, {d}, keep);
            std::vector<double> imax, imin;
            for (const auto& v : b.b) {
              imax.push_back(double(ref_arg(v, true)));
              imin.push_back(double(ref_arg(v, false)));
            }
            ValuesIndices mx = mu::max(x, d, keep), mn = mu::min(x, d, keep);
            check_close_or_nan(mx.values, b.out_shape, reduce_ref(b, ref_max), 0);
            check_close_or_nan(mn.values, b.out_shape, reduce_ref(b, ref_min), 0);
            CHECK(mx.indices.dtype() == kInt64);
            check_close_or_nan(mx.indices, b.out_shape, imax, 0);
            check_close_or_nan(mn.indices, b.out_shape, imin, 0);
            check_close_or_nan(argmax(x, d, keep), b.out_shape, imax, 0);
            check_close_or_nan(argmin(x, d, keep), b.out_shape, imin, 0);
          }
        }
      }
    }
  }
}

// Rows long enough for the CPU's vector extremum (four vectors and more), each with what
// the lanes' order could get wrong: a NaN (first in the row, inside the vector part, in
// the remainder past the last whole vector), an extremum that is zero (-0.0 before +0.0:
// the first one's sign), the extremum twice (the first index), and plain random values.
// Values and indices against ref_arg's rule, signs of zeros included.
TEST_CASE("max/min/argmax/argmin over long contiguous rows: NaN, signed zeros, ties") {
  manual_seed(21);
  for (int64_t n : {63, 64, 65, 100, 257}) {
    std::vector<std::vector<double>> rows;
    for (int r = 0; r < 9; ++r) rows.push_back(randn({n}, kFloat64).to_vector<double>());
    rows[0][0] = kNaN;
    rows[1][37] = kNaN;
    rows[2][size_t(n - 1)] = kNaN;
    for (double& v : rows[3]) v = -std::fabs(v) - 1;  // max -0.0 (first), then +0.0
    rows[3][20] = -0.0, rows[3][50] = 0.0;
    for (double& v : rows[4]) v = std::fabs(v) + 1;  // min +0.0 (first), then -0.0
    rows[4][9] = 0.0, rows[4][61] = -0.0;
    rows[5][10] = rows[5][50] = 9.0;  // max twice
    rows[6][12] = rows[6][60] = -9.0;  // min twice
    rows[7][size_t(n - 1)] = 9.0;  // the max in the remainder (n = 65, 100) or last vector
    std::vector<double> flat;
    for (const auto& row : rows) flat.insert(flat.end(), row.begin(), row.end());
    for (Device dev : test_devices())
      for (DType dt : {kFloat32, kFloat64}) {
        INFO(dev.str() << " " << dtype_name(dt) << " rows of " << n);
        Tensor x = on(from_vector(flat, {int64_t(rows.size()), n}, kFloat64).to(dt), dev);
        for (bool take_max : {true, false}) {
          ValuesIndices got = take_max ? mu::max(x, 1) : mu::min(x, 1);
          std::vector<double> values = (take_max ? amax(x, {1}) : amin(x, {1})).to_vector<double>();
          std::vector<double> mv = got.values.to_vector<double>();
          std::vector<int64_t> at = (take_max ? argmax(x, 1) : argmin(x, 1)).to_vector<int64_t>();
          std::vector<int64_t> mi = got.indices.to_vector<int64_t>();
          for (size_t r = 0; r < rows.size(); ++r) {
            INFO("row " << r << (take_max ? " max" : " min"));
            const std::vector<double> row = x.cpu().to(kFloat64).select(0, int64_t(r)).to_vector<double>();
            const int64_t want_at = ref_arg(row, take_max);
            const double want = row[size_t(want_at)];
            CHECK(at[r] == want_at);
            CHECK(mi[r] == want_at);
            for (double v : {values[r], mv[r]}) {
              if (std::isnan(want)) {
                CHECK(std::isnan(v));
              } else {
                CHECK(v == want);
                CHECK(std::signbit(v) == std::signbit(want));
              }
            }
          }
        }
      }
  }
}

TEST_CASE("argmax/argmin of bfloat16 values: the index of the narrow values, first among ties") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    // Rows whose values are exact in bfloat16, with a tie for the maximum in row 1.
    Tensor x = from_vector(std::vector<float>{0.5f, -2.0f, 3.0f, 1.0f, 4.0f, 0.25f, 4.0f, -1.0f}, {2, 4})
                   .to(kBFloat16)
                   .to(dev);
    CHECK(argmax(x, 1).cpu().to_vector<int64_t>() == std::vector<int64_t>{2, 0});
    CHECK(argmin(x, 1).cpu().to_vector<int64_t>() == std::vector<int64_t>{1, 3});
    CHECK(argmax(x).cpu().item() == 4);
  }
}

// The storage dtypes are ordered as their exact widening: every extremum, index, sort and
// top-k of them is checked against a loop over the values read back as doubles; the
// narrow integers sum to int64.
TEST_CASE("orderings (and integer sums) of 16-bit floats and narrow integers match a brute-force loop; bool is refused") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(9);
    const Tensor base = mul(randn({3, 7}), full({}, 40.0));
    for (DType dt : {kBFloat16, DType::Float16, DType::Int32, DType::Int16, DType::Int8, DType::UInt8}) {
      INFO(dtype_name(dt));
      const Tensor x = (dt == DType::UInt8 ? abs(base) : base).to(dt).to(dev);
      const std::vector<double> v = x.cpu().to(kFloat64).to_vector<double>();  // row-major, 3 x 7
      std::vector<double> row_max(3, -1e300), row_min(3, 1e300);
      std::vector<int64_t> arg_max(3, 0), arg_min(3, 0);
      for (int64_t r = 0; r < 3; ++r)
        for (int64_t c = 0; c < 7; ++c) {
          const double e = v[size_t(r * 7 + c)];
          if (e > row_max[size_t(r)]) row_max[size_t(r)] = e, arg_max[size_t(r)] = c;  // first among ties
          if (e < row_min[size_t(r)]) row_min[size_t(r)] = e, arg_min[size_t(r)] = c;
        }
      const double all_max = *std::max_element(v.begin(), v.end()), all_min = *std::min_element(v.begin(), v.end());
      if (!is_floating(dt)) {  // integer sums are int64 and exact, as torch
        double total = 0;
        for (double e : v) total += e;
        CHECK(sum(x).dtype() == kInt64);
        CHECK(sum(x).cpu().item() == total);
      }
      CHECK(max(x).dtype() == dt);
      CHECK(max(x).cpu().item() == all_max);
      CHECK(min(x).cpu().item() == all_min);
      CHECK(amax(x, {1}).cpu().to(kFloat64).to_vector<double>() == row_max);
      CHECK(amin(x, {1}).cpu().to(kFloat64).to_vector<double>() == row_min);
      CHECK(argmax(x, 1).cpu().to_vector<int64_t>() == arg_max);
      CHECK(argmin(x, 1).cpu().to_vector<int64_t>() == arg_min);
      ValuesIndices m = x.max(1);
      CHECK(m.values.dtype() == dt);
      CHECK(m.values.cpu().to(kFloat64).to_vector<double>() == row_max);
      CHECK(m.indices.cpu().to_vector<int64_t>() == arg_max);
      // sort of row 0, and its top 3: the row's values in order.
      std::vector<double> row0(v.begin(), v.begin() + 7);
      std::sort(row0.begin(), row0.end(), std::greater<>());
      ValuesIndices sorted = sort(x.select(0, 0), 0, true);
      CHECK(sorted.values.dtype() == dt);
      CHECK(sorted.values.cpu().to(kFloat64).to_vector<double>() == row0);
      ValuesIndices top = topk(x.select(0, 0), 3);
      CHECK(top.values.cpu().to(kFloat64).to_vector<double>() == std::vector<double>(row0.begin(), row0.begin() + 3));
      for (int64_t i = 0; i < 3; ++i)  // each index points at its value
        CHECK(v[size_t(top.indices.cpu().to_vector<int64_t>()[size_t(i)])] == row0[size_t(i)]);
    }
    const Tensor b = on(from_vector(std::vector<int64_t>{0, 1, 1}, {3}).to(kBool), dev);
    CHECK_THROWS_MU(max(b), "max: expected a number dtype, got bool");
    CHECK_THROWS_MU(argmax(b, 0), "argmax: expected a number dtype, got bool");
    CHECK_THROWS_MU(topk(b, 1), "topk: expected a number dtype, got bool");
  }
}

// int64 sums that overflow wrap around as two's complement, as torch's do (C++'s signed
// overflow would be undefined): against the sum in uint64, whose arithmetic is modular.
TEST_CASE("int64 sums that overflow wrap around, in every reduction scheme") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    const int64_t big = std::numeric_limits<int64_t>::max() / 3 * 2;
    std::vector<int64_t> v;
    for (int i = 0; i < 70; ++i) v.push_back(i % 3 == 0 ? -big / 5 : big - i);  // partial sums overflow many times
    uint64_t total = 0;
    for (int64_t e : v) total += uint64_t(e);
    const Tensor x = on(from_vector(v, {70}), dev);
    CHECK(sum(x).cpu().to_vector<int64_t>()[0] == int64_t(total));
    // Strided (every other element of a (70, 2) view's column) and column sums (7 rows of 10).
    const Tensor strided = on(from_vector(v, {70}).reshape({70, 1}).expand({70, 2}).contiguous(), dev).select(1, 1);
    CHECK(sum(strided).cpu().to_vector<int64_t>()[0] == int64_t(total));
    std::vector<uint64_t> cols(10, 0);
    for (size_t i = 0; i < v.size(); ++i) cols[i % 10] += uint64_t(v[i]);
    std::vector<int64_t> want;
    for (uint64_t c : cols) want.push_back(int64_t(c));
    CHECK(sum(x.reshape({7, 10}), {0}).cpu().to_vector<int64_t>() == want);
  }
}

TEST_CASE("max()/min()/argmax() over all elements") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    for (auto& [name, x] : inputs(kFloat64, dev)) {
      INFO(name);
      std::vector<double> v = x.to_vector<double>();
      check_close_or_nan(mu::max(x), {}, {ref_max(v)}, 0);
      check_close_or_nan(mu::min(x), {}, {ref_min(v)}, 0);
      Tensor a = argmax(x);
      CHECK(a.dtype() == kInt64);
      check_close_or_nan(a, {}, {double(ref_arg(v, true))}, 0);
    }
    // A 0-dim tensor is its own max, at index 0.
    Tensor s = full({}, 2.5, TensorOptions(kFloat64).device(dev));
    CHECK(mu::max(s).item() == 2.5);
    CHECK(argmax(s).item() == 0);
    ValuesIndices m = mu::max(s, 0);
    CHECK(m.values.dim() == 0);
    CHECK(m.values.item() == 2.5);
    CHECK(m.indices.item() == 0);
  }
}

TEST_CASE("ties: indices take the first extremum; gradients follow torch") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    Tensor x = on(tensor({{1, 3, 3, 0}, {2, 2, -1, -1}}, kFloat64), dev);
    ValuesIndices mx = mu::max(x, 1), mn = mu::min(x, 1);
    CHECK(mx.indices.to_vector<int64_t>() == std::vector<int64_t>{1, 0});
    CHECK(mn.indices.to_vector<int64_t>() == std::vector<int64_t>{3, 2});
    CHECK(argmax(x, 1).to_vector<int64_t>() == std::vector<int64_t>{1, 0});
    CHECK(argmin(x, 0).to_vector<int64_t>() == std::vector<int64_t>{0, 1, 1, 1});
    CHECK(argmax(x).item() == 1);

    // max(dim) values: the gradient goes to the chosen (first) index only.
    Tensor xl = x.detach().requires_grad_();
    mu::max(xl, 1).values.sum().backward();
    CHECK(xl.grad().to_vector<double>() == std::vector<double>{0, 1, 0, 0, 1, 0, 0, 0});

    // amax: shared evenly among the ties.
    Tensor xa = x.detach().requires_grad_();
    amax(xa, {1}).sum().backward();
    CHECK(xa.grad().to_vector<double>() == std::vector<double>{0, 0.5, 0.5, 0, 0.5, 0.5, 0, 0});
    Tensor xb = x.detach().requires_grad_();
    amin(xb, {1}).sum().backward();
    CHECK(xb.grad().to_vector<double>() == std::vector<double>{0, 0, 0, 1, 0, 0, 0.5, 0.5});

    // max() over everything: the two 3s share the gradient.
    Tensor xc = x.detach().requires_grad_();
    (mu::max(xc) * 4.0).backward();
    CHECK(xc.grad().to_vector<double>() == std::vector<double>{0, 2, 2, 0, 0, 0, 0, 0});
  }
}

TEST_CASE("NaN is the max and the min, and its first position is the index") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    Tensor x = on(tensor({{1, kNaN, 3, kNaN}, {5, 4, 2, 1}}, kFloat32), dev);
    CHECK(std::isnan(amax(x, {1}).at({0})));
    CHECK(amax(x, {1}).at({1}) == 5);
    CHECK(std::isnan(amin(x, {1}).at({0})));
    CHECK(amin(x, {1}).at({1}) == 1);
    CHECK(std::isnan(mu::max(x).item()));
    CHECK(std::isnan(mu::min(x).item()));
    CHECK(argmax(x, 1).to_vector<int64_t>() == std::vector<int64_t>{1, 0});
    CHECK(argmin(x, 1).to_vector<int64_t>() == std::vector<int64_t>{1, 3});
    CHECK(argmax(x).item() == 1);
    ValuesIndices m = mu::min(x, 1);
    CHECK(std::isnan(m.values.at({0})));
    CHECK(m.indices.to_vector<int64_t>() == std::vector<int64_t>{1, 3});
    // Along dim 0 the NaN column wins wherever it appears, in either row.
    CHECK(argmax(x, 0).to_vector<int64_t>() == std::vector<int64_t>{1, 0, 0, 0});
    // The NaNs share amax's gradient when the result is NaN.
    Tensor xl = x.to(kFloat64).detach().requires_grad_();
    amax(xl, {1}).sum().backward();
    CHECK(xl.grad().to_vector<double>() == std::vector<double>{0, 0.5, 0, 0.5, 1, 0, 0, 0});
  }
}

TEST_CASE("integer tensors: sum, amax, argmax") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    Tensor x = on(tensor({{3, 7, 7}, {-2, 9, 0}}, kFloat64).to(kInt64), dev);
    CHECK(sum(x).item() == 24);
    CHECK(amax(x, {1}).dtype() == kInt64);
    CHECK(amax(x, {1}).to_vector<int64_t>() == std::vector<int64_t>{7, 9});
    CHECK(amin(x, {0}).to_vector<int64_t>() == std::vector<int64_t>{-2, 7, 0});
    CHECK(argmax(x, 1).to_vector<int64_t>() == std::vector<int64_t>{1, 1});
    CHECK(mu::max(x, 0).indices.to_vector<int64_t>() == std::vector<int64_t>{0, 1, 0});
  }
}

TEST_CASE("var/std with too few elements follow torch (divide by max(0, n - correction))") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    Tensor one = on(tensor({4.0}, kFloat64).reshape({1, 1}), dev);
    CHECK(std::isnan(var(one, {1}).item()));  // 0 / 0
    CHECK(var(one, {1}, 0).item() == 0);
    Tensor two = on(tensor({1.0, 3.0}, kFloat64), dev);
    CHECK(var(two).item() == doctest::Approx(2.0));
    CHECK(mu::std(two, {}, 0).item() == doctest::Approx(1.0));
    CHECK(std::isinf(var(two, {}, 2).item()));  // 2 / 0
  }
}

TEST_CASE("reduction errors name the op and the problem") {
  Tensor x = zeros({2, 3});
  CHECK_THROWS_MU(amax(x, {2}), "amax: dimension 2 out of range");
  CHECK_THROWS_MU(var(x, {0, 0}), "appears more than once");
  CHECK_THROWS_MU(var(x, {0}, -1), "var: correction must be non-negative");
  CHECK_THROWS_MU(var(x.to(kInt64)), "var: needs a floating-point tensor");
  CHECK_THROWS_MU(amax(zeros({2, 0}), {1}), "amax: cannot reduce over zero elements");
  CHECK_THROWS_MU(mu::max(zeros({0})), "max: cannot reduce over zero elements");
  CHECK_THROWS_MU(argmax(zeros({3, 0}), 1), "argmax: cannot reduce over zero elements");
  CHECK_THROWS_MU(mu::min(x, -3), "min: dimension -3 out of range");
  // Reducing the non-empty dim of an empty tensor gives an empty result, no error.
  CHECK(amax(zeros({0, 3}), {1}).shape() == Shape{0});
}

TEST_CASE("dense sums over the trailing dims and a dim before a kept one match brute force") {
  // The CPU sums each row's trailing reduced block first, then the rest (ops/cpu/reduce.cpp,
  // a bias gradient's (B, H, D) -> (H)): small and threaded sizes, 4 dims, keepdim.
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(6);
    for (DType dt : {kFloat64, kFloat32}) {
      const double tol = dt == kFloat64 ? 1e-12 : 1e-5;
      for (const auto& [shape, dims] : std::vector<std::pair<Shape, Shape>>{
               {{5, 7, 9}, {0, 2}}, {{128, 64, 40}, {0, 2}}, {{3, 4, 5, 6}, {0, 1, 3}}, {{3, 4, 5, 6}, {0, 2, 3}},
               {{3, 4, 5, 6}, {1, 3}}}) {
        for (bool keep : {false, true}) {
          INFO(shape_str(shape) << " dims " << shape_str(dims) << " keepdim " << keep << " " << dtype_name(dt));
          Tensor x = on(randn(shape, dt), dev);
          Buckets b = bucketize(x, dims, keep);
          check_close_or_nan(sum(x, dims, keep), b.out_shape, reduce_ref(b, ref_sum), tol);
          check_close_or_nan(mean(x, dims, keep), b.out_shape, reduce_ref(b, ref_mean), tol);
        }
      }
    }
  }
}

TEST_CASE("large inputs (split over threads) match brute force") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(3);
    Tensor x = on(randn({40, 300, 3}, kFloat32), dev);
    for (Tensor v : {x, x.transpose(0, 1)}) {
      for (const Shape& dims : std::vector<Shape>{{1}, {0, 2}, {}}) {
        INFO("shape " << shape_str(v.shape()) << " dims " << shape_str(dims));
        Buckets b = bucketize(v, dims, false);
        check_close_or_nan(sum(v, dims), b.out_shape, reduce_ref(b, ref_sum), 1e-5);
        check_close_or_nan(var(v, dims), b.out_shape, reduce_ref(b, ref_var(1)), 1e-4);
        check_close_or_nan(amax(v, dims), b.out_shape, reduce_ref(b, ref_max), 0);
      }
      Buckets b = bucketize(v, {1}, false);
      std::vector<double> imin;
      for (const auto& bv : b.b) imin.push_back(double(ref_arg(bv, false)));
      check_close_or_nan(argmin(v, 1), b.out_shape, imin, 0);
    }
  }
}

// The CPU's column sums (ops/cpu/reduce.cpp) cut the rows into blocks of 256 and the
// columns into strips of 512 and combine the blocks afterwards: 600 rows (three blocks,
// the last partial), 530 columns (two strips, not a multiple of the vector width), two
// matrices (a kept dim before the columns, as in a mean over the tokens of (B, T, C)),
// read densely, through a reduced middle dim and through a column slice; and a
// transposed view, whose reduced dim is the contiguous one (the run path's 16 partials).
TEST_CASE("column sums over row blocks and column strips match brute force") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(5);
    for (DType dt : {kFloat32, kFloat64}) {
      Tensor x = on(randn({2, 600, 530}, dt), dev);
      Tensor xt = on(randn({530, 600}, dt), dev).t();  // rows of stride 1, columns of stride 600
      for (auto [v, dims] : std::vector<std::pair<Tensor, Shape>>{{x, {1}}, {x, {0, 1}}, {x.reshape({1200, 530}), {0}},
                                                                   {x.slice(2, 3, 530), {1}}, {xt, {0}}}) {
        INFO(dtype_name(dt) << " shape " << shape_str(v.shape()) << " dims " << shape_str(dims));
        Buckets b = bucketize(v, dims, false);
        check_close_or_nan(sum(v, dims), b.out_shape, reduce_ref(b, ref_sum), dt == kFloat64 ? 1e-12 : 1e-5);
        check_close_or_nan(mean(v, dims), b.out_shape, reduce_ref(b, ref_mean), dt == kFloat64 ? 1e-12 : 1e-5);
      }
    }
  }
}

// Empty reduced dims under wide kept ones (the bias gradient of an empty batch): sums
// are zeros and means NaN (0 / 0, as torch).
TEST_CASE("sums over an empty dim of wide rows are zeros") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    for (DType dt : {kFloat32, kFloat64}) {
      for (auto [shape, dims] : std::vector<std::pair<Shape, Shape>>{
               {{0, 16}, {0}}, {{3, 0, 16}, {1}}, {{0, 5, 700}, {0, 1}}, {{2, 0, 9}, {0, 1}}}) {
        INFO(dtype_name(dt) << " shape " << shape_str(shape) << " dims " << shape_str(dims));
        Tensor x = on(randn(shape, dt), dev);
        Buckets b = bucketize(x, dims, false);
        check_close_or_nan(sum(x, dims), b.out_shape, reduce_ref(b, ref_sum), 0);
        check_close_or_nan(mean(x, dims), b.out_shape, reduce_ref(b, ref_mean), 0);
        // The gradient path that found it: a broadcast operand's gradient summed down.
        Tensor w = on(randn({shape.back()}, dt), dev).requires_grad_();
        (x * w).sum().backward();
        CHECK(max_abs_diff(w.grad().cpu(), zeros({shape.back()}, dt)) == 0);
      }
    }
  }
}

// Shapes that take each mapping of the CUDA reductions (ops/cuda/reduce.cu), checked
// against the brute-force buckets on every device: runs of 40 down the columns of 9000
// outputs (the column mapping), columns of 5000 for 40 outputs and runs of 20000 for 3
// outputs (each run cut into chunks whose partial results are combined in order), read
// directly and through a transposed view, and integer and bool sums of long runs.
TEST_CASE("column reductions, long runs cut into chunks, integer sums: every reduction scheme") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(11);
    Tensor col = on(randn({40, 9000}, kFloat32), dev);
    for (const Shape& dims : std::vector<Shape>{{0}, {}}) {
      INFO("columns, dims " << shape_str(dims));
      Buckets b = bucketize(col, dims, false);
      check_close_or_nan(sum(col, dims), b.out_shape, reduce_ref(b, ref_sum), 1e-5);
      check_close_or_nan(amax(col, dims), b.out_shape, reduce_ref(b, ref_max), 0);
      check_close_or_nan(amin(col, dims), b.out_shape, reduce_ref(b, ref_min), 0);
    }
    {
      Buckets b = bucketize(col, {0}, false);
      std::vector<double> imax;
      for (const auto& v : b.b) imax.push_back(double(ref_arg(v, true)));
      check_close_or_nan(argmax(col, 0), b.out_shape, imax, 0);
    }

    // Columns of 5000 (few outputs, so each column is cut into chunks): ties for the max
    // of column 0 and NaNs in column 1 placed in different chunks; the first must win.
    {
      std::vector<double> cv = randn({5000, 40}, kFloat64).to_vector<double>();
      cv[4000 * 40] = cv[2000 * 40] = 9;            // column 0
      cv[4500 * 40 + 1] = cv[100 * 40 + 1] = kNaN;  // column 1
      for (DType dt : {kFloat64, kFloat32}) {
        INFO("chunked columns " << dtype_name(dt));
        Tensor xc = on(from_vector(cv, {5000, 40}, dt), dev);
        Buckets b = bucketize(xc, {0}, false);
        std::vector<double> imax, imin;
        for (const auto& r : b.b) {
          imax.push_back(double(ref_arg(r, true)));
          imin.push_back(double(ref_arg(r, false)));
        }
        CHECK(imax[0] == 2000);
        CHECK(imax[1] == 100);
        check_close_or_nan(argmax(xc, 0), {40}, imax, 0);
        check_close_or_nan(argmin(xc, 0), {40}, imin, 0);
        check_close_or_nan(amax(xc, {0}), {40}, reduce_ref(b, ref_max), 0);
        check_close_or_nan(amin(xc, {0}), {40}, reduce_ref(b, ref_min), 0);
        check_close_or_nan(sum(xc, {0}), {40}, reduce_ref(b, ref_sum), dt == kFloat64 ? 1e-12 : 1e-5);
      }
    }

    // Long runs: ties and NaNs placed in different chunks (the first must win), and a
    // run of zeros starting with -0, whose max and min are that first -0.
    std::vector<double> v(size_t(3 * 20000));
    for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(double(i)) * 2;
    v[12000] = v[7000] = v[19999] = 5;         // ties for the max of row 0
    v[3000] = v[18000] = -5;                    // ties for the min of row 0
    v[20000 + 17000] = v[20000 + 8000] = kNaN;  // row 1: its first NaN is the answer
    for (size_t i = 40000; i < 60000; ++i) v[i] = 0;
    v[40000] = -0.0;
    for (DType dt : {kFloat64, kFloat32}) {
      Tensor base = on(from_vector(v, {3, 20000}, dt), dev);
      Tensor tr = on(from_vector(v, {3, 20000}, dt).t().contiguous(), dev).t();  // the same values, strided runs
      for (Tensor x : {base, tr}) {
        INFO(dtype_name(dt) << (x.is_contiguous() ? " dense" : " strided"));
        Buckets b = bucketize(x, {1}, false);
        std::vector<double> imax, imin;
        for (const auto& r : b.b) {
          imax.push_back(double(ref_arg(r, true)));
          imin.push_back(double(ref_arg(r, false)));
        }
        CHECK(imax == std::vector<double>{7000, 8000, 0});
        CHECK(imin == std::vector<double>{3000, 8000, 0});
        check_close_or_nan(argmax(x, 1), {3}, imax, 0);
        check_close_or_nan(argmin(x, 1), {3}, imin, 0);
        check_close_or_nan(amax(x, {1}), {3}, reduce_ref(b, ref_max), 0);
        check_close_or_nan(amin(x, {1}), {3}, reduce_ref(b, ref_min), 0);
        CHECK(std::signbit(amax(x, {1}).at({2})));
        CHECK(std::signbit(amin(x, {1}).at({2})));
        check_close_or_nan(sum(x, {1}), {3}, reduce_ref(b, ref_sum), dt == kFloat64 ? 1e-12 : 1e-5);
      }
    }

    // int64 and bool (a count, int64) sums of long runs are exact; int64 extrema too.
    std::vector<int64_t> iv(size_t(2 * 30000));
    for (size_t i = 0; i < iv.size(); ++i) iv[i] = int64_t(i % 7) - 3 + (i == 45000 ? 1000 : 0);
    Tensor xi = on(from_vector(iv, {2, 30000}), dev);
    int64_t s0 = 0, s1 = 0, p0 = 0, p1 = 0;
    for (size_t i = 0; i < 30000; ++i) {
      s0 += iv[i];
      s1 += iv[30000 + i];
      p0 += iv[i] > 0;
      p1 += iv[30000 + i] > 0;
    }
    CHECK(sum(xi, {1}).to_vector<int64_t>() == std::vector<int64_t>{s0, s1});
    CHECK(sum(xi).item() == double(s0 + s1));
    Tensor pos = xi > 0.0;
    REQUIRE(pos.dtype() == kBool);
    Tensor cnt = sum(pos, {1});
    CHECK(cnt.dtype() == kInt64);
    CHECK(cnt.to_vector<int64_t>() == std::vector<int64_t>{p0, p1});
    // The first max and min of each row, by a scan.
    std::vector<int64_t> hi(2, 0), lo(2, 0), hv(2), lv(2);
    for (size_t r = 0; r < 2; ++r) {
      for (int64_t i = 1; i < 30000; ++i) {
        if (iv[r * 30000 + size_t(i)] > iv[r * 30000 + size_t(hi[r])]) hi[r] = i;
        if (iv[r * 30000 + size_t(i)] < iv[r * 30000 + size_t(lo[r])]) lo[r] = i;
      }
      hv[r] = iv[r * 30000 + size_t(hi[r])];
      lv[r] = iv[r * 30000 + size_t(lo[r])];
    }
    CHECK(hi[1] == 15000);  // the one large value
    CHECK(amax(xi, {1}).to_vector<int64_t>() == hv);
    CHECK(amin(xi, {1}).to_vector<int64_t>() == lv);
    CHECK(argmax(xi, 1).to_vector<int64_t>() == hi);
    CHECK(argmin(xi, 1).to_vector<int64_t>() == lo);
  }
}
