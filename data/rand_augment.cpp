#include "data/rand_augment.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstring>
#include <string>

#include "tensor/checked.h"
#include "tensor/error.h"
#include "tensor/option_checks.h"

// Pillow rounds after every product and sum (its C is built for baseline x86-64, without
// fused multiply-add), and Python does the same for torchvision's double arithmetic; a
// fused a*b + c here would round once and move pixels across a truncation boundary.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace mu::data {

namespace {

constexpr int64_t kOpCount = 14;

const char* const kOpNames[kOpCount] = {"Identity",   "ShearX",     "ShearY", "TranslateX", "TranslateY",
                                        "Rotate",     "Brightness", "Color",  "Contrast",   "Sharpness",
                                        "Posterize",  "Solarize",   "AutoContrast", "Equalize"};

void check_op(AugmentOp op, const char* where) {
  check_enum(where, "op", op, AugmentOp::Equalize, "AugmentOp",
             "Identity, ShearX, ShearY, TranslateX, TranslateY, Rotate, Brightness, Color, Contrast, Sharpness, "
             "Posterize, Solarize, AutoContrast, Equalize");
}

// The ops torchvision negates with probability 1/2.
bool is_signed(AugmentOp op) {
  switch (op) {
    case AugmentOp::ShearX:
    case AugmentOp::ShearY:
    case AugmentOp::TranslateX:
    case AugmentOp::TranslateY:
    case AugmentOp::Rotate:
    case AugmentOp::Brightness:
    case AugmentOp::Color:
    case AugmentOp::Contrast:
    case AugmentOp::Sharpness:
      return true;
    default:
      return false;
  }
}

// The image's byte count, with the sides and channels checked.
int64_t check_image(const uint8_t* image, int64_t H, int64_t W, int64_t C, const char* where) {
  MU_CHECK(H >= 0 && W >= 0, where, ": the image sides must be non-negative, got ", H, "x", W);
  MU_CHECK(C == 1 || C == 3, where, ": images must have 1 or 3 channels, got ", C);
  const int64_t n = checked_mul(checked_mul(H, W, where, ": image size"), C, where, ": image size");
  MU_CHECK(image != nullptr || n == 0, where, ": a null image pointer for a ", H, "x", W, "x", C, " image");
  return n;
}

void check_options(const RandAugmentOptions& o, const char* where) {
  MU_CHECK(o.num_ops >= 0, where, ": num_ops must be non-negative, got ", o.num_ops);
  MU_CHECK(o.num_bins >= 2, where, ": num_bins must be at least 2, got ", o.num_bins);
  MU_CHECK(o.magnitude >= 0 && o.magnitude < o.num_bins, where, ": magnitude ", o.magnitude, " is outside [0, ",
           o.num_bins - 1, "] for num_bins ", o.num_bins);
}

// ---- Python's arithmetic, as torchvision and PIL's Python code use it

// math.radians and math.degrees: a product with pi/180 (180/pi), each constant computed once.
constexpr double kPi = 3.14159265358979323846;
constexpr double kDegToRad = kPi / 180.0, kRadToDeg = 180.0 / kPi;

// x % 360.0 for a float x: fmod, moved into [0, 360) when it comes out negative (the sign
// of the divisor), and +0 for a zero remainder.
double python_mod360(double x) {
  double r = std::fmod(x, 360.0);
  if (r == 0.0) return 0.0;
  return r < 0 ? r + 360.0 : r;
}

// round(v, 15): v rounded to 15 decimal places and read back. to_chars rounds the exact
// binary value correctly, as CPython's dtoa does, and neither depends on the locale.
double python_round15(double v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::fixed, 15);
  MU_CHECK(ec == std::errc(), "rand_augment: cannot format ", v);
  double r = 0;
  std::from_chars(buf, end, r);
  return r;
}

// ---- Geometry: PIL's Image.transform(size, AFFINE, a, NEAREST, fillcolor=fill)

