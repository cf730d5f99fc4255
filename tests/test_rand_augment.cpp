// RandAugment (data/rand_augment.h) against properties derived without Pillow: the
// strength-0 form of each op is the identity; the lookup-table ops match loops over the
// pixels; translations, quarter and half turns and power-of-two shears move pixels where
// index arithmetic says; the enhance ops at factors with exact results; the magnitude table
// against the linspace formulas; the drawn ops replay; the batch form repeats for a seed
// whatever the thread count; and every bad input is refused with a message naming it.
#include <omp.h>

#include <array>
#include <map>

#include "data/rand_augment.h"
#include "helpers.h"

// The loops below that restate PIL's double arithmetic (autocontrast's v * scale + offset)
// must round the product before the sum, as Python does; a fused multiply-add moves some
// values across the truncation to the next integer.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

using namespace mu;
using data::AugmentOp;

namespace {

// A uint8 (H, W, C) image of uniform noise in [lo, hi].
std::vector<uint8_t> noise(int64_t H, int64_t W, int64_t C, uint64_t seed, int lo = 0, int hi = 255) {
  Generator gen(seed);
  std::vector<uint8_t> v(size_t(H * W * C));
  for (auto& x : v) x = uint8_t(lo + std::min(hi - lo, int(gen.uniform() * (hi - lo + 1))));
  return v;
}

std::vector<uint8_t> applied(AugmentOp op, double m, std::vector<uint8_t> image, int64_t H, int64_t W, int64_t C,
                             uint8_t fill = 0) {
  data::apply_augment_op(op, m, image.data(), H, W, C, fill);
  return image;
}

// Pixel (y, x) channel c of an (H, W, C) image.
inline uint8_t px(const std::vector<uint8_t>& im, int64_t W, int64_t C, int64_t y, int64_t x, int64_t c) {
  return im[size_t((y * W + x) * C + c)];
}

// The image built by want(y, x, c) -> value, for comparisons with one CHECK.
template <class F>
std::vector<uint8_t> build(int64_t H, int64_t W, int64_t C, F want) {
  std::vector<uint8_t> v;
  for (int64_t y = 0; y < H; ++y)
    for (int64_t x = 0; x < W; ++x)
      for (int64_t c = 0; c < C; ++c) v.push_back(uint8_t(want(y, x, c)));
  return v;
}

// uint8 tensors from and to byte vectors.
Tensor u8_tensor(const std::vector<uint8_t>& v, const Shape& shape) {
  Tensor t = empty(shape, kUInt8);
  REQUIRE(size_t(t.numel()) == v.size());
  std::copy(v.begin(), v.end(), t.data_ptr<uint8_t>());
  return t;
}
std::vector<uint8_t> u8_values(const Tensor& t) {
  Tensor c = t.contiguous();
  return std::vector<uint8_t>(c.data_ptr<uint8_t>(), c.data_ptr<uint8_t>() + c.numel());
}

const std::vector<AugmentOp> kAllOps = {
    AugmentOp::Identity,   AugmentOp::ShearX,    AugmentOp::ShearY,       AugmentOp::TranslateX, AugmentOp::TranslateY,
    AugmentOp::Rotate,     AugmentOp::Brightness, AugmentOp::Color,       AugmentOp::Contrast,   AugmentOp::Sharpness,
    AugmentOp::Posterize,  AugmentOp::Solarize,  AugmentOp::AutoContrast, AugmentOp::Equalize};

}  // namespace

TEST_CASE("op names are torchvision's, in its order") {
  const char* names[] = {"Identity",   "ShearX",   "ShearY",    "TranslateX", "TranslateY", "Rotate",       "Brightness",
                         "Color",      "Contrast", "Sharpness", "Posterize",  "Solarize",   "AutoContrast", "Equalize"};
  REQUIRE(kAllOps.size() == 14);
  for (size_t k = 0; k < kAllOps.size(); ++k) {
    CHECK(int(kAllOps[k]) == int(k));
    CHECK(std::string(data::augment_op_name(kAllOps[k])) == names[k]);
  }
}

