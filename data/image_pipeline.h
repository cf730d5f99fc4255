// The ImageNet training pipeline's per-image steps on uint8 images with interleaved
// channels (H, W, C), and its batch steps on tensors, as the MLP-Mixer recipe uses them:
//
//   random resized crop (Szegedy et al. 2015's "Inception" crop: an area fraction in
//   [0.08, 1] and an aspect ratio in [3/4, 4/3], as torchvision's RandomResizedCrop) to
//   224 x 224, bilinear; a horizontal flip; RandAugment (data/rand_augment.h); then the
//   batch to float (B, C, H, W) normalised per channel, and mixup (Zhang et al. 2018).
//
//   data::CropBox box = data::random_resized_crop_box(H, W, {0.08, 1.0}, {0.75, 4.0 / 3}, draws);
//   data::resize_bilinear(src, H, W, C, box, dst, 224, 224);
//   Tensor x = data::to_normalized_float(batch_u8, {0.485, 0.456, 0.406}, {0.229, 0.224, 0.225});
//   data::Mixed m = data::mixup(x, labels, 1000, 0.5, gen);     // m.x, m.targets (B, 1000)
//
// Evaluation takes the central crop instead (center_crop_box).
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "tensor/random.h"
#include "tensor/tensor.h"

namespace mu::data {

// A window of an image: rows [top, top + height), columns [left, left + width).
struct CropBox {
  int64_t top = 0, left = 0, height = 0, width = 0;
};

// torchvision's RandomResizedCrop.get_params: up to 10 tries of an area fraction uniform
// in `scale` and an aspect ratio (width / height) log-uniform in `ratio`, the window's
// sides rounded; the first that fits inside H x W is placed uniformly. When none fits,
// the central window of the whole image's area with the ratio clamped into `ratio`.
CropBox random_resized_crop_box(int64_t H, int64_t W, std::pair<double, double> scale,
                                std::pair<double, double> ratio, Generator::Draws& draws);
// The central out_h x out_w window (the whole side where the image is smaller).
CropBox center_crop_box(int64_t H, int64_t W, int64_t out_h, int64_t out_w);

// dst (out_h, out_w, C) = the window `box` of src (H, W, C) resized bilinearly, pixel
// centres aligned (align_corners = false, as torch's interpolate and PIL's resize), reads
// past the window's edge clamped to it, rounded to the nearest integer. No antialiasing
// filter when shrinking (PIL's resize has one; torchvision's tensor path does not).
void resize_bilinear(const uint8_t* src, int64_t H, int64_t W, int64_t C, const CropBox& box, uint8_t* dst,
                     int64_t out_h, int64_t out_w);

// Mirrors an (H, W, C) image left-right in place.
void flip_horizontal(uint8_t* image, int64_t H, int64_t W, int64_t C);

// uint8 (B, H, W, C) -> float32 (B, C, H, W): (v / 255 - mean[c]) / std[c].
Tensor to_normalized_float(const Tensor& images, const std::vector<double>& mean, const std::vector<double>& stddev);

// A draw from Beta(a, b), a, b > 0, as G_a / (G_a + G_b) of two gamma variates
// (Marsaglia and Tsang's method; for a shape below 1, G(shape + 1) · U^(1 / shape)).
double sample_beta(double a, double b, Generator::Draws& draws);

// Mixup of a batch with itself reversed (sample b with sample B-1-b, as timm pairs them):
// lambda ~ Beta(alpha, alpha), x' = lambda x + (1 - lambda) x[reversed], targets the same
// mixture of the one-hot labels: float32 (B, classes). alpha 0 leaves x as it is with
// one-hot targets (lambda = 1).
struct Mixed {
  Tensor x, targets;
  double lambda = 1.0;
};
Mixed mixup(const Tensor& x, const Tensor& labels, int64_t classes, double alpha, Generator& gen);

}  // namespace mu::data