// An inverse affine map in PIL's order: output point (x, y) reads input point
// (a0 x + a1 y + a2, a3 x + a4 y + a5), in continuous coordinates where pixel (i, j) covers
// [i, i+1) x [j, j+1), so its centre is (i + 0.5, j + 0.5).
using Affine = std::array<double, 6>;

// torchvision's _get_inverse_affine_matrix(center, angle, translate, scale = 1, shear) for
// PIL images, operation for operation: the inverse of T · C · R(angle) · SHy · SHx · C^-1
// with shears (sx, sy) in degrees, about `center` (in pixels from the top-left corner).
Affine torchvision_inverse_affine(double cx, double cy, double angle, double tx, double ty, double shear_x,
                                  double shear_y) {
  const double rot = angle * kDegToRad, sx = shear_x * kDegToRad, sy = shear_y * kDegToRad;
  const double a = std::cos(rot - sy) / std::cos(sy);
  const double b = -std::cos(rot - sy) * std::tan(sx) / std::cos(sy) - std::sin(rot);
  const double c = std::sin(rot - sy) / std::cos(sy);
  const double d = -std::sin(rot - sy) * std::tan(sx) / std::cos(sy) + std::cos(rot);
  // The rotation-shear part has determinant 1, so its inverse is the adjugate; scale 1
  // divides nothing.
  Affine m = {d, -b, 0.0, -c, a, 0.0};
  m[2] += m[0] * (-cx - tx) + m[1] * (-cy - ty);
  m[5] += m[3] * (-cx - tx) + m[4] * (-cy - ty);
  m[2] += cx;
  m[5] += cy;
  return m;
}

// PIL's Image.rotate(degrees, NEAREST, expand=False) matrix for the general case: about the
// centre (W/2, H/2), with the sine and cosine rounded to 15 decimals (so that right angles
// give exact zeros).
Affine pil_rotate_matrix(double degrees_mod360, int64_t H, int64_t W) {
  const double angle = -(degrees_mod360 * kDegToRad);
  Affine m = {python_round15(std::cos(angle)), python_round15(std::sin(angle)), 0.0,
              python_round15(-std::sin(angle)), python_round15(std::cos(angle)), 0.0};
  const double cx = double(W) / 2.0, cy = double(H) / 2.0;
  const double x = -cx, y = -cy;
  m[2] = m[0] * x + m[1] * y + m[2];
  m[5] = m[3] * x + m[4] * y + m[5];
  m[2] += cx;
  m[5] += cy;
  return m;
}

// PIL's COORD: the input index a coordinate falls in, or -1 (outside) for any negative
// one, where plain truncation would send (-1, 0) to 0. Written as an inside test on the
// double, which also keeps coordinates beyond the int range outside.
inline bool coord(double v, int64_t size, int64_t& index) {
  if (!(v >= 0.0 && v < double(size))) return false;
  index = int64_t(v);
  return true;
}

