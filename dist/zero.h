// Optimizer-state sharding, ZeRO stage 1 (Rajbhandari et al. 2020): with data parallelism
// every rank holds the whole model and the whole (averaged) gradients, but each keeps the
// optimizer state (AdamW's two moments) of its own share of the parameters only, updates
// those, and sends them to the others. The moments' memory falls to about 1 / ranks; the
// step is exactly the unsharded one, since the same update runs on the same gradients.
//
//   dist::DistributedDataParallel ddp(*model, pg);
//   optim::AdamW opt(groups, options);
//   dist::ZeroOptimizer zero(opt, pg);
//   ... backward ...; zero.step();             // instead of opt.step()
//
// Shares are whole parameters, dealt greedily (largest first) to the rank holding the
// fewest elements so far, the same on every rank. Checkpoints hold the full state:
// gather_state() (collective) loads every rank's share into `opt` before saving, and
// release_state() drops what is not this rank's after saving or after loading a
// checkpoint, so a run can resume on any number of ranks.
#pragma once
#include <cstdint>
#include <vector>

#include "dist/process_group.h"
#include "optim/optimizer.h"

namespace mu::dist {

class ZeroOptimizer {
 public:
  ZeroOptimizer(optim::Optimizer& opt, ProcessGroup& group = ProcessGroup::world());

  optim::Optimizer& optimizer() { return opt_; }
  // Updates this rank's parameters (those with a gradient), then every parameter is
  // broadcast from its owner. Collective.
  void step();
  // The rank that updates parameter `index` of group `group`.
  int owner(size_t group, size_t index) const { return owner_[group][index]; }
  // Every parameter's state from its owner into `opt` (collective): the full state, for a checkpoint.
  void gather_state();
  // Drops the state of the parameters this rank does not own.
  void release_state();
  // Bytes of optimizer state this rank holds now.
  int64_t state_bytes() const;

 private:
  optim::Optimizer& opt_;
  ProcessGroup& group_;
  std::vector<std::vector<int>> owner_;  // [group][index]
};

}  // namespace mu::dist
