// Elementwise ops against the C++ standard library, element by element, in double, on
// every test device (inputs made on the CPU and moved; results read back on the host).
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>

#include "helpers.h"

using namespace mu;

// Checks y == f(x) elementwise for a float64 input of awkward values (on any device).
static void check_unary(const std::function<Tensor(const Tensor&)>& op, const std::function<double(double)>& ref,
                        const Tensor& x) {
  Tensor y = op(x).to(Device::cpu());
  REQUIRE(y.shape() == x.shape());
  std::vector<double> xv = x.to_vector<double>(), yv = y.to_vector<double>();
  for (size_t i = 0; i < xv.size(); ++i) CHECK(yv[i] == doctest::Approx(ref(xv[i])).epsilon(1e-12));
}

TEST_CASE("unary ops match the standard library") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    Tensor x = on(tensor({-3.0, -1.5, -0.2, 0.0, 0.3, 1.0, 2.5}, kFloat64), dev);
    Tensor pos = on(tensor({0.1, 0.5, 1.0, 2.0, 9.0}, kFloat64), dev);
    check_unary([](const Tensor& t) { return neg(t); }, [](double v) { return -v; }, x);
    check_unary([](const Tensor& t) { return exp(t); }, [](double v) { return std::exp(v); }, x);
    check_unary([](const Tensor& t) { return log(t); }, [](double v) { return std::log(v); }, pos);
    check_unary([](const Tensor& t) { return sqrt(t); }, [](double v) { return std::sqrt(v); }, pos);
    check_unary([](const Tensor& t) { return rsqrt(t); }, [](double v) { return 1 / std::sqrt(v); }, pos);
    check_unary([](const Tensor& t) { return abs(t); }, [](double v) { return std::fabs(v); }, x);
    check_unary([](const Tensor& t) { return tanh(t); }, [](double v) { return std::tanh(v); }, x);
    check_unary([](const Tensor& t) { return sigmoid(t); }, [](double v) { return 1 / (1 + std::exp(-v)); }, x);
    check_unary([](const Tensor& t) { return relu(t); }, [](double v) { return v > 0 ? v : 0; }, x);
    check_unary([](const Tensor& t) { return gelu(t); },
                [](double v) { return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0))); }, x);
    check_unary([](const Tensor& t) { return gelu(t, "tanh"); },
                [](double v) { return 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v))); }, x);
    check_unary([](const Tensor& t) { return pow(t, 3.0); }, [](double v) { return v * v * v; }, x);
    check_unary([](const Tensor& t) { return pow(t, 0.5); }, [](double v) { return std::sqrt(v); }, pos);
    check_unary([](const Tensor& t) { return square(t); }, [](double v) { return v * v; }, x);
    check_unary([](const Tensor& t) { return clamp(t, -1.0, 1.0); }, [](double v) { return std::clamp(v, -1.0, 1.0); }, x);
    check_unary([](const Tensor& t) { return clamp_min(t, 0.0); }, [](double v) { return std::max(v, 0.0); }, x);
    check_unary([](const Tensor& t) { return clamp_max(t, 0.0); }, [](double v) { return std::min(v, 0.0); }, x);
    check_unary([](const Tensor& t) { return sign(t); }, [](double v) { return double((v > 0) - (v < 0)); }, x);
  }
}

TEST_CASE("unary ops on float32 agree with float64 to float precision, and with non-contiguous input") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(3);
    Tensor x = on(randn({37, 41}, kFloat64), dev);
    Tensor xt = x.t();  // non-contiguous
    Tensor y32 = tanh(xt.to(kFloat32)).cpu(), y64 = tanh(xt).cpu();
    CHECK(max_abs_diff(y32, y64) < 1e-6);
    Tensor g = gelu(xt.to(kFloat32)).to(kFloat64).cpu();
    CHECK(max_abs_diff(g, gelu(xt).cpu()) < 1e-6);
  }
}

// float32 GELU (the CPU's runs a vectorisable erf, ops/cpu/vec_exp.h) and its derivative
// against float64 over a dense grid: within a few float32 ulp of the value, or, where
// 1 + erf(x/√2) cancels (x below about -3, on any implementation), of |x| ulp(1).
namespace {

// Worst errors, in those units, of gelu(x, approximate) and of its gradient on `dev`,
// against the float64 formulas want(x) and dwant(x).
std::pair<double, double> gelu_ulp_errors(Device dev, const std::string& approximate,
                                          const std::function<double(double)>& want,
                                          const std::function<double(double)>& dwant) {
  Tensor x32 = arange(-10.0, 10.0, 1.0 / 4096, kFloat64).to(kFloat32);  // the float32 grid
  std::vector<double> xv = x32.to_vector<double>();
  std::vector<double> got = gelu(on(x32, dev), approximate).to_vector<double>();
  Tensor xg = on(x32, dev).requires_grad_();
  gelu(xg, approximate).sum().backward();
  std::vector<double> dgot = xg.grad().to_vector<double>();
  double worst = 0, dworst = 0;
  for (size_t i = 0; i < xv.size(); ++i) {
    const double x = xv[i], w = want(x), dw = dwant(x);
    worst = std::max(worst, std::fabs(got[i] - w) / (std::fabs(w) * 0x1p-23 + std::fabs(x) * 0x1p-24));
    dworst = std::max(dworst, std::fabs(dgot[i] - dw) / (std::fabs(dw) * 0x1p-23 + (1 + std::fabs(x)) * 0x1p-24));
  }
  return {worst, dworst};
}

}  // namespace

TEST_CASE("float32 gelu (exact and tanh) and its gradient are accurate to a few ulp over [-10, 10]") {
  auto cdf = [](double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); };
  // approximate = "tanh": 0.5 x (1 + tanh(k (x + c x³))), k = sqrt(2/pi), c = 0.044715.
  const double k = std::sqrt(2 / M_PI), c = 0.044715;
  auto th = [=](double x) { return std::tanh(k * (x + c * x * x * x)); };
  for (Device dev : test_devices()) {
    INFO(dev.str());
    auto [worst, dworst] = gelu_ulp_errors(
        dev, "none", [&](double x) { return x * cdf(x); },
        [&](double x) { return cdf(x) + x * std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI); });
    MESSAGE(dev.str() << ": gelu within " << worst << " ulp, its gradient " << dworst);
    CHECK(worst <= 8);
    CHECK(dworst <= 8);
    if (dev.is_cpu()) {  // the CPU's own formulas (ops/cpu/map.cpp): 1.6 and 1.4 ulp measured
      CHECK(worst <= 2.5);
      CHECK(dworst <= 2.5);
    }
    auto [tworst, tdworst] = gelu_ulp_errors(
        dev, "tanh", [&](double x) { return 0.5 * x * (1 + th(x)); },
        [&](double x) { return 0.5 * (1 + th(x)) + 0.5 * x * (1 - th(x) * th(x)) * k * (1 + 3 * c * x * x); });
    MESSAGE(dev.str() << ": gelu (tanh) within " << tworst << " ulp, its gradient " << tdworst);
    CHECK(tworst <= 8);
    CHECK(tdworst <= 8);
  }
}