// dst (filled with `fill` beforehand) = src mapped through `a` with nearest-neighbour
// sampling, as Pillow's ImagingTransformAffine does it. Three paths, as there:
//  - no rotation or shear terms (a1 = a3 = 0): per-axis tables of truncated coordinates,
//    stepping a0 (a4) from the first pixel centre (PIL copies the columns between the first
//    and last inside one; with a0 != 0 those are exactly the inside ones, as here);
//  - all four corners within +-32768: 16.16 fixed point, each coefficient rounded to the
//    nearest 1/65536 and the pixel index the integer part (an arithmetic shift, so it
//    floors negatives), stepped from the first pixel centre in exact integer sums;
//  - otherwise doubles accumulated step by step from the first pixel centre.
// The fixed-point rounding is why this is written out rather than computed as
// floor(a0 (x + 1/2) + a1 (y + 1/2) + a2): near a pixel boundary the two disagree.
void pil_affine_nearest(const uint8_t* src, uint8_t* dst, int64_t H, int64_t W, int64_t C, const Affine& a) {
  auto put = [&](int64_t y, int64_t x, int64_t yi, int64_t xi) {
    std::memcpy(dst + (y * W + x) * C, src + (yi * W + xi) * C, size_t(C));
  };
  if (a[1] == 0 && a[3] == 0) {
    std::vector<int64_t> xin(size_t(W), -1);
    double xo = a[2] + a[0] * 0.5;
    for (int64_t x = 0; x < W; ++x, xo += a[0]) {
      int64_t i;
      if (coord(xo, W, i)) xin[size_t(x)] = i;
    }
    double yo = a[5] + a[4] * 0.5;
    for (int64_t y = 0; y < H; ++y, yo += a[4]) {
      int64_t yi;
      if (!coord(yo, H, yi)) continue;
      for (int64_t x = 0; x < W; ++x)
        if (xin[size_t(x)] >= 0) put(y, x, yi, xin[size_t(x)]);
    }
    return;
  }
  auto fits_fixed = [&](double x, double y) {
    return std::fabs(x * a[0] + y * a[1] + a[2]) < 32768.0 && std::fabs(x * a[3] + y * a[4] + a[5]) < 32768.0;
  };
  const double w = double(W), h = double(H);
  if (fits_fixed(0, 0) && fits_fixed(w, h) && fits_fixed(0, h) && fits_fixed(w, 0)) {
    // PIL's FIX: v * 2^16 rounded half up (the floor of v * 2^16 + 1/2).
    auto fix = [](double v) { return int64_t(std::floor(v * 65536.0 + 0.5)); };
    const int64_t a0 = fix(a[0]), a1 = fix(a[1]), a3 = fix(a[3]), a4 = fix(a[4]);
    const int64_t a2 = fix(a[2] + a[1] * 0.5 + a[0] * 0.5), a5 = fix(a[5] + a[4] * 0.5 + a[3] * 0.5);
    for (int64_t y = 0; y < H; ++y) {
      // PIL adds a1 (a4) once per row and a0 (a3) once per pixel in int: the same sums,
      // which the corner test keeps far from overflowing.
      int64_t xx = a2 + y * a1, yy = a5 + y * a4;
      for (int64_t x = 0; x < W; ++x, xx += a0, yy += a3) {
        const int64_t xi = xx >> 16, yi = yy >> 16;
        if (xi >= 0 && xi < W && yi >= 0 && yi < H) put(y, x, yi, xi);
      }
    }
    return;
  }
  double xo = a[2] + a[1] * 0.5 + a[0] * 0.5, yo = a[5] + a[4] * 0.5 + a[3] * 0.5;
  for (int64_t y = 0; y < H; ++y, xo += a[1], yo += a[4]) {
    double xx = xo, yy = yo;
    for (int64_t x = 0; x < W; ++x, xx += a[0], yy += a[3]) {
      int64_t xi, yi;
      if (coord(xx, W, xi) && coord(yy, H, yi)) put(y, x, yi, xi);
    }
  }
}

// Applies `a` to the image in place, pixels from outside becoming `fill`.
void affine_in_place(uint8_t* image, int64_t H, int64_t W, int64_t C, const Affine& a, uint8_t fill) {
  const size_t n = size_t(H * W * C);
  std::vector<uint8_t> src(image, image + n);
  std::memset(image, fill, n);
  pil_affine_nearest(src.data(), image, H, W, C, a);
}

// PIL's rotate, with its shortcuts: 0 (mod 360) leaves the image as it is, 180 and, on a
// square image, 90 and 270 are exact transpositions (which the general matrix, thanks to
// its rounded sine and cosine, reproduces too).
void rotate(uint8_t* image, int64_t H, int64_t W, int64_t C, double degrees, uint8_t fill) {
  const double angle = python_mod360(degrees);
  if (angle == 0.0) return;
  const bool half_turn = angle == 180.0, quarter = (angle == 90.0 || angle == 270.0) && H == W;
  if (!half_turn && !quarter) {
    affine_in_place(image, H, W, C, pil_rotate_matrix(angle, H, W), fill);
    return;
  }
  const std::vector<uint8_t> src(image, image + H * W * C);
  for (int64_t y = 0; y < H; ++y)
    for (int64_t x = 0; x < W; ++x) {
      // The input pixel (row, column) that lands on output (y, x): half a turn reverses both
      // axes; a quarter turn counter-clockwise brings column W-1-y of row x to row y.
      const int64_t r = half_turn ? H - 1 - y : angle == 90.0 ? x : H - 1 - x;
      const int64_t c = half_turn ? W - 1 - x : angle == 90.0 ? W - 1 - y : y;
      std::memcpy(image + (y * W + x) * C, src.data() + (r * W + c) * C, size_t(C));
    }
}

