// The dropout mask's hash (ops/kernels/attention.h) for eight counters at once, in 64-bit
// vector lanes. One element's hash is two 64-bit multiplies and six shifts and xors;
// element by element, dropout's forward on 1M floats took 2.2 ms on one Zen 5 core, of
// which the multiply by the mask 0.12 ms. As eight lanes (vpmullq on AVX-512) the same
// arithmetic gives the same bits,
// so the CPU's masks still equal every other backend's.
#pragma once
#include <cstdint>
#include <cstring>

#include "ops/kernels/attention.h"

namespace mu::cpu {

typedef uint64_t DropoutU64x8 __attribute__((vector_size(64)));
typedef int64_t DropoutI64x8 __attribute__((vector_size(64)));

// Eight lanes of T and the lane mask that selects them (all ones: kept; zero: dropped).
template <class T>
struct DropoutLanes;
template <>
struct DropoutLanes<float> {
  typedef float type __attribute__((vector_size(32)));
  typedef int32_t mask __attribute__((vector_size(32)));
};
template <>
struct DropoutLanes<double> {
  typedef double type __attribute__((vector_size(64)));
  typedef int64_t mask __attribute__((vector_size(64)));
};

// Lane w is all ones when the element with counter n0 + w * step is kept, that is when
// attention_dropout_bits(key, n0 + w * step) >= threshold; zero when it is dropped.
template <class T>
inline typename DropoutLanes<T>::mask dropout_kept8(uint64_t key, uint64_t n0, uint64_t step, uint64_t threshold) {
  const DropoutU64x8 lane = {0, 1, 2, 3, 4, 5, 6, 7};
  // attention_dropout_bits, lane by lane (unsigned arithmetic wraps as the scalar form's):
  // key + (n0 + w step) C as (key + n0 C) + w (step C), whose vector product is a
  // constant when step is (the mask's step 1).
  constexpr uint64_t C = 0x9e3779b97f4a7c15ULL;
  DropoutU64x8 z = (key + n0 * C) + lane * (step * C);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  const DropoutU64x8 bits = (z ^ (z >> 31)) >> 32;
  const DropoutI64x8 kept = bits >= threshold;  // -1 or 0 in each lane
  return __builtin_convertvector(kept, typename DropoutLanes<T>::mask);
}

// v where kept, +0 where dropped: a select by bits, so a dropped NaN or infinity is 0 too.
template <class T>
inline typename DropoutLanes<T>::type dropout_select8(typename DropoutLanes<T>::mask kept,
                                                      typename DropoutLanes<T>::type v) {
  using M = typename DropoutLanes<T>::mask;
  M bits;
  std::memcpy(&bits, &v, sizeof(v));
  bits &= kept;
  std::memcpy(&v, &bits, sizeof(v));
  return v;
}

}  // namespace mu::cpu
