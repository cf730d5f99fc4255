// The storage dtypes (float16, bfloat16, int8, int16, int32, uint8): conversions checked
// against their definitions by brute force, elementwise ops computing through a wider
// dtype, type promotion's everyday cases and gradients across a promotion.
#include <cmath>
#include <limits>

#include "helpers.h"
#include "nn/linear.h"
#include "tensor/half.h"

using namespace mu;

namespace {

// Checks that `bits` is the 16-bit float nearest to x, ties to an even mantissa, by
// comparing with both neighbours (in double, where every distance here is exact).
// to_float / make: the type's decoding and the bits -> value type.
template <class H>
void check_nearest(float x, uint16_t bits) {
  const double want = x;
  const double got = double(H::to_float(bits));
  INFO("x = " << x << ", bits = " << bits);
  if (std::isinf(got)) {
    // Overflow: x must lie at or beyond the midpoint between the largest finite value and
    // the next power of two (where infinity would sit).
    const uint16_t max_finite = uint16_t((bits & 0x8000u) | (std::is_same_v<H, half_t> ? 0x7bffu : 0x7f7fu));
    const double top = std::fabs(double(H::to_float(max_finite)));
    const double ulp = top - std::fabs(double(H::to_float(uint16_t(max_finite - 1))));
    CHECK(std::fabs(want) >= top + ulp / 2);
    return;
  }
  const double err = std::fabs(want - got);
  for (int step : {-1, 1}) {
    const uint16_t mag = bits & 0x7fffu;
    if ((step < 0 && mag == 0) || (step > 0 && (mag == (std::is_same_v<H, half_t> ? 0x7bffu : 0x7f7fu)))) continue;
    const uint16_t other = uint16_t((bits & 0x8000u) | uint16_t(mag + step));
    const double e = std::fabs(want - double(H::to_float(other)));
    CHECK(err <= e);
    if (err == e) CHECK((bits & 1u) == 0);  // a tie goes to the even mantissa
  }
}

}  // namespace

TEST_CASE("every float16 and bfloat16 value converts to float and back unchanged; NaN stays NaN") {
  for (uint32_t b = 0; b < 65536; ++b) {
    const uint16_t bits = uint16_t(b);
    const float h = half_t::to_float(bits), g = bfloat16_t::to_float(bits);
    if (std::isnan(h)) {
      CHECK(std::isnan(half_t::to_float(half_t::from_float(h))));
    } else {
      CHECK(half_t::from_float(h) == bits);
    }
    if (std::isnan(g)) {
      CHECK(bfloat16_t::from_float(g) == 0x7fc0);
    } else {
      CHECK(bfloat16_t::from_float(g) == bits);
    }
  }
  // A few values whose encodings are known from the formats' definitions.
  CHECK(half_t::from_float(1.0f) == 0x3c00);
  CHECK(half_t::from_float(65504.0f) == 0x7bff);
  CHECK(half_t::from_float(-2.0f) == 0xc000);
  CHECK(half_t::from_float(5.9604644775390625e-8f) == 0x0001);  // 2^-24, the smallest subnormal
  CHECK(bfloat16_t::from_float(1.0f) == 0x3f80);
}

TEST_CASE("float to float16 and bfloat16 rounds to nearest, ties to even, across the whole range") {
  // Every 2^13-th float bit pattern (both signs, every exponent), plus the exact ties
  // between neighbouring 16-bit values.
  for (uint64_t u = 0; u < (uint64_t(1) << 32); u += 8191) {
    const float x = std::bit_cast<float>(uint32_t(u));
    if (std::isnan(x)) continue;
    check_nearest<half_t>(x, half_t::from_float(x));
    check_nearest<bfloat16_t>(x, bfloat16_t::from_float(x));
  }
  for (uint32_t b = 0; b < 0x7bff; b += 7) {
    const float mid = float((double(half_t::to_float(uint16_t(b))) + double(half_t::to_float(uint16_t(b + 1)))) / 2);
    check_nearest<half_t>(mid, half_t::from_float(mid));
  }
  for (uint32_t b = 0; b < 0x7f7f; b += 7) {
    const float mid = std::bit_cast<float>((b << 16) | 0x8000u);  // exactly between b and b + 1
    check_nearest<bfloat16_t>(mid, bfloat16_t::from_float(mid));
  }
}