// float32 tanh and sigmoid against long double over [-20, 20] (a 1/256 grid), small
// arguments and sigmoid's left tail down through the subnormals (to -104, where it rounds
// to zero), then the special values. Errors in float32 ulp of the reference where that is
// a normal float; below the normals, within 2^-149 on the CPU (its exp keeps the
// subnormals) and 2^-126 on other devices (a flush to zero).
TEST_CASE("float32 tanh and sigmoid are accurate to a few ulp, in their tails and at the special values") {
  std::vector<double> xs;
  for (int i = -20 * 256; i <= 20 * 256; ++i) xs.push_back(i / 256.0);
  for (double v : {1e-30, 1e-10, 1e-5, 3e-3, 0.5493, 0.55, 0.5507})
    xs.push_back(v), xs.push_back(-v);
  for (double v = -80; v >= -104; v -= 0.125) xs.push_back(v);
  const Tensor x32 = from_vector<double>(xs, {int64_t(xs.size())}).to(kFloat32);
  const std::vector<double> xv = x32.to_vector<double>();
  auto ulp_error = [](double got, long double want, bool cpu) {
    const float w = float(want);
    if (std::fabs(w) < 0x1p-126f) return std::fabs(double(got - double(want))) <= (cpu ? 0x1p-149 : 0x1p-126) ? 0.0 : 1e9;
    const double ulp = double(std::nextafter(std::fabs(w), INFINITY) - std::fabs(w));
    return double(std::fabs((long double)got - want)) / ulp;
  };
  for (Device dev : test_devices()) {
    INFO(dev.str());
    const std::vector<double> t = tanh(on(x32, dev)).to_vector<double>(), sg = sigmoid(on(x32, dev)).to_vector<double>();
    double tworst = 0, sworst = 0;
    for (size_t i = 0; i < xv.size(); ++i) {
      INFO("x = " << xv[i]);
      const long double x = xv[i];
      const long double want_s = x >= 0 ? 1 / (1 + std::exp(-x)) : std::exp(x) / (1 + std::exp(x));
      tworst = std::max(tworst, ulp_error(t[i], std::tanh(x), dev.is_cpu()));
      sworst = std::max(sworst, ulp_error(sg[i], want_s, dev.is_cpu()));
      CHECK(std::signbit(t[i]) == std::signbit(xv[i]));
    }
    MESSAGE(dev.str() << ": tanh within " << tworst << " ulp, sigmoid " << sworst);
    CHECK(tworst <= 4);
    CHECK(sworst <= 4);
    if (dev.is_cpu()) {  // ops/cpu/map.cpp's lanes: 1.43 and 2.40 ulp over every 97th float32
      CHECK(tworst <= 1.5);
      CHECK(sworst <= 2.5);
    }
    const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
    const Tensor special = on(from_vector<double>({0.0, -0.0, inf, -inf, nan}, {5}).to(kFloat32), dev);
    const std::vector<double> ts = tanh(special).to_vector<double>(), ss = sigmoid(special).to_vector<double>();
    CHECK(ts[0] == 0.0);
    CHECK_FALSE(std::signbit(ts[0]));
    CHECK(ts[1] == 0.0);
    CHECK(std::signbit(ts[1]));
    CHECK(ts[2] == 1.0);
    CHECK(ts[3] == -1.0);
    CHECK(std::isnan(ts[4]));
    CHECK(ss[0] == 0.5);
    CHECK(ss[1] == 0.5);
    CHECK(ss[2] == 1.0);
    CHECK(ss[3] == 0.0);
    CHECK(std::isnan(ss[4]));
  }
}

// float32 log against long double over 2^-149 to 2^128 (a geometric grid: subnormals,
// both sides of 1 and of √½, where the reduction switches exponent, up to the largest
// float), then its special values.
TEST_CASE("float32 log is accurate to an ulp or so, through the subnormals, and at the special values") {
  std::vector<double> xs;
  for (int i = -149 * 64; i < 128 * 64; ++i) xs.push_back(std::exp2(i / 64.0));
  for (double v : {0.70710677, 0.70710683, 1.0 - 0x1p-24, 1.0 + 0x1p-23, 1.4142135, 1.4142137, 3.4028235e38})
    xs.push_back(v);
  const Tensor x32 = from_vector<double>(xs, {int64_t(xs.size())}).to(kFloat32);
  const std::vector<double> xv = x32.to_vector<double>();
  for (Device dev : test_devices()) {
    INFO(dev.str());
    const std::vector<double> y = log(on(x32, dev)).to_vector<double>();
    double worst = 0;
    for (size_t i = 0; i < xv.size(); ++i) {
      INFO("x = " << xv[i]);
      const long double want = std::log((long double)xv[i]);
      const float w = float(want);
      if (w == 0) {
        CHECK(y[i] == 0.0);  // log 1
        continue;
      }
      const double ulp = double(std::nextafter(std::fabs(w), INFINITY) - std::fabs(w));
      worst = std::max(worst, double(std::fabs((long double)y[i] - want)) / ulp);
    }
    MESSAGE(dev.str() << ": log within " << worst << " ulp");
    CHECK(worst <= 4);
    if (dev.is_cpu()) CHECK(worst <= 1);  // ops/cpu/map.cpp's lanes: 0.89 ulp over every 97th float32
    const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
    const std::vector<double> sv =
        log(on(from_vector<double>({0.0, -0.0, inf, -1.0, -inf, nan}, {6}).to(kFloat32), dev)).to_vector<double>();
    CHECK(sv[0] == -inf);
    CHECK(sv[1] == -inf);
    CHECK(sv[2] == inf);
    CHECK(std::isnan(sv[3]));
    CHECK(std::isnan(sv[4]));
    CHECK(std::isnan(sv[5]));
  }
}

// float32 GELU and its gradient where the tails run out: beyond ±10 up to ±20 (past
// -13.2, below which x Φ(x) is no longer a normal float, and past the |x| cap of 16)
// against float64, and at the special values. Below the normals a result must be a zero
// or a subnormal of the right sign, never a stray normal number.
TEST_CASE("float32 gelu and its gradient in the far tails and at the special values") {
  auto cdf = [](double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); };
  auto dgelu = [&](double x) { return cdf(x) + x * std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI); };
  const double kNormal = 0x1p-126;
  for (Device dev : test_devices()) {
    INFO(dev.str());
    std::vector<double> xs;
    for (double v = 10; v <= 20; v += 1.0 / 64) xs.push_back(v), xs.push_back(-v);
    for (double v : {1e30, -1e30, 3e38, -3e38}) xs.push_back(v);
    Tensor x32 = from_vector<double>(xs, {int64_t(xs.size())}).to(kFloat32);
    std::vector<double> xv = x32.to_vector<double>();
    Tensor xg = on(x32, dev).requires_grad_();
    Tensor y = gelu(xg);
    y.backward(ones_like(y));
    std::vector<double> got = y.to_vector<double>(), dgot = xg.grad().to_vector<double>();
    int64_t wrong = 0;
    for (size_t i = 0; i < xv.size(); ++i) {
      const double x = xv[i], w = x * cdf(x), dw = dgelu(x);
      // Normal results within 8 float32 ulp of float64's; others zero or subnormal, their sign that of the truth.
      auto ok = [&](double g, double want) {
        if (std::abs(want) >= kNormal) return std::abs(g - want) <= 8 * 0x1p-24 * std::abs(want);
        return std::abs(g) < kNormal && !(g * want < 0);
      };
      const bool bad = !ok(got[i], w) || !ok(dgot[i], dw);
      if (bad) MESSAGE("x = " << x << ": gelu " << got[i] << " (want " << w << "), gradient " << dgot[i] << " (want " << dw << ")");
      wrong += bad;
    }
    CHECK(wrong == 0);
    // NaN stays NaN, +inf stays +inf (gradient NaN: inf times a zero density, as float64's
    // formula gives), -inf gives NaN (-inf times Φ(-inf) = 0, as torch's).
    Tensor sp = on(from_vector<float>({NAN, INFINITY, -INFINITY}, {3}), dev).requires_grad_();
    Tensor ysp = gelu(sp);
    ysp.backward(ones_like(ysp));
    std::vector<float> g = ysp.to_vector<float>(), dg = sp.grad().to_vector<float>();
    CHECK(std::isnan(g[0]));
    CHECK(g[1] == INFINITY);
    CHECK(std::isnan(g[2]));
    CHECK(std::isnan(dg[0]));
    CHECK(std::isnan(dg[1]));
  }
}

// The CPU's float32 GELU runs whole vectors over dense runs and one lane of the same code
// for strided elements and a run's last partial vector: an element's result must not
// depend on where it sits (threads split runs at different places).

