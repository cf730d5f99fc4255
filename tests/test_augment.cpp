// Image augmentations (random crop with zero padding, horizontal flip, per-channel
// normalisation) checked element by element against loops over the pixels, and the
// background prefetcher: same batches as without it, errors re-raised, clean shutdown.
#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>

#include "data/augment.h"
#include "data/loader.h"
#include "data/prefetch.h"
#include "helpers.h"

using namespace mu;

TEST_CASE("crop with padding keeps the image content at the drawn offset, zeros elsewhere") {
  for (Device dev : test_devices()) {
    manual_seed(1);
    const int64_t B = 6, C = 2, H = 5, W = 7, P = 3;
    Tensor x = on(randn({B, C, H, W}), dev);
    Generator gen(42);
    std::vector<std::pair<int64_t, int64_t>> offs;
    Tensor y = data::random_crop(x, P, &gen, &offs);
    REQUIRE(y.shape() == x.shape());
    REQUIRE(offs.size() == size_t(B));
    auto xv = x.to_vector<double>();
    std::vector<double> want;
    for (int64_t b = 0; b < B; ++b) {
      auto [dy, dx] = offs[size_t(b)];
      CHECK((dy >= 0 && dy <= 2 * P && dx >= 0 && dx <= 2 * P));
      for (int64_t c = 0; c < C; ++c)
        for (int64_t i = 0; i < H; ++i)
          for (int64_t j = 0; j < W; ++j) {
            // The padded image is the original shifted by P; the window starts at (dy, dx).
            const int64_t si = i + dy - P, sj = j + dx - P;
            const bool in = si >= 0 && si < H && sj >= 0 && sj < W;
            want.push_back(in ? xv[size_t(flat({B, C, H, W}, {b, c, si, sj}))] : 0.0);
          }
    }
    check_close(y, want, 0);
    // The same seed draws the same offsets; crop_at with them gives the same batch.
    Generator again(42);
    std::vector<std::pair<int64_t, int64_t>> offs2;
    Tensor y2 = data::random_crop(x, P, &again, &offs2);
    CHECK(offs2 == offs);
    CHECK(max_abs_diff(y2, y) == 0);
    CHECK(max_abs_diff(data::crop_at(x, P, offs), y) == 0);
    // Offset (P, P) is the identity; padding 0 returns the batch.
    CHECK(max_abs_diff(data::crop_at(x, P, std::vector<std::pair<int64_t, int64_t>>(size_t(B), {P, P})), x) == 0);
    CHECK(data::random_crop(x, 0, &gen).is_same(x));
  }
}

TEST_CASE("crop draws cover every offset and work on (B, H, W) batches") {
  Generator gen(3);
  Tensor x = randn({400, 4, 4});
  std::vector<std::pair<int64_t, int64_t>> offs;
  Tensor y = data::random_crop(x, 1, &gen, &offs);
  CHECK(y.shape() == x.shape());
  int seen[3][3] = {};
  for (auto [dy, dx] : offs) seen[dy][dx]++;
  // 400 draws over 9 offsets (44 each expected): each appears.
  for (auto& row : seen)
    for (int n : row) CHECK(n > 15);
  // Sample 0 against its offset.
  auto [dy, dx] = offs[0];
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t j = 0; j < 4; ++j) {
      const int64_t si = i + dy - 1, sj = j + dx - 1;
      const double want = (si >= 0 && si < 4 && sj >= 0 && sj < 4) ? x.at({0, si, sj}) : 0.0;
      CHECK(y.at({0, i, j}) == want);
    }
}

