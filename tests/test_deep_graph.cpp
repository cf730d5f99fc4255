// Graphs of any depth: a chain of 10^6 recorded ops is built, run backward and freed
// on a thread with a 256 KiB stack, where a recursive traversal or a recursive release
// (one nest of frames per op, a hundred bytes or more each) would overflow at once.
// Releasing a chain allocates nothing. Gradients are checked exactly against the closed
// form, evaluated in the same double arithmetic.
#include <pthread.h>

#include <atomic>
#include <cstdlib>
#include <functional>
#include <new>

#include "helpers.h"

using namespace mu;

// ---------------------------------------------------------------- allocation counting
// The program's operator new, counting the calls made by a thread that asked to be counted.
namespace {
std::atomic<int64_t> g_allocations{0};
thread_local bool t_counting = false;
}  // namespace

void* operator new(std::size_t n) {
  if (t_counting) g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace {

// The number of allocations `fn` makes on this thread.
int64_t allocations_in(const std::function<void()>& fn) {
  const int64_t before = g_allocations.load();
  t_counting = true;
  fn();
  t_counting = false;
  return g_allocations.load() - before;
}

constexpr int64_t kDepth = 1000000;
// The variants below go 5 * 10^4 deep: a recursive release or traversal needs far more
// than this stack at that depth already (a few hundred bytes of frames per op).
constexpr int64_t kVariantDepth = 50000;
constexpr size_t kSmallStack = 256 * 1024;

// Runs `fn` to completion on a new thread with a 256 KiB stack. An exception is caught
// there and its message returned (empty: none); a stack overflow kills the test.
std::string on_small_stack(const std::function<void()>& fn) {
  struct Job {
    const std::function<void()>* fn;
    std::string error;
  } job{&fn, {}};
  auto body = [](void* arg) -> void* {
    Job* j = static_cast<Job*>(arg);
    try {
      (*j->fn)();
    } catch (const std::exception& e) {
      j->error = e.what();
    }
    return nullptr;
  };
  pthread_attr_t attr;
  REQUIRE(pthread_attr_init(&attr) == 0);
  REQUIRE(pthread_attr_setstacksize(&attr, kSmallStack) == 0);
  pthread_t thread;
  REQUIRE(pthread_create(&thread, &attr, body, &job) == 0);
  pthread_join(thread, nullptr);
  pthread_attr_destroy(&attr);
  return job.error;
}

// x * c, then + 1, alternately, kDepth ops in all: the value and the gradient follow the
// same double products as the tests' closed forms below.
constexpr double kFactor = 1.0 + 0x1.0p-20;  // c^(kDepth/2) = e^0.477 ≈ 1.6: no overflow

Tensor chain(const Tensor& leaf, int64_t depth) {
  Tensor x = leaf;
  for (int64_t i = 0; i < depth; ++i) x = (i % 2 == 0) ? x * kFactor : x + 1.0;
  return x;
}

}  // namespace

TEST_CASE("a chain of 10^6 ops runs backward and is freed on a 256 KiB stack") {
  Tensor leaf = tensor({0.5, -2.0}, kFloat64).requires_grad_();
  // Closed forms, evaluated step by step in double as the forward and backward passes do:
  // value v_{i+1} = v_i * c or v_i + 1; d(sum)/d(leaf) = c^(kDepth/2), one product per mul.
  std::vector<double> value = {0.5, -2.0};
  double grad = 1.0;
  for (int64_t i = 0; i < kDepth; ++i)
    for (double& v : value) {
      // Rounded after every op, as each kernel call rounds it: through a volatile, so the
      // compiler cannot fuse a product and the next sum into one FMA (GCC contracts by
      // default where the target has FMA, and did under -march=native here).
      volatile double r = (i % 2 == 0) ? v * kFactor : v + 1.0;
      v = r;
    }
  for (int64_t i = 0; i < kDepth / 2; ++i) grad *= kFactor;

  std::vector<double> forward;
  std::string error = on_small_stack([&] {
    Tensor y = chain(leaf, kDepth);
    forward = y.to_vector<double>();
    y.sum().backward();
    // y and its graph (10^6 nodes, the saved operands of each product) die here.
  });
  CHECK(error == "");
  CHECK(forward == value);
  REQUIRE(leaf.grad().defined());
  CHECK(leaf.grad().to_vector<double>() == std::vector<double>{grad, grad});
  CHECK(leaf.is_leaf());
}

TEST_CASE("graphs of 10^6 nodes dropped without backward are freed on a 256 KiB stack") {
  // Made of nodes directly (no op runs, so building takes a fraction of a second): a chain
  // (node i -> i-1), and a ladder (node i -> i-1 and i-2), where every producer but the
  // first has two consumers, so the release meets shared producers all the way down.
  using autograd::Edge;
  using autograd::LambdaNode;
  using autograd::Node;
  auto build = [](int64_t depth, bool ladder) {
    std::shared_ptr<Node> top, below;
    for (int64_t i = 0; i < depth; ++i) {
      auto n = std::make_shared<LambdaNode>("Step", nullptr);
      n->next_edges.push_back(Edge{top, 0});
      if (ladder) n->next_edges.push_back(Edge{below, 0});
      below = std::move(top);
      top = std::move(n);
    }
    return top;  // `below` is let go here; `top` holds the rest
  };
  for (bool ladder : {false, true}) {
    INFO("ladder: " << ladder);
    std::weak_ptr<Node> watch;
    std::string error = on_small_stack([&] {
      std::shared_ptr<Node> top = build(kDepth, ladder);
      // The bottom node, reached through the edges; it must die with the rest.
      const std::shared_ptr<Node>* n = &top;
      while ((*n)->next_edges[0].fn) n = &(*n)->next_edges[0].fn;
      watch = *n;
      top.reset();
    });
    CHECK(error == "");
    CHECK(watch.expired());
  }

  // Through ops: x + 1 keeps no tensors, so only the nodes die.
  Tensor leaf = ones({3}, kFloat64).requires_grad_();
  std::string error = on_small_stack([&] {
    Tensor y = leaf;
    for (int64_t i = 0; i < kVariantDepth; ++i) y = y + 1.0;
  });
  CHECK(error == "");
  CHECK(!leaf.grad().defined());
  // The leaf outlived its graph and takes part in a new one as before.
  (leaf * 2.0).sum().backward();
  CHECK(leaf.grad().to_vector<double>() == std::vector<double>{2.0, 2.0, 2.0});
}

TEST_CASE("backward with retain_graph twice over a deep chain, then the graph is freed") {
  Tensor leaf = tensor({1.0}, kFloat64).requires_grad_();
  double grad = 1.0;
  for (int64_t i = 0; i < kVariantDepth / 2; ++i) grad *= kFactor;
  std::string error = on_small_stack([&] {
    Tensor y = chain(leaf, kVariantDepth);
    y.backward(ones({1}, kFloat64), /*retain_graph=*/true);
    y.backward(ones({1}, kFloat64), /*retain_graph=*/true);
  });
  CHECK(error == "");
  // Two passes accumulate: 2 c^n, exact (doubling is).
  CHECK(leaf.grad().to_vector<double>() == std::vector<double>{2 * grad});
}

TEST_CASE("a deep graph with branches is freed without recursion; parts still held live on") {
  // Each step combines the running value with a fresh branch of two ops and a diamond
  // through x * x, so nodes own several producers at once. The test keeps the value after
  // the first step and the one half-way: releasing the end stops at the half-way value,
  // releasing that stops at the first, which still runs backward.
  constexpr int64_t kSteps = kVariantDepth / 2;  // 6 ops a step
  Tensor leaf = tensor({1.0}, kFloat64).requires_grad_();
  Tensor first, half;
  std::string error = on_small_stack([&] {
    Tensor x = leaf;
    for (int64_t i = 0; i < kSteps; ++i) {
      Tensor branch = (leaf * 0.0) + 1.0;  // value 1, d/dleaf 0
      x = x * branch + (x * x) * 0.0;      // value x
      if (i == 0) first = x;
      if (i == kSteps / 2) half = x;
    }
  });  // x, 10^5 steps above `half`, is released here
  CHECK(error == "");
  error = on_small_stack([&] { half = Tensor(); });
  CHECK(error == "");
  error = on_small_stack([&] { first.sum().backward(); });
  CHECK(error == "");
  // first = leaf * (leaf * 0 + 1) + (leaf * leaf) * 0: d/dleaf = 1 + leaf * 0 + 2 leaf * 0 = 1.
  CHECK(leaf.grad().to_vector<double>() == std::vector<double>{1.0});
}

TEST_CASE("y = x * x chains: two edges to one producer are released iteratively") {
  Tensor leaf = tensor({1.0}, kFloat64).requires_grad_();
  double value = 0;
  std::string error = on_small_stack([&] {
    Tensor x = leaf;
    for (int64_t i = 0; i < kVariantDepth; ++i) x = x * x;  // 1 * 1: stays finite
    value = x.item<double>();
  });
  CHECK(error == "");
  CHECK(value == 1.0);
}

TEST_CASE("releasing a chain allocates nothing") {
  Tensor leaf = tensor({1.0}, kFloat64).requires_grad_();
  Tensor x = leaf;
  for (int i = 0; i < 1000; ++i) x = x + 1.0;  // additions keep no tensors: only nodes die below
  std::shared_ptr<autograd::Node> top = x.grad_fn();
  x = Tensor();
  CHECK(allocations_in([&] { top.reset(); }) == 0);

  // A node whose producer is still held elsewhere: the release stops there, also without
  // allocating, and the held part is intact.
  Tensor mid = leaf * 3.0;
  Tensor y = mid + 1.0;
  std::shared_ptr<autograd::Node> y_fn = y.grad_fn();
  y = Tensor();
  CHECK(allocations_in([&] { y_fn.reset(); }) == 0);
  mid.sum().backward();
  CHECK(leaf.grad().to_vector<double>() == std::vector<double>{3.0});
}
