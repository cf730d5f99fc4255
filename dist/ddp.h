// Data-parallel training of any nn::Module: every process (rank) holds the whole model,
// runs forward and backward on its own shard of the global batch (dist/sampler.h), and the
// gradients are averaged across ranks, so every rank takes the same optimizer step.
//
//   auto& pg = dist::ProcessGroup::world();
//   model->to(pg.default_device());
//   dist::DistributedDataParallel ddp(*model, pg);          // parameters broadcast from rank 0
//   for (...) {
//     ddp.set_sync(micro == accum - 1);                      // accumulate locally, average once
//     loss.backward();                                       // averaging overlaps backward
//     ...
//     opt.step();                                            // identical on every rank
//   }
//
// Gradients are averaged in buckets of about 25 MB, in the reverse of the parameters'
// registration order (roughly the order backward produces them). A bucket's all-reduce
// starts, without waiting, as soon as the last of its gradients is in (a grad-ready hook,
// autograd/hooks.h), while backward goes on with the layers below; at the end of backward
// (a backward-end hook) the remaining buckets are sent and every bucket is waited for and
// written back as the mean over ranks. Buckets start in index order on every rank, so the
// collectives match even when ranks finish their gradients in different orders.
//
// A parameter no gradient reached on some rank counts as zero there; one no rank gave a
// gradient keeps none (each bucket carries a per-parameter count of contributing ranks),
// so an optimizer skips it exactly as a single process would.
//
// Every rank must run backward through the module for each synchronised step, and build
// the same model (checked at construction: parameter count, shapes and dtypes).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "autograd/hooks.h"
#include "dist/process_group.h"
#include "nn/module.h"

namespace mu::dist {

struct DDPOptions {
  int64_t bucket_bytes = 25 * 1024 * 1024;  // gradient bytes per bucket (a larger parameter gets a bucket alone)
  bool broadcast_buffers = true;            // buffers (running statistics) from rank 0 at construction too
};

class DistributedDataParallel {
 public:
  explicit DistributedDataParallel(nn::Module& module, ProcessGroup& group = ProcessGroup::world(),
                                   const DDPOptions& options = {});
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  nn::Module& module() { return module_; }
  ProcessGroup& group() { return group_; }

  // Whether the following backward passes average the gradients (true by default). With
  // false, gradients only accumulate locally (the micro-batches before the last of a step).
  void set_sync(bool sync) { sync_ = sync; }
  bool sync() const { return sync_; }

  // Sends what is still unsent, waits for every bucket and writes the means into the
  // gradients. The backward-end hook calls it after each synchronised backward that
  // reached the module's parameters; call it directly only after gradients were produced
  // some other way (set by hand), with every rank doing the same.
  void finish_sync();

  int64_t bucket_count() const { return int64_t(buckets_.size()); }
  // Bytes each synchronised backward all-reduces (the gradients plus one count per parameter).
  int64_t bytes_per_sync() const;

 private:
  struct Bucket {
    std::vector<size_t> params;      // indices into params_
    std::vector<int64_t> offsets;    // each parameter's first element in `flat`
    int64_t numel = 0;               // gradient elements (the counts follow them in `flat`)
    Tensor flat;                     // gradients, then one count per parameter
    std::shared_ptr<Work> work;      // the all-reduce in flight
    size_t ready = 0;                // parameters whose gradient is in
  };

  void on_grad_ready(size_t param);
  void launch(size_t bucket);
  void reset_round();

  nn::Module& module_;
  ProcessGroup& group_;
  DDPOptions options_;
  std::vector<Tensor> params_;
  std::vector<size_t> bucket_of_;
  std::vector<bool> ready_;
  std::vector<Bucket> buckets_;
  size_t next_launch_ = 0;   // buckets start in index order
  bool sync_ = true;
  bool touched_ = false;     // a hook of this module fired in the current backward
  std::vector<autograd::HookHandle> hooks_;
};

}  // namespace mu::dist