TEST_CASE("elementwise ops on storage dtypes compute wide and round back to the dtype") {
  for (Device dev : test_devices()) {
    const std::vector<float> xs = {-3.5f, -0.1f, 0.0f, 0.7f, 2.0f, 11.25f};
    Tensor x = on(from_vector(xs, {int64_t(xs.size())}), dev);
    Tensor h = x.to(kFloat16);
    Tensor e = exp(h);
    CHECK(e.dtype() == kFloat16);
    Tensor s = h * h + h;
    CHECK(s.dtype() == kFloat16);
    std::vector<double> ev = e.to_vector<double>(), sv = s.to_vector<double>();
    for (size_t i = 0; i < xs.size(); ++i) {
      // The definition: each operand rounded to half, the op in float, the result rounded.
      const float xh = half_t::to_float(half_t::from_float(xs[i]));
      CHECK(ev[i] == half_t::to_float(half_t::from_float(std::exp(xh))));
      const float sq = half_t::to_float(half_t::from_float(xh * xh));
      CHECK(sv[i] == half_t::to_float(half_t::from_float(sq + xh)));
    }
    // bfloat16 likewise.
    Tensor g = x.to(kBFloat16) * 3.0;
    CHECK(g.dtype() == kBFloat16);
    std::vector<double> gv = g.to_vector<double>();
    for (size_t i = 0; i < xs.size(); ++i)
      CHECK(gv[i] == bfloat16_t::to_float(bfloat16_t::from_float(bfloat16_t::to_float(bfloat16_t::from_float(xs[i])) * 3.0f)));

    // Narrow integers wrap as two's complement, as in PyTorch.
    Tensor i8 = on(tensor({127.0, -128.0, 5.0}), dev).to(kInt8);
    CHECK((i8 + 1).dtype() == kInt8);
    CHECK((i8 + 1).to_vector<int64_t>() == std::vector<int64_t>{-128, -127, 6});
    Tensor u8 = on(tensor({0.0, 255.0}), dev).to(kUInt8);
    CHECK((u8 - 1).to_vector<int64_t>() == std::vector<int64_t>{255, 254});
    CHECK((u8 + i8.narrow(0, 0, 2)).dtype() == kInt16);  // uint8 with int8: int16
    Tensor i32 = on(arange(4), dev).to(kInt32);
    CHECK((i32 * 2).dtype() == kInt32);
    CHECK((i32 * 2).to_vector<int64_t>() == std::vector<int64_t>{0, 2, 4, 6});
  }
}

TEST_CASE("a tensor and a number promote as in PyTorch: integers meet fractions in float32") {
  for (Device dev : test_devices()) {
    Tensor i = on(arange(3), dev);  // int64 [0, 1, 2]
    // Comparing with a fraction compares values, not the fraction truncated to 0.
    CHECK((i < 0.5).to_vector<bool>() == std::vector<bool>{true, false, false});
    CHECK((i >= 1.5).to_vector<bool>() == std::vector<bool>{false, false, true});
    Tensor half_i = i * 0.5;
    CHECK(half_i.dtype() == kFloat32);
    CHECK(half_i.to_vector<double>() == std::vector<double>{0.0, 0.5, 1.0});
    CHECK((i / 2).dtype() == kFloat32);  // true division
    CHECK((i / 2).to_vector<double>() == std::vector<double>{0.0, 0.5, 1.0});
    CHECK((i * 2).dtype() == kInt64);
    CHECK((1.5 - i).to_vector<double>() == std::vector<double>{1.5, 0.5, -0.5});
    Tensor m = on(arange(3), dev) > 0;  // bool
    CHECK((m + 1).dtype() == kInt64);
    CHECK((m + true).dtype() == kBool);
    CHECK(where(m, i, 0.25).dtype() == kFloat32);
    CHECK(where(m, i, 0.25).to_vector<double>() == std::vector<double>{0.25, 1.0, 2.0});
  }
}

TEST_CASE("gradients flow back across a promotion in each operand's own dtype") {
  for (Device dev : test_devices()) {
    Tensor a = on(tensor({1.0, 2.0, 3.0}).requires_grad_(), dev);          // float32
    Tensor b = on(tensor({0.5, -1.0, 4.0}, kFloat64).requires_grad_(), dev);  // float64
    Tensor y = a * b;
    CHECK(y.dtype() == kFloat64);
    y.sum().backward();
    CHECK(a.grad().dtype() == kFloat32);
    CHECK(b.grad().dtype() == kFloat64);
    CHECK(a.grad().to_vector<double>() == std::vector<double>{0.5, -1.0, 4.0});
    CHECK(b.grad().to_vector<double>() == std::vector<double>{1.0, 2.0, 3.0});
    // A float64 0-dim tensor leaves a float32 tensor float32 (it ranks below dimensions).
    Tensor c = on(tensor({1.0, 2.0}).requires_grad_(), dev);
    Tensor s = on(scalar_tensor(3.0, kFloat64).requires_grad_(), dev);
    Tensor z = c * s;
    CHECK(z.dtype() == kFloat32);
    z.sum().backward();
    CHECK(s.grad().dtype() == kFloat64);
    CHECK(s.grad().item() == 3.0);
  }
}

