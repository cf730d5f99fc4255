// Backward-pass hooks (autograd/hooks.h): a leaf's grad-ready hook sees its accumulated
// gradient once per backward, the end hook runs after every leaf's, handles remove hooks,
// and bad arguments and throwing hooks are reported.
#include <string>
#include <vector>

#include "autograd/hooks.h"
#include "helpers.h"

using namespace mu;

TEST_CASE("grad-ready hooks see each leaf's accumulated gradient once per backward, then the end hook runs") {
  Tensor a = from_vector(std::vector<double>{1, 2, 3}, {3}).requires_grad_(true);
  Tensor b = from_vector(std::vector<double>{4, 5, 6}, {3}).requires_grad_(true);
  Tensor unused = from_vector(std::vector<double>{7}, {1}).requires_grad_(true);
  std::vector<std::string> events;
  std::vector<std::vector<double>> seen_a;
  autograd::HookHandle ha = autograd::add_grad_ready_hook(a, [&](const Tensor& leaf) {
    events.push_back("a");
    seen_a.push_back(leaf.grad().to_vector<double>());
  });
  autograd::HookHandle hb = autograd::add_grad_ready_hook(b, [&](const Tensor&) { events.push_back("b"); });
  autograd::HookHandle hu = autograd::add_grad_ready_hook(unused, [&](const Tensor&) { events.push_back("unused"); });
  autograd::HookHandle he = autograd::add_backward_end_hook([&] { events.push_back("end"); });

  // d/da sum(a * b + a) = b + 1; a is used twice, its hook still runs once.
  (a * b + a).sum().backward();
  REQUIRE(events.size() == 3);
  CHECK(events.back() == "end");
  CHECK(std::count(events.begin(), events.end(), std::string("a")) == 1);
  CHECK(std::count(events.begin(), events.end(), std::string("b")) == 1);
  CHECK(seen_a.at(0) == std::vector<double>{5, 6, 7});
  // A second backward accumulates: the hook sees the sum.
  (a * 2.0).sum().backward();
  CHECK(seen_a.at(1) == std::vector<double>{7, 8, 9});
  CHECK(events.back() == "end");
  CHECK(std::count(events.begin(), events.end(), std::string("unused")) == 0);
}

TEST_CASE("hook handles remove their hooks; moved handles keep them") {
  Tensor w = from_vector(std::vector<double>{1, 2}, {2}).requires_grad_(true);
  int calls = 0, ends = 0;
  autograd::HookHandle moved;
  {
    autograd::HookHandle h = autograd::add_grad_ready_hook(w, [&](const Tensor&) { ++calls; });
    moved = std::move(h);
    CHECK_FALSE(h.active());
  }
  CHECK(moved.active());
  (w * w).sum().backward();
  CHECK(calls == 1);
  moved.reset();
  (w * w).sum().backward();
  CHECK(calls == 1);
  {
    autograd::HookHandle e = autograd::add_backward_end_hook([&] { ++ends; });
    (w * 3.0).sum().backward();
  }
  (w * 3.0).sum().backward();
  CHECK(ends == 1);
}

TEST_CASE("bad hook arguments and throwing hooks are reported") {
  Tensor plain = from_vector(std::vector<double>{1}, {1});
  CHECK_THROWS_MU(autograd::add_grad_ready_hook(plain, [](const Tensor&) {}), "must be a leaf that requires grad");
  Tensor w = from_vector(std::vector<double>{1}, {1}).requires_grad_(true);
  Tensor y = w * 2.0;
  CHECK_THROWS_MU(autograd::add_grad_ready_hook(y, [](const Tensor&) {}), "must be a leaf that requires grad");
  CHECK_THROWS_MU(autograd::add_grad_ready_hook(w, nullptr), "the hook is empty");
  autograd::HookHandle h =
      autograd::add_grad_ready_hook(w, [](const Tensor&) { MU_FAIL("the bucket could not be sent"); });
  CHECK_THROWS_MU((w * 3.0).sum().backward(), "the bucket could not be sent");
}