TEST_CASE("every op at its neutral strength leaves the image unchanged") {
  for (int64_t C : {1, 3})
    for (auto [H, W] : {std::pair<int64_t, int64_t>{7, 7}, {6, 9}, {1, 4}}) {
      INFO(H << "x" << W << "x" << C);
      const std::vector<uint8_t> im = noise(H, W, C, uint64_t(H * 10 + W + C));
      // Shears, shifts and turns of 0 (translations truncate towards zero, turns are
      // modulo 360); enhance factor 1; all 8 bits; a threshold no value reaches.
      const std::vector<std::pair<AugmentOp, double>> neutral = {
          {AugmentOp::Identity, 0.0},    {AugmentOp::Identity, 123.0},  {AugmentOp::ShearX, 0.0},
          {AugmentOp::ShearY, -0.0},     {AugmentOp::TranslateX, 0.0},  {AugmentOp::TranslateX, 0.9},
          {AugmentOp::TranslateY, -0.9}, {AugmentOp::Rotate, 0.0},      {AugmentOp::Rotate, 360.0},
          {AugmentOp::Rotate, -720.0},   {AugmentOp::Brightness, 0.0},  {AugmentOp::Color, 0.0},
          {AugmentOp::Contrast, 0.0},    {AugmentOp::Sharpness, 0.0},   {AugmentOp::Posterize, 8.0},
          {AugmentOp::Solarize, 256.0},  {AugmentOp::Solarize, 1000.0}};
      for (const auto& [op, m] : neutral) {
        INFO(data::augment_op_name(op) << " " << m);
        CHECK(applied(op, m, im, H, W, C, 77) == im);
      }
    }
  // Color of a single channel, at any factor: the grey image is its own.
  const std::vector<uint8_t> g = noise(5, 6, 1, 3);
  CHECK(applied(AugmentOp::Color, 0.8, g, 5, 6, 1) == g);
  CHECK(applied(AugmentOp::Color, -1.0, g, 5, 6, 1) == g);
  // An image with no pixels is fine for every op.
  for (AugmentOp op : kAllOps) CHECK(applied(op, 0.5, {}, 0, 5, 3).empty());
}

TEST_CASE("posterize and solarize: per-value tables, the same in every channel") {
  const int64_t H = 9, W = 11, C = 3;
  const std::vector<uint8_t> im = noise(H, W, C, 1);
  for (int bits = 0; bits <= 8; ++bits) {
    INFO("bits " << bits);
    std::vector<uint8_t> want = im;
    // Keeping the top `bits` bits: clear the low 8 - bits.
    for (auto& v : want) v = uint8_t(v >> (8 - bits) << (8 - bits));
    CHECK(applied(AugmentOp::Posterize, bits, im, H, W, C) == want);
    // A fractional count is truncated, as torchvision's int(m).
    CHECK(applied(AugmentOp::Posterize, bits + 0.75, im, H, W, C) == want);
  }
  for (double t : {0.0, 1.0, 100.5, 128.0, 255.0, 255.5}) {
    INFO("threshold " << t);
    std::vector<uint8_t> want = im;
    for (auto& v : want)
      if (v >= t) v = uint8_t(255 - v);
    CHECK(applied(AugmentOp::Solarize, t, im, H, W, C) == want);
  }
}

TEST_CASE("autocontrast stretches each channel's range onto [0, 255]") {
  const int64_t H = 8, W = 10;
  for (int64_t C : {1, 3}) {
    // Channel c spans [20 + 10c, 150 + 20c]: each has its own range.
    std::vector<uint8_t> im = noise(H, W, C, 5, 0, 255);
    for (size_t i = 0; i < im.size(); ++i) {
      const int c = int(i % size_t(C));
      im[i] = uint8_t(20 + 10 * c + im[i] * (130 + 10 * c) / 255);
    }
    const std::vector<uint8_t> out = applied(AugmentOp::AutoContrast, 0, im, H, W, C);
    for (int64_t c = 0; c < C; ++c) {
      int lo = 255, hi = 0;
      for (int64_t p = 0; p < H * W; ++p) {
        lo = std::min<int>(lo, im[size_t(p * C + c)]);
        hi = std::max<int>(hi, im[size_t(p * C + c)]);
      }
      REQUIRE(hi > lo);
      // ImageOps.autocontrast's table: scale 255 / (hi - lo), offset -lo * scale,
      // int(v * scale + offset) clipped.
      const double scale = 255.0 / (hi - lo), offset = -lo * scale;
      int out_lo = 255, out_hi = 0;
      for (int64_t p = 0; p < H * W; ++p) {
        const int v = im[size_t(p * C + c)];
        const int want = std::clamp(int(v * scale + offset), 0, 255);
        CHECK(int(out[size_t(p * C + c)]) == want);
        out_lo = std::min<int>(out_lo, out[size_t(p * C + c)]);
        out_hi = std::max<int>(out_hi, out[size_t(p * C + c)]);
      }
      CHECK(out_lo == 0);
      CHECK(out_hi >= 254);
    }
  }
  // A constant channel is left as it is.
  std::vector<uint8_t> flat(4 * 4 * 3, 90);
  CHECK(applied(AugmentOp::AutoContrast, 0, flat, 4, 4, 3) == flat);
}