TEST_CASE("horizontal flip: an index reversal of the chosen samples, its own inverse") {
  for (Device dev : test_devices()) {
    manual_seed(2);
    const int64_t B = 40, C = 3, H = 2, W = 5;
    Tensor x = on(randn({B, C, H, W}), dev);
    Generator gen(9);
    std::vector<bool> flags;
    Tensor y = data::random_horizontal_flip(x, 0.5, &gen, &flags);
    REQUIRE(flags.size() == size_t(B));
    int64_t n_flipped = 0;
    for (bool f : flags) n_flipped += f;
    CHECK(n_flipped > 5);
    CHECK(n_flipped < 35);
    auto xv = x.to_vector<double>();
    std::vector<double> want;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t c = 0; c < C; ++c)
        for (int64_t i = 0; i < H; ++i)
          for (int64_t j = 0; j < W; ++j)
            want.push_back(xv[size_t(flat({B, C, H, W}, {b, c, i, flags[size_t(b)] ? W - 1 - j : j}))]);
    check_close(y, want, 0);
    // Flipping the same samples again restores the batch exactly.
    CHECK(max_abs_diff(data::flip_at(y, flags), x) == 0);
    // p = 0 never flips, p = 1 always does.
    CHECK(max_abs_diff(data::random_horizontal_flip(x, 0.0, &gen), x) == 0);
    Tensor all = data::random_horizontal_flip(x, 1.0, &gen);
    CHECK(max_abs_diff(data::flip_at(all, std::vector<bool>(size_t(B), true)), x) == 0);
  }
  // (B, H, W) batches too.
  Tensor g = tensor({{1, 2, 3}, {4, 5, 6}}).reshape({1, 2, 3});
  check_close(data::flip_at(g, {true}), {3, 2, 1, 6, 5, 4}, 0);
}

TEST_CASE("normalize: (x - mean_c) / std_c per channel") {
  for (Device dev : test_devices()) {
    manual_seed(3);
    const int64_t B = 200, C = 3, H = 4, W = 4;
    // Channel c has mean 10c and std c + 1.
    std::vector<double> mean = {0, 10, 20}, sd = {1, 2, 3};
    Tensor x = randn({B, C, H, W}) * from_vector(sd, {C, 1, 1}).to(kFloat32) + from_vector(mean, {C, 1, 1}).to(kFloat32);
    x = on(x, dev);
    Tensor y = data::normalize(x, mean, sd);
    auto xv = x.to_vector<double>();
    std::vector<double> want(xv.size());
    for (size_t k = 0; k < xv.size(); ++k) {
      const int64_t c = unflat({B, C, H, W}, int64_t(k))[1];
      want[k] = (xv[k] - mean[size_t(c)]) / sd[size_t(c)];
    }
    check_close(y, want, 1e-6);
    // The per-channel statistics after normalisation: near 0 and 1 (3200 values each).
    Tensor m = y.mean({0, 2, 3}), s = mu::std(y, {0, 2, 3});
    for (int64_t c = 0; c < C; ++c) {
      CHECK(std::abs(m.at({c})) < 0.1);
      CHECK(std::abs(s.at({c}) - 1.0) < 0.1);
    }
  }
  Tensor g = tensor({{2, 4}, {6, 8}}).reshape({1, 2, 2});
  check_close(data::normalize(g, {2}, {2}), {0, 1, 2, 3}, 0);
}

TEST_CASE("augmentations refuse bad input with messages naming it") {
  Tensor x = randn({2, 3, 4, 4});
  CHECK_THROWS_MU(data::random_crop(x, -1), "padding must be non-negative, got -1");
  CHECK_THROWS_MU(data::random_crop(randn({4, 4}), 1), "expected images (B, C, H, W) or (B, H, W), got shape [4, 4]");
  CHECK_THROWS_MU(data::random_crop(zeros({2, 4, 4}, kInt64), 1), "images must be floating point, got int64");
  CHECK_THROWS_MU(data::crop_at(x, 1, {{0, 0}}), "1 offsets for a batch of 2");
  CHECK_THROWS_MU(data::crop_at(x, 1, {{0, 0}, {3, 0}}), "offset (3, 0) outside [0, 2] for padding 1");
  CHECK_THROWS_MU(data::random_horizontal_flip(x, 1.5), "p must lie in [0, 1], got 1.5");
  CHECK_THROWS_MU(data::random_horizontal_flip(x, std::nan("")), "p must lie in [0, 1]");
  CHECK_THROWS_MU(data::flip_at(x, {true}), "1 flags for a batch of 2");
  CHECK_THROWS_MU(data::normalize(x, {0, 0}, {1, 1}), "images have 3 channels but mean has 2 and std 2 values");
  CHECK_THROWS_MU(data::normalize(x, {0, 0, 0}, {1, 0, 1}), "std must be positive and finite, got 0 for channel 1");
  CHECK_THROWS_MU(data::normalize(x, {0, std::nan(""), 0}, {1, 1, 1}), "mean must be a finite number");
  CHECK_THROWS_MU(data::normalize(Tensor(), {0}, {1}), "undefined");
}

