#include "dist/sampler.h"

#include "ops/ops.h"
#include "tensor/error.h"
#include "tensor/random.h"

namespace mu::dist {

Shard batch_shard(int64_t global, int rank, int world) {
  MU_CHECK(world >= 1 && rank >= 0 && rank < world, "batch_shard: rank ", rank, " of a world of ", world);
  MU_CHECK(global >= 0 && global % world == 0, "batch_shard: a global batch of ", global,
           " samples does not split evenly over ", world, " ranks; make it a multiple of ", world);
  const int64_t per = global / world;
  return {per * rank, per};
}

DistributedSampler::DistributedSampler(int64_t dataset_size, int64_t global_batch, uint64_t seed, int rank, int world)
    : n_(dataset_size), global_(global_batch), per_epoch_(0), seed_(seed), rank_(rank), world_(world) {
  MU_CHECK(global_batch > 0 && global_batch <= dataset_size, "DistributedSampler: a global batch of ", global_batch,
           " from a dataset of ", dataset_size, " samples");
  batch_shard(global_batch, rank, world);  // checks the split
  per_epoch_ = n_ / global_;
}

std::vector<int64_t> DistributedSampler::global_batch(int64_t k) const {
  MU_CHECK(k >= 0, "DistributedSampler: batch ", k, " is negative");
  const int64_t epoch = k / per_epoch_, slot = k % per_epoch_;
  // The epoch's permutation: the same seed mixing the trainers used before sharding existed,
  // so a single process draws exactly what it always drew.
  if (epoch != cached_epoch_) {
    Generator g(mix_seed(seed_, uint64_t(1) << 40 | uint64_t(epoch)));
    cached_perm_ = randperm(n_, kInt64, &g);
    cached_epoch_ = epoch;
  }
  const int64_t* p = cached_perm_.data_ptr<int64_t>() + slot * global_;
  return std::vector<int64_t>(p, p + global_);
}

std::vector<int64_t> DistributedSampler::local_batch(int64_t k) const {
  const std::vector<int64_t> all = global_batch(k);
  const Shard s = batch_shard(global_, rank_, world_);
  return std::vector<int64_t>(all.begin() + s.begin, all.begin() + s.begin + s.count);
}

}  // namespace mu::dist