TEST_CASE("equalize: ImageOps.equalize's table from each channel's counts") {
  const int64_t H = 23, W = 31;
  for (int64_t C : {1, 3}) {
    const std::vector<uint8_t> im = noise(H, W, C, 8, 40, 120);
    const std::vector<uint8_t> out = applied(AugmentOp::Equalize, 0, im, H, W, C);
    for (int64_t c = 0; c < C; ++c) {
      // The counts below each value, and of the highest value present.
      std::array<int64_t, 257> below{};
      int top = 0;
      for (int64_t p = 0; p < H * W; ++p) {
        ++below[size_t(im[size_t(p * C + c)]) + 1];
        top = std::max<int>(top, im[size_t(p * C + c)]);
      }
      const int64_t top_count = below[size_t(top) + 1];
      for (size_t v = 1; v < below.size(); ++v) below[v] += below[v - 1];
      const int64_t step = (H * W - top_count) / 255;
      REQUIRE(step > 0);
      for (int64_t p = 0; p < H * W; ++p) {
        const uint8_t v = im[size_t(p * C + c)];
        CHECK(int64_t(out[size_t(p * C + c)]) == std::min<int64_t>(255, (step / 2 + below[v]) / step));
      }
    }
  }
  // Too few pixels for a step (fewer than 255 below the top value): unchanged.
  const std::vector<uint8_t> small = noise(10, 10, 3, 9);
  CHECK(applied(AugmentOp::Equalize, 0, small, 10, 10, 3) == small);
}

TEST_CASE("translations move the content by whole pixels and bring in the fill") {
  const int64_t H = 6, W = 9, C = 3;
  const std::vector<uint8_t> im = noise(H, W, C, 11);
  for (double m : {3.0, -2.0, 4.7, -4.7, 12.0}) {
    const int64_t k = int64_t(m);  // truncated towards zero
    INFO("shift " << m);
    auto shifted = [&](bool along_x) {
      return build(H, W, C, [&](int64_t y, int64_t x, int64_t c) {
        const int64_t sy = along_x ? y : y - k, sx = along_x ? x - k : x;
        return sy >= 0 && sy < H && sx >= 0 && sx < W ? px(im, W, C, sy, sx, c) : 7;
      });
    };
    CHECK(applied(AugmentOp::TranslateX, m, im, H, W, C, 7) == shifted(true));
    CHECK(applied(AugmentOp::TranslateY, m, im, H, W, C, 7) == shifted(false));
  }
}

