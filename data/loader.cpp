#include "data/loader.h"

#include <algorithm>

#include "tensor/error.h"

namespace mu::data {

DataLoader::DataLoader(int64_t size, const DataLoaderOptions& options) : size_(size), options_(options) {
  MU_CHECK(size >= 0, "DataLoader: negative dataset size ", size);
  MU_CHECK(options.batch_size() > 0, "DataLoader: batch_size must be positive, got ", options.batch_size());
}

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, const DataLoaderOptions& options)
    : DataLoader(dataset != nullptr ? dataset->size() : 0, options) {
  MU_CHECK(dataset != nullptr, "DataLoader: no dataset given");
  dataset_ = std::move(dataset);
}

EpochBatches DataLoader::batches() const {
  MU_CHECK(dataset_ != nullptr, "DataLoader::batches: this loader was made with a size (", size_,
           "), not a dataset; use epoch() for its index batches or construct it with a dataset");
  return EpochBatches(dataset_, epoch());
}

int64_t DataLoader::batches_per_epoch() const {
  const int64_t b = options_.batch_size();
  // ceil(size / b) without size + b - 1, which overflows for sizes near 2^63.
  return options_.drop_last() ? size_ / b : size_ / b + (size_ % b != 0);
}

std::vector<Tensor> DataLoader::epoch() const {
  Tensor order = options_.shuffle() ? randperm(size_, kInt64, options_.generator()) : arange(size_);
  std::vector<Tensor> batches;
  const int64_t b = options_.batch_size();
  for (int64_t k = 0, n = batches_per_epoch(); k < n; ++k) {
    const int64_t start = k * b;
    // A view into the permutation; the last batch may be short.
    batches.push_back(order.narrow(0, start, std::min(b, size_ - start)));
  }
  return batches;
}

}  // namespace mu::data
