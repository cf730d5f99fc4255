// Image augmentations for training batches: float (B, C, H, W) batches, or (B, H, W)
// for one channel. The random ones draw one decision per sample from a Generator (null:
// the global one), all under one lock, so a batch's draws are never interleaved with
// another thread's and a generator of its own makes them repeat.
//
//   Tensor x = data::random_crop(images, 4, &gen);                // zero padding 4
//   x = data::random_horizontal_flip(x, 0.5, &gen);
//   x = data::normalize(x, {0.2860}, {0.3530});                   // per channel
//
// Each random augmentation can report its draws (offsets, flags), and the *_at forms
// apply given draws: the same result, for tests and for replaying a batch.
#pragma once
#include <utility>
#include <vector>

#include "tensor/random.h"
#include "tensor/tensor.h"

namespace mu::data {

// Zero-pads each image by `padding` on every side and cuts an H × W window at offset
// (dy, dx), dy and dx uniform in [0, 2·padding]: out[b, c, i, j] = x[b, c, i+dy-p, j+dx-p]
// where that lies inside the image, else 0. padding 0 returns the batch unchanged.
// When `offsets` is given it receives the (dy, dx) of each sample.
Tensor random_crop(const Tensor& x, int64_t padding, Generator* gen = nullptr,
                   std::vector<std::pair<int64_t, int64_t>>* offsets = nullptr);
// The same crop with given offsets (one (dy, dx) per sample, each in [0, 2·padding]).
Tensor crop_at(const Tensor& x, int64_t padding, const std::vector<std::pair<int64_t, int64_t>>& offsets);

// Mirrors each image left-right (reverses the last dim) with probability p.
// When `flipped` is given it receives each sample's decision.
Tensor random_horizontal_flip(const Tensor& x, double p = 0.5, Generator* gen = nullptr,
                              std::vector<bool>* flipped = nullptr);
// Mirrors the samples whose flag is set.
Tensor flip_at(const Tensor& x, const std::vector<bool>& flipped);

// (x - mean[c]) / std[c] for each channel c; (B, H, W) batches take one value each.
Tensor normalize(const Tensor& x, const std::vector<double>& mean, const std::vector<double>& stddev);

}  // namespace mu::data