TEST_CASE("rotations: quarter and half turns are index permutations") {
  for (int64_t C : {1, 3}) {
    // A square of odd side: 90 degrees counter-clockwise takes column n-1-y of row x to row
    // y (transpose, then flip top to bottom); -90 the other way.
    const int64_t n = 7;
    const std::vector<uint8_t> sq = noise(n, n, C, 12);
    auto ccw = build(n, n, C, [&](int64_t y, int64_t x, int64_t c) { return px(sq, n, C, x, n - 1 - y, c); });
    auto cw = build(n, n, C, [&](int64_t y, int64_t x, int64_t c) { return px(sq, n, C, n - 1 - x, y, c); });
    CHECK(applied(AugmentOp::Rotate, 90.0, sq, n, n, C) == ccw);
    CHECK(applied(AugmentOp::Rotate, -270.0, sq, n, n, C) == ccw);
    CHECK(applied(AugmentOp::Rotate, -90.0, sq, n, n, C) == cw);
    // Half a turn reverses both axes, on any shape.
    const int64_t H = 5, W = 8;
    const std::vector<uint8_t> im = noise(H, W, C, 13);
    auto half = build(H, W, C, [&](int64_t y, int64_t x, int64_t c) { return px(im, W, C, H - 1 - y, W - 1 - x, c); });
    CHECK(applied(AugmentOp::Rotate, 180.0, im, H, W, C) == half);
    CHECK(applied(AugmentOp::Rotate, -180.0, im, H, W, C) == half);
    // A quarter turn of a 5 x 8 image about its centre (4, 2.5): output pixel centre
    // (x + 1/2, y + 1/2) reads input (cx + cy - (y + 1/2), x + 1/2 - cx + cy), all multiples
    // of 1/2, so the nearest pixel is the floor; outside the image, the fill.
    auto quarter = build(H, W, C, [&](int64_t y, int64_t x, int64_t c) {
      const double sx = 4.0 + 2.5 - (double(y) + 0.5), sy = double(x) + 0.5 - 4.0 + 2.5;
      const int64_t ix = int64_t(std::floor(sx)), iy = int64_t(std::floor(sy));
      return ix >= 0 && ix < W && iy >= 0 && iy < H ? px(im, W, C, iy, ix, c) : 9;
    });
    CHECK(applied(AugmentOp::Rotate, 90.0, im, H, W, C, 9) == quarter);
  }
}

TEST_CASE("shears by powers of two: output (x, y) reads the nearest pixel to (x + m y, y) or (x, y + m x)") {
  const int64_t H = 7, W = 10, C = 3;
  const std::vector<uint8_t> im = noise(H, W, C, 14);
  for (double m : {0.25, -0.5, 0.125}) {
    INFO("m " << m);
    // Pixel centres (x + 1/2, y + 1/2) map to exact binary fractions, never on a boundary.
    auto sheared = [&](bool along_x) {
      return build(H, W, C, [&](int64_t y, int64_t x, int64_t c) {
        const double cx = double(x) + 0.5, cy = double(y) + 0.5;
        const int64_t ix = int64_t(std::floor(along_x ? cx + m * cy : cx));
        const int64_t iy = int64_t(std::floor(along_x ? cy : cy + m * cx));
        return ix >= 0 && ix < W && iy >= 0 && iy < H ? px(im, W, C, iy, ix, c) : 3;
      });
    };
    CHECK(applied(AugmentOp::ShearX, m, im, H, W, C, 3) == sheared(true));
    CHECK(applied(AugmentOp::ShearY, m, im, H, W, C, 3) == sheared(false));
  }
}

TEST_CASE("enhance ops at factors with exact results") {
  const int64_t H = 6, W = 7, C = 3;
  const std::vector<uint8_t> im = noise(H, W, C, 15);
  // Brightness: factor 1/2 halves (truncating), 2 doubles (clipping), 0 is black.
  std::vector<uint8_t> half = im, twice = im;
  for (auto& v : half) v = uint8_t(v / 2);
  for (auto& v : twice) v = uint8_t(std::min(255, 2 * v));
  CHECK(applied(AugmentOp::Brightness, -0.5, im, H, W, C) == half);
  CHECK(applied(AugmentOp::Brightness, 1.0, im, H, W, C) == twice);
  CHECK(applied(AugmentOp::Brightness, -1.0, im, H, W, C) == std::vector<uint8_t>(im.size(), 0));
  // Color at factor 0: the grey level (R 0.299 + G 0.587 + B 0.114 in 16-bit fixed point)
  // in every channel; a grey image (R = G = B) is unchanged at any factor.
  auto grey = build(H, W, C, [&](int64_t y, int64_t x, int64_t) {
    return (px(im, W, C, y, x, 0) * 19595 + px(im, W, C, y, x, 1) * 38470 + px(im, W, C, y, x, 2) * 7471 + 32768) >> 16;
  });
  CHECK(applied(AugmentOp::Color, -1.0, im, H, W, C) == grey);
  CHECK(applied(AugmentOp::Color, 0.7, grey, H, W, C) == grey);
  // Contrast at factor 0: flat at the rounded mean grey level; a flat image stays.
  int64_t sum = 0;
  for (size_t i = 0; i < grey.size(); i += 3) sum += grey[i];
  const int mean = int(std::floor(double(sum) / double(H * W) + 0.5));
  CHECK(applied(AugmentOp::Contrast, -1.0, im, H, W, C) == std::vector<uint8_t>(im.size(), uint8_t(mean)));
  const std::vector<uint8_t> flat(im.size(), 99);
  CHECK(applied(AugmentOp::Contrast, 0.9, flat, H, W, C) == flat);
  // Sharpness at factor 0: the smoothed image, (neighbours + 5 centre) / 13 rounded
  // (never a tie: 13 is odd), with the border rows and columns as they were.
  auto smooth = build(H, W, C, [&](int64_t y, int64_t x, int64_t c) {
    if (y == 0 || x == 0 || y == H - 1 || x == W - 1) return int(px(im, W, C, y, x, c));
    int s = 4 * px(im, W, C, y, x, c);
    for (int64_t dy = -1; dy <= 1; ++dy)
      for (int64_t dx = -1; dx <= 1; ++dx) s += px(im, W, C, y + dy, x + dx, c);
    return (2 * s + 13) / 26;
  });
  CHECK(applied(AugmentOp::Sharpness, -1.0, im, H, W, C) == smooth);
  // Under 3 rows there is no smoothing: unchanged at any factor.
  const std::vector<uint8_t> thin = noise(2, 9, 3, 16);
  CHECK(applied(AugmentOp::Sharpness, 0.9, thin, 2, 9, 3) == thin);
}

