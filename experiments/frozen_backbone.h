// The frozen backbone of the final-layer reproductions (repro_table10_hierarchical,
// repro_fig3_polysemanticity). The paper trains μMoE final layers on the features of a
// pre-trained CLIP ViT-B-32 (and DINO) for ImageNet-1k; neither model nor data is
// available offline, so the analog here is a small network trained once on
// Fashion-MNIST (784 -> 256 -> 128 with GELUs, and a linear head that is then dropped)
// whose 128 penultimate features are computed once for both splits and held fixed while
// the final layers (128 -> 10 classes) train on them. The backbone has its own seed, so
// every final layer of a reproduction sees the same features.
//
//   repro::FrozenFeatures f = repro::frozen_features(repro::BackboneConfig{});
//   repro::HeadTraining t;                     // AdamW, warm-up and cosine
//   repro::fit(*head, f.train, f.images.train.labels, t, /*seed=*/0);
//   double acc = repro::accuracy(*head, f.test, f.images.test.labels);
#pragma once
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <vector>

#include <CLI/CLI.hpp>

#include "data/fashion_mnist.h"
#include "data/loader.h"
#include "experiments/repro.h"
#include "mumoe.h"
#include "nn/activation.h"
#include "nn/linear.h"
#include "optim/adamw.h"
#include "optim/schedule.h"

namespace mu::repro {

// How a classifier is trained on fixed inputs: AdamW on shuffled mini-batches (the last,
// smaller batch dropped, so that batch-norm gating never normalises over a handful of
// rows), the learning rate warmed up linearly and decayed along a cosine to min_lr.
struct HeadTraining {
  double epochs = 10;
  int64_t batch = 128;
  double lr = 2e-3, min_lr = 2e-5;
  int64_t warmup = 100;
  double weight_decay = 1e-4;
};

// The batches and learning rates of a HeadTraining over `rows` rows: shuffled batches in
// the order `order` draws (the last, smaller batch dropped), the step count, and the
// warm-up and cosine schedule over it. `who` names the caller in the error for too few rows.
struct HeadSteps {
  data::DataLoader loader;
  int64_t steps;
  optim::LRSchedule schedule;
};
inline HeadSteps head_steps(int64_t rows, const HeadTraining& t, Generator* order, const char* who) {
  const int64_t per_epoch = rows / t.batch;
  MU_CHECK(per_epoch > 0, who, ": ", rows, " rows make no batch of ", t.batch);
  const int64_t steps = std::max<int64_t>(1, int64_t(t.epochs * double(per_epoch)));
  return HeadSteps{data::DataLoader(rows, data::DataLoaderOptions(t.batch).drop_last(true).generator(order)), steps,
                   optim::warmup_cosine_lr(t.lr, t.min_lr, std::min(t.warmup, steps / 2), steps)};
}

// Trains `model` (inputs -> class logits) on rows of x with their labels. The seed sets
// the batch order (the model's initialisation is the caller's: build it after
// manual_seed). Returns the mean training loss over the last epoch's batches.
inline double fit(nn::UnaryModule& model, const Tensor& x, const Tensor& labels, const HeadTraining& t,
                  uint64_t seed) {
  Generator order(seed);
  const HeadSteps hs = head_steps(x.size(0), t, &order, "fit");
  optim::AdamW opt(model.parameters(), optim::AdamWOptions(t.lr).weight_decay(t.weight_decay));
  model.train();
  int64_t step = 0;
  double last_epoch_loss = 0;
  int64_t last_epoch_batches = 0;
  while (step < hs.steps) {
    last_epoch_loss = 0, last_epoch_batches = 0;
    for (const Tensor& idx : hs.loader.epoch()) {
      if (step == hs.steps) break;
      optim::apply_lr(opt, hs.schedule, step++);
      Tensor loss = cross_entropy(model(index_select(x, 0, idx)), index_select(labels, 0, idx));
      opt.zero_grad();
      loss.backward();
      opt.step();
      last_epoch_loss += loss.item();
      ++last_epoch_batches;
    }
  }
  return last_epoch_loss / double(std::max<int64_t>(1, last_epoch_batches));
}

// The predicted class of every row of x, in eval mode, without a graph: int64 (rows).
inline Tensor predict(nn::UnaryModule& model, const Tensor& x) {
  NoGradGuard no_grad;
  model.eval();
  std::vector<Tensor> parts;
  for (const Tensor& idx : data::DataLoader(x.size(0), data::DataLoaderOptions(1000).shuffle(false)).epoch())
    parts.push_back(argmax(model(index_select(x, 0, idx)), 1));
  return cat(parts, 0);
}

// The share of rows of x whose predicted class is their label.
inline double accuracy(nn::UnaryModule& model, const Tensor& x, const Tensor& labels) {
  return sum((predict(model, x) == labels).to(kInt64)).item() / double(labels.size(0));
}

struct BackboneConfig {
  int64_t hidden = 256, features = 128;
  HeadTraining training{3, 128, 2e-3, 2e-5, 100, 1e-4};
  uint64_t seed = 1000;
  // Rows of each split used (0: all): the smoke scale trains on a slice.
  int64_t train_rows = 0, test_rows = 0;
};

struct FrozenFeatures {
  data::FashionMnist images;  // the data (sliced as the config says): labels, and images for the expert grids
  Tensor train, test;         // float32 (rows, features): the backbone's penultimate activations
  double backbone_accuracy = 0;  // the backbone's test accuracy through its own linear head
  double seconds = 0;            // the backbone's training and feature extraction
  std::shared_ptr<nn::Sequential> backbone;  // images (rows, 784) -> features, in eval mode