TEST_CASE("float32 gelu and its gradient give the same bits dense, strided and at any offset") {
  Tensor x = randn({37, 29}) * 3.0;
  std::vector<float> dense = gelu(x).to_vector<float>();
  // A transposed view walks strided runs (or tiles); transposing back compares element by element.
  std::vector<float> strided = gelu(x.t()).t().contiguous().to_vector<float>();
  CHECK(std::memcmp(dense.data(), strided.data(), dense.size() * sizeof(float)) == 0);
  Tensor flat = x.reshape({-1});
  std::vector<float> whole = gelu(flat).to_vector<float>();
  bool same_offsets = true;
  for (int64_t off : {1, 3, 5, 7, 11}) {
    std::vector<float> part = gelu(flat.slice(0, off, flat.size(0))).to_vector<float>();
    same_offsets = same_offsets && std::memcmp(part.data(), whole.data() + off, part.size() * sizeof(float)) == 0;
  }
  CHECK(same_offsets);
  // The gradient of a dense input and of a transposed one (which the backward's map walks
  // another way) give the same bits, here (one partial vector) and on a tensor large
  // enough for the threads to share it, on 1 and on 4 threads, which cut the runs
  // elsewhere (a run's last partial vector once took other instructions than its whole
  // ones: an ulp apart at the cut points).
  for (const Shape& shape : {Shape{37, 29}, Shape{300, 257}}) {
    INFO(shape_str(shape));
    Tensor xv = randn(shape) * 3.0, gv = randn(shape);
    std::vector<std::vector<float>> grads;
    for (int threads : {1, 4}) {
      const int saved = omp_get_max_threads();
      omp_set_num_threads(threads);
      Tensor xg = xv.clone().requires_grad_(), xs = xv.t().contiguous().requires_grad_();
      gelu(xg).backward(gv);
      gelu(xs.t()).backward(gv);
      omp_set_num_threads(saved);
      grads.push_back(xg.grad().to_vector<float>());
      grads.push_back(xs.grad().t().contiguous().to_vector<float>());
    }
    for (size_t k = 1; k < grads.size(); ++k)
      CHECK(std::memcmp(grads[0].data(), grads[k].data(), grads[0].size() * sizeof(float)) == 0);
  }
}

// float32 exp over the whole float range against float64: within 3 ulp where the result is
// normal (the CPU runs a vector exp, ops/cpu/vec_exp.h, squared from x/2 beyond its
// range), within 2 units of the smallest subnormal where it is subnormal, +inf past
// overflow, 0 at -inf, NaN for NaN; the same bits dense and strided.
TEST_CASE("float32 exp is accurate over the whole range, overflows to inf and keeps subnormals") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    Tensor x32 = arange(-104.0, 89.0, 1.0 / 512, kFloat64).to(kFloat32);
    std::vector<double> xv = x32.to_vector<double>();
    std::vector<double> got = exp(on(x32, dev)).to_vector<double>();
    double worst_ulp = 0, worst_sub = 0;
    bool overflow_ok = true;
    for (size_t i = 0; i < xv.size(); ++i) {
      const double want = std::exp(xv[i]);
      if (want > double(std::numeric_limits<float>::max())) {
        overflow_ok = overflow_ok && std::isinf(got[i]) && got[i] > 0;
      } else if (want >= double(std::numeric_limits<float>::min())) {
        worst_ulp = std::max(worst_ulp, std::fabs(got[i] - want) / (want * 0x1p-23));
      } else {
        worst_sub = std::max(worst_sub, std::fabs(got[i] - want) / 0x1p-149);
      }
    }
    MESSAGE(dev.str() << ": exp within " << worst_ulp << " ulp (normal), " << worst_sub << " x 2^-149 (subnormal)");
    CHECK(worst_ulp <= 3);
    CHECK(worst_sub <= 2);
    CHECK(overflow_ok);
    const float inf = std::numeric_limits<float>::infinity();
    std::vector<float> special = exp(on(from_vector<float>({-inf, inf, NAN, 0.0f, -0.0f}, {5}), dev)).to_vector<float>();
    CHECK(special[0] == 0.0f);
    CHECK((std::isinf(special[1]) && special[1] > 0));
    CHECK(std::isnan(special[2]));
    CHECK(special[3] == 1.0f);
    CHECK(special[4] == 1.0f);
  }
  Tensor x = randn({37, 29}) * 20.0;
  std::vector<float> dense = exp(x).to_vector<float>(), strided = exp(x.t()).t().contiguous().to_vector<float>();
  CHECK(std::memcmp(dense.data(), strided.data(), dense.size() * sizeof(float)) == 0);
}

// Below about x = -5.5, x/2 (1 + erf(x/√2)) cancels to nothing in float32 on any
// implementation of erf; the CPU computes Φ(x) as erfc(|x|/√2)/2 there, so GELU keeps its
// relative accuracy in the lower tail (CPU only: the CUDA kernel uses torch's formula).
TEST_CASE("float32 gelu on the CPU keeps its relative accuracy in the lower tail") {
  Tensor x32 = arange(-13.0, -3.0, 1.0 / 64, kFloat64).to(kFloat32);
  std::vector<double> xv = x32.to_vector<double>(), got = gelu(x32).to_vector<double>();
  double worst = 0;
  for (size_t i = 0; i < xv.size(); ++i) {
    const double x = xv[i], want = x * 0.5 * std::erfc(-x / std::sqrt(2.0));
    worst = std::max(worst, std::fabs(got[i] - want) / std::fabs(want));
  }
  MESSAGE("gelu relative error over [-13, -3]: " << worst);
  CHECK(worst < 1e-6);
  // Its gradient Φ(x) + x φ(x) too (the two terms, of opposite signs, within a factor of
  // 1.1 of each other at x = -3 and closer below: a few float32 roundings of each).
  Tensor xg = x32.clone().requires_grad_();
  gelu(xg).sum().backward();
  const std::vector<double> dgot = xg.grad().to_vector<double>();
  double dworst = 0;
  for (size_t i = 0; i < xv.size(); ++i) {
    const double x = xv[i];
    const double want = 0.5 * std::erfc(-x / std::sqrt(2.0)) + x * std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI);
    dworst = std::max(dworst, std::fabs(dgot[i] - want) / std::fabs(want));
  }
  MESSAGE("gelu gradient relative error over [-13, -3]: " << dworst);
  CHECK(dworst < 1e-5);
}

TEST_CASE("binary ops broadcast like PyTorch") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    // Made on the CPU, used on dev; results read back with to_vector / at (host copies).
    auto d = [dev](const Tensor& t) { return on(t, dev); };
    Tensor a = d(arange(0, 6, 1, kFloat64).reshape({2, 3}));
    Tensor b = d(tensor({10.0, 20.0, 30.0}, kFloat64));
    Tensor col = d(tensor({1.0, 2.0}, kFloat64).reshape({2, 1}));
    Tensor s = add(a, b);
    CHECK(s.shape() == Shape{2, 3});
    CHECK(s.to_vector<double>() == std::vector<double>{10, 21, 32, 13, 24, 35});
    CHECK((a * col).to_vector<double>() == std::vector<double>{0, 1, 2, 6, 8, 10});
    CHECK((col - b).shape() == Shape{2, 3});
    CHECK((col - b).to_vector<double>() == std::vector<double>{-9, -19, -29, -8, -18, -28});
    CHECK((b / 10.0).to_vector<double>() == std::vector<double>{1, 2, 3});
    CHECK((1.0 - b).to_vector<double>() == std::vector<double>{-9, -19, -29});
    CHECK((60.0 / b).to_vector<double>() == std::vector<double>{6, 3, 2});
    // (4,1,3) with (2,1) -> (4,2,3)
    Tensor c = add(ones({4, 1, 3}, TensorOptions(kFloat64).device(dev)), col);
    CHECK(c.shape() == Shape{4, 2, 3});
    CHECK(c.at({3, 1, 2}) == 3.0);
    // a transposed operand
    Tensor m = d(arange(0, 4, 1, kFloat64).reshape({2, 2}));
    CHECK((m + m.t()).to_vector<double>() == std::vector<double>{0, 3, 3, 6});
    CHECK(pow(d(tensor({2.0, 3.0}, kFloat64)), d(tensor({3.0, 2.0}, kFloat64))).to_vector<double>() ==
          std::vector<double>{8, 9});
    CHECK((d(arange(5)) * 2.0).to_vector<int64_t>() == std::vector<int64_t>{0, 2, 4, 6, 8});
  }
}