TEST_CASE("the magnitude table follows torchvision's linspace formulas") {
  const int64_t n = 31, H = 17, W = 23;
  auto lin = [&](double a, double b, int64_t i) { return a + (b - a) * double(i) / double(n - 1); };
  auto close = [](double got, double want) { return std::abs(got - want) <= 1e-6 * std::max(1.0, std::abs(want)); };
  for (int64_t i = 0; i < n; ++i) {
    INFO("bin " << i);
    CHECK(close(data::rand_augment_magnitude(AugmentOp::ShearX, i, n, H, W), lin(0, 0.3, i)));
    CHECK(close(data::rand_augment_magnitude(AugmentOp::ShearY, i, n, H, W), lin(0, 0.3, i)));
    CHECK(close(data::rand_augment_magnitude(AugmentOp::TranslateX, i, n, H, W), lin(0, 150.0 / 331 * W, i)));
    CHECK(close(data::rand_augment_magnitude(AugmentOp::TranslateY, i, n, H, W), lin(0, 150.0 / 331 * H, i)));
    CHECK(close(data::rand_augment_magnitude(AugmentOp::Rotate, i, n, H, W), lin(0, 30, i)));
    for (AugmentOp op : {AugmentOp::Brightness, AugmentOp::Color, AugmentOp::Contrast, AugmentOp::Sharpness})
      CHECK(close(data::rand_augment_magnitude(op, i, n, H, W), lin(0, 0.9, i)));
    // Multiples of 8.5 from 255 down: exact.
    CHECK(data::rand_augment_magnitude(AugmentOp::Solarize, i, n, H, W) == 255.0 - 8.5 * double(i));
    for (AugmentOp op : {AugmentOp::Identity, AugmentOp::AutoContrast, AugmentOp::Equalize})
      CHECK(data::rand_augment_magnitude(op, i, n, H, W) == 0.0);
    // 8 - round(i / 7.5): bins 0-3 keep 8 bits, 4-11 7, 12-18 6, 19-26 5, 27-30 4.
    const int bits = i < 4 ? 8 : i < 12 ? 7 : i < 19 ? 6 : i < 27 ? 5 : 4;
    CHECK(data::rand_augment_magnitude(AugmentOp::Posterize, i, n, H, W) == bits);
  }
  // The ends are the linspace ends; with 9 bins, i / 2 lands on halves, rounded to even:
  // bins 1, 3, 5, 7 give 8 - 0, 8 - 2, 8 - 2, 8 - 4.
  CHECK(data::rand_augment_magnitude(AugmentOp::Rotate, 1, 2, 9, 9) == 30.0);
  CHECK(data::rand_augment_magnitude(AugmentOp::Solarize, 1, 2, 9, 9) == 0.0);
  const std::map<int64_t, double> nine = {{0, 8}, {1, 8}, {2, 7}, {3, 6}, {4, 6}, {5, 6}, {6, 5}, {7, 4}, {8, 4}};
  for (const auto& [i, bits] : nine) CHECK(data::rand_augment_magnitude(AugmentOp::Posterize, i, 9, 9, 9) == bits);
}

