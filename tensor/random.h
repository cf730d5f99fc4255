// The global random generator. One stream for the CPU (CUDA tensors are drawn on the
// host and copied, so the same seed gives the same values on either device).
#pragma once
#include <cstdint>
#include <random>
#include <string>

namespace mu {

class Generator {
 public:
  explicit Generator(uint64_t seed = 5489) { manual_seed(seed); }
  // Also drops a pending Box-Muller value, so a seed alone fixes the next normal draws.
  void manual_seed(uint64_t seed) { engine_.seed(seed); seed_ = seed; has_spare_ = false; }
  uint64_t seed() const { return seed_; }
  uint64_t next_u64() { return engine_(); }
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return double(engine_() >> 11) * 0x1.0p-53; }
  // Standard normal (Box-Muller; the second value of each pair is kept for the next call).
  double normal();
  // The complete state as text, and back: checkpoints resume the exact stream.
  std::string state() const;
  void set_state(const std::string& s);

 private:
  std::mt19937_64 engine_;
  uint64_t seed_ = 0;
  bool has_spare_ = false;
  double spare_ = 0;
};

Generator& default_generator();

}  // namespace mu
