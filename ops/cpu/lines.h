// Line-wise kernels (softmax-like ops that normalise along one dim): a dense tensor is
// viewed as (outer, n, inner) and every line of n elements along the middle axis is
// handed to the kernel as (offset, stride). Lines are disjoint, so they run on several
// threads once the tensor is large enough to pay for it.
#pragma once
#include <omp.h>

#include <array>
#include <cstdint>

#include "ops/cpu/loops.h"
#include "tensor/shape.h"

namespace mu::cpu {

// Calls f(offset, stride) for every line along the middle axis of a dense (outer, n,
// inner) tensor. `cost` weighs one element's work against an elementwise op's, so that
// a kernel doing a sort or a bisection per line goes parallel on smaller tensors.
template <class F>
void for_each_line(int64_t outer, int64_t n, int64_t inner, F f, int64_t cost = 1) {
  int64_t lines = outer * inner;
  bool par = lines * n * cost >= kParallelGrain && lines > 1 && !omp_in_parallel();
  parallel_for_if(lines, par, [&](int64_t l) { f((l / inner) * n * inner + l % inner, inner); });
}

}  // namespace mu::cpu
