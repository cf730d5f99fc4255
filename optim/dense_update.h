// Shared plumbing of the fused per-parameter updates (AdamW, SGD): a dense working copy
// of a strided parameter for the update kernels of ops/kernels/optim.h.
#pragma once
#include "tensor/tensor.h"

namespace mu::optim::detail {

// A dense view of a parameter for an update loop. A contiguous parameter is updated in
// its own memory; a strided one (rare: a parameter made from a transposed view) through
// a dense copy that finish() writes back.
class DenseParam {
 public:
  explicit DenseParam(const Tensor& p) : param_(p), work_(p.is_contiguous() ? p : p.contiguous()) {}
  const Tensor& work() const { return work_; }
  // Writes a copy back and bumps the version, so autograd sees the in-place change.
  void finish() const {
    if (!work_.is_same(param_)) param_.copy_(work_);  // copy_ bumps the version itself
    else param_.bump_version();
  }

 private:
  mutable Tensor param_;  // copy_ is a method of a non-const handle; it writes the shared data
  Tensor work_;
};

}  // namespace mu::optim::detail
