// Hostile input for the Mixer and the image-data entry points, each case in a forked
// child (tests/isolated.h): sizes near int64's end, NaN options, empty batches, huge
// paddings, and producers that fail in odd ways. Each asserts the error (by a substring
// of its message) or the exact result.
#include <cmath>
#include <limits>

#include "data/augment.h"
#include "data/prefetch.h"
#include "helpers.h"
#include "isolated_checks.h"
#include "models/mlp_mixer.h"

using namespace mu;
using models::MixerConfig;

namespace {


constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

}  // namespace

TEST_CASE("MixerConfig: sizes near int64's end and NaN rates are refused in counts and construction") {
  auto count = [](MixerConfig c) { return [c] { return std::to_string(models::MlpMixer::count_parameters(c)); }; };
  MixerConfig c = models::mixer_fmnist();
  c.image_size = kMax;  // not divisible by 4
  expect_error("image_size max", count(c), "is not divisible by patch_size 4");
  c = models::mixer_fmnist();
  c.image_size = int64_t(1) << 62;
  c.patch_size = 1;
  expect_error("tokens overflow", count(c), "does not fit in int64");
  c = models::mixer_fmnist();
  c.num_classes = kMax;
  expect_error("classes overflow", count(c), "does not fit in int64");
  c = models::mixer_fmnist();
  c.depth = kMax;
  expect_error("depth overflow", count(c), "does not fit in int64");
  c = models::mixer_s16(models::MixerMlp::DenseMoE);
  c.experts = int64_t(1) << 40;
  expect_error("dense MoE experts overflow", count(c), "does not fit in int64");
  c = models::mixer_fmnist();
  c.stochastic_depth = std::numeric_limits<double>::infinity();
  expect_error("stochastic_depth inf", count(c), "stochastic_depth must lie in [0, 1], got inf");
  c = models::mixer_fmnist();
  c.stochastic_depth = NAN;
  expect_error("stochastic_depth NaN (model)", [c] { return std::to_string(models::MlpMixer(c).num_parameters()); },
               "stochastic_depth must lie in [0, 1], got nan");
  c = models::mixer_s16(models::MixerMlp::TRMuMoE);
  c.tr_rank_ratio = -std::numeric_limits<double>::infinity();
  expect_error("tr ratio -inf", count(c), "tr_rank_ratio must be a positive finite number");
  // The largest S/16 dense-MoE count still fits and is exact (no allocation).
  expect_result("S/16 dense MoE count", count(models::mixer_s16(models::MixerMlp::DenseMoE)), "1127950824");
}

TEST_CASE("Mixer forward on empty and mismatched batches") {
  expect_result("empty batch, MLP blocks", [] {
    models::MlpMixer m(models::mixer_fmnist());
    return shape_str(m.forward(zeros({0, 1, 28, 28})).shape());
  }, "[0, 10]");
  expect_error("NaN-free check of a 0-channel image", [] {
    models::MlpMixer m(models::mixer_fmnist());
    return shape_str(m.forward(zeros({2, 0, 28, 28})).shape());
  }, "expected 1 channels, got 0");
  expect_error("bool images", [] {
    models::MlpMixer m(models::mixer_fmnist());
    return shape_str(m.forward(zeros({2, 784}, kBool)).shape());
  }, "images must be floating point, got bool");
}

TEST_CASE("augmentations: huge paddings, empty batches, NaN and infinite options") {
  expect_error("padding overflow", [] { return shape_str(data::random_crop(zeros({1, 2, 2}), kMax).shape()); },
               "does not fit in int64");
  expect_result("padding 2^61 gives zeros", [] {
    Generator g(1);
    return std::to_string(data::random_crop(ones({2, 3, 3}), int64_t(1) << 61, &g).abs().sum().item());
  }, "0.000000");
  expect_result("empty batch with huge sizes", [] {
    return shape_str(data::random_crop(zeros({0, 3, 3}), 2).shape());
  }, "[0, 3, 3]");
  expect_result("zero channels, huge H and W", [] {
    Tensor x = zeros({2, 0, 1, 1}).expand({2, 0, int64_t(1) << 30, int64_t(1) << 30});
    return shape_str(data::random_crop(x, 1).shape());
  }, "[2, 0, 1073741824, 1073741824]");
  expect_error("flip p inf", [] { return shape_str(data::random_horizontal_flip(zeros({1, 2, 2}), INFINITY).shape()); },
               "p must lie in [0, 1], got inf");
  expect_error("normalize std inf", [] { return shape_str(data::normalize(zeros({1, 2, 2}), {0}, {INFINITY}).shape()); },
               "std must be positive and finite, got inf");
  expect_error("normalize int64", [] { return shape_str(data::normalize(zeros({1, 2, 2}, kInt64), {0}, {1}).shape()); },
               "images must be floating point, got int64");
}

TEST_CASE("prefetch: odd failures in the producer end as a mu::Error, never a crash or a hang") {
  expect_error("producer throws an int", [] {
    data::Prefetcher pf([]() -> std::optional<data::Batch> { throw 7; });
    return std::to_string(pf.next().has_value());
  }, "an exception that is not a std::exception");
  expect_error("producer throws bad_alloc", [] {
    data::Prefetcher pf([]() -> std::optional<data::Batch> { throw std::bad_alloc(); });
    return std::to_string(pf.next().has_value());
  }, "the batch source failed");
  expect_result("consumer leaves before the producer's first batch", [] {
    data::Prefetcher pf([]() -> std::optional<data::Batch> { return data::Batch{zeros({1}), zeros({1}, kInt64)}; }, 1);
    return std::string("left");
  }, "left");
  expect_error("huge capacity is fine, empty source is not", [] {
    data::Prefetcher pf(data::BatchSource{}, kMax);
    return std::string("constructed");
  }, "the batch source is empty");
}