TEST_CASE("rand_augment_image: draws every op, signs half the signed ones, and replays") {
  const int64_t H = 12, W = 15, C = 3;
  const std::vector<uint8_t> im = noise(H, W, C, 17);
  data::RandAugmentOptions o;
  o.num_ops = 2;
  o.magnitude = 15;
  std::map<AugmentOp, int> count;
  int negative = 0, signed_ops = 0;
  for (uint64_t seed = 0; seed < 300; ++seed) {
    std::vector<uint8_t> out = im;
    Generator gen(seed);
    std::vector<std::pair<AugmentOp, double>> ops;
    data::rand_augment_image(out.data(), H, W, C, o, gen, &ops);
    REQUIRE(ops.size() == 2);
    std::vector<uint8_t> replay = im;
    for (const auto& [op, m] : ops) {
      ++count[op];
      // The table's magnitude, negated for some of the signed ops.
      const double table = data::rand_augment_magnitude(op, 15, 31, H, W);
      CHECK((m == table || m == -table));
      if (m < 0) ++negative;
      const bool has_sign = op != AugmentOp::Identity && op != AugmentOp::Posterize && op != AugmentOp::Solarize &&
                            op != AugmentOp::AutoContrast && op != AugmentOp::Equalize;
      signed_ops += has_sign;
      if (!has_sign) CHECK(m >= 0);
      data::apply_augment_op(op, m, replay.data(), H, W, C, o.fill);
    }
    CHECK(replay == out);
    // The same seed draws the same ops.
    std::vector<uint8_t> again = im;
    Generator gen2(seed);
    data::rand_augment_image(again.data(), H, W, C, o, gen2);
    CHECK(again == out);
  }
  // 600 draws over 14 ops (about 43 each), and about half the signed ones negative.
  CHECK(count.size() == 14);
  for (const auto& [op, k] : count) CHECK(k > 15);
  CHECK(negative > signed_ops / 2 - 60);
  CHECK(negative < signed_ops / 2 + 60);
  // No ops: unchanged.
  o.num_ops = 0;
  std::vector<uint8_t> same = im;
  Generator gen(1);
  std::vector<std::pair<AugmentOp, double>> ops = {{AugmentOp::Rotate, 1.0}};
  data::rand_augment_image(same.data(), H, W, C, o, gen, &ops);
  CHECK(same == im);
  CHECK(ops.empty());
}

TEST_CASE("rand_augment on a batch: per-sample streams, the same on any thread count") {
  const int64_t B = 12, H = 10, W = 13;
  for (int64_t C : {1, 3}) {
    const std::vector<uint8_t> pixels = noise(B * H, W, C, 18);
    Tensor batch = u8_tensor(pixels, {B, H, W, C});
    data::RandAugmentOptions o;
    o.num_ops = 2;
    o.magnitude = 15;
    const int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    Tensor one = data::rand_augment(batch, o, 42);
    omp_set_num_threads(2);
    Tensor two = data::rand_augment(batch, o, 42);
    omp_set_num_threads(threads);
    REQUIRE(one.shape() == batch.shape());
    CHECK(one.dtype() == kUInt8);
    CHECK(one.to_vector<int64_t>() == two.to_vector<int64_t>());
    CHECK(u8_values(batch) == pixels);  // the input is left alone
    // Sample b is rand_augment_image with a generator seeded by mix_seed(42, b).
    const std::vector<uint8_t> got = u8_values(one);
    int64_t changed = 0;
    for (int64_t b = 0; b < B; ++b) {
      std::vector<uint8_t> im(pixels.begin() + b * H * W * C, pixels.begin() + (b + 1) * H * W * C);
      Generator gen(mix_seed(42, uint64_t(b)));
      data::rand_augment_image(im.data(), H, W, C, o, gen);
      CHECK(std::equal(im.begin(), im.end(), got.begin() + b * H * W * C));
      changed += !std::equal(im.begin(), im.end(), pixels.begin() + b * H * W * C);
    }
    CHECK(changed > B / 2);
    // Another seed gives another batch; a non-contiguous view is read as its values.
    CHECK(data::rand_augment(batch, o, 43).to_vector<int64_t>() != one.to_vector<int64_t>());
    Tensor strided = u8_tensor(pixels, {H, B, W, C}).transpose(0, 1);
    CHECK(data::rand_augment(strided, o, 42).to_vector<int64_t>() ==
          data::rand_augment(strided.contiguous(), o, 42).to_vector<int64_t>());
  }
  // An empty batch comes back empty.
  CHECK(data::rand_augment(zeros({0, 4, 4, 3}, kUInt8), {}, 1).numel() == 0);
}

