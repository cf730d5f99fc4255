#include "data/augment.h"

#include <algorithm>
#include <cmath>

#include "ops/ops.h"
#include "tensor/checked.h"
#include "tensor/option_checks.h"

namespace mu::data {

namespace {

// Checks a batch and views it as (B, C, H, W) (C = 1 for (B, H, W)).
Tensor as_bchw(const Tensor& x, const char* op) {
  MU_CHECK(x.defined(), op, ": expected a batch of images, got an undefined tensor");
  MU_CHECK(x.is_floating_point(), op, ": images must be floating point, got ", dtype_name(x.dtype()));
  MU_CHECK(x.dim() == 3 || x.dim() == 4, op, ": expected images (B, C, H, W) or (B, H, W), got shape ",
           shape_str(x.shape()));
  return x.dim() == 3 ? x.unsqueeze(1) : x;
}

Generator& pick(Generator* gen) { return gen ? *gen : default_generator(); }

// The number of offsets per axis, 2·padding + 1, with padding checked: non-negative, and
// small enough that the sum and every source index i + dy - padding fit in int64.
int64_t offset_span(int64_t padding, const char* op) {
  MU_CHECK(padding >= 0, op, ": padding must be non-negative, got ", padding);
  return checked_add(checked_mul(2, padding, op, ": padding"), 1, op, ": padding");
}

}  // namespace

Tensor crop_at(const Tensor& x, int64_t padding, const std::vector<std::pair<int64_t, int64_t>>& offsets) {
  const char* op = "crop_at";
  Tensor v = as_bchw(x, op);
  const int64_t span = offset_span(padding, op);
  const int64_t B = v.size(0), C = v.size(1), H = v.size(2), W = v.size(3), HW = H * W;
  MU_CHECK(int64_t(offsets.size()) == B, op, ": ", offsets.size(), " offsets for a batch of ", B);
  for (const auto& [dy, dx] : offsets)
    MU_CHECK(dy >= 0 && dy < span && dx >= 0 && dx < span, op, ": offset (", dy, ", ", dx, ") outside [0, ", span - 1,
             "] for padding ", padding);
  // Nothing to move (an empty batch may still name huge sizes: no index table is built).
  if (padding == 0 || v.numel() == 0) return x;
  // A gather along the flattened pixels: output pixel (i, j) of sample b reads source
  // pixel (i+dy-p, j+dx-p) where that is inside the image; elsewhere it reads pixel 0 and
  // the mask replaces it by the zero of the padding.
  std::vector<int64_t> index(size_t(B * HW));
  std::vector<bool> inside(size_t(B * HW));
  for (int64_t b = 0; b < B; ++b) {
    const auto [dy, dx] = offsets[size_t(b)];
    for (int64_t i = 0; i < H; ++i)
      for (int64_t j = 0; j < W; ++j) {
        // (dy - padding) first: it lies in [-padding, padding], so no sum leaves int64.
        const int64_t si = i + (dy - padding), sj = j + (dx - padding);
        const bool in = si >= 0 && si < H && sj >= 0 && sj < W;
        index[size_t(b * HW + i * W + j)] = in ? si * W + sj : 0;
        inside[size_t(b * HW + i * W + j)] = in;
      }
  }
  const Device dev = x.device();
  Tensor idx = from_vector(index, {B, 1, HW}).to(dev).expand({B, C, HW}).contiguous();
  Tensor mask = from_vector(inside, {B, 1, HW}).to(dev);
  Tensor out = where(mask, gather(v.reshape({B, C, HW}), 2, idx), 0.0);
  return out.reshape(x.shape());
}

Tensor random_crop(const Tensor& x, int64_t padding, Generator* gen,
                   std::vector<std::pair<int64_t, int64_t>>* offsets) {
  Tensor v = as_bchw(x, "random_crop");
  const int64_t B = v.size(0), span = offset_span(padding, "random_crop");
  std::vector<std::pair<int64_t, int64_t>> drawn(static_cast<size_t>(B));
  {
    // One lock for the batch: its draws are consecutive in the generator's stream.
    auto draws = pick(gen).lock();
    for (auto& [dy, dx] : drawn) {
      // uniform() < 1, but the product can round up to span when span is huge.
      dy = std::min(span - 1, int64_t(draws.uniform() * double(span)));
      dx = std::min(span - 1, int64_t(draws.uniform() * double(span)));
    }
  }
  if (offsets) *offsets = drawn;
  return crop_at(x, padding, drawn);
}

Tensor flip_at(const Tensor& x, const std::vector<bool>& flipped) {
  const char* op = "flip_at";
  Tensor v = as_bchw(x, op);
  const int64_t B = v.size(0), W = v.size(3);
  MU_CHECK(int64_t(flipped.size()) == B, op, ": ", flipped.size(), " flags for a batch of ", B);
  if (B == 0 || W == 0) return x;
  const Device dev = x.device();
  // The columns in reverse order, and each sample's choice broadcast over its pixels.
  Tensor reversed = index_select(x, -1, arange(double(W - 1), -1.0, -1.0).to(dev));
  Shape mask_shape(size_t(x.dim()), 1);
  mask_shape[0] = B;
  Tensor mask = from_vector(flipped, mask_shape).to(dev);
  return where(mask, reversed, x);
}

Tensor random_horizontal_flip(const Tensor& x, double p, Generator* gen, std::vector<bool>* flipped) {
  Tensor v = as_bchw(x, "random_horizontal_flip");
  check_unit_interval("random_horizontal_flip", "p", p);
  std::vector<bool> drawn(size_t(v.size(0)));
  {
    auto draws = pick(gen).lock();
    for (size_t b = 0; b < drawn.size(); ++b) drawn[b] = draws.uniform() < p;
  }
  if (flipped) *flipped = drawn;
  return flip_at(x, drawn);
}

Tensor normalize(const Tensor& x, const std::vector<double>& mean, const std::vector<double>& stddev) {
  const char* op = "normalize";
  Tensor v = as_bchw(x, op);
  const int64_t C = v.size(1);
  MU_CHECK(int64_t(mean.size()) == C && int64_t(stddev.size()) == C, op, ": images have ", C, " channel",
           C == 1 ? "" : "s", " but mean has ", mean.size(), " and std ", stddev.size(), " values");
  for (int64_t c = 0; c < C; ++c) {
    check_finite(op, "mean", mean[size_t(c)]);
    MU_CHECK(std::isfinite(stddev[size_t(c)]) && stddev[size_t(c)] > 0, op, ": std must be positive and finite, got ",
             stddev[size_t(c)], " for channel ", c);
  }
  // (C, 1, 1) per-channel values broadcast over (B, C, H, W); subtract, then divide, as
  // torchvision's Normalize.
  TensorOptions o = TensorOptions(x.dtype()).device(x.device());
  Tensor m = from_vector(mean, {C, 1, 1}).to(o.dtype()).to(o.device());
  Tensor s = from_vector(stddev, {C, 1, 1}).to(o.dtype()).to(o.device());
  return ((v - m) / s).reshape(x.shape());
}

}  // namespace mu::data
