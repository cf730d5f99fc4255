// Random generators under threads: concurrent factory calls on one generator interleave
// as whole calls (checked against the serial stream, block by block), a private
// Generator's stream does not depend on what other threads draw, state snapshots taken
// mid-run are whole, and the factories, dropout, nn::init, nn::Dropout and the DataLoader
// take a Generator.
// Each thread records what it drew; all checks run on the main thread afterwards.
#include <latch>
#include <map>
#include <thread>

#include "helpers.h"
#include "nn/activation.h"
#include "nn/init.h"
#include "nn/mumoe_block.h"
#include "ops/kernels/dropout.h"

using namespace mu;

namespace {

constexpr int64_t kBlock = 7;    // odd: a call ends half-way through a Box-Muller pair
constexpr int kCalls = 10000;    // calls per thread

using Block = std::vector<double>;

// The serial stream of normals from seed `seed`, cut into `n` blocks of kBlock, each
// mapped to its position. One long draw gives the same numbers as n short ones (the
// pending Box-Muller value carries over from call to call).
std::map<Block, int64_t> serial_blocks(uint64_t seed, int64_t n) {
  Generator g(seed);
  std::vector<double> s = randn({n * kBlock}, kFloat64, &g).to_vector<double>();
  std::map<Block, int64_t> pos;
  for (int64_t j = 0; j < n; ++j)
    pos.emplace(Block(s.begin() + j * kBlock, s.begin() + (j + 1) * kBlock), j);
  REQUIRE(int64_t(pos.size()) == n);  // 7 random doubles: no two blocks alike
  return pos;
}

// Where each drawn block sits in the serial stream (-1: nowhere, a torn or corrupted draw).
std::vector<int64_t> positions(const std::vector<Block>& drawn, const std::map<Block, int64_t>& serial) {
  std::vector<int64_t> at;
  for (const Block& b : drawn) {
    auto it = serial.find(b);
    at.push_back(it == serial.end() ? -1 : it->second);
  }
  return at;
}

// Every drawn block is a whole block of the serial stream, one thread's blocks come in
// stream order, and together the threads used each serial block exactly once.
void check_whole_calls(const std::vector<std::vector<Block>>& per_thread, const std::map<Block, int64_t>& serial) {
  std::vector<int> used(serial.size(), 0);
  for (size_t t = 0; t < per_thread.size(); ++t) {
    std::vector<int64_t> at = positions(per_thread[t], serial);
    int64_t torn = std::count(at.begin(), at.end(), int64_t(-1));
    INFO("thread " << t);
    CHECK(torn == 0);
    bool ordered = true;
    for (size_t i = 1; i < at.size(); ++i) ordered = ordered && at[i] > at[i - 1];
    CHECK(ordered);
    for (int64_t j : at)
      if (j >= 0) used[size_t(j)] += 1;
  }
  CHECK(std::count(used.begin(), used.end(), 1) == int64_t(used.size()));
}

bool all_finite(const std::vector<Block>& blocks) {
  for (const Block& b : blocks)
    for (double v : b)
      if (!std::isfinite(v)) return false;
  return true;
}

}  // namespace

TEST_CASE("two threads drawing from the default generator get whole blocks of the serial stream") {
  manual_seed(2024);
  std::vector<std::vector<Block>> drawn(2);
  std::latch start(2);  // both threads begin together, so their calls overlap
  // Thread 0 uses the tensor factory, thread 1 the in-place initialiser: both draw one
  // normal per element under one hold of the lock.
  std::thread a([&] {
    start.arrive_and_wait();
    for (int i = 0; i < kCalls; ++i) drawn[0].push_back(randn({kBlock}, kFloat64).to_vector<double>());
  });
  std::thread b([&] {
    start.arrive_and_wait();
    Tensor t = empty({kBlock}, kFloat64);
    for (int i = 0; i < kCalls; ++i) drawn[1].push_back(nn::init::normal_(t).to_vector<double>());
  });
  a.join();
  b.join();
  CHECK(all_finite(drawn[0]));
  CHECK(all_finite(drawn[1]));
  check_whole_calls(drawn, serial_blocks(2024, 2 * kCalls));
}