TEST_CASE("RandAugment refuses bad input with messages naming it") {
  Tensor x = zeros({2, 4, 4, 3}, kUInt8);
  data::RandAugmentOptions o;
  CHECK_THROWS_MU(data::rand_augment(zeros({2, 4, 4, 3}), o, 0), "images must be uint8, got float32");
  CHECK_THROWS_MU(data::rand_augment(zeros({4, 4, 3}, kUInt8), o, 0), "expected images (B, H, W, C), got shape [4, 4, 3]");
  CHECK_THROWS_MU(data::rand_augment(zeros({2, 4, 4, 2}, kUInt8), o, 0), "images must have 1 or 3 channels, got 2");
  CHECK_THROWS_MU(data::rand_augment(Tensor(), o, 0), "undefined");
  if (cuda::device_count() > 0)
    CHECK_THROWS_MU(data::rand_augment(x.to(Device::cuda(0)), o, 0), "images must be on the CPU, got cuda:0");
  o.num_ops = -1;
  CHECK_THROWS_MU(data::rand_augment(x, o, 0), "num_ops must be non-negative, got -1");
  o = {};
  o.magnitude = 31;
  CHECK_THROWS_MU(data::rand_augment(x, o, 0), "magnitude 31 is outside [0, 30] for num_bins 31");
  o.magnitude = -1;
  CHECK_THROWS_MU(data::rand_augment(x, o, 0), "magnitude -1 is outside [0, 30]");
  o = {};
  o.num_bins = 1;
  o.magnitude = 0;
  CHECK_THROWS_MU(data::rand_augment(x, o, 0), "num_bins must be at least 2, got 1");
  CHECK_THROWS_MU(data::rand_augment_magnitude(AugmentOp::Rotate, 5, 5, 4, 4), "magnitude 5 is outside [0, 4]");
  CHECK_THROWS_MU(data::rand_augment_magnitude(AugmentOp(14), 0, 5, 4, 4), "op 14 is not a AugmentOp");

  std::vector<uint8_t> im(4 * 4 * 3);
  CHECK_THROWS_MU(data::apply_augment_op(AugmentOp::Rotate, 1, im.data(), 4, 4, 2), "1 or 3 channels, got 2");
  CHECK_THROWS_MU(data::apply_augment_op(AugmentOp::Rotate, 1, im.data(), -4, 4, 3), "non-negative, got -4x4");
  CHECK_THROWS_MU(data::apply_augment_op(AugmentOp::Rotate, 1, nullptr, 4, 4, 3), "null image pointer for a 4x4x3");
  CHECK_THROWS_MU(data::apply_augment_op(AugmentOp::Rotate, std::nan(""), im.data(), 4, 4, 3),
                  "magnitude must be a finite number, got nan");
  CHECK_THROWS_MU(data::apply_augment_op(AugmentOp::Posterize, 9, im.data(), 4, 4, 3), "Posterize keeps 0 to 8 bits, got 9");
  CHECK_THROWS_MU(data::apply_augment_op(AugmentOp::Posterize, -1, im.data(), 4, 4, 3), "got -1");
  CHECK_THROWS_MU(data::apply_augment_op(AugmentOp(99), 0, im.data(), 4, 4, 3), "op 99 is not a AugmentOp");
  CHECK_THROWS_MU(data::augment_op_name(AugmentOp(-1)), "op -1 is not a AugmentOp");
  Generator gen(0);
  CHECK_THROWS_MU(data::rand_augment_image(im.data(), 4, 4, 3, o, gen), "num_bins must be at least 2, got 1");
}