TEST_CASE("storage-dtype tensors print, fill, and load into a module's float32 parameters") {
  Tensor h = tensor({1.5, -2.0}).to(kFloat16);
  CHECK(h.str().find("float16") != std::string::npos);
  CHECK(h.str().find("1.5") != std::string::npos);
  Tensor f = full({3}, 0.1, kBFloat16);
  CHECK(f.to_vector<double>()[0] == double(bfloat16_t::to_float(bfloat16_t::from_float(0.1f))));
  // load_state_dict converts as torch's copy_ does.
  nn::Linear lin(2, 1);
  Tensor w = tensor({{0.25, -0.5}}).to(kFloat16), b = tensor({3.0}).to(kBFloat16);
  lin.load_state_dict({{"weight", w}, {"bias", b}});
  CHECK(lin.named_parameters().size() == 2);
  CHECK(lin.state_dict()[0].second.dtype() == kFloat32);
  CHECK(lin.forward(tensor({{4.0, 2.0}})).item() == 1.0 - 1.0 + 3.0);
}

// A number beside a float16 or bfloat16 tensor is kept in float32 and the result rounded
// once (torch's rule for Python numbers): not rounded to 16 bits first, where 1e5 is
// float16's inf and 1/3 keeps 8 bits in bfloat16. The expected values: the definition
// written out with the conversions of tensor/half.h.
TEST_CASE("a number beside a 16-bit float tensor stays float32; the result is rounded once") {
  auto h = [](float v) { return half_t::to_float(half_t::from_float(v)); };
  auto b = [](float v) { return bfloat16_t::to_float(bfloat16_t::from_float(v)); };
  for (Device dev : test_devices()) {
    INFO(dev.str());
    auto f16 = [&](double v) { return on(full({2}, v, kFloat16), dev); };
    auto first = [](const Tensor& t) { return t.to(kFloat64).to_vector<double>()[0]; };
    CHECK((f16(1.0) / 1e5).dtype() == kFloat16);
    CHECK(first(f16(1.0) / 1e5) == h(1.0f / 1e5f));
    CHECK(first(f16(60000.0) / 1e5) == h(h(60000.0f) / 1e5f));
    CHECK(first(f16(INFINITY) / 1e5) == INFINITY);
    CHECK(first(f16(-60000.0) + 1e5) == h(h(-60000.0f) + 1e5f));
    CHECK(first(f16(1e-4) * 1e5) == h(h(1e-4f) * 1e5f));
    CHECK(first(1e5 - f16(60000.0)) == h(1e5f - h(60000.0f)));
    const std::vector<float> xs = {3.0f, -7.5f, 0.1f, 1000.0f};
    Tensor xb = on(from_vector(xs, {4}), dev).to(kBFloat16);
    std::vector<double> third = (xb * (1.0 / 3)).to_vector<double>();
    for (size_t i = 0; i < xs.size(); ++i) CHECK(third[i] == b(b(xs[i]) * float(1.0 / 3)));
    // In place likewise.
    Tensor a = f16(-60000.0);
    a.add_(1e5);
    CHECK(first(a) == h(h(-60000.0f) + 1e5f));
    Tensor d = f16(1.0);
    d.div_(1e5);
    CHECK(first(d) == h(1.0f / 1e5f));
    // masked_fill writes the number rounded once.
    CHECK(first(masked_fill(xb, on(ones({4}), dev) > 0, 1.0 / 3)) == b(float(1.0 / 3)));
    // A 0-dim tensor keeps its dtype with a number.
    CHECK((on(full({}, 3.0, kBFloat16), dev) * 0.5).dtype() == kBFloat16);
  }
}

