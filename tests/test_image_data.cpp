// The paper-scale image data path: image arrays written and read back (damage named by
// file, image and byte), and the training pipeline's steps (random resized crop box,
// bilinear resize, flip, normalisation, Beta draws, mixup), each against loops and
// formulas written here; the batches built from them (training: crops, flips, RandAugment,
// mixup, the same on any thread count; evaluation: central crops).
#include <cmath>
#include <filesystem>

#include <omp.h>

#include <algorithm>

#include "data/image_arrays.h"
#include "data/image_batches.h"
#include "data/image_pipeline.h"
#include "file_helpers.h"
#include "helpers.h"

using namespace mu;
using namespace mu::data;

namespace {

ImageArraysMeta geometry(int64_t H, int64_t W, int64_t C, int64_t K) {
  ImageArraysMeta m;
  m.height = H;
  m.width = W;
  m.channels = C;
  m.classes = K;
  return m;
}

// Images whose bytes spell out (image, position): (7 i + p) mod 256.
Tensor patterned(int64_t N, int64_t H, int64_t W, int64_t C) {
  Tensor t = empty({N, H, W, C}, kUInt8);
  uint8_t* p = t.data_ptr<uint8_t>();
  for (int64_t i = 0; i < N; ++i)
    for (int64_t q = 0; q < H * W * C; ++q) p[i * H * W * C + q] = uint8_t((7 * i + q) % 256);
  return t;
}

}  // namespace

TEST_CASE("image arrays: written splits read back byte for byte, the meta records each split") {
  TempDir dir("imgarr");
  const int64_t N = 5, H = 3, W = 4, C = 3, K = 10;
  Tensor imgs = patterned(N, H, W, C);
  Tensor labels = from_vector(std::vector<int64_t>{3, 0, 9, 9, 1}, {N});
  write_image_arrays(dir.path.string(), "train", imgs, labels, geometry(H, W, C, K));
  write_image_arrays(dir.path.string(), "val", patterned(2, H, W, C), from_vector(std::vector<int64_t>{4, 5}, {2}),
                     geometry(H, W, C, K));
  const ImageArraysMeta meta = load_image_arrays_meta(dir.path.string());
  CHECK(meta.splits.at("train") == N);
  CHECK(meta.splits.at("val") == 2);
  ImageArrays train(dir.path.string(), "train");
  REQUIRE(train.size() == N);
  CHECK((train.height() == H && train.width() == W && train.channels() == C && train.classes() == K));
  Tensor got = train.images({4, 0, 4});
  REQUIRE(got.shape() == Shape{3, H, W, C});
  const int64_t per = H * W * C;
  const int64_t picks[] = {4, 0, 4};
  for (int64_t b = 0; b < 3; ++b)
    for (int64_t q = 0; q < per; ++q)
      CHECK(got.data_ptr<uint8_t>()[b * per + q] == uint8_t((7 * picks[b] + q) % 256));
  CHECK(train.labels({4, 0, 2}).to_vector<int64_t>() == std::vector<int64_t>{1, 3, 9});
  CHECK(ImageArrays(dir.path.string(), "val").labels({1}).to_vector<int64_t>() == std::vector<int64_t>{5});
}