TEST_CASE("large tensors take the threaded path and give the same answer") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(5);
    Tensor a = randn({300, 400}, kFloat64), b = randn({400}, kFloat64);
    Tensor y = (on(a, dev) * on(b, dev)).cpu();
    std::vector<double> av = a.to_vector<double>(), bv = b.to_vector<double>(), yv = y.to_vector<double>();
    for (size_t i = 0; i < av.size(); i += 997) CHECK(yv[i] == av[i] * bv[i % 400]);
    Tensor yt = (on(a, dev).t() * 2.0).cpu();  // strided large input
    CHECK(yt.at({399, 299}) == 2 * a.at({299, 399}));
    // A broadcast scalar on either side of a non-commutative op; and square's gradient
    // under a sum, whose g reaches it as a broadcast scalar on the left.
    std::vector<double> lv = (full({}, 1.5, TensorOptions(kFloat64).device(dev)) - on(a, dev)).cpu().to_vector<double>();
    std::vector<double> rv = (on(a, dev) / full({}, 4.0, TensorOptions(kFloat64).device(dev))).cpu().to_vector<double>();
    Tensor ag = on(a, dev).requires_grad_();
    square(ag).sum().backward();
    std::vector<double> gv = ag.grad().cpu().to_vector<double>();
    bool left = true, right = true, grad = true;
    for (size_t i = 0; i < av.size(); ++i) {
      left = left && lv[i] == 1.5 - av[i];
      right = right && rv[i] == av[i] / 4.0;
      grad = grad && gv[i] == 2 * av[i];
    }
    CHECK(left);
    CHECK(right);
    CHECK(grad);
  }
}

TEST_CASE("transposed operands: copies and binary ops element by element, tiles partial and threaded") {
  // The CPU walks a transposed operand in 16 x 16 tiles (ops/cpu/loops.h) and gives a
  // binary op a dense copy of it first (ops/cpu/map.h): every element must still land
  // where a plain index loop puts it, for shapes that are not whole tiles, with a batch
  // dim, past the size where the work is split over threads, and with a broadcast operand.
  for (Device dev : test_devices())
    for (const Shape& s : std::vector<Shape>{{5, 37, 45}, {3, 300, 70}, {1, 8, 9}}) {
      INFO(dev.str() << " " << shape_str(s));
      manual_seed(8);
      const int64_t B = s[0], R = s[1], C = s[2];
      Tensor x = randn({B, R, C}, kFloat64), y = randn({B, C, R}, kFloat64), row = randn({C}, kFloat64);
      Tensor yt = on(y, dev).transpose(1, 2);  // (B, R, C), element (b, r, c) = y[b, c, r]
      Tensor copied = yt.contiguous().cpu(), sum = (on(x, dev) + yt).cpu(), prod = (yt * on(row, dev)).cpu();
      Tensor into = on(zeros({B, C, R}, kFloat64), dev);
      into.transpose(1, 2).copy_(on(x, dev));  // a transposed destination
      std::vector<double> xv = x.to_vector<double>(), yv = y.to_vector<double>(), rv = row.to_vector<double>();
      std::vector<double> cv = copied.to_vector<double>(), sv = sum.to_vector<double>(), pv = prod.to_vector<double>();
      std::vector<double> iv = into.cpu().to_vector<double>();
      int64_t wrong = 0;
      for (int64_t b = 0; b < B; ++b)
        for (int64_t r = 0; r < R; ++r)
          for (int64_t c = 0; c < C; ++c) {
            const size_t o = size_t((b * R + r) * C + c), t = size_t((b * C + c) * R + r);
            wrong += cv[o] != yv[t];
            wrong += sv[o] != xv[o] + yv[t];
            wrong += pv[o] != yv[t] * rv[size_t(c)];
            wrong += iv[t] != xv[o];
          }
      CHECK(wrong == 0);
    }
}

// 4-byte dtypes' transposing copies move whole 16 x 16 tiles through registers on the CPU
// (ops/cpu/copy.cpp) and the edge tiles element by element: float32 (with NaN and -0.0,
// whose bits must survive) and int32, shapes of whole tiles, partial ones and both, a
// batch, a transposed destination, and a source transposed across the batch dim.
TEST_CASE("transposing copies of 4-byte dtypes keep every element's bits") {
  for (Device dev : test_devices())
    for (DType dt : {kFloat32, kInt32})
      for (const Shape& s : std::vector<Shape>{{2, 48, 64}, {3, 49, 128}, {1, 17, 33}, {4, 300, 70}}) {
        INFO(dev.str() << " " << dtype_name(dt) << " " << shape_str(s));
        manual_seed(10);
        const int64_t B = s[0], R = s[1], C = s[2];
        const std::vector<double> v = (randn({B, C, R}, kFloat64) * 1000.0).to_vector<double>();
        // The expected bits, element by element; float32 gets specials at the corners of
        // the first tile and of the last.
        std::vector<uint32_t> bits(v.size());
        Tensor y;
        if (dt == kFloat32) {
          std::vector<float> f(v.begin(), v.end());
          f[0] = NAN, f[size_t(R)] = -0.0f, f.back() = -INFINITY;
          for (size_t i = 0; i < f.size(); ++i) std::memcpy(&bits[i], &f[i], 4);
          y = from_vector(f, {B, C, R});
        } else {
          std::vector<int32_t> n(v.begin(), v.end());
          for (size_t i = 0; i < n.size(); ++i) bits[i] = uint32_t(n[i]);
          y = from_vector(n, {B, C, R});
        }
        auto bits_of = [&](const Tensor& t) {
          std::vector<uint32_t> out(size_t(t.numel()));
          if (dt == kFloat32) {
            const std::vector<float> f = t.cpu().to_vector<float>();
            std::memcpy(out.data(), f.data(), 4 * f.size());
          } else {
            const std::vector<int64_t> n = t.cpu().to_vector<int64_t>();
            for (size_t i = 0; i < n.size(); ++i) out[i] = uint32_t(n[i]);
          }
          return out;
        };
        const std::vector<uint32_t> copied = bits_of(on(y, dev).transpose(1, 2).contiguous());
        Tensor into = on(zeros({B, C, R}, dt), dev);
        into.transpose(1, 2).copy_(on(y, dev).transpose(1, 2).contiguous());  // back through a transposed destination
        const std::vector<uint32_t> back = bits_of(into);
        const std::vector<uint32_t> across = bits_of(on(y, dev).permute({2, 1, 0}).contiguous());  // (R, C, B)
        int64_t wrong = 0;
        for (int64_t b = 0; b < B; ++b)
          for (int64_t r = 0; r < R; ++r)
            for (int64_t c = 0; c < C; ++c) {
              const uint32_t want = bits[size_t((b * C + c) * R + r)];
              wrong += copied[size_t((b * R + r) * C + c)] != want;
              wrong += back[size_t((b * C + c) * R + r)] != want;
              wrong += across[size_t((r * C + c) * B + b)] != want;
            }
        CHECK(wrong == 0);
      }
}

TEST_CASE("permuted copies with a short innermost dim, and a unary op on them, element by element") {
  // A tensor-ring core's layouts: (P, Q, 4) from a (4, P, Q) tensor permuted, whose short
  // innermost dim the CPU walks as an outer one (ops/cpu/loops.h), into a dense and into
  // a permuted destination; sizes on both sides of the thread split.
  for (Device dev : test_devices())
    for (const Shape& s : std::vector<Shape>{{4, 9, 11}, {4, 149, 300}, {3, 2, 40}}) {
      INFO(dev.str() << " " << shape_str(s));
      manual_seed(9);
      const int64_t A = s[0], P = s[1], Q = s[2];
      Tensor x = randn({A, P, Q}, kFloat64);
      Tensor xp = on(x, dev).permute({1, 2, 0});  // (P, Q, A), element (p, q, a) = x[a, p, q]
      std::vector<double> copied = xp.contiguous().cpu().to_vector<double>();
      std::vector<double> squared = square(xp).cpu().to_vector<double>();
      Tensor into = on(zeros({A, P, Q}, kFloat64), dev);
      into.permute({1, 2, 0}).copy_(on(x.permute({1, 2, 0}).contiguous(), dev));  // a permuted destination
      std::vector<double> xv = x.to_vector<double>(), iv = into.cpu().to_vector<double>();
      int64_t wrong = 0;
      for (int64_t p = 0; p < P; ++p)
        for (int64_t q = 0; q < Q; ++q)
          for (int64_t a = 0; a < A; ++a) {
            const size_t o = size_t((p * Q + q) * A + a), src = size_t((a * P + p) * Q + q);
            wrong += copied[o] != xv[src];
            wrong += squared[o] != xv[src] * xv[src];
            wrong += iv[src] != xv[src];
          }
      CHECK(wrong == 0);
    }
  // The same walk with no outer dims left ((5000, 3) from a transposed (3, 5000)) and with
  // two that cannot merge (a sliced source), against the index arithmetic.
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(10);
    Tensor x2 = randn({3, 5000}, kFloat64);
    std::vector<double> x2v = x2.to_vector<double>(), t2 = on(x2, dev).t().contiguous().cpu().to_vector<double>();
    int64_t wrong = 0;
    for (int64_t i = 0; i < 5000; ++i)
      for (int64_t a = 0; a < 3; ++a) wrong += t2[size_t(i * 3 + a)] != x2v[size_t(a * 5000 + i)];
    Tensor x4 = randn({4, 6, 7, 60}, kFloat64);
    std::vector<double> x4v = x4.to_vector<double>();
    std::vector<double> t4 = on(x4, dev).slice(3, 0, 50).permute({1, 2, 3, 0}).contiguous().cpu().to_vector<double>();
    for (int64_t p = 0; p < 6; ++p)
      for (int64_t q = 0; q < 7; ++q)
        for (int64_t r = 0; r < 50; ++r)
          for (int64_t a = 0; a < 4; ++a)
            wrong += t4[size_t(((p * 7 + q) * 50 + r) * 4 + a)] != x4v[size_t(((a * 6 + p) * 7 + q) * 60 + r)];
    CHECK(wrong == 0);
  }
}

