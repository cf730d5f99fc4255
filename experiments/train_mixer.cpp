// Trains an MLP-Mixer (dense, CPμMoE or TRμMoE mixing blocks with batch-norm gating) on
// Fashion-MNIST with random flips (and zero-padded random crops with --crop-padding), and
// reports test accuracy; or, with --image-arrays, on an image-array dataset such as
// ImageNet (data/image_arrays.h, scripts/image_folder_to_arrays.py) with the ImageNet
// recipe: random resized crops, flips, RandAugment and mixup (data/image_batches.h),
// reporting top-1 accuracy on its "val" split.
//
//   ./build/experiments/train_mixer --out-dir runs/mixer --epochs 3
//   ./build/experiments/train_mixer --out-dir runs/mixer-cp --epochs 3 --mlp cp
//   ./build/experiments/train_mixer --out-dir runs/s16 --image-arrays imagenet-256 --image-size 224 \
//       --patch 16 --width 512 --depth 8 --token-mlp 256 --channel-mlp 2048 --randaugment-magnitude 15 --mixup 0.5
//
// The model is the mixer-fmnist workload (patch 4, width 128, depth 4, token 64, channel
// 512) unless the size flags say otherwise. Batches are built on a prefetch thread; batch
// k's order and augmentation come from generators seeded by (--seed, k), so --resume
// continues bit-identically. Ctrl-C saves a checkpoint and exits with status 130.
//
// Under `mpirun -np N` the same command trains data-parallel (experiments/train_dist.h):
// each rank takes its N-th of every global micro-batch, only rank 0 prints and writes.
// The μMoE blocks' batch-norm gating then normalises over each rank's share of the batch.
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>

#include "data/augment.h"
#include "data/fashion_mnist.h"
#include "data/image_arrays.h"
#include "data/image_batches.h"
#include "data/prefetch.h"
#include "models/mlp_mixer.h"
#include "mumoe.h"
#include "optim/adamw.h"
#include "optim/decay_groups.h"
#include "train_dist.h"
#include "train_flags.h"
#include "train_seed.h"

using namespace mu;