  // The features of more images (a validation split), without a graph.
  Tensor features(const Tensor& images) const {
    NoGradGuard no_grad;
    return backbone->forward(images).detach();
  }
};

// Trains the backbone on `data`'s training split (seeded by config.seed) and computes the
// features of both splits. A reproduction that changes the data (repro_table2_rewrite
// makes a subpopulation rare) passes its own.
inline FrozenFeatures frozen_features(const BackboneConfig& config, data::FashionMnist data) {
  const auto t0 = std::chrono::steady_clock::now();
  FrozenFeatures f;
  f.images = std::move(data);
  auto slice = [](data::LabelledImages& s, int64_t rows) {
    if (rows <= 0 || rows >= s.size()) return;
    s.images = s.images.narrow(0, 0, rows).contiguous();
    s.labels = s.labels.narrow(0, 0, rows).contiguous();
  };
  slice(f.images.train, config.train_rows);
  slice(f.images.test, config.test_rows);
  manual_seed(config.seed);
  auto body = std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::UnaryModule>>{
      std::make_shared<nn::Linear>(784, config.hidden), std::make_shared<nn::GELU>(),
      std::make_shared<nn::Linear>(config.hidden, config.features), std::make_shared<nn::GELU>()});
  nn::Sequential net({body, std::make_shared<nn::Linear>(config.features, 10)});
  fit(net, f.images.train.images, f.images.train.labels, config.training, config.seed);
  f.backbone_accuracy = accuracy(net, f.images.test.images, f.images.test.labels);
  NoGradGuard no_grad;
  body->eval();
  f.train = body->forward(f.images.train.images).detach();
  f.test = body->forward(f.images.test.images).detach();
  f.backbone = body;
  f.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("frozen backbone: 784 -> %lld -> %lld, test accuracy %.2f%% through its own head (%.0f s)\n",
              (long long)config.hidden, (long long)config.features, 100 * f.backbone_accuracy, f.seconds);
  return f;
}

// The flags every final-layer program shares, --seeds and --epochs (per final layer), and
// what they and the scale resolve to: 2 seeds and 1 epoch at smoke, where the backbone
// trains 1 epoch on the first 2,000 training images and is tested on the first 500;
// 3 seeds and 10 epochs at local, on all of Fashion-MNIST.
struct FinalLayerRuns {
  int seeds = 0;
  double epochs = 0;
  BackboneConfig backbone;
};

inline void add_final_layer_flags(CLI::App& app, FinalLayerRuns& r) {
  app.add_option("--seeds", r.seeds, "Seeds per final layer (default: 2 at smoke, 3 at local)")->check(CLI::Range(1, 100));
  app.add_option("--epochs", r.epochs, "Epochs per final layer (default: 1 at smoke, 10 at local)")
      ->check(CLI::PositiveNumber);
}

inline void resolve(FinalLayerRuns& r, Scale scale) {
  const bool smoke = scale == Scale::Smoke;
  if (r.seeds == 0) r.seeds = smoke ? 2 : 3;
  if (r.epochs == 0) r.epochs = smoke ? 1 : 10;
  if (smoke) {
    r.backbone.train_rows = 2000, r.backbone.test_rows = 500;
    r.backbone.training.epochs = 1;
  }
}

// The same on Fashion-MNIST as loaded.
inline FrozenFeatures frozen_features(const BackboneConfig& config) {
  return frozen_features(config, data::load_fashion_mnist());
}

}  // namespace mu::repro
