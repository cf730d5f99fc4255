// The reduction skeleton: put the kept dims first and the reduced dims last, so that
// every output element reduces one run of `inner` input elements with one stride.
// When the reduced dims do not form such a run, the input is first copied into that
// order. Each op supplies only the per-run function (sum, max, argmax, ...).
#pragma once
#include <omp.h>

#include "ops/cpu/loops.h"
#include "tensor/tensor.h"

namespace mu::cpu {

struct ReducePlan {
  std::vector<bool> reduced;  // per input dim
  Shape out_shape;            // with keepdim applied as requested
  Shape keep_shape;           // reduced dims as size 1
  int64_t outer = 1;          // number of output elements
  int64_t inner = 1;          // input elements per output element
};

// dims empty = reduce every dim. Throws naming op for out-of-range or repeated dims.
inline ReducePlan plan_reduce(const Tensor& x, const Shape& dims, bool keepdim, const char* op) {
  ReducePlan p;
  int64_t nd = x.dim();
  p.reduced.assign(size_t(nd), dims.empty());
  for (int64_t d : dims) {
    int64_t w = wrap_dim(d, nd, op);
    MU_CHECK(nd == 0 || !p.reduced[size_t(w)], op, ": dimension ", d, " appears more than once in the reduced dims");
    if (nd > 0) p.reduced[size_t(w)] = true;
  }
  for (int64_t d = 0; d < nd; ++d) {
    int64_t s = x.shape()[size_t(d)];
    if (p.reduced[size_t(d)]) {
      p.inner *= s;
      p.keep_shape.push_back(1);
      if (keepdim) p.out_shape.push_back(1);
    } else {
      p.outer *= s;
      p.keep_shape.push_back(s);
      p.out_shape.push_back(s);
    }
  }
  return p;
}

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
#pragma omp parallel for if (par) schedule(static)
  for (int64_t o = 0; o < p.outer; ++o) out[o] = run(base + o * kstride, p.inner, stride);
}

}  // namespace mu::cpu
