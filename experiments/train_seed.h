// Per-batch seeds for the trainers: the data of micro-batch k (windows, a permutation, an
// augmentation) is drawn from a Generator seeded by mix(seed, k), so it depends on the
// run's seed and k alone. A resumed run then needs no data-generator state (only the step),
// and a prefetch thread may draw ahead without changing what any step sees.
#pragma once
#include <cstdint>

namespace mu::experiments {

// SplitMix64's finaliser over seed and k: nearby (seed, k) give unrelated seeds.
inline uint64_t mix_seed(uint64_t seed, uint64_t k) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + k + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace mu::experiments
