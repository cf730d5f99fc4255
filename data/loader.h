// DataLoader: the mini-batches of one epoch as int64 index tensors, in a fresh random
// order each epoch (drawn from the global generator, so manual_seed makes it repeat, or
// from the Generator given in the options, a stream of the loader's own).
//
//   data::DataLoader loader(ds.train.size(), data::DataLoaderOptions(128).drop_last(true));
//   for (int epoch = 0; epoch < epochs; ++epoch)
//     for (const Tensor& idx : loader.epoch()) {
//       Tensor x = index_select(ds.train.images, 0, idx), y = index_select(ds.train.labels, 0, idx);
//       ...
//     }
#pragma once
#include <vector>

#include "tensor/tensor.h"

namespace mu::data {

struct DataLoaderOptions {
  explicit DataLoaderOptions(int64_t batch_size) : batch_size_(batch_size) {}
  DataLoaderOptions& batch_size(int64_t b) { batch_size_ = b; return *this; }
  // Off: batches in index order 0, 1, 2, ... (evaluation).
  DataLoaderOptions& shuffle(bool s) { shuffle_ = s; return *this; }
  // Leave out the last batch when it is smaller than batch_size (keeps batch statistics,
  // as in batch-norm gating, from resting on a handful of samples).
  DataLoaderOptions& drop_last(bool d) { drop_last_ = d; return *this; }
  // The generator the shuffles draw from (null: the global one). It must outlive the
  // loader; with one of its own, a loader on a prefetch thread repeats its order whatever
  // other threads draw.
  DataLoaderOptions& generator(Generator* g) { generator_ = g; return *this; }
  int64_t batch_size() const { return batch_size_; }
  bool shuffle() const { return shuffle_; }
  bool drop_last() const { return drop_last_; }
  Generator* generator() const { return generator_; }

 private:
  int64_t batch_size_;
  bool shuffle_ = true;
  bool drop_last_ = false;
  Generator* generator_ = nullptr;
};

class DataLoader {
 public:
  // Batches over the indices 0 .. size-1.
  DataLoader(int64_t size, const DataLoaderOptions& options);
  // One epoch: each index appears once (once at most with drop_last), in batches of
  // batch_size except perhaps the last. Shuffling draws one permutation per call.
  std::vector<Tensor> epoch() const;
  int64_t size() const { return size_; }
  int64_t batches_per_epoch() const;
  const DataLoaderOptions& options() const { return options_; }

 private:
  int64_t size_;
  DataLoaderOptions options_;
};

}  // namespace mu::data