TEST_CASE("maximum and minimum, with NaN propagating") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    Tensor a = on(tensor({1.0, 5.0, NAN, 2.0}, kFloat64), dev), b = on(tensor({3.0, 4.0, 0.0, 2.0}, kFloat64), dev);
    std::vector<double> mx = maximum(a, b).to_vector<double>(), mn = minimum(a, b).to_vector<double>();
    CHECK(mx[0] == 3.0);
    CHECK(mx[1] == 5.0);
    CHECK(std::isnan(mx[2]));
    CHECK(mn[0] == 1.0);
    CHECK(mn[1] == 4.0);
    CHECK(std::isnan(mn[2]));
    CHECK(mn[3] == 2.0);
  }
}

TEST_CASE("ties in maximum split the gradient in half") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    Tensor a = on(tensor({1.0, 2.0, 3.0}, kFloat64).requires_grad_(), dev);
    Tensor b = on(tensor({2.0, 2.0, 1.0}, kFloat64).requires_grad_(), dev);
    maximum(a, b).sum().backward();
    CHECK(a.grad().to_vector<double>() == std::vector<double>{0, 0.5, 1});
    CHECK(b.grad().to_vector<double>() == std::vector<double>{1, 0.5, 0});
  }
}

TEST_CASE("comparisons give bool tensors; where and masked_fill select") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    auto d = [dev](const Tensor& t) { return on(t, dev); };
    Tensor a = d(tensor({1.0, 2.0, 3.0})), b = d(tensor({3.0, 2.0, 1.0}));
    CHECK((a < b).dtype() == kBool);
    CHECK((a < b).to_vector<bool>() == std::vector<bool>{true, false, false});
    CHECK((a <= b).to_vector<bool>() == std::vector<bool>{true, true, false});
    CHECK((a > b).to_vector<bool>() == std::vector<bool>{false, false, true});
    CHECK((a >= b).to_vector<bool>() == std::vector<bool>{false, true, true});
    CHECK((a == b).to_vector<bool>() == std::vector<bool>{false, true, false});
    CHECK((a != b).to_vector<bool>() == std::vector<bool>{true, false, true});
    CHECK((a > 1.5).to_vector<bool>() == std::vector<bool>{false, true, true});
    CHECK(logical_not(a > 1.5).to_vector<bool>() == std::vector<bool>{true, false, false});
    CHECK(logical_and(a > 1.5, b > 1.5).to_vector<bool>() == std::vector<bool>{false, true, false});
    CHECK(logical_or(a > 2.5, b > 2.5).to_vector<bool>() == std::vector<bool>{true, false, true});
    CHECK(where(a < b, a, b).to_vector<double>() == std::vector<double>{1, 2, 1});
    CHECK(where(a < b, a, -1.0).to_vector<double>() == std::vector<double>{1, -1, -1});
    // condition broadcast along rows
    Tensor m = ones({2, 3}, TensorOptions().device(dev));
    Tensor rowmask = d(tensor({1.0, 0.0}).reshape({2, 1})) > 0.5;
    CHECK(masked_fill(m, rowmask, -INFINITY).at({0, 2}) == -INFINITY);
    CHECK(masked_fill(m, rowmask, -INFINITY).at({1, 2}) == 1.0);
    CHECK(allclose(d(tensor({1.0, 2.0})), d(tensor({1.0, 2.0 + 1e-9}))));
    CHECK(!allclose(d(tensor({1.0, 2.0})), d(tensor({1.0, 2.1}))));
  }
}

// where over runs long enough for the CPU's vector select, with each of the condition and
// the two values dense or a broadcast scalar (the eight combinations: masked_fill's value,
// where's gradient's zero), against the element-by-element rule.
TEST_CASE("where with dense and broadcast operands selects element by element") {
  manual_seed(23);
  const int64_t n = 1000;
  const Tensor cond = rand({n}) > 0.5, a = randn({n}), b = randn({n});
  const Tensor c1 = tensor({1.0}) > 0.5, a1 = tensor({2.5}), b1 = tensor({-7.0});
  const std::vector<double> cv = cond.to_vector<double>(), av = a.to_vector<double>(), bv = b.to_vector<double>();
  for (Device dev : test_devices())
    for (int k = 0; k < 8; ++k) {
      const bool dc = k & 4, da = k & 2, db = k & 1;
      INFO(dev.str() << " condition " << (dc ? "dense" : "scalar") << ", a " << (da ? "dense" : "scalar") << ", b "
                     << (db ? "dense" : "scalar"));
      if (!dc && !da && !db) continue;  // all scalar: not a run of n
      const Tensor got = where(on(dc ? cond : c1, dev), on(da ? a : a1, dev), on(db ? b : b1, dev));
      REQUIRE(got.numel() == n);
      const std::vector<double> g = got.to_vector<double>();
      int64_t wrong = 0;
      for (int64_t i = 0; i < n; ++i) {
        const bool c = dc ? cv[size_t(i)] != 0 : true;
        const double want = c ? (da ? av[size_t(i)] : 2.5) : (db ? bv[size_t(i)] : -7.0);
        wrong += g[size_t(i)] != want;
      }
      CHECK(wrong == 0);
    }
}

// pow by a scalar exponent of 2, 1, 0 or -1 takes one operation instead of pow
// (ops/functors.h, pow_scalar): the same values as std::pow, special values included, and
// the gradient e x^(e - 1) g.
TEST_CASE("pow with exponents 2, 1, 0 and -1 gives std::pow's values and gradients") {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<double> xs = {0.0, -0.0, 1.5, -1.5, 3e-20, 1e30, -2e-310, inf, -inf, nan, 0.1, -7.25};
  for (Device dev : test_devices())
    for (DType dt : {kFloat64, kFloat32})
      for (double e : {2.0, 1.0, 0.0, -1.0}) {
        INFO(dev.str() << " " << dtype_name(dt) << " exponent " << e);
        const Tensor x = from_vector<double>(xs, {int64_t(xs.size())}).to(dt);
        const std::vector<double> xv = x.to_vector<double>();
        Tensor xg = on(x, dev).requires_grad_();
        Tensor y = pow(xg, e);
        y.backward(ones_like(y));
        const std::vector<double> yv = y.to_vector<double>(), gv = xg.grad().to_vector<double>();
        for (size_t i = 0; i < xv.size(); ++i) {
          INFO("x = " << xv[i]);
          const double want = dt == kFloat32 ? double(std::pow(float(xv[i]), float(e))) : std::pow(xv[i], e);
          if (std::isnan(want)) {
            CHECK(std::isnan(yv[i]));
          } else {
            CHECK(yv[i] == want);
            CHECK(std::signbit(yv[i]) == std::signbit(want));
          }
          if (e != 0 && std::isfinite(xv[i]) && xv[i] != 0 && std::fabs(xv[i]) > 1e-300) {
            const double wg = e == 2 ? 2 * xv[i] : e == 1 ? 1.0 : -1.0 / (xv[i] * xv[i]);
            if (dt == kFloat32 && std::fabs(wg) > 3.4e38) CHECK(gv[i] == -inf);  // past float32's range
            else CHECK(gv[i] == doctest::Approx(wg).epsilon(dt == kFloat32 ? 1e-6 : 1e-14));
          }
        }
      }
}

