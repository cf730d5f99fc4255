// Random generators. default_generator() is the global stream for every device (CUDA
// tensors are drawn on the host and copied, so the same seed gives the same values on
// either device); a program may also make its own Generator and pass it to the factories
// (randn(shape, opts, &gen)), so that, say, a data-prefetch thread has a stream of its own
// that the training thread's draws do not move.
//
// A Generator is safe to share between threads: each draw, and each factory call as a
// whole (one tensor's worth of draws), runs under the generator's lock, so concurrent
// calls interleave as whole calls and never corrupt the engine state. Which thread's
// call comes first is then up to the scheduler; for a stream that repeats, give each
// thread its own Generator.
//
//   Generator g(1234);
//   {
//     auto draws = g.lock();              // one batch: no other thread draws in between
//     for (auto& v : values) v = draws.normal();
//   }
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <random>
#include <string>

namespace mu {

// SplitMix64's finaliser over (seed, k): nearby pairs give unrelated 64-bit seeds. The
// data pipelines seed one Generator per batch or per image with it, so that what a batch
// holds depends on (seed, k) alone, not on the order or the thread that draws it.
inline uint64_t mix_seed(uint64_t seed, uint64_t k) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + k + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

class Generator;

namespace detail {
// While set, called on this thread with each generator before a batch of its draws:
// autograd's checkpointing notes the generators a region draws from, to replay them
// (autograd/activation_checkpoint.cpp).
extern thread_local void (*draw_observer)(Generator&);
}  // namespace detail

class Generator {
  // The stream itself, with no locking: every access goes through Generator's lock.
  struct Engine {
    std::mt19937_64 bits;
    uint64_t seed = 0;
    bool has_spare = false;  // Box-Muller makes pairs; the second waits here
    double spare = 0;

    void reseed(uint64_t s) { bits.seed(s); seed = s; has_spare = false; }
    uint64_t next_u64() { return bits(); }
    double uniform() { return double(bits() >> 11) * 0x1.0p-53; }
    double normal();
  };

 public:
  // Draws made while holding the generator's lock; obtained from Generator::lock().
  // Holding one blocks every other user of the generator, so keep it for one batch.
  class Draws {
   public:
    uint64_t next_u64() { return e_->next_u64(); }
    // Uniform in [0, 1) with 53 random bits.
    double uniform() { return e_->uniform(); }
    // Standard normal (Box-Muller; the second value of each pair is kept for the next draw).
    double normal() { return e_->normal(); }

   private:
    friend class Generator;
    Draws(std::mutex& m, Engine& e) : lock_(m), e_(&e) {}
    std::unique_lock<std::mutex> lock_;
    Engine* e_;
  };

  explicit Generator(uint64_t seed = 5489) { e_.reseed(seed); }
  // Copies take the source's lock, so a snapshot is never half-way through a draw.
  Generator(const Generator& other);
  Generator& operator=(const Generator& other);

  // Takes the lock for a batch of draws (see Draws).
  Draws lock() {
    if (detail::draw_observer) detail::draw_observer(*this);
    return Draws(m_, e_);
  }

  // Also drops a pending Box-Muller value, so a seed alone fixes the next normal draws.
  void manual_seed(uint64_t seed);
  uint64_t seed() const;
  // Single draws, each under the lock (for a batch, take lock() once instead).
  uint64_t next_u64() { return lock().next_u64(); }
  double uniform() { return lock().uniform(); }
  double normal() { return lock().normal(); }
  // The complete state as text, and back: checkpoints resume the exact stream.
  std::string state() const;
  void set_state(const std::string& s);
  // Expires when this generator is destroyed (copies and assignments have their own).
  std::weak_ptr<const void> liveness() const { return alive_; }

 private:
  mutable std::mutex m_;
  Engine e_;
  std::shared_ptr<const char> alive_ = std::make_shared<const char>('\0');
};

Generator& default_generator();

}  // namespace mu