// ---- ImageEnhance: Image.blend(degenerate, image, factor)

// Pillow's ImagingBlend into `image`: out = degenerate + alpha (image - degenerate) in
// float, alpha the factor narrowed to float; for alpha in [0, 1] truncated, otherwise
// clipped to [0, 255] first.
void blend(const uint8_t* degenerate, uint8_t* image, int64_t n, double factor) {
  const float alpha = float(factor);
  if (alpha == 0.0f) {
    if (n > 0) std::memcpy(image, degenerate, size_t(n));  // an empty image may have null buffers
    return;
  }
  if (alpha == 1.0f) return;
  const bool inside = alpha >= 0.0f && alpha <= 1.0f;
  for (int64_t i = 0; i < n; ++i) {
    const int d = degenerate[i];
    const float t = float(d) + alpha * float(int(image[i]) - d);
    // Between the two values for alpha in [0, 1], so only the extrapolation clips.
    image[i] = inside ? uint8_t(t) : t <= 0.0f ? 0 : t >= 255.0f ? 255 : uint8_t(t);
  }
}

// PIL's "L" conversion of an RGB pixel: ITU-R 601-2 luma in 16-bit fixed point, rounded.
inline uint8_t luma(const uint8_t* rgb) {
  return uint8_t((uint32_t(rgb[0]) * 19595 + uint32_t(rgb[1]) * 38470 + uint32_t(rgb[2]) * 7471 + 0x8000) >> 16);
}

// ImageFilter.SMOOTH as Pillow's 3x3 filter computes it: weights 1/13 and, at the centre,
// 5/13 as floats, summed row by row (the row below first) onto 0.5, then truncated and
// clipped; the first and last rows and columns keep the image's values, and an image
// under 3 pixels on a side is copied unchanged.
void smooth(const uint8_t* src, uint8_t* dst, int64_t H, int64_t W, int64_t C) {
  if (H * W * C == 0) return;  // nothing to copy (and memcpy must not see null buffers)
  std::memcpy(dst, src, size_t(H * W * C));
  if (H < 3 || W < 3) return;
  const float k1 = 1.0f / 13.0f, k5 = 5.0f / 13.0f;
  const int64_t row = W * C;
  for (int64_t y = 1; y < H - 1; ++y)
    for (int64_t i = y * row + C; i < (y + 1) * row - C; ++i) {
      const uint8_t *below = src + i + row, *at = src + i, *above = src + i - row;
      float ss = 0.5f;
      ss += float(below[-C]) * k1 + float(below[0]) * k1 + float(below[C]) * k1;
      ss += float(at[-C]) * k1 + float(at[0]) * k5 + float(at[C]) * k1;
      ss += float(above[-C]) * k1 + float(above[0]) * k1 + float(above[C]) * k1;
      dst[i] = ss <= 0.0f ? 0 : ss >= 255.0f ? 255 : uint8_t(ss);
    }
}