TEST_CASE("a private generator repeats its stream while another thread hammers the default one") {
  // What the prefetch thread draws with Generator(99): normals, uniforms, integers and a
  // permutation per step, as a data pipeline would.
  auto prefetch = [](Generator& g, int steps) {
    std::vector<std::vector<double>> out;
    for (int i = 0; i < steps; ++i) {
      out.push_back(randn({5}, kFloat32, &g).to_vector<double>());
      out.push_back(rand({3}, kFloat64, &g).to_vector<double>());
      out.push_back(randint(-4, 9, {4}, kInt64, &g).to_vector<double>());
      out.push_back(randperm(6, kInt64, &g).to_vector<double>());
    }
    return out;
  };
  constexpr int kSteps = 3000;
  Generator alone(99);
  const auto expected = prefetch(alone, kSteps);

  manual_seed(5);
  const std::string default_before = default_generator().state();
  std::vector<std::vector<double>> got;
  std::vector<Block> hammered;
  std::latch start(2);
  std::thread loader([&] {
    Generator mine(99);
    start.arrive_and_wait();
    got = prefetch(mine, kSteps);
  });
  std::thread trainer([&] {
    start.arrive_and_wait();
    for (int i = 0; i < kCalls; ++i) hammered.push_back(randn({kBlock}, kFloat64).to_vector<double>());
  });
  loader.join();
  trainer.join();
  CHECK(got == expected);
  // The trainer was the default generator's only user, so its stream is the serial one:
  // the private generator took nothing from it.
  check_whole_calls({hammered}, serial_blocks(5, kCalls));
  CHECK(default_generator().state() != default_before);
}

TEST_CASE("a private generator leaves the default stream where it was") {
  manual_seed(11);
  const std::string before = default_generator().state();
  Generator g(11);
  Tensor a = randn({100}, kFloat32, &g);
  rand({10}, kFloat64, &g);
  randint(0, 5, {10}, kInt64, &g);
  randperm(10, kInt64, &g);
  CHECK((default_generator().state() == before));  // parenthesised: no 5 kB state in the log
  // Same seed, same numbers: the private generator is the default one's stream, unshared.
  CHECK(randn({100}).to_vector<float>() == a.to_vector<float>());
}

TEST_CASE("nn::init and nn::Dropout draw from a private generator as the functions of the same seed") {
  manual_seed(3);
  const std::string before = default_generator().state();
  Generator g(21);
  Tensor u = nn::init::uniform_(empty({50}), -1, 1, &g);
  Tensor k = nn::init::kaiming_normal_(empty({8, 6}), 0.0, nn::init::FanMode::FanIn,
                                       nn::init::Nonlinearity::ReLU, &g);
  Tensor t = nn::init::trunc_normal_(empty({40}), 0.0, 0.02, -0.04, 0.04, &g);
  nn::Dropout drop(nn::DropoutOptions(0.5).generator(&g));
  Tensor d = drop(ones({64}));
  CHECK((default_generator().state() == before));
  // The same draws from the global generator, seeded alike, give the same values.
  manual_seed(21);
  CHECK(nn::init::uniform_(empty({50}), -1, 1).to_vector<float>() == u.to_vector<float>());
  CHECK(nn::init::kaiming_normal_(empty({8, 6}), 0.0, nn::init::FanMode::FanIn, nn::init::Nonlinearity::ReLU)
            .to_vector<float>() == k.to_vector<float>());
  CHECK(nn::init::trunc_normal_(empty({40}), 0.0, 0.02, -0.04, 0.04).to_vector<float>() == t.to_vector<float>());
  CHECK(dropout(ones({64}), 0.5).to_vector<float>() == d.to_vector<float>());
}

TEST_CASE("μMoE blocks draw their factors from a private generator as from the global one of the same seed") {
  for (nn::MoEKind kind : {nn::MoEKind::CP, nn::MoEKind::TR, nn::MoEKind::Tucker, nn::MoEKind::Hadamard,
                           nn::MoEKind::Dense}) {
    auto opts = [kind] {
      nn::MuMoEOptions o = nn::MuMoEOptions(6, 5).experts({4, 3}).kind(kind);
      if (kind == nn::MoEKind::CP) o.rank(3);
      if (kind == nn::MoEKind::TR) o.ranks({2, 2, 2, 3});
      if (kind == nn::MoEKind::Tucker) o.ranks({2, 2, 3, 3});
      return o;
    };
    manual_seed(4);
    const std::string before = default_generator().state();
    Generator g(31);
    nn::MuMoE mine(opts().generator(&g));
    CHECK((default_generator().state() == before));
    manual_seed(31);
    nn::MuMoE global(opts());
    INFO(nn::to_string(kind));
    const auto a = mine.named_parameters(), b = global.named_parameters();
    REQUIRE(a.size() == b.size());
    for (size_t i = 0; i < a.size(); ++i) CHECK(a[i].second.to_vector<float>() == b[i].second.to_vector<float>());
  }
}

