// The kernel profiler (ops/profile.h): counts every kernel call while on, none while
// off, on every device; a report empties it.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

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

TEST_CASE("by shape, each signature of a kernel is its own row") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    Tensor a = on(randn({6, 4}), dev), b = on(randn({4, 5}), dev), c = on(randn({4, 7}), dev);
    profile::enable(profile::Detail::Shapes);
    (void)matmul(a, b);
    (void)matmul(a, b);
    (void)matmul(a, c);
    (void)a.to(kFloat64);
    const std::vector<profile::KernelTime> ks = profile::report();
    profile::disable();
    // matmul(out, a, b): the output's signature, then the first operand's.
    const profile::KernelTime* ab = find(ks, "matmul  float32[6, 5], float32[6, 4]");
    const profile::KernelTime* ac = find(ks, "matmul  float32[6, 7], float32[6, 4]");
    REQUIRE(ab != nullptr);
    REQUIRE(ac != nullptr);
    CHECK(ab->calls == 2);
    CHECK(ac->calls == 1);
    CHECK(find(ks, "copy  float64[6, 4], float32[6, 4]") != nullptr);  // copy(dst, src)
    CHECK(find(ks, "matmul") == nullptr);
    // Enabled again without the detail: plain kernel names.
    profile::enable();
    (void)matmul(a, b);
    const std::vector<profile::KernelTime> plain = profile::report();
    profile::disable();
    CHECK(find(plain, "matmul") != nullptr);
  }
}

TEST_CASE("by shape, a kernel called with an optional tensor left out names it undefined") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    // layer_norm without an affine weight passes the kernel an undefined weight, as the
    // coefficient norm of a μMoE block does.
    Tensor x = on(randn({6, 4}), dev);
    profile::enable(profile::Detail::Shapes);
    Tensor y = layer_norm(x, {4}, Tensor(), Tensor());
    const std::vector<profile::KernelTime> ks = profile::report();
    profile::disable();
    CHECK(y.shape() == Shape{6, 4});
    bool named = false;
    for (const auto& k : ks) named = named || k.kernel.find("undefined") != std::string::npos;
    CHECK(named);
  }
}

TEST_CASE("a Scope times a named region beside the kernels it runs; none while disabled") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    Tensor a = on(randn({32, 32}), dev);
    profile::enable();
    {
      profile::Scope s("two products", dev);
      (void)matmul(matmul(a, a), a);
    }
    const std::vector<profile::KernelTime> ks = profile::report();
    profile::disable();
    const profile::KernelTime* scope = find(ks, "two products");
    REQUIRE(scope != nullptr);
    CHECK(scope->calls == 1);
    const profile::KernelTime* mm = find(ks, "matmul");
    REQUIRE(mm != nullptr);
    CHECK(mm->calls == 2);
    CHECK(scope->total_ms >= mm->total_ms * 0.999);  // the region holds both products
    {
      profile::Scope off("not recorded", dev);
    }
    CHECK(profile::report().empty());
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

// Run alone by the next case with MUMOE_PROFILE=1 (and in the full run without it): the
// variable turns the profiler on before anything calls enable().
TEST_CASE("MUMOE_PROFILE=1 turns the profiler on from the start") {
  const char* v = std::getenv("MUMOE_PROFILE");
  const bool from_env = v != nullptr && std::string(v) == "1";
  CHECK(profile::enabled() == from_env);
  Tensor a = randn({16, 16});
  CHECK(matmul(a, eye(16)).to_vector<float>() == a.to_vector<float>());
}

TEST_CASE("MUMOE_PROFILE=1 prints the table of the whole run at exit, for any program") {
  // This test binary run again on one case that computes, with the variable set.
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  REQUIRE(n > 0);
  self[n] = '\0';
  const std::string log = std::filesystem::temp_directory_path() / ("mumoe_profile_" + std::to_string(::getpid()));
  const std::string cmd = "MUMOE_PROFILE=1 MUMOE_TEST_DEVICES=cpu '" + std::string(self) +
                          "' --test-case='MUMOE_PROFILE=1 turns the profiler on from the start' >/dev/null 2>'" + log + "'";
  CHECK(std::system(cmd.c_str()) == 0);
  std::ifstream f(log);
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::filesystem::remove(log);
  INFO(text);
  CHECK(text.find("mumoe kernel profile (MUMOE_PROFILE=1):") != std::string::npos);
  CHECK(text.find("matmul") != std::string::npos);  // the kernels of that case, none called enable()
  CHECK(text.find("all kernels") != std::string::npos);
}
