#include "dist/ddp.h"

#include <string>

#include "autograd/grad_mode.h"
#include "ops/ops.h"
#include "tensor/error.h"

namespace mu::dist {

namespace {

// Every rank must hold the same parameters: their count, and per parameter its element
// count and dtype, summed into a few numbers that all ranks compare.
void check_same_model(ProcessGroup& g, const std::vector<Tensor>& params) {
  int64_t numel = 0, weighted = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    numel += params[i].numel();
    weighted += params[i].numel() * int64_t(i + 1) + int64_t(params[i].dtype()) * 7919;
  }
  Tensor mine = from_vector(std::vector<int64_t>{int64_t(params.size()), numel, weighted}, {3});
  const std::vector<int64_t> all = g.all_gather(mine).to_vector<int64_t>();
  for (int r = 0; r < g.size(); ++r)
    MU_CHECK(all[size_t(3 * r)] == all[0] && all[size_t(3 * r + 1)] == all[1] && all[size_t(3 * r + 2)] == all[2],
             "DistributedDataParallel: rank ", r, " holds ", all[size_t(3 * r)], " parameters of ",
             all[size_t(3 * r + 1)], " elements, rank 0 ", all[0], " of ", all[1],
             (all[size_t(3 * r)] == all[0] && all[size_t(3 * r + 1)] == all[1] ? " (their shapes or dtypes differ)" : ""),
             "; every rank must build the same model");
}

}  // namespace

DistributedDataParallel::DistributedDataParallel(nn::Module& module, ProcessGroup& group, const DDPOptions& options)
    : module_(module), group_(group), options_(options) {
  MU_CHECK(options.bucket_bytes > 0, "DistributedDataParallel: bucket_bytes must be positive, got ",
           options.bucket_bytes);
  for (const Tensor& p : module.parameters())
    if (p.requires_grad()) params_.push_back(p);
  MU_CHECK(!params_.empty(), "DistributedDataParallel: the module has no parameter that requires grad");
  for (const Tensor& p : params_)
    MU_CHECK(p.is_contiguous() && p.is_floating_point(), "DistributedDataParallel: parameter ", p.describe(),
             " must be a contiguous floating-point tensor");
  check_same_model(group_, params_);

  // The same starting point everywhere: rank 0's parameters (and buffers).
  {
    NoGradGuard no_grad;
    for (Tensor& p : params_) group_.broadcast(p, 0);
    if (options.broadcast_buffers)
      for (Tensor b : module.buffers()) {
        Tensor dense = b.is_contiguous() ? b : b.contiguous();
        group_.broadcast(dense, 0);
        if (!b.is_contiguous()) b.copy_(dense);
      }
  }

  // Buckets from the last parameter to the first, each of one dtype and device.
  bucket_of_.resize(params_.size());
  ready_.assign(params_.size(), false);
  for (size_t k = params_.size(); k-- > 0;) {
    const Tensor& p = params_[k];
    bool fresh = buckets_.empty();
    if (!fresh) {
      const Bucket& b = buckets_.back();
      const Tensor& first = params_[b.params.front()];
      fresh = first.dtype() != p.dtype() || first.device() != p.device() ||
              (b.numel + p.numel()) * int64_t(element_size(p.dtype())) > options.bucket_bytes;
    }
    if (fresh) buckets_.emplace_back();
    Bucket& b = buckets_.back();
    b.params.push_back(k);
    b.offsets.push_back(b.numel);
    b.numel += p.numel();
    bucket_of_[k] = buckets_.size() - 1;
  }
  for (Bucket& b : buckets_) {
    const Tensor& first = params_[b.params.front()];
    b.flat = zeros({b.numel + int64_t(b.params.size())}, TensorOptions(first.dtype()).device(first.device()));
  }

  for (size_t k = 0; k < params_.size(); ++k)
    hooks_.push_back(autograd::add_grad_ready_hook(params_[k], [this, k](const Tensor&) { on_grad_ready(k); }));
  hooks_.push_back(autograd::add_backward_end_hook([this] {
    if (touched_) finish_sync();
  }));
}

DistributedDataParallel::~DistributedDataParallel() {
  hooks_.clear();  // no hook may run into a half-destroyed object
  for (Bucket& b : buckets_)
    if (b.work) {
      try {
        b.work->wait();  // the buffer must outlive its collective
      } catch (...) {
        // A failed collective has already been reported where it was waited for.
      }
    }
}

void DistributedDataParallel::on_grad_ready(size_t k) {
  touched_ = true;
  if (!sync_) return;
  if (!ready_[k]) {
    ready_[k] = true;
    ++buckets_[bucket_of_[k]].ready;
  }
  // Start every bucket that is complete and whose predecessors have started.
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].ready == buckets_[next_launch_].params.size())
    launch(next_launch_++);
  // Polling the buckets in flight lets MPI move their data along while backward runs.
  for (size_t i = 0; i < next_launch_; ++i)
    if (buckets_[i].work) buckets_[i].work->done();
}

void DistributedDataParallel::launch(size_t i) {
  Bucket& b = buckets_[i];
  std::vector<double> counts(b.params.size(), 0.0);
  for (size_t j = 0; j < b.params.size(); ++j) {
    const Tensor& p = params_[b.params[j]];
    Tensor slot = b.flat.narrow(0, b.offsets[j], p.numel());
    const Tensor g = p.grad();
    if (g.defined()) {
      slot.copy_(g.reshape({-1}));
      counts[j] = 1.0;
    } else {
      slot.zero_();  // no gradient here: this rank contributes zero
    }
  }
  b.flat.narrow(0, b.numel, int64_t(b.params.size()))
      .copy_(from_vector(counts, {int64_t(counts.size())}).to(b.flat.dtype()).to(b.flat.device()));
  b.work = group_.all_reduce_async(b.flat, ReduceOp::Sum);
}

void DistributedDataParallel::finish_sync() {
  NoGradGuard no_grad;
  if (!sync_) {
    reset_round();
    return;
  }
  while (next_launch_ < buckets_.size()) launch(next_launch_++);
  const double inv = 1.0 / double(group_.size());
  for (Bucket& b : buckets_) {
    b.work->wait();
    b.work.reset();
    const std::vector<double> counts =
        b.flat.narrow(0, b.numel, int64_t(b.params.size())).cpu().to(kFloat64).to_vector<double>();
    // The sums become means in place, the whole bucket at once (one kernel, not one per
    // parameter), then each parameter's slice is copied into its gradient.
    b.flat.narrow(0, 0, b.numel).mul_(inv);
    for (size_t j = 0; j < b.params.size(); ++j) {
      const Tensor& p = params_[b.params[j]];
      if (counts[j] == 0) continue;  // no rank had a gradient: none it stays
      const Tensor mean = b.flat.narrow(0, b.offsets[j], p.numel()).reshape(p.shape());
      Tensor g = p.grad();
      if (g.defined())
        g.copy_(mean);
      else
        p.set_grad(mean.clone());  // its own memory: the bucket is overwritten next step
    }
  }
  reset_round();
}

void DistributedDataParallel::reset_round() {
  std::fill(ready_.begin(), ready_.end(), false);
  for (Bucket& b : buckets_) b.ready = 0;
  next_launch_ = 0;
  touched_ = false;
}

int64_t DistributedDataParallel::bytes_per_sync() const {
  int64_t bytes = 0;
  for (const Bucket& b : buckets_) bytes += b.flat.numel() * int64_t(element_size(b.flat.dtype()));
  return bytes;
}

}  // namespace mu::dist
