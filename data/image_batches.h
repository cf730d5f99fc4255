// Training and evaluation batches of an image-array dataset (data/image_arrays.h) with
// the ImageNet recipe of the MLP-Mixer paper (Tolstikhin et al. 2021, as Table 7 of the
// μMoE paper uses it): per image a random resized crop to size x size, a horizontal flip
// with probability 1/2 and RandAugment; per batch normalisation with ImageNet's channel
// statistics and mixup. Evaluation takes the central crop.
//
//   data::ImageArrays train(dir, "train");
//   data::ImageBatchOptions o;  o.size = 224; o.rand_augment.magnitude = 15; o.mixup = 0.5;
//   data::Batch b = data::training_batch(train, indices, o, seed);   // b.target: (B, K) soft targets
//
// Image b of a batch draws from its own generator, seeded by (seed, b), and the images are
// prepared in an OpenMP loop: the batch is the same whatever the thread count. Mixup pairs
// the images of the batch given (a rank's share under data parallelism).
#pragma once
#include <cstdint>
#include <vector>

#include "data/image_arrays.h"
#include "data/prefetch.h"
#include "data/rand_augment.h"

namespace mu::data {

struct ImageBatchOptions {
  int64_t size = 224;                       // side of the square crops
  double min_scale = 0.08;                  // smallest area fraction of the random resized crop
  double flip = 0.5;                        // probability of a horizontal flip
  bool augment = true;                      // RandAugment at all
  RandAugmentOptions rand_augment;          // its ops and magnitude
  double mixup = 0.0;                       // Beta(alpha, alpha) of mixup; 0: none
  std::vector<double> mean{0.485, 0.456, 0.406}, stddev{0.229, 0.224, 0.225};  // ImageNet's, in [0, 1] units
};

// input: float32 (B, C, size, size); target: float32 (B, K) class probabilities (the
// mixup of one-hot labels; one-hot without mixup).
// Image b draws from a generator seeded by (seed, first + b): a rank preparing rows
// [first, first + B) of a global batch draws what one process would for those rows.
Batch training_batch(const ImageArrays& data, const std::vector<int64_t>& indices, const ImageBatchOptions& options,
                     uint64_t seed, int64_t first = 0);

// Images first .. first + count - 1 (clipped to the split), central crops of size x size
// (where the stored images are smaller, the whole image resized), normalised; labels int64 (B).
Batch eval_batch(const ImageArrays& data, int64_t first, int64_t count, const ImageBatchOptions& options);

}  // namespace mu::data
