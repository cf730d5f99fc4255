#include "data/image_batches.h"

#include "data/image_pipeline.h"
#include "tensor/error.h"

namespace mu::data {

namespace {

void check_options(const ImageArrays& data, const ImageBatchOptions& o, const char* what) {
  MU_CHECK(o.size > 0, what, ": the crop size must be positive, got ", o.size);
  MU_CHECK(o.min_scale > 0 && o.min_scale <= 1, what, ": min_scale must be in (0, 1], got ", o.min_scale);
  MU_CHECK(o.flip >= 0 && o.flip <= 1, what, ": the flip probability must be in [0, 1], got ", o.flip);
  MU_CHECK(o.mixup >= 0, what, ": the mixup alpha must be non-negative, got ", o.mixup);
  MU_CHECK(int64_t(o.mean.size()) == data.channels() && int64_t(o.stddev.size()) == data.channels(), what, ": ",
           data.channels(), " channels, but ", o.mean.size(), " means and ", o.stddev.size(), " standard deviations");
}

}  // namespace

Batch training_batch(const ImageArrays& data, const std::vector<int64_t>& indices, const ImageBatchOptions& o,
                     uint64_t seed, int64_t first) {
  check_options(data, o, "training_batch");
  const int64_t B = int64_t(indices.size()), H = data.height(), W = data.width(), C = data.channels(), S = o.size;
  for (int64_t b = 0; b < B; ++b)
    MU_CHECK(indices[size_t(b)] >= 0 && indices[size_t(b)] < data.size(), "training_batch: index ", b, " is ",
             indices[size_t(b)], ", outside 0..", data.size() - 1);
  Tensor crops = empty({B, S, S, C}, kUInt8);
  uint8_t* dst = crops.data_ptr<uint8_t>();
  // The first error of any image, rethrown after the loop (an exception must not leave an
  // OpenMP region).
  std::string failure;
#pragma omp parallel for schedule(dynamic, 4)
  for (int64_t b = 0; b < B; ++b) {
    try {
      Generator gen(mix_seed(seed, uint64_t(first + b)));
      uint8_t* out = dst + b * S * S * C;
      bool flip;
      {
        Generator::Draws d = gen.lock();
        const CropBox box = random_resized_crop_box(H, W, {o.min_scale, 1.0}, {3.0 / 4.0, 4.0 / 3.0}, d);
        resize_bilinear(data.image(indices[size_t(b)]), H, W, C, box, out, S, S);
        flip = d.uniform() < o.flip;
      }
      if (flip) flip_horizontal(out, S, S, C);
      if (o.augment) rand_augment_image(out, S, S, C, o.rand_augment, gen);
    } catch (const std::exception& e) {
#pragma omp critical(training_batch_failure)
      if (failure.empty()) failure = e.what();
    }
  }
  MU_CHECK(failure.empty(), "training_batch: ", failure);
  Batch batch;
  const Tensor labels = data.labels(indices);
  Generator mix(mix_seed(seed, ~uint64_t(first)));
  Mixed m = mixup(to_normalized_float(crops, o.mean, o.stddev), labels, data.classes(), o.mixup, mix);
  batch.input = m.x;
  batch.target = m.targets;
  return batch;
}

Batch eval_batch(const ImageArrays& data, int64_t first, int64_t count, const ImageBatchOptions& o) {
  check_options(data, o, "eval_batch");
  MU_CHECK(first >= 0 && first < data.size() && count > 0, "eval_batch: images ", first, " .. ", first + count - 1,
           " are outside the split's 0..", data.size() - 1);
  const int64_t B = std::min(count, data.size() - first), H = data.height(), W = data.width(), C = data.channels();
  const int64_t S = o.size;
  const CropBox box = center_crop_box(H, W, S, S);
  Tensor crops = empty({B, S, S, C}, kUInt8);
  uint8_t* dst = crops.data_ptr<uint8_t>();
  std::vector<int64_t> indices(static_cast<size_t>(B));
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < B; ++b) {
    indices[size_t(b)] = first + b;
    // The central window; resized only where the stored image is smaller than the crop.
    resize_bilinear(data.image(first + b), H, W, C, box, dst + b * S * S * C, S, S);
  }
  return Batch{to_normalized_float(crops, o.mean, o.stddev), data.labels(indices)};
}

}  // namespace mu::data
