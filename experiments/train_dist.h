// Data parallelism for the trainers (train_gpt2, train_mixer): the same program runs under
// `mpirun -np N` unchanged. Every rank builds the same model, DistributedDataParallel
// broadcasts rank 0's weights and averages the gradients, each rank reads its shard of
// every global batch (--batch-size stays the global micro-batch, which N must divide), and
// only rank 0 prints, logs and writes checkpoints (train/loop.h). --zero 1 shards AdamW's
// moments across the ranks (dist/zero.h). A checkpoint holds the whole state, so a run may
// resume on another number of ranks.
//
// With CUDA, rank r trains on cuda:(local rank) when --device cuda names no index.
#pragma once
#include <cstdio>
#include <memory>
#include <string>

#include "dist/ddp.h"
#include "dist/sampler.h"
#include "dist/zero.h"
#include "experiments/train_flags.h"

namespace mu::experiments {

struct DataParallel {
  dist::ProcessGroup& group = dist::ProcessGroup::world();
  bool main = group.rank() == 0;  // rank 0 (or the one process): the only one that speaks
  std::unique_ptr<dist::DistributedDataParallel> ddp;
  std::unique_ptr<dist::ZeroOptimizer> zero;

  // The device of this rank: --device as given, cuda:(local rank) for a bare "cuda" under mpirun.
  Device device(const TrainFlags& f) const {
    if (f.device == "cuda" && group.size() > 1) return group.default_device();
    return parse_device(f.device);
  }

  // This rank's rows of a global batch of `global` samples.
  dist::Shard shard(int64_t global) const { return dist::batch_shard(global, group.rank(), group.size()); }

  // With more than one rank (or --zero 1): DDP on `model`, ZeRO-1 on `opt` when asked,
  // both attached to the loop's options. Call after the model is on its device and the
  // optimizer is built.
  void attach(nn::Module& model, optim::Optimizer& opt, const TrainFlags& f, train::LoopOptions& o) {
    MU_CHECK(f.batch_size % group.size() == 0, "--batch-size ", f.batch_size, " does not split over ", group.size(),
             " ranks; make it a multiple of ", group.size());
    if (group.size() == 1 && f.zero == 0) return;
    ddp = std::make_unique<dist::DistributedDataParallel>(model, group);
    if (f.zero == 1) zero = std::make_unique<dist::ZeroOptimizer>(opt, group);
    o.ddp = ddp.get();
    o.zero = zero.get();
    if (main)
      std::fprintf(stderr, "data parallel: %d ranks, %lld of each %lld-sample micro-batch per rank, %lld gradient "
                   "buckets (%.1f MB all-reduced per step)%s\n", group.size(), (long long)(f.batch_size / group.size()),
                   (long long)f.batch_size, (long long)ddp->bucket_count(), double(ddp->bytes_per_sync()) / 1e6,
                   zero ? ", AdamW state sharded (ZeRO-1)" : "");
  }
};

}  // namespace mu::experiments
