// A whole experiment with the library, the README's worked example: a hierarchical
// TRμMoE classifier on Fashion-MNIST. It loads the data, holds out a validation split,
// trains with AdamW under a warm-up + cosine schedule, evaluates under NoGradGuard,
// saves a checkpoint after every epoch and resumes from it, and prints what the experts
// learnt (per-class mean coefficients and each expert's top inputs).
//
//   ./build/experiments/hierarchical_trmumoe --out-dir run            # 3 epochs, ~1 min on 2 cores
//   ./build/experiments/hierarchical_trmumoe --out-dir run --epochs 5 # resumes after epoch 3
//
// Data: Debian's dataset-fashion-mnist, or the directory in $MUMOE_FASHION_MNIST_DIR.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "mumoe.h"

using namespace mu;

// Fraction of test images the model classifies correctly (one pass, no graph recorded).
double accuracy(nn::MuMoE& model, std::shared_ptr<const data::Dataset> ds) {
  NoGradGuard no_grad;
  model.eval();  // batch-norm gating uses its running statistics
  int64_t correct = 0;
  data::DataLoader loader(ds, data::DataLoaderOptions(1000).shuffle(false));
  for (auto [x, y] : loader.batches()) correct += int64_t(eq(model.forward(x).argmax(1), y).sum().item());
  model.train();
  return double(correct) / double(ds->size());
}