TEST_CASE("state() and copies taken while another thread draws resume at a block boundary") {
  constexpr int kSnapshots = 200;
  manual_seed(77);
  std::vector<std::string> states;
  std::vector<Generator> copies;
  std::latch start(2);
  std::thread drawer([&] {
    start.arrive_and_wait();
    for (int i = 0; i < kCalls; ++i) randn({kBlock}, kFloat64);
  });
  std::thread snapshotter([&] {
    start.arrive_and_wait();
    for (int i = 0; i < kSnapshots; ++i) {
      states.push_back(default_generator().state());
      copies.push_back(default_generator());
    }
  });
  drawer.join();
  snapshotter.join();
  // kCalls + 1 blocks: a snapshot taken after the last call continues past the drawer's end.
  const auto serial = serial_blocks(77, kCalls + 1);
  std::vector<Block> next;
  for (const std::string& s : states) {
    Generator g;
    g.set_state(s);  // every snapshot parses: none was taken half-way through a draw
    next.push_back(randn({kBlock}, kFloat64, &g).to_vector<double>());
  }
  for (Generator& g : copies) next.push_back(randn({kBlock}, kFloat64, &g).to_vector<double>());
  std::vector<int64_t> at = positions(next, serial);
  CHECK(std::count(at.begin(), at.end(), int64_t(-1)) == 0);
}

TEST_CASE("dropout and the DataLoader draw from the generator they are given") {
  Tensor x = ones({64}, kFloat64);
  Generator g1(3), g2(3);
  manual_seed(0);
  const std::string before = default_generator().state();
  Tensor m1 = dropout(x, 0.5, true, &g1), m2 = dropout(x, 0.5, true, &g2);
  CHECK(m1.to_vector<double>() == m2.to_vector<double>());
  // The mask is drawn from one 64-bit seed of the generator: element i is kept when the
  // counter hash of (seed, i) reaches round(p 2^32), and scaled by 1/(1-p).
  Generator g3(3);
  const uint64_t key = kernels::attention_dropout_key(g3.next_u64());
  std::vector<double> m = m1.to_vector<double>();
  for (size_t i = 0; i < m.size(); ++i)
    CHECK(m[i] == (kernels::attention_dropout_bits(key, i) >= (uint64_t(1) << 31) ? 2.0 : 0.0));
  CHECK((default_generator().state() == before));

  // A loader with a generator of its own shuffles by that generator's permutations,
  // epoch after epoch, whatever is drawn from the default generator in between.
  Generator mine(8), ref(8);
  data::DataLoader loader(50, data::DataLoaderOptions(16).generator(&mine));
  for (int epoch = 0; epoch < 3; ++epoch) {
    randn({10});
    std::vector<int64_t> order;
    for (const Tensor& batch : loader.epoch())
      for (int64_t i : batch.to_vector<int64_t>()) order.push_back(i);
    CHECK(order == randperm(50, kInt64, &ref).to_vector<int64_t>());
  }
}

TEST_CASE("a copied generator continues the stream independently of its source") {
  Generator g(123);
  randn({3}, kFloat64, &g);  // leaves a pending Box-Muller value, which the copy carries
  Generator c = g;
  std::vector<double> from_g = randn({9}, kFloat64, &g).to_vector<double>();
  std::vector<double> from_c = randn({9}, kFloat64, &c).to_vector<double>();
  CHECK(from_g == from_c);
  c = g;  // assignment likewise
  CHECK(randn({4}, kFloat64, &c).to_vector<double>() == randn({4}, kFloat64, &g).to_vector<double>());
  CHECK(g.seed() == 123);
}