// base^e by e multiplications, wrapping modulo 2^64 (unsigned: defined); a negative e as
// torch's integer pow: 1 for 1, +-1 for -1, 0 else.
static int64_t power_by_loop(int64_t base, int64_t e) {
  if (e < 0) return base == 1 ? 1 : base == -1 ? (e % 2 != 0 ? -1 : 1) : 0;
  uint64_t r = 1;
  for (int64_t i = 0; i < e; ++i) r *= uint64_t(base);
  return int64_t(r);
}

TEST_CASE("pow of integers stays integer: exact, wrapping, negative exponents as torch") {
  std::vector<int64_t> bases, exps;
  for (int64_t b : {-3, -2, -1, 0, 1, 2, 3, 7, 1000003})
    for (int64_t e = -3; e <= 70; ++e) bases.push_back(b), exps.push_back(e);
  const int64_t n = int64_t(bases.size());
  for (Device dev : test_devices()) {
    INFO(dev.str());
    auto ints = [&](const std::vector<int64_t>& v) { return on(from_vector(v, {int64_t(v.size())}), dev); };
    const Tensor b = on(from_vector(bases, {n}), dev), e = on(from_vector(exps, {n}), dev);
    const Tensor y = pow(b, e);
    CHECK(y.dtype() == kInt64);
    const std::vector<int64_t> yv = y.to_vector<int64_t>();
    int64_t wrong = 0;
    for (int64_t i = 0; i < n; ++i) wrong += yv[size_t(i)] != power_by_loop(bases[size_t(i)], exps[size_t(i)]);
    CHECK(wrong == 0);
    // torch.tensor([2, 3, -2, 0, 1, -1, 7]) ** torch.tensor([3, 0, -1, -2, 5, -3, 40]).
    CHECK(pow(ints({2, 3, -2, 0, 1, -1, 7}), ints({3, 0, -1, -2, 5, -3, 40}))
              .to_vector<int64_t>() == std::vector<int64_t>{8, 1, 0, 0, 1, -1, -6212923193149656639});
    // int32 wraps as int32 products do: 2^31 and (-2)^31 are -2^31, 3^31 torch's 1264544299.
    const Tensor i32 = ints({2, -2, 3}).to(kInt32);
    const Tensor y32 = pow(i32, on(full({1}, 31.0, kInt32), dev));
    CHECK(y32.dtype() == kInt32);
    CHECK(y32.to_vector<int64_t>() == std::vector<int64_t>{-2147483648LL, -2147483648LL, 1264544299});
    // A scalar exponent: integral >= 0 stays int64; a fraction gives float32.
    const Tensor x = ints({-3, 0, 5, 3});
    CHECK(pow(x, 3.0).dtype() == kInt64);
    CHECK(pow(x, 3.0).to_vector<int64_t>() == std::vector<int64_t>{-27, 0, 125, 27});
    CHECK(pow(x, 41.0).to_vector<int64_t>()[3] == power_by_loop(3, 41));
    CHECK(pow(x, 0.0).to_vector<int64_t>() == std::vector<int64_t>{1, 1, 1, 1});
    const Tensor half = pow(x, 0.5);
    CHECK(half.dtype() == kFloat32);
    const std::vector<double> hv = half.to_vector<double>();
    CHECK(std::isnan(hv[0]));
    CHECK(hv[2] == double(std::sqrt(5.0f)));
    // With a float operand the pair promotes: int64 ** float64 is float64.
    CHECK(pow(x, on(tensor({2.0}, kFloat64), dev)).to_vector<double>() == std::vector<double>{9, 0, 25, 9});
    CHECK_THROWS_MU(pow(x, -1.0), "pow: integers to negative integer powers are not allowed (int64 [4] to the power -1)");
    CHECK_THROWS_MU(pow(ints({1, 0}).to(kBool), 2.0), "pow: a bool base [2] has no power");
    CHECK_THROWS_MU(pow(ints({1}).to(kBool), ints({1}).to(kBool)), "pow: a bool base [1] has no power");
  }
}

TEST_CASE("clamp's gradient passes inside the bounds only") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    Tensor x = on(tensor({-2.0, -1.0, 0.0, 1.0, 2.0}, kFloat64).requires_grad_(), dev);
    clamp(x, -1.0, 1.0).sum().backward();
    CHECK(x.grad().to_vector<double>() == std::vector<double>{0, 1, 1, 1, 0});
  }
}

// float x rounded to the nearest bfloat16, ties to even (finite x): the host reference
// for what a kernel writes into a bfloat16 tensor.
static float round_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  u &= 0xffff0000u;
  float r;
  std::memcpy(&r, &u, 4);
  return r;
}

static std::vector<float> floats(const Tensor& t) {
  std::vector<double> v = t.to_vector<double>();
  return std::vector<float>(v.begin(), v.end());
}

// autocast's bfloat16 activations meet float32 biases and residuals: the kernels read
// each operand in its own dtype, compute in float32 and write the promoted dtype once
// (bfloat16 with float32 gives float32; bfloat16 with bfloat16 gives bfloat16, rounded
// once), and each gradient comes back in its operand's dtype. The references are float
// arithmetic on the host and a host rounding to bfloat16.
TEST_CASE("bfloat16 beside float32: computed in float32, rounded once, gradients in each operand's dtype") {
  Generator gen(11);
  const Tensor a32 = randn({4, 6}, TensorOptions(kFloat32), &gen), b32 = randn({4, 6}, TensorOptions(kFloat32), &gen);
  const Tensor col = randn({4}, TensorOptions(kFloat32), &gen);
  const Tensor a16c = a32.to(kBFloat16), b16c = b32.to(kBFloat16);
  const std::vector<float> av = floats(a16c), bv = floats(b32), b16v = floats(b16c), cv = floats(col);
  for (Device dev : test_devices()) {
    INFO(dev.str());
    const Tensor a16 = on(a16c, dev), b16 = on(b16c, dev), b = on(b32, dev), c = on(col, dev);

    Tensor s = a16 + b;  // dense, mixed
    REQUIRE(s.dtype() == kFloat32);
    std::vector<float> sv = floats(s);
    for (size_t i = 0; i < av.size(); ++i) CHECK(sv[i] == av[i] + bv[i]);

    Tensor p = a16 * b16;  // all bfloat16
    REQUIRE(p.dtype() == kBFloat16);
    std::vector<float> pv = floats(p);
    for (size_t i = 0; i < av.size(); ++i) CHECK(pv[i] == round_bf16(av[i] * b16v[i]));

    Tensor t = a16.t() - c;  // strided bfloat16 minus a broadcast float32 row
    REQUIRE(t.dtype() == kFloat32);
    REQUIRE(t.shape() == Shape{6, 4});
    std::vector<float> tv = floats(t);
    for (int j = 0; j < 6; ++j)
      for (int i = 0; i < 4; ++i) CHECK(tv[size_t(j * 4 + i)] == av[size_t(i * 6 + j)] - cv[size_t(i)]);

    Tensor w = where(a16 > b, a16, b);  // a mixed comparison, then a mixed selection
    REQUIRE(w.dtype() == kFloat32);
    std::vector<float> wv = floats(w);
    for (size_t i = 0; i < av.size(); ++i) CHECK(wv[i] == (av[i] > bv[i] ? av[i] : bv[i]));

    Tensor g = gelu(a16);  // a unary op stays bfloat16: within one rounding of float gelu
    REQUIRE(g.dtype() == kBFloat16);
    std::vector<float> gv = floats(g);
    for (size_t i = 0; i < av.size(); ++i) {
      const double want = 0.5 * av[i] * (1 + std::erf(av[i] / std::sqrt(2.0)));
      CHECK(std::fabs(gv[i] - want) <= std::ldexp(std::fabs(want), -8) + 1e-30);
    }

    Tensor r = a16.sum({1});  // summed in float32, rounded once
    REQUIRE(r.dtype() == kBFloat16);
    std::vector<float> rv = floats(r);
    for (int i = 0; i < 4; ++i) {
      double want = 0;
      for (int j = 0; j < 6; ++j) want += av[size_t(i * 6 + j)];
      CHECK(std::fabs(rv[size_t(i)] - want) <= std::ldexp(std::fabs(want), -8) + 1e-6);
    }

    // d(sum(a * b) + sum(aᵀ + c))/da = b + 1, each term rounded to a's bfloat16 as it
    // arrives and their sum rounded again; d/db = a, in float32; d/dc = 6 per entry.
    Tensor al = a16.detach().requires_grad_(), bl = b.detach().requires_grad_(), cl = c.detach().requires_grad_();
    ((al * bl).sum() + (al.t() + cl).sum()).backward();
    REQUIRE(al.grad().dtype() == kBFloat16);
    REQUIRE(bl.grad().dtype() == kFloat32);
    std::vector<float> ga = floats(al.grad()), gb = floats(bl.grad()), gc = floats(cl.grad());
    for (size_t i = 0; i < av.size(); ++i) {
      CHECK(ga[i] == round_bf16(round_bf16(bv[i]) + 1.0f));
      CHECK(gb[i] == av[i]);
    }
    for (int i = 0; i < 4; ++i) CHECK(gc[size_t(i)] == 6.0f);
  }
}