void enhance(AugmentOp op, double factor, uint8_t* image, int64_t H, int64_t W, int64_t C) {
  const int64_t pixels = H * W, n = pixels * C;
  std::vector<uint8_t> degenerate(size_t(n), 0);  // Brightness blends with black
  if (op == AugmentOp::Color) {
    // The grey image in every channel; a grey image is its own.
    if (C == 1) return;
    for (int64_t p = 0; p < pixels; ++p) std::fill_n(degenerate.data() + p * 3, 3, luma(image + p * 3));
  } else if (op == AugmentOp::Contrast) {
    // A flat image at the mean grey level: ImageStat's mean of the "L" histogram (an exact
    // integer sum over the count, in double), rounded half up.
    if (pixels == 0) return;
    int64_t sum = 0;
    for (int64_t p = 0; p < pixels; ++p) sum += C == 1 ? image[p] : luma(image + p * 3);
    const uint8_t mean = uint8_t(int64_t(double(sum) / double(pixels) + 0.5));
    std::fill(degenerate.begin(), degenerate.end(), mean);
  } else if (op == AugmentOp::Sharpness) {
    smooth(image, degenerate.data(), H, W, C);
  }
  blend(degenerate.data(), image, n, factor);
}

// ---- ImageOps: per-channel lookup tables

using Lut = std::array<uint8_t, 256>;
using Histogram = std::array<int64_t, 256>;

void apply_luts(uint8_t* image, int64_t pixels, int64_t C, const std::vector<Lut>& luts) {
  for (int64_t p = 0; p < pixels; ++p)
    for (int64_t c = 0; c < C; ++c) image[p * C + c] = luts[size_t(c)][image[p * C + c]];
}

void apply_lut(uint8_t* image, int64_t pixels, int64_t C, const Lut& lut) {
  apply_luts(image, pixels, C, std::vector<Lut>(size_t(C), lut));
}

std::vector<Histogram> histograms(const uint8_t* image, int64_t pixels, int64_t C) {
  std::vector<Histogram> h(size_t(C), Histogram{});
  for (int64_t p = 0; p < pixels; ++p)
    for (int64_t c = 0; c < C; ++c) ++h[size_t(c)][image[p * C + c]];
  return h;
}

Lut identity_lut() {
  Lut lut;
  for (int i = 0; i < 256; ++i) lut[size_t(i)] = uint8_t(i);
  return lut;
}

// ImageOps.autocontrast(cutoff=0): the channel's [lo, hi] stretched onto [0, 255] by
// int(i * scale + offset) in double, clipped; a channel of one value is left alone.
Lut autocontrast_lut(const Histogram& h) {
  int lo = 0, hi = 255;
  while (lo < 255 && h[size_t(lo)] == 0) ++lo;
  while (hi > 0 && h[size_t(hi)] == 0) --hi;
  if (hi <= lo) return identity_lut();
  const double scale = 255.0 / double(hi - lo), offset = double(-lo) * scale;
  Lut lut;
  for (int i = 0; i < 256; ++i) {
    // Python's int() truncates towards zero; negatives then clip to 0 either way.
    const double v = std::trunc(double(i) * scale + offset);
    lut[size_t(i)] = uint8_t(std::clamp(v, 0.0, 255.0));
  }
  return lut;
}

// ImageOps.equalize: step = (pixels - count of the highest value present) // 255; value i
// maps to (step // 2 + pixels below i) // step, which Pillow's table conversion clips at
// 255. A channel with one value, or a step of 0, is left alone.
Lut equalize_lut(const Histogram& h) {
  int64_t total = 0, last = 0, present = 0;
  for (int64_t count : h)
    if (count) total += count, last = count, ++present;
  if (present <= 1) return identity_lut();
  const int64_t step = (total - last) / 255;
  if (step == 0) return identity_lut();
  Lut lut;
  int64_t n = step / 2;
  for (int i = 0; i < 256; ++i) {
    lut[size_t(i)] = uint8_t(std::min<int64_t>(255, n / step));
    n += h[size_t(i)];
  }
  return lut;
}

}  // namespace

const char* augment_op_name(AugmentOp op) {
  check_op(op, "augment_op_name");
  return kOpNames[static_cast<int>(op)];
}