TEST_CASE("image arrays: damaged or inconsistent files are refused with the file, image and byte") {
  TempDir dir("imgarr_bad");
  const std::string d = dir.path.string();
  const int64_t H = 2, W = 2, C = 1;
  write_image_arrays(d, "train", patterned(3, H, W, C), from_vector(std::vector<int64_t>{0, 1, 2}, {3}),
                     geometry(H, W, C, 3));
  const std::string images = dir.file("train.images"), labels = dir.file("train.labels");
  const std::string good_images = read_bytes(images), good_labels = read_bytes(labels);

  write_bytes(images, good_images.substr(0, 9));  // 2 whole images of 4 bytes, then 1 byte of the third
  CHECK_THROWS_MU(ImageArrays(d, "train"), "train.images: the file has 9 bytes");
  CHECK_THROWS_MU(ImageArrays(d, "train"), "it ends inside image 2 (at byte 9)");
  write_bytes(images, good_images + "xy");
  CHECK_THROWS_MU(ImageArrays(d, "train"), "2 more than meta.json's 3 images of 4 bytes (from byte 12)");
  write_bytes(images, good_images);

  std::string bad = good_labels;
  bad[4] = char(7);  // label 2 := 7, with 3 classes
  write_bytes(labels, bad);
  CHECK_THROWS_MU(ImageArrays(d, "train"), "label 2 at byte 4 is 7, not below the 3 classes");
  write_bytes(labels, good_labels.substr(0, 5));
  CHECK_THROWS_MU(ImageArrays(d, "train"), "the file has 5 bytes, 3 uint16 labels take 6");
  write_bytes(labels, good_labels);

  CHECK_THROWS_MU(ImageArrays(d, "test"), "has no split \"test\"");
  CHECK_THROWS_MU(ImageArrays(d, "../train"), "may hold only letters");
  ImageArrays ok(d, "train");
  CHECK_THROWS_MU(ok.images({3}), "image 3 is outside 0..2");
  CHECK_THROWS_MU(write_image_arrays(d, "x", patterned(1, H, W, C), from_vector(std::vector<int64_t>{3}, {1}),
                                     geometry(H, W, C, 3)),
                  "label 0 is 3, outside 0..2");
  CHECK_THROWS_MU(write_image_arrays(d, "x", patterned(1, 3, W, C), from_vector(std::vector<int64_t>{0}, {1}),
                                     geometry(3, W, C, 3)),
                  "holds images of 2x2x1 in 3 classes, not 3x2x1 in 3");

  const std::string meta = read_bytes(dir.file("meta.json"));
  write_bytes(dir.file("meta.json"), "{\"format\": \"mumoe-image-arrays\", \"version\": 1}");
  CHECK_THROWS_MU(ImageArrays(d, "train"), "missing field \"height\"");
  write_bytes(dir.file("meta.json"), "{\"format\": \"other\"}");
  CHECK_THROWS_MU(ImageArrays(d, "train"), "field \"format\" is \"other\"");
  write_bytes(dir.file("meta.json"), "{not json");
  CHECK_THROWS_MU(ImageArrays(d, "train"), "not valid JSON");
  write_bytes(dir.file("meta.json"), meta);
  CHECK(ImageArrays(d, "train").size() == 3);
}

TEST_CASE("random resized crop boxes lie inside the image with the drawn area and aspect, and repeat per seed") {
  const int64_t H = 200, W = 300;
  Generator gen(7), again(7);
  for (int i = 0; i < 500; ++i) {
    Generator::Draws d = gen.lock();
    const CropBox b = random_resized_crop_box(H, W, {0.08, 1.0}, {0.75, 4.0 / 3.0}, d);
    Generator::Draws d2 = again.lock();
    const CropBox b2 = random_resized_crop_box(H, W, {0.08, 1.0}, {0.75, 4.0 / 3.0}, d2);
    CHECK((b.top == b2.top && b.left == b2.left && b.height == b2.height && b.width == b2.width));
    REQUIRE((b.top >= 0 && b.left >= 0 && b.top + b.height <= H && b.left + b.width <= W));
    // Sides are rounded from the exact window: area and ratio within rounding of the ranges.
    const double area = double(b.height * b.width) / double(H * W);
    const double ratio = double(b.width) / double(b.height);
    CHECK(area >= 0.08 * 0.9);
    CHECK(area <= 1.0);
    CHECK(ratio >= 0.75 * (1 - 1.0 / double(b.height)) - 1e-9);
    CHECK(ratio <= 4.0 / 3.0 * (1 + 1.0 / double(b.height)) + 1e-9);
  }
  // Nothing fits a 10 x 1000 strip at these ratios: the centred window of the widest allowed ratio.
  Generator g(1);
  Generator::Draws d = g.lock();
  const CropBox f = random_resized_crop_box(10, 1000, {0.9, 1.0}, {0.75, 4.0 / 3.0}, d);
  CHECK((f.height == 10 && f.width == 13 && f.top == 0 && f.left == (1000 - 13) / 2));
  const CropBox c = center_crop_box(256, 300, 224, 224);
  CHECK((c.top == 16 && c.left == 38 && c.height == 224 && c.width == 224));
}

