// The kernel profiler (ops/profile.h): counts every kernel call while on, none while
// off, on every device; a report empties it.
#include "helpers.h"

using namespace mu;

namespace {

const profile::KernelTime* find(const std::vector<profile::KernelTime>& ks, const std::string& kernel) {
  for (const auto& k : ks)
    if (k.kernel == kernel) return &k;
  return nullptr;
}

}  // namespace

TEST_CASE("the profiler counts each kernel call while enabled, on every device") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    Tensor a = on(randn({64, 32}), dev), b = on(randn({32, 16}), dev);
    profile::enable();
    for (int i = 0; i < 3; ++i) (void)matmul(a, b);
    (void)softmax(a, -1);
    const std::vector<profile::KernelTime> ks = profile::report();
    profile::disable();
    const profile::KernelTime* mm = find(ks, "matmul");
    REQUIRE(mm != nullptr);
    CHECK(mm->calls == 3);
    CHECK(mm->device == (dev.is_cuda() ? "CUDA" : "CPU"));
    CHECK(mm->total_ms >= 0);
    const profile::KernelTime* sm = find(ks, "softmax_forward");
    REQUIRE(sm != nullptr);
    CHECK(sm->calls == 1);
    // Sorted by total time, longest first.
    for (size_t i = 1; i < ks.size(); ++i) CHECK(ks[i - 1].total_ms >= ks[i].total_ms);
  }
}

TEST_CASE("the profiler records nothing while disabled; a report or reset empties it") {
  Tensor a = randn({8, 8});
  profile::disable();
  (void)matmul(a, a);
  CHECK(profile::report().empty());
  profile::enable();
  (void)matmul(a, a);
  CHECK(profile::table().find("matmul") != std::string::npos);
  CHECK(profile::report().empty());  // table() took the records
  (void)matmul(a, a);
  profile::reset();
  CHECK(profile::report().empty());
  profile::disable();
  CHECK_FALSE(profile::enabled());
}