// add, sub, mul and div of two bfloat16 tensors (autocast's bias and residual adds): each
// element the float32 operation on the two values, rounded once to bfloat16. Values of
// all 8 bits of precision (randn), and the ones where rounding can go wrong: results
// half-way between two bfloat16 values, past the largest finite, below the normals, NaN
// and infinities, zeros of both signs. Dense rows of 37 (whole vectors and a tail), a
// broadcast row, a broadcast column, a transposed view and an in-place add. The reference
// is the host's float arithmetic and bfloat16_t's conversion (tensor/half.h).
TEST_CASE("bfloat16 add, sub, mul, div: the float32 operation rounded once, over runs, broadcasts and special values") {
  Generator gen(23);
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> special = {1.0f + 0x1p-7f, 1.5f, 3.0e38f, -3.0e38f, inf, -inf, 0.0f, -0.0f, 0x1p-120f,
                                0x1p-126f, -0x1p-127f, 1.0f + 0x1p-6f, 2.0f, -1.0f, 0.75f,
                                std::numeric_limits<float>::quiet_NaN()};
  const int64_t R = 5, C = 37;
  std::vector<double> av = randn({R, C}, TensorOptions(kFloat32), &gen).to_vector<double>();
  std::vector<double> bv = randn({R, C}, TensorOptions(kFloat32), &gen).to_vector<double>();
  for (size_t i = 0; i < special.size(); ++i)  // every special value against every other, in rows 0 and 1
    for (size_t j = 0; j < 2; ++j) {
      av[j * C + i] = special[i];
      bv[j * C + i] = special[(i * 7 + j * 3) % special.size()];
    }
  const Tensor a16c = from_vector(std::vector<float>(av.begin(), av.end()), {R, C}).to(kBFloat16);
  const Tensor b16c = from_vector(std::vector<float>(bv.begin(), bv.end()), {R, C}).to(kBFloat16);
  const std::vector<float> a = floats(a16c), b = floats(b16c);
  // bfloat16_t(x)'s bits. A NaN result is a NaN on every device; the CPU writes the one
  // quiet NaN 0x7fc0 that bfloat16_t gives (as PyTorch's CPU does), CUDA's conversion
  // (__float2bfloat16_rn) its own 0x7fff.
  auto got_bits = [](const Tensor& t) {  // the stored bits themselves (a NaN's too)
    const Tensor h = t.cpu().contiguous();
    std::vector<uint16_t> out;
    for (int64_t i = 0; i < h.numel(); ++i) out.push_back(h.data_ptr<bfloat16_t>()[i].bits);
    return out;
  };
  for (Device dev : test_devices()) {
    INFO(dev.str());
    auto differs = [cpu = dev.is_cpu()](uint16_t got, float want) {
      if (std::isnan(want)) return (got & 0x7f80u) != 0x7f80u || (got & 0x7fu) == 0 || (cpu && got != 0x7fc0u);
      return got != bfloat16_t(want).bits;
    };
    const Tensor x = on(a16c, dev), y = on(b16c, dev);
    const std::vector<std::pair<const char*, std::function<float(float, float)>>> ops = {
        {"add", [](float u, float v) { return u + v; }}, {"sub", [](float u, float v) { return u - v; }},
        {"mul", [](float u, float v) { return u * v; }}, {"div", [](float u, float v) { return u / v; }}};
    for (const auto& [name, op] : ops) {
      INFO(name);
      auto apply = [&, name = std::string(name)](const Tensor& u, const Tensor& v) {
        return name == "add" ? u + v : name == "sub" ? u - v : name == "mul" ? u * v : u / v;
      };
      const Tensor row = y.select(0, 2), column = y.select(1, 3).unsqueeze(1);
      const Tensor dense = apply(x, y), by_row = apply(x, row), by_column = apply(x, column),
                   transposed = apply(x.t(), y.t());
      for (const Tensor& t : {dense, by_row, by_column, transposed}) REQUIRE(t.dtype() == kBFloat16);
      const std::vector<uint16_t> d = got_bits(dense), r = got_bits(by_row), c = got_bits(by_column),
                                  tr = got_bits(transposed);
      int64_t wrong = 0;
      for (int64_t i = 0; i < R; ++i)
        for (int64_t j = 0; j < C; ++j) {
          const size_t k = size_t(i * C + j);
          wrong += differs(d[k], op(a[k], b[k]));
          wrong += differs(r[k], op(a[k], b[size_t(2 * C + j)]));
          wrong += differs(c[k], op(a[k], b[size_t(i * C + 3)]));
          wrong += differs(tr[size_t(j * R + i)], op(a[k], b[k]));
        }
      CHECK(wrong == 0);
    }
    Tensor acc = x.clone();
    acc.add_(y);
    const std::vector<uint16_t> in_place = got_bits(acc);
    int64_t wrong = 0;
    for (size_t k = 0; k < a.size(); ++k) wrong += differs(in_place[k], a[k] + b[k]);
    CHECK(wrong == 0);
  }
}

// GELU, its gradient and exp on bfloat16 tensors: the CPU runs them a chunk at a time
// through the float32 lane code, so each result must be the float32 op's on the widened
// value, rounded once, bit for bit (which is also what the other devices compute). Runs
// past one chunk (512) with a tail, a strided view, and the values at the ends of GELU's
// range (below -13 its result is a subnormal or 0, above 16 it is x) and of exp's.
TEST_CASE("bfloat16 gelu, its gradient, exp, log, tanh, sigmoid: the float32 op on the widened values, rounded once") {
  Generator gen(29);
  Tensor x = (randn({3, 700}, TensorOptions(kFloat32), &gen) * 4.0);
  std::vector<float> xs = floats(x);
  const std::vector<float> ends = {-20.0f, -13.5f, -13.2f, -9.0f, -0.0f, 0.0f, 1e-30f, 15.9f, 16.0f, 17.0f,
                                   88.5f, -87.5f, -104.0f, 300.0f, std::numeric_limits<float>::infinity(),
                                   -std::numeric_limits<float>::infinity()};
  for (size_t i = 0; i < ends.size(); ++i) xs[i * 37] = ends[i];
  const Tensor x16 = from_vector(xs, {3, 700}).to(kBFloat16), g16 = (randn({3, 700}, TensorOptions(kFloat32), &gen)).to(kBFloat16);
  auto same_bits = [](const Tensor& a, const Tensor& b) {
    const Tensor ha = a.cpu().contiguous(), hb = b.cpu().contiguous();
    int64_t differing = 0;
    for (int64_t i = 0; i < ha.numel(); ++i)
      differing += ha.data_ptr<bfloat16_t>()[i].bits != hb.data_ptr<bfloat16_t>()[i].bits;
    return differing;
  };
  const Tensor x32 = x16.to(kFloat32), g32 = g16.to(kFloat32);
  {
    NoGradGuard no_grad;
    CHECK(same_bits(gelu(x16), gelu(x32).to(kBFloat16)) == 0);
    CHECK(same_bits(exp(x16), exp(x32).to(kBFloat16)) == 0);
    CHECK(same_bits(log(x16), log(x32).to(kBFloat16)) == 0);  // NaN for the negative half, -inf at 0
    CHECK(same_bits(tanh(x16), tanh(x32).to(kBFloat16)) == 0);
    CHECK(same_bits(sigmoid(x16), sigmoid(x32).to(kBFloat16)) == 0);
    CHECK(same_bits(gelu(x16.t()), gelu(x32.t()).to(kBFloat16)) == 0);  // strided: element by element
  }
  Tensor a = x16.detach().requires_grad_(), b = x32.detach().requires_grad_();
  gelu(a).backward(g16);
  gelu(b).backward(g32);
  REQUIRE(a.grad().dtype() == kBFloat16);
  CHECK(same_bits(a.grad(), b.grad().to(kBFloat16)) == 0);
}