TEST_CASE("mean and var of 16-bit floats are computed in float32 and rounded once") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    // A float16 sum of 100000 ones is inf; a bfloat16 sum of 1000 threes is 3008.
    CHECK(mean(on(ones({100000}, kFloat16), dev)).item<double>() == 1.0);
    CHECK(mean(on(full({70000}, 0.5, kFloat16), dev)).item<double>() == 0.5);
    CHECK(mean(on(full({1000}, 3.0, kBFloat16), dev)).item<double>() == 3.0);
    CHECK(var(on(ones({100000}, kFloat16), dev)).item<double>() == 0.0);
    CHECK(mean(on(ones({10}, kBFloat16), dev)).dtype() == kBFloat16);
    // Rows of bfloat16 values: each row's mean and variance are the float64 ones of the
    // same values, rounded once to bfloat16 (float32's error is far below bfloat16's ulp).
    manual_seed(3);
    Tensor x = randn({6, 500}).to(kBFloat16);
    std::vector<double> xv = x.to_vector<double>();
    std::vector<double> m = mean(on(x, dev), {1}).to_vector<double>(), v = var(on(x, dev), {1}).to_vector<double>();
    for (int r = 0; r < 6; ++r) {
      double s = 0, ss = 0;
      for (int j = 0; j < 500; ++j) s += xv[size_t(r * 500 + j)];
      const double mu = s / 500;
      for (int j = 0; j < 500; ++j) ss += (xv[size_t(r * 500 + j)] - mu) * (xv[size_t(r * 500 + j)] - mu);
      INFO("row " << r);
      CHECK(m[size_t(r)] == bfloat16_t::to_float(bfloat16_t::from_float(float(mu))));
      CHECK(v[size_t(r)] == bfloat16_t::to_float(bfloat16_t::from_float(float(ss / 499))));
    }
  }
}

TEST_CASE("integer numbers beside integer tensors are exact past 2^53; a number must fit the tensor's dtype") {
  const int64_t big = (int64_t(1) << 62) + 1, odd = (int64_t(1) << 53) + 1;
  for (Device dev : test_devices()) {
    INFO(dev.str());
    Tensor one = on(from_vector(std::vector<int64_t>{1}, {1}), dev);
    CHECK((one + big).to_vector<int64_t>() == std::vector<int64_t>{big + 1});
    CHECK((one * odd).to_vector<int64_t>() == std::vector<int64_t>{odd});
    CHECK((big - one).to_vector<int64_t>() == std::vector<int64_t>{big - 1});
    Tensor t = on(from_vector(std::vector<int64_t>{odd, odd - 1}, {2}), dev);
    CHECK((t == odd).to_vector<bool>() == std::vector<bool>{true, false});
    CHECK((t < odd).to_vector<bool>() == std::vector<bool>{false, true});
    CHECK(where(t == odd, t, big).to_vector<int64_t>() == std::vector<int64_t>{odd, big});
    Tensor i8 = on(tensor({1.0, 2.0}), dev).to(kInt8);
    CHECK((i8 + 100).to_vector<int64_t>() == std::vector<int64_t>{101, 102});
    CHECK_THROWS_MU(i8 + 300, "an op between a tensor and a number: value 300 does not fit in int8");
  }
}

TEST_CASE("clamp of an integer tensor: fractional or infinite bounds give float32, integer bounds must fit or bind nothing") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    Tensor x = on(from_vector(std::vector<int64_t>{0, 5, 10}, {3}), dev);
    Tensor f = clamp(x, 2.5, 7.5);
    CHECK(f.dtype() == kFloat32);
    CHECK(f.to_vector<double>() == std::vector<double>{2.5, 5.0, 7.5});
    CHECK(clamp(x, -INFINITY, INFINITY).to_vector<double>() == std::vector<double>{0.0, 5.0, 10.0});
    // A bound past the dtype's range on its own side binds nothing; past the other side
    // its values do not fit.
    CHECK(clamp(x, 0, 1e30).dtype() == kInt64);
    CHECK(clamp(x, 0, 1e30).to_vector<int64_t>() == std::vector<int64_t>{0, 5, 10});
    CHECK(clamp(x, -1e30, 3).to_vector<int64_t>() == std::vector<int64_t>{0, 3, 3});
    CHECK_THROWS_MU(clamp(x, 1e30, 2e30), "clamp: value 1e+30 does not fit in int64");
    Tensor i = clamp(x, 1, 7);
    CHECK(i.dtype() == kInt64);
    CHECK(i.to_vector<int64_t>() == std::vector<int64_t>{1, 5, 7});
    CHECK(clamp_max(x, 3).to_vector<int64_t>() == std::vector<int64_t>{0, 3, 3});
    Tensor i8 = on(tensor({0.0, 5.0}), dev).to(kInt8);
    CHECK_THROWS_MU(clamp_min(i8, 300), "clamp: value 300 does not fit in int8");
    CHECK(clamp_min(i8, 3).to_vector<int64_t>() == std::vector<int64_t>{3, 5});
  }
}