TEST_CASE("bilinear resize: the identity at equal size, a plane reproduced at the sampled points") {
  const int64_t H = 9, W = 11, C = 2;
  std::vector<uint8_t> src(size_t(H * W * C));
  for (int64_t y = 0; y < H; ++y)
    for (int64_t x = 0; x < W; ++x)
      for (int64_t c = 0; c < C; ++c) src[size_t((y * W + x) * C + c)] = uint8_t(10 * y + 7 * x + 40 * c);
  const CropBox box{2, 3, 5, 6};
  std::vector<uint8_t> same(size_t(5 * 6 * C));
  resize_bilinear(src.data(), H, W, C, box, same.data(), 5, 6);
  for (int64_t y = 0; y < 5; ++y)
    for (int64_t x = 0; x < 6; ++x)
      for (int64_t c = 0; c < C; ++c)
        CHECK(same[size_t((y * 6 + x) * C + c)] == src[size_t(((y + 2) * W + x + 3) * C + c)]);
  // Upsampled 5x6 -> 13x17: bilinear interpolation of a plane is the plane at the source
  // coordinate (o + 0.5) n / m - 0.5, clamped to [0, n - 1] inside the window.
  const int64_t oh = 13, ow = 17;
  std::vector<uint8_t> up(size_t(oh * ow * C));
  resize_bilinear(src.data(), H, W, C, box, up.data(), oh, ow);
  for (int64_t y = 0; y < oh; ++y)
    for (int64_t x = 0; x < ow; ++x)
      for (int64_t c = 0; c < C; ++c) {
        const double sy = std::clamp((y + 0.5) * 5.0 / oh - 0.5, 0.0, 4.0);
        const double sx = std::clamp((x + 0.5) * 6.0 / ow - 0.5, 0.0, 5.0);
        const double want = 10 * (sy + 2) + 7 * (sx + 3) + 40 * c;
        CHECK(std::abs(double(up[size_t((y * ow + x) * C + c)]) - want) <= 0.5 + 1e-4);
      }
  CHECK_THROWS_MU(resize_bilinear(src.data(), H, W, C, CropBox{5, 0, 5, 2}, up.data(), 2, 2), "is not inside the 9x11");
}

TEST_CASE("flip and normalisation, element by element") {
  const int64_t B = 2, H = 3, W = 5, C = 3;
  Tensor imgs = patterned(B, H, W, C);
  std::vector<uint8_t> orig(imgs.data_ptr<uint8_t>(), imgs.data_ptr<uint8_t>() + imgs.numel());
  flip_horizontal(imgs.data_ptr<uint8_t>(), H, W, C);  // image 0 only
  for (int64_t y = 0; y < H; ++y)
    for (int64_t x = 0; x < W; ++x)
      for (int64_t c = 0; c < C; ++c)
        CHECK(imgs.data_ptr<uint8_t>()[(y * W + x) * C + c] == orig[size_t((y * W + (W - 1 - x)) * C + c)]);
  const std::vector<double> mean{0.485, 0.456, 0.406}, sd{0.229, 0.224, 0.225};
  Tensor f = to_normalized_float(imgs, mean, sd);
  REQUIRE(f.shape() == Shape{B, C, H, W});
  std::vector<double> want;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t y = 0; y < H; ++y)
        for (int64_t x = 0; x < W; ++x)
          want.push_back((imgs.data_ptr<uint8_t>()[((b * H + y) * W + x) * C + c] / 255.0 - mean[size_t(c)]) /
                         sd[size_t(c)]);
  check_close(f, want, 1e-5);
  CHECK_THROWS_MU(to_normalized_float(imgs, {0.5}, {0.5}), "3 channels, but 1 means");
  CHECK_THROWS_MU(to_normalized_float(f, mean, sd), "expected uint8 (B, H, W, C)");
}

TEST_CASE("Beta draws have the distribution's mean and variance") {
  for (auto [a, b] : {std::pair{0.5, 0.5}, std::pair{2.0, 5.0}, std::pair{0.2, 1.5}}) {
    Generator gen(11);
    Generator::Draws d = gen.lock();
    const int n = 40000;
    double s = 0, ss = 0;
    for (int i = 0; i < n; ++i) {
      const double x = sample_beta(a, b, d);
      REQUIRE((x >= 0 && x <= 1));
      s += x;
      ss += x * x;
    }
    const double mean = s / n, var = ss / n - mean * mean;
    const double want_mean = a / (a + b), want_var = a * b / ((a + b) * (a + b) * (a + b + 1));
    // The sample mean's standard error is sqrt(var / n); 5 of them.
    CHECK(std::abs(mean - want_mean) < 5 * std::sqrt(want_var / n));
    CHECK(std::abs(var - want_var) < 0.05 * want_var);
  }
}

TEST_CASE("mixup blends each sample with its mirror in the batch, targets likewise") {
  const int64_t B = 5, K = 4;
  Tensor x = randn({B, 3});
  Tensor labels = from_vector(std::vector<int64_t>{0, 3, 1, 1, 2}, {B});
  Generator gen(3);
  const Mixed m = mixup(x, labels, K, 0.5, gen);
  REQUIRE((m.lambda > 0 && m.lambda < 1));
  std::vector<double> want_x, want_t(size_t(B * K), 0.0);
  const auto xv = x.to_vector<double>();
  const auto lv = labels.to_vector<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t j = 0; j < 3; ++j)
      want_x.push_back(m.lambda * xv[size_t(b * 3 + j)] + (1 - m.lambda) * xv[size_t((B - 1 - b) * 3 + j)]);
    want_t[size_t(b * K + lv[size_t(b)])] += m.lambda;
    want_t[size_t(b * K + lv[size_t(B - 1 - b)])] += 1 - m.lambda;
  }
  check_close(m.x, want_x, 1e-6);
  check_close(m.targets, want_t, 1e-6);
  Generator g0(3);
  const Mixed none = mixup(x, labels, K, 0.0, g0);
  CHECK(none.lambda == 1.0);
  check_close(none.x, xv, 0);
  CHECK_THROWS_MU(mixup(x, labels, 3, 0.5, g0), "label 1 is 3, outside 0..2");
}