namespace {

// An augmentation drawing from its generator: crop with padding 2, then flip.
Tensor augment(const Tensor& x, Generator* gen) {
  return data::random_horizontal_flip(data::random_crop(x.reshape({x.size(0), 1, 6, 6}), 2, gen), 0.5, gen);
}

}  // namespace

TEST_CASE("prefetch: the same seed gives the same batches with and without the thread") {
  manual_seed(4);
  const int64_t N = 100;
  Tensor images = randn({N, 36}), labels = randint(0, 10, {N});
  Generator shuffle(5);
  data::DataLoader loader(N, data::DataLoaderOptions(16).generator(&shuffle));
  std::vector<Tensor> order = loader.epoch();
  REQUIRE(order.size() == 7);
  // Directly, on this thread.
  Generator g1(77);
  data::BatchSource direct = data::epoch_source(images, labels, order, augment, &g1);
  std::vector<data::Batch> want;
  while (auto b = direct()) want.push_back(*b);
  REQUIRE(want.size() == 7);
  // Through the prefetcher, with capacities 1 and 3; the training thread meanwhile draws
  // from the global generator, which the source's own stream does not see.
  for (int64_t capacity : {1, 3}) {
    Generator g2(77);
    data::Prefetcher pf(data::epoch_source(images, labels, order, augment, &g2), capacity);
    size_t k = 0;
    while (auto b = pf.next()) {
      REQUIRE(k < want.size());
      (void)randn({64});
      CHECK(max_abs_diff(b->input, want[k].input) == 0);
      CHECK(max_abs_diff(b->target, want[k].target) == 0);
      CHECK(!b->input.requires_grad());
      ++k;
    }
    CHECK(k == want.size());
    CHECK(!pf.next().has_value());  // stays at the end
  }
  // The batches are the loader's rows, augmented: labels are index_select of labels.
  CHECK(max_abs_diff(want[0].target, index_select(labels, 0, order[0])) == 0);
}

TEST_CASE("prefetch: errors in the producer reach the consumer as mu::Error, in order") {
  int calls = 0;
  data::Prefetcher pf(
      [&]() -> std::optional<data::Batch> {
        if (++calls == 3) throw std::runtime_error("disk on fire");
        return data::Batch{full({1}, double(calls)), zeros({1}, kInt64)};
      },
      4);
  auto a = pf.next();
  auto b = pf.next();
  REQUIRE(a.has_value());
  REQUIRE(b.has_value());
  CHECK(a->input.item() == 1);
  CHECK(b->input.item() == 2);
  CHECK_THROWS_MU(pf.next(), "Prefetcher: the batch source failed: disk on fire");
  CHECK_THROWS_MU(pf.next(), "disk on fire");  // the error stays
  // A mu::Error passes through as itself.
  data::Prefetcher pe([]() -> std::optional<data::Batch> { return data::Batch{index_select(zeros({2}), 0, tensor({5})), {}}; });
  CHECK_THROWS_MU(pe.next(), "index_select");
  CHECK_THROWS_MU(data::Prefetcher(data::BatchSource{}), "the batch source is empty");
  CHECK_THROWS_MU(data::Prefetcher([]() { return std::optional<data::Batch>(); }, 0), "capacity must be at least 1, got 0");
  CHECK_THROWS_MU(data::epoch_source(zeros({3, 2}), zeros({4}, kInt64), {}), "differ in the sample count");
}

TEST_CASE("prefetch: destruction stops an endless producer without taking its batches") {
  std::atomic<int> made{0};
  auto start = std::chrono::steady_clock::now();
  {
    data::Prefetcher pf(
        [&]() -> std::optional<data::Batch> {
          ++made;
          return data::Batch{zeros({8}), zeros({8}, kInt64)};
        },
        2);
    CHECK(pf.next().has_value());
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    // Bounded: at most the one taken, two queued and one in hand.
    CHECK(made.load() <= 4);
  }  // joins here
  {
    // Destroyed before anything is taken, and a producer that is slow.
    data::Prefetcher pf([]() -> std::optional<data::Batch> {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      return data::Batch{zeros({1}), zeros({1}, kInt64)};
    });
  }
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
}
