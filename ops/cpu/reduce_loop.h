// The CPU reduction skeleton: put the kept dims first and the reduced dims last, so
// that every output element reduces one run of `inner` input elements with one stride.
// When the reduced dims do not form such a run, the input is first copied into that
// order. Each op supplies only the per-run function (sum, max, argmax, ...).
#pragma once
#include <omp.h>

#include <algorithm>

#include "ops/cpu/loops.h"
#include "ops/reduce_plan.h"
#include "tensor/tensor.h"

namespace mu::cpu {

// The input ordered (kept..., reduced...): returns the view (or copy) and the single
// stride with which each output's run is read.
inline std::pair<Tensor, int64_t> reduce_layout(const Tensor& x, const ReducePlan& p) {
  Shape perm;
  for (int64_t d = 0; d < x.dim(); ++d)
    if (!p.reduced[size_t(d)]) perm.push_back(d);
  for (int64_t d = 0; d < x.dim(); ++d)
    if (p.reduced[size_t(d)]) perm.push_back(d);
  Tensor xp = x.detach().permute(perm);
  // Do the reduced dims (the tail of xp) coalesce into one run?
  Shape tail_shape, tail_strides;
  for (size_t i = perm.size() - size_t(std::count(p.reduced.begin(), p.reduced.end(), true)); i < perm.size(); ++i) {
    tail_shape.push_back(xp.shape()[i]);
    tail_strides.push_back(xp.strides()[i]);
  }
  auto L = coalesce<1>(tail_shape, {tail_strides});
  if (L.shape.size() == 1) {
    // The kept dims must also be walkable as a flat index: make xp dense in them.
    Shape head_shape(xp.shape().begin(), xp.shape().end() - long(tail_shape.size()));
    Shape head_strides(xp.strides().begin(), xp.strides().end() - long(tail_shape.size()));
    auto H = coalesce<1>(head_shape, {head_strides});
    if (H.shape.size() == 1) return {xp, L.strides[0][0]};
  }
  return {xp.contiguous(), 1};
}

// For every output element o (in row-major order of the kept dims), out[o] =
// run(pointer to o's first input element, inner, stride). Parallel over outputs.
template <class T, class R, class Run>
void reduce_runs(const Tensor& x, const ReducePlan& p, R* out, Run run) {
  auto [xp, stride] = reduce_layout(x, p);
  const T* base = xp.template data_ptr<T>();
  // Offsets of the first element of each output's run: walk the kept dims.
  int64_t nkeep = xp.dim() - int64_t(std::count(p.reduced.begin(), p.reduced.end(), true));
  Shape ks(xp.shape().begin(), xp.shape().begin() + nkeep), kst(xp.strides().begin(), xp.strides().begin() + nkeep);
  auto L = coalesce<1>(ks, {kst});
  int64_t kstride = L.strides[0].back();  // a single run after reduce_layout
  bool par = p.outer * p.inner >= kParallelGrain && p.outer > 1 && !omp_in_parallel();
  parallel_for_if(p.outer, par, [&](int64_t o) { out[o] = run(base + o * kstride, p.inner, stride); });
}

}  // namespace mu::cpu
