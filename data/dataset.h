// Datasets of (input, target) examples, as torch.utils.data's TensorDataset, Subset and
// random_split:
//
//   auto all = std::make_shared<data::TensorDataset>(ds.train.images, ds.train.labels);
//   std::vector<data::Subset> parts = data::random_split(all, {0.9, 0.1});   // or {54000, 6000}
//   data::DataLoader train(parts[0], data::DataLoaderOptions(128));
//   for (auto [x, y] : train.batches()) { ... }                            // data/loader.h
//
// A dataset hands out whole batches (the examples at a tensor of indices stacked along
// dim 0): one index_select per batch, not one call per example.
#pragma once
#include <memory>
#include <vector>

#include "tensor/tensor.h"

namespace mu::data {

// A batch of inputs and the matching targets, row i of one belonging to row i of the
// other. An aggregate, so `auto [x, y] = batch;` unpacks it.
struct Batch {
  Tensor input;
  Tensor target;
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  // The number of examples.
  virtual int64_t size() const = 0;
  // The examples at `indices` (int64, 0-D or 1-D, each in [0, size())), in that order.
  virtual Batch get(const Tensor& indices) const = 0;
};

// Examples that are rows of two tensors with the same first dim.
class TensorDataset : public Dataset {
 public:
  TensorDataset(Tensor inputs, Tensor targets);
  int64_t size() const override { return inputs_.size(0); }
  Batch get(const Tensor& indices) const override;
  const Tensor& inputs() const { return inputs_; }
  const Tensor& targets() const { return targets_; }

 private:
  Tensor inputs_, targets_;
};

// The examples of `base` at `indices` (int64, 1-D; repeats allowed), example i of the
// subset being example indices[i] of the base. Holds the base alive.
class Subset : public Dataset {
 public:
  Subset(std::shared_ptr<const Dataset> base, Tensor indices);
  int64_t size() const override { return indices_.size(0); }
  Batch get(const Tensor& indices) const override;
  const std::shared_ptr<const Dataset>& base() const { return base_; }
  const Tensor& indices() const { return indices_; }

 private:
  std::shared_ptr<const Dataset> base_;
  Tensor indices_;
};

// Splits `dataset` into disjoint random subsets that cover it, as torch.utils.data.random_split.
// `lengths` are either the subsets' sizes (whole numbers summing to dataset->size()) or
// fractions (each in [0, 1], summing to 1): then each subset gets floor(fraction · size)
// examples and the remainder is dealt one at a time to the subsets in order. One
// permutation is drawn from `gen` (null: the global generator), so a seeded generator
// gives the same split every run.
std::vector<Subset> random_split(std::shared_ptr<const Dataset> dataset, const std::vector<double>& lengths,
                                 Generator* gen = nullptr);
// The same for a TensorDataset held by value (its tensors are shared, not copied).
std::vector<Subset> random_split(const TensorDataset& dataset, const std::vector<double>& lengths,
                                 Generator* gen = nullptr);

}  // namespace mu::data