int main(int argc, char** argv) {
  int64_t epochs = 3, limit = 0;
  std::string out_dir = "hierarchical_trmumoe_run";
  CLI::App app("A hierarchical TRμMoE classifier on Fashion-MNIST, trained, checkpointed and analysed");
  app.add_option("--epochs", epochs, "Epochs in all (a resumed run trains the ones left)")->check(CLI::PositiveNumber);
  app.add_option("--limit", limit, "Use only the first N training images (0: all 60,000)")->check(CLI::NonNegativeNumber);
  app.add_option("--out-dir", out_dir, "Where the checkpoint is kept");
  CLI11_PARSE(app, argc, argv);
  try {
    manual_seed(0);

    // ---- data: 90% of the training split to train on, 10% to validate; the test split apart
    data::FashionMnist fm = data::load_fashion_mnist();
    const int64_t n = limit > 0 ? std::min(limit, fm.train.size()) : fm.train.size();
    auto all = std::make_shared<data::TensorDataset>(fm.train.images.narrow(0, 0, n), fm.train.labels.narrow(0, 0, n));
    auto test = std::make_shared<data::TensorDataset>(fm.test.images, fm.test.labels);
    Generator split_gen(1);  // its own stream: the same split on every run
    std::vector<data::Subset> parts = data::random_split(all, {0.9, 0.1}, &split_gen);
    auto train = std::make_shared<data::Subset>(parts[0]), val = std::make_shared<data::Subset>(parts[1]);

    // ---- model: 784 pixels -> 10 classes through 16 x 4 experts on two levels. A TR block
    // with E = 2 levels takes E + 2 = 4 ranks (R_1, R_2, R_3, R_4): cores U1 (R_1, 16, R_2),
    // U2 (R_2, 4, R_3), U_in (R_3, 785, R_4), U_out (R_4, 10, R_1); R_1 closes the ring.
    // .rank(64) alone would mean (4, 4, 4, 64); TT takes E + 1 ranks (R_1 = 1), Tucker E + 2.
    // further_gate_std: the paper's initialisation draws the first level's expert slices
    // around one matrix with noise (σ = 1) and repeats it exactly on further levels (σ = 0),
    // with every gate at zero. Level 1 would then start with 4 identical experts and uniform
    // coefficients, get no gate gradient and identical expert updates, and stay inert for
    // the whole run. Small random values in its gate break the tie.
    auto model = std::make_shared<nn::MuMoE>(nn::MuMoEOptions(784, 10)
                                                 .experts({16, 4})
                                                 .kind(nn::MoEKind::TR)
                                                 .ranks({4, 4, 4, 64})
                                                 .gate_norm(nn::GateNorm::BatchNorm)
                                                 .further_gate_std(0.01));
    std::printf("%s", model->str().c_str());

    // ---- optimiser, loader and schedule
    optim::AdamW opt(model->parameters(), optim::AdamWOptions().lr(2e-3).weight_decay(0.01));
    Generator shuffle_gen(2);  // the loader's own stream, saved in the checkpoint
    data::DataLoader loader(train, data::DataLoaderOptions(128).drop_last(true).generator(&shuffle_gen));
    const int64_t per_epoch = loader.batches_per_epoch(), total = epochs * per_epoch;

    // ---- resume: model, optimiser, step, the global generator and the loader's stream
    std::filesystem::create_directories(out_dir);
    const std::string ckpt = out_dir + "/checkpoint.safetensors";
    optim::CheckpointExtras extras{.generators = {{"shuffle", &shuffle_gen}}};
    int64_t step = 0;
    if (std::filesystem::exists(ckpt)) {
      step = optim::load_checkpoint(ckpt, *model, opt, &extras);
      std::printf("resumed from %s at step %lld (epoch %lld)\n", ckpt.c_str(), (long long)step,
                  (long long)(step / per_epoch));
    }
    optim::LRScheduler sched(opt, optim::warmup_cosine_lr(2e-3, 2e-5, total / 20, total), step);

    // ---- training
    for (int64_t epoch = step / per_epoch; epoch < epochs; ++epoch) {
      double loss_sum = 0;
      for (auto [x, y] : loader.batches()) {
        Tensor loss = cross_entropy(model->forward(x), y);
        opt.zero_grad();
        loss.backward();
        opt.step();
        sched.step();
        loss_sum += loss.item();
      }
      step = (epoch + 1) * per_epoch;
      optim::save_checkpoint(ckpt, *model, opt, step, extras);
      std::printf("epoch %lld: train loss %.4f, validation accuracy %.4f, lr %.2e (checkpoint saved)\n",
                  (long long)epoch + 1, loss_sum / double(per_epoch), accuracy(*model, val), sched.last_lr());
    }
    std::printf("test accuracy %.4f\n", accuracy(*model, test));

    // ---- expert analysis on the test split: coefficients of both levels, per class and per input
    model->eval();
    nn::CoefficientCollector stats({16, 4}, /*top_k=*/3, /*num_classes=*/10);
    for (int64_t i = 0; i < test->size(); i += 1000) {
      const Tensor idx = arange(i, std::min(test->size(), i + 1000));
      auto [x, y] = test->get(idx);
      stats.add(*model, x, idx, y);
    }
    const Tensor means = stats.class_means(0);  // (10 classes, 16 experts) of level 0
    const std::vector<int64_t> labels = fm.test.labels.to_vector<int64_t>();
    std::printf("level 0: each expert's favourite class (mean coefficient) and top-3 test images (label)\n");
    for (int64_t e = 0; e < 16; ++e) {
      const int64_t c = means.select(1, e).argmax().item<int64_t>();
      std::printf("  expert %2lld: %-11s %.3f |", (long long)e, data::kFashionMnistClasses[size_t(c)], means.at({c, e}));
      for (const nn::ExpertActivation& a : stats.top_k(0, e))
        std::printf(" #%lld (%s)", (long long)a.index, data::kFashionMnistClasses[size_t(labels[size_t(a.index)])]);
      std::printf("\n");
    }
    const Tensor means1 = stats.class_means(1);  // (10, 4) of level 1
    std::printf("level 1: mean coefficient of each of the 4 experts, per class\n");
    for (int64_t c = 0; c < 10; ++c)
      std::printf("  %-11s %.3f %.3f %.3f %.3f\n", data::kFashionMnistClasses[size_t(c)], means1.at({c, 0}),
                  means1.at({c, 1}), means1.at({c, 2}), means1.at({c, 3}));
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