void apply_augment_op(AugmentOp op, double magnitude, uint8_t* image, int64_t H, int64_t W, int64_t C,
                      uint8_t fill) {
  const char* where = "apply_augment_op";
  check_op(op, where);
  const int64_t n = check_image(image, H, W, C, where);
  check_finite(where, "magnitude", magnitude);
  const int64_t pixels = H * W;
  switch (op) {
    case AugmentOp::Identity:
      return;
    case AugmentOp::ShearX:
    case AugmentOp::ShearY: {
      // torchvision passes shear = degrees(atan(m)) on one axis about centre (0, 0), the
      // top-left corner (its tensor path and the AutoAugment paper's matrix (1, m, 0, 0, 1, 0)
      // agree): the inverse map is (1, m, 0, 0, 1, 0) for ShearX and (1, 0, 0, m, 1, 0) for
      // ShearY, m as tan(radians(degrees(atan(m)))) comes back.
      const double deg = std::atan(magnitude) * kRadToDeg;
      const bool x = op == AugmentOp::ShearX;
      if (n) affine_in_place(image, H, W, C, torchvision_inverse_affine(0, 0, 0.0, 0, 0, x ? deg : 0.0, x ? 0.0 : deg), fill);
      return;
    }
    case AugmentOp::TranslateX:
    case AugmentOp::TranslateY: {
      // torchvision passes translate = [int(m), 0] (or [0, int(m)]) about the image centre;
      // the matrix is then a whole-pixel shift, which PIL's scale path carries out exactly.
      const double t = std::trunc(magnitude);
      const bool x = op == AugmentOp::TranslateX;
      if (n)
        affine_in_place(image, H, W, C,
                        torchvision_inverse_affine(double(W) * 0.5, double(H) * 0.5, 0.0, x ? t : 0, x ? 0 : t, 0.0, 0.0),
                        fill);
      return;
    }
    case AugmentOp::Rotate:
      if (n) rotate(image, H, W, C, magnitude, fill);
      return;
    case AugmentOp::Brightness:
    case AugmentOp::Color:
    case AugmentOp::Contrast:
    case AugmentOp::Sharpness:
      // ImageEnhance's factor: torchvision passes 1.0 + m.
      enhance(op, 1.0 + magnitude, image, H, W, C);
      return;
    case AugmentOp::Posterize: {
      // torchvision passes int(m) bits, and refuses a count outside [0, 8].
      const double bits = std::trunc(magnitude);
      MU_CHECK(bits >= 0 && bits <= 8, where, ": Posterize keeps 0 to 8 bits, got ", magnitude);
      const int mask = ~((1 << (8 - int(bits))) - 1);
      Lut lut;
      for (int i = 0; i < 256; ++i) lut[size_t(i)] = uint8_t(i & mask);
      apply_lut(image, pixels, C, lut);
      return;
    }
    case AugmentOp::Solarize: {
      Lut lut;
      for (int i = 0; i < 256; ++i) lut[size_t(i)] = uint8_t(double(i) < magnitude ? i : 255 - i);
      apply_lut(image, pixels, C, lut);
      return;
    }
    case AugmentOp::AutoContrast:
    case AugmentOp::Equalize: {
      std::vector<Lut> luts;
      for (const Histogram& h : histograms(image, pixels, C))
        luts.push_back(op == AugmentOp::AutoContrast ? autocontrast_lut(h) : equalize_lut(h));
      apply_luts(image, pixels, C, luts);
      return;
    }
  }
}

