#include "data/image_pipeline.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "tensor/error.h"
#include "ops/ops.h"
#include "tensor/tensor.h"

namespace mu::data {

CropBox random_resized_crop_box(int64_t H, int64_t W, std::pair<double, double> scale,
                                std::pair<double, double> ratio, Generator::Draws& draws) {
  MU_CHECK(H > 0 && W > 0, "random_resized_crop_box: the image is ", H, "x", W);
  MU_CHECK(scale.first > 0 && scale.first <= scale.second && scale.second <= 1, "random_resized_crop_box: scale (",
           scale.first, ", ", scale.second, ") must satisfy 0 < min <= max <= 1");
  MU_CHECK(ratio.first > 0 && ratio.first <= ratio.second, "random_resized_crop_box: ratio (", ratio.first, ", ",
           ratio.second, ") must satisfy 0 < min <= max");
  const double area = double(H) * double(W);
  const double log_lo = std::log(ratio.first), log_hi = std::log(ratio.second);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target = area * (scale.first + (scale.second - scale.first) * draws.uniform());
    const double aspect = std::exp(log_lo + (log_hi - log_lo) * draws.uniform());
    const int64_t w = std::llround(std::sqrt(target * aspect)), h = std::llround(std::sqrt(target / aspect));
    if (w > 0 && w <= W && h > 0 && h <= H) {
      // Uniform offsets: u in [0, 1) times the number of placements, floored.
      const int64_t top = std::min(H - h, int64_t(draws.uniform() * double(H - h + 1)));
      const int64_t left = std::min(W - w, int64_t(draws.uniform() * double(W - w + 1)));
      return {top, left, h, w};
    }
  }
  // No try fitted: the whole image, cut to the nearest allowed aspect ratio, centred.
  const double in_ratio = double(W) / double(H);
  int64_t w = W, h = H;
  if (in_ratio < ratio.first)
    h = std::llround(double(W) / ratio.first);
  else if (in_ratio > ratio.second)
    w = std::llround(double(H) * ratio.second);
  return {(H - h) / 2, (W - w) / 2, h, w};
}

CropBox center_crop_box(int64_t H, int64_t W, int64_t out_h, int64_t out_w) {
  MU_CHECK(out_h > 0 && out_w > 0, "center_crop_box: the crop is ", out_h, "x", out_w);
  const int64_t h = std::min(H, out_h), w = std::min(W, out_w);
  return {(H - h) / 2, (W - w) / 2, h, w};
}

void resize_bilinear(const uint8_t* src, int64_t H, int64_t W, int64_t C, const CropBox& box, uint8_t* dst,
                     int64_t out_h, int64_t out_w) {
  MU_CHECK(box.height > 0 && box.width > 0 && box.top >= 0 && box.left >= 0 && box.top + box.height <= H &&
               box.left + box.width <= W,
           "resize_bilinear: window (top ", box.top, ", left ", box.left, ", ", box.height, "x", box.width,
           ") is not inside the ", H, "x", W, " image");
  MU_CHECK(out_h > 0 && out_w > 0, "resize_bilinear: the output is ", out_h, "x", out_w);
  // Source coordinate of output index o along a side of n source and m output pixels:
  // (o + 0.5) n / m - 0.5, the pixel centres lined up; below 0 it clamps to 0.
  struct Tap {
    int64_t i0, i1;
    float w1;  // weight of i1; i0 gets 1 - w1
  };
  auto taps = [](int64_t n, int64_t m) {
    std::vector<Tap> t(static_cast<size_t>(m));
    const double step = double(n) / double(m);
    for (int64_t o = 0; o < m; ++o) {
      const double s = std::max(0.0, (double(o) + 0.5) * step - 0.5);
      const int64_t i0 = std::min(n - 1, int64_t(s));
      t[size_t(o)] = {i0, std::min(n - 1, i0 + 1), float(s - double(i0))};
    }
    return t;
  };
  const std::vector<Tap> ty = taps(box.height, out_h), tx = taps(box.width, out_w);
  for (int64_t y = 0; y < out_h; ++y) {
    const Tap& a = ty[size_t(y)];
    const uint8_t* r0 = src + ((box.top + a.i0) * W + box.left) * C;
    const uint8_t* r1 = src + ((box.top + a.i1) * W + box.left) * C;
    uint8_t* out = dst + y * out_w * C;
    for (int64_t x = 0; x < out_w; ++x) {
      const Tap& b = tx[size_t(x)];
      for (int64_t c = 0; c < C; ++c) {
        const float top = float(r0[b.i0 * C + c]) + b.w1 * float(int(r0[b.i1 * C + c]) - int(r0[b.i0 * C + c]));
        const float bot = float(r1[b.i0 * C + c]) + b.w1 * float(int(r1[b.i1 * C + c]) - int(r1[b.i0 * C + c]));
        const float v = top + a.w1 * (bot - top);
        out[x * C + c] = uint8_t(std::clamp(std::lround(v), 0L, 255L));
      }
    }
  }
}

void flip_horizontal(uint8_t* image, int64_t H, int64_t W, int64_t C) {
  for (int64_t y = 0; y < H; ++y) {
    uint8_t* row = image + y * W * C;
    for (int64_t l = 0, r = W - 1; l < r; ++l, --r)
      for (int64_t c = 0; c < C; ++c) std::swap(row[l * C + c], row[r * C + c]);
  }
}