TEST_CASE("training batches: crops of the stored images, the same on 1 and 2 threads, soft targets summing to 1") {
  TempDir dir("imgbatch");
  const int64_t N = 6, S = 20, C = 3, K = 4;
  Tensor imgs = patterned(N, S, S, C);
  write_image_arrays(dir.path.string(), "train", imgs, from_vector(std::vector<int64_t>{0, 1, 2, 3, 0, 1}, {N}),
                     geometry(S, S, C, K));
  ImageArrays train(dir.path.string(), "train");
  ImageBatchOptions o;
  o.size = 12;
  o.rand_augment.magnitude = 15;
  o.mixup = 0.5;
  const std::vector<int64_t> idx{5, 2, 3, 0};
  omp_set_num_threads(1);
  const Batch one = training_batch(train, idx, o, 42);
  omp_set_num_threads(2);
  const Batch two = training_batch(train, idx, o, 42);
  const Batch other = training_batch(train, idx, o, 43);
  REQUIRE(one.input.shape() == Shape{4, C, 12, 12});
  REQUIRE(one.target.shape() == Shape{4, K});
  CHECK(max_abs_diff(one.input, two.input) == 0.0);
  CHECK(max_abs_diff(one.target, two.target) == 0.0);
  CHECK(max_abs_diff(one.input, other.input) > 0.0);
  const auto t = one.target.to_vector<double>();
  for (int64_t b = 0; b < 4; ++b) {
    double s = 0;
    for (int64_t k = 0; k < K; ++k) s += t[size_t(b * K + k)];
    CHECK(s == doctest::Approx(1.0).epsilon(1e-6));
  }
  // Without augmentation, flips or mixup, and a crop area fraction of 1 with the stored
  // aspect ratio, the whole image is resized: a constant image stays that constant.
  Tensor flat = empty({1, S, S, C}, kUInt8);
  std::fill(flat.data_ptr<uint8_t>(), flat.data_ptr<uint8_t>() + flat.numel(), uint8_t(51));
  write_image_arrays(dir.path.string(), "flat", flat, from_vector(std::vector<int64_t>{2}, {1}), geometry(S, S, C, K));
  ImageBatchOptions plain;
  plain.size = 12;
  plain.min_scale = 1.0;
  plain.flip = 0;
  plain.augment = false;
  const Batch b = training_batch(ImageArrays(dir.path.string(), "flat"), {0}, plain, 7);
  for (int64_t c = 0; c < C; ++c) {
    const double want = (51 / 255.0 - plain.mean[size_t(c)]) / plain.stddev[size_t(c)];
    CHECK(max_abs_diff(b.input.narrow(1, c, 1), full({1, 1, 12, 12}, want)) < 1e-5);
  }
  CHECK(b.target.to_vector<double>() == std::vector<double>{0, 0, 1, 0});
  CHECK_THROWS_MU(training_batch(train, {6}, o, 1), "index 0 is 6, outside 0..5");
}

TEST_CASE("evaluation batches: the central crop, normalised, with integer labels") {
  TempDir dir("imgeval");
  const int64_t N = 3, S = 10, C = 3, K = 5;
  Tensor imgs = patterned(N, S, S, C);
  write_image_arrays(dir.path.string(), "val", imgs, from_vector(std::vector<int64_t>{4, 0, 2}, {N}),
                     geometry(S, S, C, K));
  ImageArrays val(dir.path.string(), "val");
  ImageBatchOptions o;
  o.size = 6;
  const Batch b = eval_batch(val, 1, 5, o);  // images 1 and 2 (the split ends)
  REQUIRE(b.input.shape() == Shape{2, C, 6, 6});
  CHECK(b.target.to_vector<int64_t>() == std::vector<int64_t>{0, 2});
  std::vector<double> want;
  for (int64_t i = 1; i < 3; ++i)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t y = 0; y < 6; ++y)
        for (int64_t x = 0; x < 6; ++x) {
          const int64_t q = ((y + 2) * S + (x + 2)) * C + c;  // offset (10 - 6) / 2 = 2
          want.push_back((double((7 * i + q) % 256) / 255.0 - o.mean[size_t(c)]) / o.stddev[size_t(c)]);
        }
  check_close(b.input, want, 1e-5);
}