namespace {

// The pixel statistics of Fashion-MNIST's training images, in [0, 1] units.
constexpr double kMean = 0.2860, kStd = 0.3530;

// Test accuracy over the whole split, in batches of 500, as (correct / total).
double accuracy(models::MlpMixer& model, const data::LabelledImages& split, Device dev, bool bf16) {
  int64_t correct = 0;
  const int64_t n = split.size();
  for (int64_t i = 0; i < n; i += 500) {
    const int64_t count = std::min<int64_t>(500, n - i);
    Tensor x = data::normalize(split.images.narrow(0, i, count).reshape({count, 1, 28, 28}), {kMean}, {kStd});
    AutocastGuard amp(kBFloat16, bf16);
    Tensor pred = argmax(model.forward(x.to(dev)), 1);
    correct += int64_t(eq(pred, split.labels.narrow(0, i, count).to(dev)).to(kInt64).sum().item());
  }
  return double(correct) / double(n);
}

// Top-1 accuracy over an image-array split, in batches of 250 central crops.
double accuracy(models::MlpMixer& model, const data::ImageArrays& split, const data::ImageBatchOptions& o, Device dev,
                bool bf16) {
  int64_t correct = 0;
  for (int64_t i = 0; i < split.size(); i += 250) {
    data::Batch b = data::eval_batch(split, i, 250, o);
    AutocastGuard amp(kBFloat16, bf16);
    Tensor pred = argmax(model.forward(b.input.to(dev)), 1);
    correct += int64_t(eq(pred, b.target.to(dev)).to(kInt64).sum().item());
  }
  return double(correct) / double(split.size());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Train an MLP-Mixer (dense, CPμMoE or TRμMoE blocks) on Fashion-MNIST."};
  experiments::TrainFlags f;
  f.batch_size = 128;
  f.lr = 2e-3;
  f.min_lr = 2e-5;
  f.warmup = 100;
  f.weight_decay = 0.05;
  f.beta2 = 0.999;
  f.eval_every = 0;
  f.checkpoint_every = 200;
  experiments::add_train_flags(app, f);
  double epochs = 3;
  int64_t patch = 4, width = 128, depth = 4, token_mlp = 64, channel_mlp = 512, padding = 0;
  double stochastic_depth = 0.0;
  bool channel_only = false;
  double expect_accuracy = 0;
  app.add_option("--epochs", epochs, "Passes over the training set (sets the steps unless --max-steps is given)")->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--patch", patch, "Patch size (divides 28)")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--width", width, "Hidden (channel) dimension")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--depth", depth, "Mixer blocks")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--token-mlp", token_mlp, "Hidden width of the token-mixing MLPs")->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--channel-mlp", channel_mlp, "Hidden width of the channel-mixing MLPs")->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--stochastic-depth", stochastic_depth, "Drop-path rate of the last block (rising from 0)")
      ->capture_default_str()->check(CLI::Range(0.0, 1.0));
  app.add_option("--crop-padding", padding, "Zero padding of the random crops (0: no crops; crops pay off in runs longer than a few epochs)")->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  std::vector<int64_t> expert_levels;
  app.add_option("--expert-levels", expert_levels, "Further expert levels of every μMoE block, comma-separated (a "
                 "hierarchical μMoE: '2' gives --experts x 2 experts)")->delimiter(',')->check(CLI::PositiveNumber);
  double further_gate_std = 0;
  app.add_option("--further-gate-std", further_gate_std, "Draw the gates of the further expert levels from N(0, s^2) "
                 "(0: zeros, the paper's; those levels then never learn)")->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--channel-only", channel_only, "μMoE in the channel-mixing blocks only (token mixing stays dense)");
  bool gelu_recompute = false;
  app.add_flag("--gelu-recompute", gelu_recompute, "The channel MLPs keep their first Linear's output and compute the "
               "GELU again in the backward pass (the same numbers; one activation of width --channel-mlp less held per "
               "block). --mlp dense only");
  // The rank rules of the μMoE blocks (models/mlp_mixer.h): rank = int(ratio · d), d the
  // block's input dim; small models need larger ratios than the paper's.
  const models::MixerConfig defaults;
  double cp_rank_ratio = defaults.cp_rank_ratio, tr_rank_ratio = defaults.tr_rank_ratio;
  const CLI::Option* cp_ratio_opt =
      app.add_option("--cp-rank-ratio", cp_rank_ratio, "CP rank of a μMoE block as a fraction of its input dim "
                     "(--mlp cp)")->capture_default_str()->check(CLI::PositiveNumber);
  const CLI::Option* tr_ratio_opt =
      app.add_option("--tr-rank-ratio", tr_rank_ratio, "TR last rank of a μMoE block as a fraction of its input "
                     "dim (--mlp tr)")->capture_default_str()->check(CLI::PositiveNumber);
  std::string image_arrays;
  int64_t image_size = 0, ra_ops = 2, ra_magnitude = 9;
  double mixup = 0;
  auto* imgs = app.add_option_group("image arrays", "Training on an image-array dataset instead of Fashion-MNIST");
  imgs->add_option("--image-arrays", image_arrays, "Directory of image arrays with \"train\" and \"val\" splits "
                   "(data/image_arrays.h; scripts/image_folder_to_arrays.py writes them)");
  std::vector<CLI::Option*> array_only;  // the options that mean nothing without --image-arrays
  array_only.push_back(imgs->add_option("--image-size", image_size, "Side of the training crops and the model's "
                                        "input (0: the stored images' side)")->capture_default_str()
                           ->check(CLI::NonNegativeNumber));
  array_only.push_back(imgs->add_option("--randaugment-ops", ra_ops, "RandAugment operations per image (0: no "
                                        "RandAugment)")->capture_default_str()->check(CLI::NonNegativeNumber));
  array_only.push_back(imgs->add_option("--randaugment-magnitude", ra_magnitude, "RandAugment magnitude, a bin of "
                                        "0..30")->capture_default_str()->check(CLI::Range(0, 30)));
  array_only.push_back(imgs->add_option("--mixup", mixup, "Mixup alpha (0: none)")->capture_default_str()
                           ->check(CLI::NonNegativeNumber));
  app.add_option("--expect-accuracy", expect_accuracy, "Exit with status 3 unless the final test accuracy (a "
                 "fraction) reaches this (a check for tests)")->check(CLI::Range(0.0, 1.0));
  CLI11_PARSE(app, argc, argv);

  try {
    const bool arrays = !image_arrays.empty();
    MU_CHECK(!arrays || padding == 0, "--crop-padding is Fashion-MNIST's augmentation; image arrays take "
             "random resized crops");
    for (const CLI::Option* o : array_only)
      MU_CHECK(arrays || o->count() == 0, o->get_name(), " applies to --image-arrays datasets only (Fashion-MNIST ",
               "takes --crop-padding)");
    MU_CHECK(f.mlp == "cp" || cp_ratio_opt->count() == 0, "--cp-rank-ratio applies to --mlp cp only, got --mlp ", f.mlp);
    MU_CHECK(f.mlp == "tr" || tr_ratio_opt->count() == 0, "--tr-rank-ratio applies to --mlp tr only, got --mlp ", f.mlp);
    MU_CHECK(!gelu_recompute || f.mlp == "dense", "--gelu-recompute applies to --mlp dense only (plain channel MLPs), "
             "got --mlp ", f.mlp);
    // Either Fashion-MNIST or an image-array dataset's train and val splits.
    std::optional<data::FashionMnist> fmnist;
    std::optional<data::ImageArrays> train_images, val_images;
    if (arrays) {
      train_images.emplace(image_arrays, "train");
      val_images.emplace(image_arrays, "val");
    } else {
      fmnist.emplace(data::load_fashion_mnist());
    }
    models::MixerConfig cfg = models::mixer_fmnist();
    data::ImageBatchOptions io;
    if (arrays) {
      cfg.image_size = image_size > 0 ? image_size : train_images->height();
      cfg.channels = train_images->channels();
      cfg.num_classes = train_images->classes();
      io.size = cfg.image_size;
      io.augment = ra_ops > 0;
      io.rand_augment.num_ops = ra_ops;
      io.rand_augment.magnitude = ra_magnitude;
      io.mixup = mixup;
      if (cfg.channels == 1) io.mean = {0.449}, io.stddev = {0.226};  // grayscale: ImageNet's channel average
    }
    cfg.patch_size = patch;
    cfg.width = width;
    cfg.depth = depth;
    cfg.token_mlp = token_mlp;
    cfg.channel_mlp = channel_mlp;
    cfg.stochastic_depth = stochastic_depth;
    cfg.recompute = f.recompute;
    cfg.gelu_recompute = gelu_recompute;
    cfg.experts = f.experts;
    cfg.expert_levels = expert_levels;
    cfg.further_gate_std = further_gate_std;
    cfg.cp_rank_ratio = cp_rank_ratio;
    cfg.tr_rank_ratio = tr_rank_ratio;
    const models::MixerMlp kind = f.mlp == "cp"   ? models::MixerMlp::CPMuMoE
                                  : f.mlp == "tr" ? models::MixerMlp::TRMuMoE
                                                  : models::MixerMlp::MLP;
    cfg.channel_block = kind;
    cfg.token_block = channel_only ? models::MixerMlp::MLP : kind;
    experiments::DataParallel dp;
    manual_seed(f.seed);
    auto model = std::make_shared<models::MlpMixer>(cfg);
    const Device dev = dp.device(f);
    model->to(dev);
    const bool bf16 = f.dtype == "bf16";
    if (dp.main) std::fprintf(stderr, "MLP-Mixer patch %lld, width %lld, depth %lld, token %lld / channel %lld, blocks %s/%s: "
                 "%lld parameters\n", (long long)patch, (long long)width, (long long)depth, (long long)token_mlp,
                 (long long)channel_mlp, models::to_string(cfg.token_block), models::to_string(cfg.channel_block),
                 (long long)model->num_parameters());

    if (arrays && dp.main)
      std::fprintf(stderr, "data %s: %lld train, %lld val images of %lldx%lldx%lld, %lld classes; crops %lld, "
                   "RandAugment %lld ops at %lld, mixup %g\n", image_arrays.c_str(), (long long)train_images->size(),
                   (long long)val_images->size(), (long long)train_images->height(), (long long)train_images->width(),
                   (long long)train_images->channels(), (long long)train_images->classes(), (long long)io.size,
                   (long long)ra_ops, (long long)ra_magnitude, mixup);
    const int64_t B = f.batch_size, n = arrays ? train_images->size() : fmnist->train.size();
    const int64_t per_epoch = n / B;  // full batches only: batch-norm gating wants no tiny batch
    const int64_t micro_batches = int64_t(std::ceil(epochs * double(per_epoch)));
    if (app.count("--max-steps") == 0) f.max_steps = std::max<int64_t>(1, micro_batches / f.grad_accum);

    optim::AdamW opt(optim::decay_groups(*model, f.weight_decay),
                     optim::AdamWOptions(f.lr).betas(f.beta1, f.beta2).weight_decay(f.weight_decay));
    auto schedule = optim::warmup_cosine_lr(f.lr, std::min(f.min_lr, f.lr), f.warmup,
                                            std::max<int64_t>(f.max_steps, f.warmup + 1));

    // Micro-batch k: epoch k / per_epoch's permutation (seeded by the epoch), slice k % per_epoch,
    // augmented from generators seeded by k. The prefetch thread runs ahead from the first k
    // this run needs; the training thread takes the batches in order.
    train::LoopOptions o = experiments::loop_options(f);
    o.units_per_step = B * f.grad_accum;
    o.unit = "img";
    int64_t next_k = -1;
    std::unique_ptr<data::Prefetcher> prefetch;
    dp.attach(*model, opt, f, o);
    const dist::Shard shard = dp.shard(B);
    auto source_from = [&](int64_t first_k) -> data::BatchSource {
      auto k = std::make_shared<int64_t>(first_k);
      // The global micro-batch k as one process draws it (dist/sampler.h); this rank
      // takes its rows. One sampler per source: it caches the epoch's permutation.
      auto sampler = std::make_shared<dist::DistributedSampler>(n, B, f.seed, 0, 1);
      return [&, k, sampler]() -> std::optional<data::Batch> {
        const std::vector<int64_t> all = sampler->global_batch(*k);
        if (arrays) {
          // Image i of the global batch draws from (seed, k, i) whatever rank prepares it.
          const std::vector<int64_t> mine(all.begin() + shard.begin, all.begin() + shard.begin + shard.count);
          const uint64_t seed = experiments::mix_seed(f.seed, uint64_t(*k));
          ++*k;
          return data::training_batch(*train_images, mine, io, seed, shard.begin);
        }
        // Fashion-MNIST's augmentation draws from one generator along the batch: the
        // whole global batch is augmented (it is small) and this rank's rows kept.
        const data::FashionMnist& ds = *fmnist;
        const Tensor idx = from_vector(all, {B});
        Generator g(experiments::mix_seed(f.seed, uint64_t(*k)));
        Tensor x = index_select(ds.train.images, 0, idx).reshape({B, 1, 28, 28});
        if (padding > 0) x = data::random_crop(x, padding, &g);
        x = data::random_horizontal_flip(x, 0.5, &g);
        ++*k;
        Tensor labels = index_select(ds.train.labels, 0, idx);
        if (shard.count != B) x = x.narrow(0, shard.begin, shard.count), labels = labels.narrow(0, shard.begin, shard.count);
        return data::Batch{data::normalize(x, {kMean}, {kStd}), labels};
      };
    };
    train::LoopHooks h;
    h.micro_batch_loss = [&](int64_t step, int64_t micro) {
      const int64_t k = step * f.grad_accum + micro;
      if (!prefetch || k != next_k) prefetch = std::make_unique<data::Prefetcher>(source_from(k), 4);
      next_k = k + 1;
      std::optional<data::Batch> b = prefetch->next();
      MU_CHECK(b.has_value(), "the batch source ended early");
      AutocastGuard amp(kBFloat16, bf16);
      return cross_entropy(model->forward(b->input.to(dev)), b->target.to(dev));
    };
    // The test split of Fashion-MNIST, the val split of image arrays (ImageNet's test set).
    h.evaluate = [&] {
      return train::Metrics{
          {"test_acc", arrays ? accuracy(*model, *val_images, io, dev, bf16) : accuracy(*model, fmnist->test, dev, bf16)}};
    };
    train::LoopResult r = train::run_training(*model, opt, schedule, o, h);
    prefetch.reset();
    if (r.interrupted) return 130;
    if (!dp.main) return 0;  // the results below are rank 0's to print
    std::printf("final test accuracy %.2f%% after %lld steps (%.2f epochs)\n",
                100.0 * (r.last_eval.empty() ? NAN : r.last_eval[0].second), (long long)r.steps_done,
                double(r.steps_done * f.grad_accum) / double(per_epoch));
    experiments::print_peak_memory(dev);
    const double acc = r.last_eval.empty() ? NAN : r.last_eval[0].second;
    if (expect_accuracy > 0 && !(acc >= expect_accuracy)) {
      std::fprintf(stderr, "train_mixer: test accuracy %.4f is below the %.4f expected\n", acc, expect_accuracy);
      return 3;
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "train_mixer: %s\n", e.what());
    return 1;
  }
  return 0;
}