// Contiguous views that start at any element (a slice of a flat tensor) are dense but not
// 16-byte aligned unless the offset happens to make them so: the device's vector loads and
// stores (16 bytes at a time) must take them only when every pointer is aligned, or a GPU
// faults (the emulated device checks each access's alignment). Operands, outputs and
// in-place targets at each offset 0..8, beside one another at other offsets, in every
// dtype, element by element against values computed here.
TEST_CASE("dense views at any element offset: maps, copies, conversions, in-place ops and sums, element by element") {
  constexpr int64_t kLen = 64, kBase = kLen + 16;
  for (Device dev : test_devices()) {
    for (DType dt : {kFloat32, kFloat64, kBFloat16, kInt64}) {
      INFO(dev.str() << " " << dtype_name(dt));
      Generator gen(5);
      // Values that every dtype holds exactly: small integers plus a multiple of 1/4.
      Tensor values = randint(-40, 40, {kBase}, TensorOptions(kInt64), &gen).to(kFloat64);
      if (dt != kInt64) values = values + randint(0, 4, {kBase}, TensorOptions(kInt64), &gen).to(kFloat64) * 0.25;
      const Tensor host = values.to(dt);
      const std::vector<double> v = host.to(kFloat64).to_vector<double>();
      // What a float32 computation rounded once to dt gives (dt's own arithmetic otherwise).
      auto in_dt = [&](double r) {
        if (dt == kBFloat16) return double(round_bf16(float(r)));
        if (dt == kFloat32) return double(float(r));
        return r;
      };
      const Tensor base = host.to(dev);
      for (int64_t off = 0; off <= 8; ++off) {
        const int64_t off2 = (3 * off + 1) % 9;
        INFO("offsets " << off << " and " << off2);
        const Tensor x = base.slice(0, off, off + kLen), y = base.slice(0, off2, off2 + kLen);
        REQUIRE(x.is_contiguous());
        auto at = [&](int64_t o, int64_t i) { return v[size_t(o + i)]; };

        const std::vector<double> sum = (x + y).to(kFloat64).cpu().to_vector<double>();
        const std::vector<double> neg = (-x).to(kFloat64).cpu().to_vector<double>();
        const std::vector<double> sel = where(x > y, x, y).to(kFloat64).cpu().to_vector<double>();
        const std::vector<double> same = x.clone().to(kFloat64).cpu().to_vector<double>();
        const DType other = dt == kFloat32 ? kBFloat16 : kFloat32;
        const std::vector<double> conv = x.to(other).to(kFloat64).cpu().to_vector<double>();
        // Into views at an offset: a converting copy_, then an in-place add of another view.
        Tensor dst = zeros({kBase}, TensorOptions(other).device(dev));
        dst.slice(0, off2, off2 + kLen).copy_(x);
        const std::vector<double> copied = dst.to(kFloat64).cpu().to_vector<double>();
        Tensor acc = base.clone();
        acc.slice(0, off, off + kLen).add_(y);
        const std::vector<double> added = acc.to(kFloat64).cpu().to_vector<double>();
        for (int64_t i = 0; i < kLen; ++i) {
          INFO("element " << i);
          CHECK(sum[size_t(i)] == in_dt(at(off, i) + at(off2, i)));
          CHECK(neg[size_t(i)] == -at(off, i));
          CHECK(sel[size_t(i)] == std::max(at(off, i), at(off2, i)));
          CHECK(same[size_t(i)] == at(off, i));
          CHECK(conv[size_t(i)] == at(off, i));  // every value is exact in the other dtype too
          CHECK(copied[size_t(off2 + i)] == at(off, i));
          CHECK(added[size_t(off + i)] == in_dt(at(off, i) + at(off2, i)));
        }
        for (int64_t i = 0; i < kBase; ++i)  // nothing outside the views is touched
          if (i < off2 || i >= off2 + kLen) CHECK(copied[size_t(i)] == 0.0);
        for (int64_t i = 0; i < kBase; ++i)
          if (i < off || i >= off + kLen) CHECK(added[size_t(i)] == v[size_t(i)]);
        double want = 0;
        for (int64_t i = 0; i < kLen; ++i) want += at(off, i);
        // Exact in any order (quarters below 2^22 in float32's sums), rounded once to dt.
        CHECK(x.sum().to(kFloat64).cpu().item<double>() == in_dt(want));
      }
    }
  }
}

TEST_CASE("div_ by a number divides (not a product with its reciprocal), and refuses integer tensors") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    Tensor tiny = on(tensor({1e-300, -3e-300}, kFloat64), dev);
    tiny.div_(1e-310);  // 1 / 1e-310 is inf in double
    std::vector<double> t = tiny.to_vector<double>();
    CHECK(t[0] == 1e-300 / 1e-310);
    CHECK(t[1] == -3e-300 / 1e-310);
    // Rounded once: every element the float32 quotient of its own value.
    Tensor x = on(arange(1, 2000, 1, TensorOptions(kFloat32)), dev);
    Tensor y = x.clone();
    y.div_(3.0);
    std::vector<float> xv = x.to_vector<float>(), yv = y.to_vector<float>();
    int64_t wrong = 0;
    for (size_t i = 0; i < xv.size(); ++i) wrong += yv[i] != xv[i] / 3.0f;
    CHECK(wrong == 0);
    Tensor i = on(tensor({1, 2}), dev);
    CHECK_THROWS_MU(i.div_(2.0), "div_: the result type of true division is floating point");
  }
}

// A number an integer tensor cannot hold is refused naming the op the user called (it
// said fill_, from the 0-dim tensor made inside).
TEST_CASE("numbers an integer tensor cannot hold: the error names the op") {
  Tensor i32 = zeros({2}, kInt32);
  CHECK_THROWS_MU(i32.add_(3e9), "add_: value 3e+09 does not fit in int32");
  CHECK_THROWS_MU(i32.mul_(-3e9), "mul_: value -3e+09 does not fit in int32");
  CHECK_THROWS_MU(masked_fill(ones({2}, kInt64), ones({2}, kBool), INFINITY),
                  "masked_fill: scalar inf is not an integer but the tensor is int64");
  CHECK_THROWS_MU(masked_fill(zeros({2}, kInt8), ones({2}, kBool), 300.0), "masked_fill: value 300 does not fit in int8");
  i32.add_(2e9);  // fits
  CHECK(i32.to_vector<int64_t>() == std::vector<int64_t>{2000000000, 2000000000});
}

TEST_CASE("writing elementwise into an expanded view is refused: its elements share memory") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    Tensor e = on(zeros({1}), dev).expand({4});
    CHECK_THROWS_MU(e.add_(on(ones({4}), dev)), "add_: more than one element of the written-to tensor");
    CHECK_THROWS_MU(e.copy_(on(arange(0, 4, 1, TensorOptions(kFloat32)), dev)), "dim 0 has size 4 and stride 0");
    CHECK_THROWS_MU(e.mul_(2.0), "mul_: more than one element");
    Tensor row = on(ones({1, 3}), dev).expand({2, 3});
    CHECK_THROWS_MU(row.add_(on(ones({2, 3}), dev)), "an expanded view");
    // Nothing was written; an expanded size-1 dim and a transposed view are fine.
    CHECK(e.to_vector<float>() == std::vector<float>(4, 0.0f));
    Tensor one = on(zeros({3, 1}), dev).expand({3, 1});
    one.add_(on(ones({3, 1}), dev));
    CHECK(one.to_vector<float>() == std::vector<float>(3, 1.0f));
    Tensor sq = on(arange(0, 4, 1, TensorOptions(kFloat32)), dev).reshape({2, 2});
    sq.t().add_(on(ones({2, 2}), dev));
    CHECK(sq.to_vector<float>() == std::vector<float>{1, 2, 3, 4});
  }
}
