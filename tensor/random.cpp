#include "tensor/random.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <new>
#include <sstream>

#include "tensor/checked.h"
#include "tensor/tensor.h"

namespace mu {

namespace detail {
thread_local void (*draw_observer)(Generator&) = nullptr;
}  // namespace detail

double Generator::Engine::normal() {
  if (has_spare) {
    has_spare = false;
    return spare;
  }
  double u1 = uniform(), u2 = uniform();
  if (u1 < 1e-300) u1 = 1e-300;  // log(0) guard
  double r = std::sqrt(-2.0 * std::log(u1)), th = 2.0 * M_PI * u2;
  spare = r * std::sin(th);
  has_spare = true;
  return r * std::cos(th);
}

Generator::Generator(const Generator& other) {
  std::lock_guard<std::mutex> lock(other.m_);
  e_ = other.e_;
}

Generator& Generator::operator=(const Generator& other) {
  if (this == &other) return *this;
  // Both locks at once, in a deadlock-free order (two threads may assign a <-> b).
  std::scoped_lock lock(m_, other.m_);
  e_ = other.e_;
  return *this;
}

void Generator::manual_seed(uint64_t seed) {
  std::lock_guard<std::mutex> lock(m_);
  e_.reseed(seed);
}

uint64_t Generator::seed() const {
  std::lock_guard<std::mutex> lock(m_);
  return e_.seed;
}

std::string Generator::state() const {
  std::ostringstream os;
  os.precision(17);
  std::lock_guard<std::mutex> lock(m_);
  os << e_.seed << ' ' << e_.has_spare << ' ' << e_.spare << ' ' << e_.bits;
  return os.str();
}

void Generator::set_state(const std::string& s) {
  const std::string what = "Generator::set_state: malformed generator state (" + std::to_string(s.size()) + " bytes)";
  // Parsed into a spare generator first (no other thread sees it, so no lock), so that a
  // malformed state leaves this one unchanged.
  std::istringstream is(s);
  Generator g;
  is >> g.e_.seed >> g.e_.has_spare >> g.e_.spare >> g.e_.bits;
  MU_CHECK(!is.fail(), what, ": not \"seed has_spare spare engine\" as state() writes it");
  // The stream extractors are lenient (a leading '-' wraps an unsigned value, any run of
  // spaces separates, text may follow); only the exact text state() writes for what
  // was read is taken.
  MU_CHECK(g.state() == s, what, ": not in the exact form state() writes (extra text, signs, leading zeros or "
           "other spacing)");
  // A pending Box-Muller value is sqrt(-2 ln u1) * sin(.) with u1 >= 1e-300: below 37.2.
  MU_CHECK(std::isfinite(g.e_.spare) && std::abs(g.e_.spare) <= 38.0, what, ": the pending normal value ", g.e_.spare,
           " is not one the generator can produce");
  // The engine's text is its words and then its position in them (libstdc++), which
  // never exceeds the word count.
  constexpr size_t n = std::mt19937_64::state_size;
  const size_t tokens = size_t(std::count(s.begin(), s.end(), ' ')) + 1;
  if (tokens == 3 + n + 1) {
    const std::string last = s.substr(s.rfind(' ') + 1);
    MU_CHECK(last.size() <= 3 && std::stoul(last) <= n, what, ": the engine position ", last, " is past its ", n,
             " words");
    // All words zero: the twister would draw zeros forever (no seed leads there).
    std::istringstream words(s);
    std::string skip;
    words >> skip >> skip >> skip;
    bool all_zero = true;
    for (size_t i = 0; i < n && all_zero; ++i) {
      uint64_t w = 0;
      words >> w;
      all_zero = w == 0;
    }
    MU_CHECK(!all_zero, what, ": the engine's words are all zero");
  }
  *this = g;  // under both locks
}

Generator& default_generator() {
  static Generator g(0);
  return g;
}

void manual_seed(uint64_t seed) { default_generator().manual_seed(seed); }

// Draws on the host in row-major order (so results do not depend on threads), then
// moves to the requested device. The whole tensor is drawn under one hold of the
// generator's lock, so a call made at the same time from another thread takes its values
// from before or after this block, never from the middle of it.
template <class Draw>
static Tensor draw(const Shape& shape, TensorOptions opts, Generator* gen, Draw d) {
  Tensor t = empty(shape, TensorOptions(opts.dtype()));
  MU_DISPATCH_NUMERIC(opts.dtype(), "random", [&] {
    scalar_t* p = t.data_ptr<scalar_t>();
    Generator::Draws g = (gen ? *gen : default_generator()).lock();
    for (int64_t i = 0, n = t.numel(); i < n; ++i) p[i] = scalar_t(d(g));
  });
  if (!opts.device().is_cpu()) t = t.to(opts.device());
  if (opts.requires_grad()) t.requires_grad_(true);
  return t;
}

Tensor rand(const Shape& shape, TensorOptions opts, Generator* gen) {
  MU_CHECK(is_floating(opts.dtype()), "rand: needs a floating-point dtype, got ", dtype_name(opts.dtype()));
  if (opts.dtype() == kFloat32)  // 24 random bits, so the value is exactly representable and < 1
    return draw(shape, opts, gen, [](Generator::Draws& g) { return double(g.next_u64() >> 40) * 0x1.0p-24; });
  return draw(shape, opts, gen, [](Generator::Draws& g) { return g.uniform(); });
}

Tensor randn(const Shape& shape, TensorOptions opts, Generator* gen) {
  MU_CHECK(is_floating(opts.dtype()), "randn: needs a floating-point dtype, got ", dtype_name(opts.dtype()));
  return draw(shape, opts, gen, [](Generator::Draws& g) { return g.normal(); });
}

Tensor randint(int64_t low, int64_t high, const Shape& shape, TensorOptions opts, Generator* gen) {
  MU_CHECK(high > low, "randint: empty range [", low, ", ", high, ")");
  // In unsigned arithmetic: high - low may exceed INT64_MAX (a signed overflow), and the
  // modular sum below lands back in [low, high) exactly.
  uint64_t span = uint64_t(high) - uint64_t(low);
  // Rejection sampling: no modulo bias even for spans that do not divide 2^64.
  uint64_t limit = UINT64_MAX - UINT64_MAX % span;
  return draw(shape, opts, gen, [=](Generator::Draws& g) {
    uint64_t v;
    do v = g.next_u64(); while (v >= limit);
    // An int64, never a double: values above 2^53 stay exact in an int64 tensor.
    return int64_t(uint64_t(low) + v % span);
  });
}

// The largest m such that every integer 0..m is exact in dtype t (each of randperm's
// values must be, or the permutation repeats values): 2^(mantissa bits + 1) for a float,
// the greatest value for an integer or bool (tensor/dtype.h's integer_range).
static int64_t largest_exact_integer(DType t) {
  switch (t) {
    case DType::Float32: return int64_t(1) << 24;
    case DType::Float64: return int64_t(1) << 53;
    case DType::BFloat16: return 256;
    case DType::Float16: return 2048;
    case DType::Int64: return std::numeric_limits<int64_t>::max();  // not a double
    default: return int64_t(integer_range(t).second);
  }
}

Tensor randperm(int64_t n, TensorOptions opts, Generator* gen) {
  MU_CHECK(n >= 0, "randperm: negative n ", n);
  MU_CHECK(n - 1 <= largest_exact_integer(opts.dtype()), "randperm: n = ", n, " is too large for ", dtype_name(opts.dtype()),
           ", which holds the integers 0 to ", largest_exact_integer(opts.dtype()), " exactly, not 0 to ", n - 1);
  // The host buffer is checked like a tensor's bytes, so a huge n is a mu::Error here,
  // not a std::length_error or bad_alloc from the vector.
  MU_CHECK(n <= kMaxAllocationBytes / int64_t(sizeof(int64_t)), "randperm: n = ", n, " needs more than ",
           kMaxAllocationBytes, " bytes");
  std::vector<int64_t> p;
  try {
    p.resize(static_cast<size_t>(n));
  } catch (const std::bad_alloc&) {
    MU_FAIL("randperm: out of host memory for n = ", n);
  }
  for (int64_t i = 0; i < n; ++i) p[size_t(i)] = i;
  {
    Generator::Draws g = (gen ? *gen : default_generator()).lock();  // one shuffle, one hold
    for (int64_t i = n - 1; i > 0; --i) std::swap(p[size_t(i)], p[size_t(g.next_u64() % uint64_t(i + 1))]);
  }
  return from_vector(p, {n}, opts);
}

}  // namespace mu