Tensor to_normalized_float(const Tensor& images, const std::vector<double>& mean, const std::vector<double>& stddev) {
  MU_CHECK(images.defined() && images.dtype() == kUInt8 && images.dim() == 4, "to_normalized_float: expected uint8 "
           "(B, H, W, C), got ", images.defined() ? dtype_name(images.dtype()) : "undefined", " ",
           images.defined() ? shape_str(images.shape()) : "");
  const int64_t B = images.size(0), H = images.size(1), W = images.size(2), C = images.size(3);
  MU_CHECK(int64_t(mean.size()) == C && int64_t(stddev.size()) == C, "to_normalized_float: ", C,
           " channels, but ", mean.size(), " means and ", stddev.size(), " standard deviations");
  for (int64_t c = 0; c < C; ++c)
    MU_CHECK(stddev[size_t(c)] > 0, "to_normalized_float: standard deviation ", c, " is ", stddev[size_t(c)]);
  const Tensor in = images.cpu().contiguous();
  Tensor out = empty({B, C, H, W}, kFloat32);
  const uint8_t* s = in.data_ptr<uint8_t>();
  float* d = out.data_ptr<float>();
  // v / 255 / std - mean / std as one multiply-add per value.
  std::vector<float> mul(static_cast<size_t>(C)), add(static_cast<size_t>(C));
  for (int64_t c = 0; c < C; ++c) {
    mul[size_t(c)] = float(1.0 / (255.0 * stddev[size_t(c)]));
    add[size_t(c)] = float(-mean[size_t(c)] / stddev[size_t(c)]);
  }
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t c = 0; c < C; ++c) {
      const uint8_t* src = s + b * H * W * C + c;
      float* dst = d + (b * C + c) * H * W;
      for (int64_t p = 0; p < H * W; ++p) dst[p] = float(src[p * C]) * mul[size_t(c)] + add[size_t(c)];
    }
  return out;
}

namespace {

// Gamma(shape, 1) for shape >= 1: Marsaglia and Tsang (2000).
double gamma_at_least_one(double shape, Generator::Draws& draws) {
  const double d = shape - 1.0 / 3.0, c = 1.0 / std::sqrt(9.0 * d);
  for (;;) {
    double x, v;
    do {
      x = draws.normal();
      v = 1.0 + c * x;
    } while (v <= 0);
    v = v * v * v;
    const double u = draws.uniform();
    if (u < 1.0 - 0.0331 * x * x * x * x) return d * v;
    if (std::log(u) < 0.5 * x * x + d * (1.0 - v + std::log(v))) return d * v;
  }
}

double sample_gamma(double shape, Generator::Draws& draws) {
  if (shape >= 1) return gamma_at_least_one(shape, draws);
  // G(a) = G(a + 1) U^(1/a) for a < 1; 1 - uniform() lies in (0, 1], so the power is finite.
  return gamma_at_least_one(shape + 1.0, draws) * std::pow(1.0 - draws.uniform(), 1.0 / shape);
}

}  // namespace

double sample_beta(double a, double b, Generator::Draws& draws) {
  MU_CHECK(a > 0 && b > 0, "sample_beta: the parameters must be positive, got (", a, ", ", b, ")");
  const double x = sample_gamma(a, draws), y = sample_gamma(b, draws);
  return x + y > 0 ? x / (x + y) : 0.5;  // both underflowed to 0 (tiny a and b): either end is as likely
}

Mixed mixup(const Tensor& x, const Tensor& labels, int64_t classes, double alpha, Generator& gen) {
  MU_CHECK(x.defined() && x.dim() >= 1 && x.is_floating_point(), "mixup: x must be a floating-point batch, got ",
           x.defined() ? shape_str(x.shape()) : "undefined");
  const int64_t B = x.size(0);
  MU_CHECK(labels.defined() && labels.dtype() == kInt64 && labels.dim() == 1 && labels.size(0) == B,
           "mixup: labels must be int64 (", B, "), got ", labels.defined() ? shape_str(labels.shape()) : "undefined");
  MU_CHECK(classes > 0, "mixup: classes must be positive, got ", classes);
  MU_CHECK(alpha >= 0, "mixup: alpha must be non-negative, got ", alpha);
  Mixed m;
  if (alpha > 0) {
    Generator::Draws draws = gen.lock();
    m.lambda = sample_beta(alpha, alpha, draws);
  }
  const Tensor lab = labels.cpu().contiguous();
  const int64_t* l = lab.data_ptr<int64_t>();
  std::vector<float> t(static_cast<size_t>(B * classes), 0.0f);
  std::vector<int64_t> reversed(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    const int64_t mine = l[b], other = l[B - 1 - b];
    MU_CHECK(mine >= 0 && mine < classes, "mixup: label ", b, " is ", mine, ", outside 0..", classes - 1);
    t[size_t(b * classes + mine)] += float(m.lambda);
    t[size_t(b * classes + other)] += float(1.0 - m.lambda);
    reversed[size_t(b)] = B - 1 - b;
  }
  m.targets = from_vector(t, {B, classes}).to(x.device());
  m.x = m.lambda == 1.0 ? x
                        : x * m.lambda + index_select(x, 0, from_vector(reversed, {B}).to(x.device())) * (1.0 - m.lambda);
  return m;
}

}  // namespace mu::data
