// Which samples each rank reads. A global batch is drawn exactly as one process would draw
// it (from the run's seed and the batch number alone), then cut into equal contiguous
// shards, one per rank: the global batch of a given seed and step is the same whatever the
// number of ranks, so 1 process with batch B and N processes with B / N each train on the
// same data (and, with gradients averaged, take the same steps).
//
//   dist::DistributedSampler s(train.size(), 256, seed, pg.rank(), pg.size());
//   std::vector<int64_t> mine = s.local_batch(k);   // this rank's 256 / size() indices of batch k
//
// Batch k is slot k % batches_per_epoch() of epoch k / batches_per_epoch()'s permutation
// of the dataset, the permutation seeded by (seed, epoch); only whole batches are served.
// A sampler keeps the last epoch's permutation: use one per thread.
#pragma once
#include <cstdint>
#include <vector>

#include "tensor/tensor.h"

namespace mu::dist {

// This rank's part [begin, begin + count) of a global batch of `global` samples; `global`
// must be divisible by `world` (a mu::Error naming both otherwise).
struct Shard {
  int64_t begin = 0, count = 0;
};
Shard batch_shard(int64_t global, int rank, int world);

class DistributedSampler {
 public:
  DistributedSampler(int64_t dataset_size, int64_t global_batch, uint64_t seed, int rank, int world);

  int64_t batches_per_epoch() const { return per_epoch_; }
  int64_t global_batch_size() const { return global_; }
  // The indices of global batch k, and this rank's shard of them.
  std::vector<int64_t> global_batch(int64_t k) const;
  std::vector<int64_t> local_batch(int64_t k) const;

 private:
  int64_t n_, global_, per_epoch_;
  uint64_t seed_;
  int rank_, world_;
  mutable int64_t cached_epoch_ = -1;  // the epoch whose permutation `cached_perm_` holds
  mutable Tensor cached_perm_;
};

}  // namespace mu::dist