double rand_augment_magnitude(AugmentOp op, int64_t magnitude, int64_t num_bins, int64_t H, int64_t W) {
  const char* where = "rand_augment_magnitude";
  check_op(op, where);
  check_options(RandAugmentOptions{0, magnitude, num_bins, 0}, where);
  MU_CHECK(H >= 0 && W >= 0, where, ": the image sides must be non-negative, got ", H, "x", W);
  // torch.linspace(start, end, num_bins)[magnitude] in float32: the endpoints as floats,
  // the value start + (end - start) i / (n - 1) rounded to float. torch's own CPU kernel
  // rounds its steps in float32 in ways that depend on the machine (vector width, fused
  // multiply-adds), straying from this by a rounding or two at the scale of the endpoints;
  // this is the value all those approximate.
  auto linspace = [&](double start, double end) {
    const double s = float(start), e = float(end);
    return double(float(s + (e - s) * double(magnitude) / double(num_bins - 1)));
  };
  switch (op) {
    case AugmentOp::ShearX:
    case AugmentOp::ShearY:
      return linspace(0.0, 0.3);
    case AugmentOp::TranslateX:
      return linspace(0.0, 150.0 / 331.0 * double(W));
    case AugmentOp::TranslateY:
      return linspace(0.0, 150.0 / 331.0 * double(H));
    case AugmentOp::Rotate:
      return linspace(0.0, 30.0);
    case AugmentOp::Brightness:
    case AugmentOp::Color:
    case AugmentOp::Contrast:
    case AugmentOp::Sharpness:
      return linspace(0.0, 0.9);
    case AugmentOp::Posterize: {
      // arange(num_bins) / ((num_bins - 1) / 4) is a float32 division; round() goes to
      // the even integer at halves.
      const float q = float(magnitude) / float(double(num_bins - 1) / 4.0);
      return double(8 - int64_t(std::nearbyint(q)));
    }
    case AugmentOp::Solarize:
      return linspace(255.0, 0.0);
    default:
      return 0.0;
  }
}

void rand_augment_image(uint8_t* image, int64_t H, int64_t W, int64_t C, const RandAugmentOptions& options,
                        Generator& gen, std::vector<std::pair<AugmentOp, double>>* applied) {
  const char* where = "rand_augment_image";
  check_image(image, H, W, C, where);
  check_options(options, where);
  std::vector<std::pair<AugmentOp, double>> ops;
  ops.reserve(size_t(options.num_ops));
  {
    // All draws first, under one lock: the image's ops are consecutive in the stream.
    auto draws = gen.lock();
    for (int64_t k = 0; k < options.num_ops; ++k) {
      // uniform() < 1, but the product may round up to 14.
      const auto op = AugmentOp(std::min<int64_t>(kOpCount - 1, int64_t(draws.uniform() * double(kOpCount))));
      double m = rand_augment_magnitude(op, options.magnitude, options.num_bins, H, W);
      if (is_signed(op) && draws.uniform() < 0.5) m = -m;
      ops.emplace_back(op, m);
    }
  }
  for (const auto& [op, m] : ops) apply_augment_op(op, m, image, H, W, C, options.fill);
  if (applied) *applied = std::move(ops);
}

Tensor rand_augment(const Tensor& images, const RandAugmentOptions& options, uint64_t seed) {
  const char* where = "rand_augment";
  MU_CHECK(images.defined(), where, ": expected a batch of images, got an undefined tensor");
  MU_CHECK(images.dtype() == kUInt8, where, ": images must be uint8, got ", dtype_name(images.dtype()));
  MU_CHECK(images.dim() == 4, where, ": expected images (B, H, W, C), got shape ", shape_str(images.shape()));
  MU_CHECK(images.device().is_cpu(), where, ": images must be on the CPU, got ", images.device().str());
  const int64_t B = images.size(0), H = images.size(1), W = images.size(2), C = images.size(3);
  MU_CHECK(C == 1 || C == 3, where, ": images must have 1 or 3 channels, got ", C, " (shape ",
           shape_str(images.shape()), ")");
  check_options(options, where);
  Tensor out = images.clone();  // a dense copy of its own
  if (out.numel() == 0) return out;
  uint8_t* base = out.data_ptr<uint8_t>();
  const int64_t per_image = H * W * C;
  // The first error of any image, rethrown after the loop (an exception must not leave an
  // OpenMP region).
  std::string failure;
#pragma omp parallel for schedule(dynamic)
  for (int64_t b = 0; b < B; ++b) {
    try {
      Generator gen(mix_seed(seed, uint64_t(b)));
      rand_augment_image(base + b * per_image, H, W, C, options, gen);
    } catch (const std::exception& e) {
#pragma omp critical(rand_augment_failure)
      if (failure.empty()) failure = e.what();
    }
  }
  MU_CHECK(failure.empty(), where, ": ", failure);
  return out;
}

}  // namespace mu::data
