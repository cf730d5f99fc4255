// Per-batch seeds for the trainers: the data of micro-batch k (windows, a permutation, an
// augmentation) is drawn from a Generator seeded by mix(seed, k), so it depends on the
// run's seed and k alone. A resumed run then needs no data-generator state (only the step),
// and a prefetch thread may draw ahead without changing what any step sees.
#pragma once
#include <cstdint>

#include "tensor/random.h"

namespace mu::experiments {

// mix_seed itself lives in the library (tensor/random.h), beside the pipelines that use it.
using mu::mix_seed;

}  // namespace mu::experiments
