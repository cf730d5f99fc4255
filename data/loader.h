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
//
// Or over a dataset (data/dataset.h), yielding (input, target) batches:
//
//   data::DataLoader loader(std::make_shared<data::TensorDataset>(images, labels), data::DataLoaderOptions(128));
//   for (auto [x, y] : loader.batches()) { ... }
#pragma once
#include <memory>
#include <vector>

#include "data/dataset.h"
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

// One epoch of (input, target) batches, read from the dataset one batch at a time as the
// loop reaches it (iterating again reads the same batches again; the order was drawn
// when batches() was called).
class EpochBatches {
 public:
  class iterator {
   public:
    using value_type = Batch;
    using difference_type = std::ptrdiff_t;
    Batch operator*() const { return owner_->dataset_->get(owner_->indices_[size_t(k_)]); }
    iterator& operator++() { ++k_; return *this; }
    void operator++(int) { ++k_; }
    bool operator==(const iterator& o) const { return k_ == o.k_; }

   private:
    friend class EpochBatches;
    iterator(const EpochBatches* owner, int64_t k) : owner_(owner), k_(k) {}
    const EpochBatches* owner_;
    int64_t k_;
  };
  EpochBatches(std::shared_ptr<const Dataset> dataset, std::vector<Tensor> indices)
      : dataset_(std::move(dataset)), indices_(std::move(indices)) {}
  iterator begin() const { return {this, 0}; }
  iterator end() const { return {this, int64_t(indices_.size())}; }
  int64_t size() const { return int64_t(indices_.size()); }
  // The index batch behind batch k (what epoch() would have returned).
  const Tensor& indices(int64_t k) const { return indices_.at(size_t(k)); }

 private:
  std::shared_ptr<const Dataset> dataset_;
  std::vector<Tensor> indices_;
};

class DataLoader {
 public:
  // Batches over the indices 0 .. size-1.
  DataLoader(int64_t size, const DataLoaderOptions& options);
  // Batches of the examples of `dataset` (its size, and the dataset for batches()).
  DataLoader(std::shared_ptr<const Dataset> dataset, const DataLoaderOptions& options);
  // One epoch: each index appears once (once at most with drop_last), in batches of
  // batch_size except perhaps the last. Shuffling draws one permutation per call.
  std::vector<Tensor> epoch() const;
  // One epoch of the dataset's (input, target) batches, in the order epoch() gives
  // (one permutation drawn per call); only for a loader made with a dataset.
  EpochBatches batches() const;
  int64_t size() const { return size_; }
  int64_t batches_per_epoch() const;
  const DataLoaderOptions& options() const { return options_; }
  const std::shared_ptr<const Dataset>& dataset() const { return dataset_; }

 private:
  int64_t size_;
  DataLoaderOptions options_;
  std::shared_ptr<const Dataset> dataset_;
};

}  // namespace mu::data
