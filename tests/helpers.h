// Shared test helpers.
#pragma once
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "mumoe.h"

// doctest prints a char pointer that is not a literal (a ternary of literals, dtype_name(),
// a const char* variable) as an address; these print the text. (Its
// DOCTEST_CONFIG_TREAT_CHAR_STAR_AS_STRING does not compile with Debian's doctest 2.4.9.)
namespace doctest {
template <>
struct StringMaker<const char*> {
  static String convert(const char* s) { return s ? String(s) : String("(null)"); }
};
template <>
struct StringMaker<char*> {
  static String convert(const char* s) { return s ? String(s) : String("(null)"); }
};
}  // namespace doctest

// Checks that `expr` throws mu::Error whose message contains `needle`.
#define CHECK_THROWS_MU(expr, needle)                                                  \
  do {                                                                                 \
    bool thrown_ = false;                                                              \
    try {                                                                              \
      (void)(expr);                                                                    \
    } catch (const mu::Error& e_) {                                                    \
      thrown_ = true;                                                                  \
      INFO("message: " << std::string(e_.what()));                                                  \
      CHECK(std::string(e_.what()).find(needle) != std::string::npos);                 \
    }                                                                                  \
    CHECK_MESSAGE(thrown_, "expected mu::Error containing \"" << needle << "\"");      \
  } while (0)

// Runs gradcheck and reports the worst element on failure.
#define CHECK_GRAD(fn, inputs)                                      \
  do {                                                              \
    auto r_ = mu::autograd::gradcheck(fn, inputs);                  \
    CHECK_MESSAGE(r_.ok, r_.message);                               \
  } while (0)

// Max |a - b| over all elements (same shape), in double. Like every reader below, it
// goes through to_vector, a host copy: the tensors may be on any device.
inline double max_abs_diff(const mu::Tensor& a, const mu::Tensor& b) {
  REQUIRE(a.shape() == b.shape());
  auto x = a.to_vector<double>(), y = b.to_vector<double>();
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i) m = std::max(m, std::abs(x[i] - y[i]));
  return m;
}

// Row-major flat position of a multi-index in `shape`.
inline int64_t flat(const mu::Shape& shape, const std::vector<int64_t>& idx) {
  int64_t f = 0;
  for (size_t d = 0; d < shape.size(); ++d) f = f * shape[d] + idx[d];
  return f;
}

// Multi-index of flat position f in `shape`.
inline std::vector<int64_t> unflat(const mu::Shape& shape, int64_t f) {
  std::vector<int64_t> idx(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    idx[d] = f % shape[d];
    f /= shape[d];
  }
  return idx;
}

// Element i of `got` within tol * max(1, |want_i|) of want_i (relative for large values,
// absolute near zero). With nan_matches, a NaN in `want` asks for a NaN in `got`;
// without, it fails.
inline void check_elements_close(const mu::Tensor& got, const std::vector<double>& want, double tol,
                                 bool nan_matches) {
  std::vector<double> g = got.to_vector<double>();
  REQUIRE(g.size() == want.size());
  for (size_t i = 0; i < g.size(); ++i) {
    INFO("element " << i << ": got " << g[i] << ", want " << want[i]);
    if (nan_matches && std::isnan(want[i])) {
      CHECK(std::isnan(g[i]));
    } else {
      CHECK(std::fabs(g[i] - want[i]) <= tol * std::max(1.0, std::fabs(want[i])));
    }
  }
}

// check_elements_close where a NaN in `want` fails.
inline void check_close(const mu::Tensor& got, const std::vector<double>& want, double tol) {
  check_elements_close(got, want, tol, /*nan_matches=*/false);
}

// The same after requiring `got` to have `shape`.
inline void check_close(const mu::Tensor& got, const mu::Shape& shape, const std::vector<double>& want, double tol) {
  REQUIRE(got.shape() == shape);
  check_elements_close(got, want, tol, /*nan_matches=*/false);
}

// check_close with `shape`, where a NaN in `want` asks for a NaN.
inline void check_close_or_nan(const mu::Tensor& got, const mu::Shape& shape, const std::vector<double>& want,
                               double tol) {
  REQUIRE(got.shape() == shape);
  check_elements_close(got, want, tol, /*nan_matches=*/true);
}

// got against want element by element: NaN for NaN, an infinity exactly, otherwise within
// tol * max(1, |want|). Reports the first five bad elements.
inline void check_close_special(const mu::Tensor& got, const std::vector<double>& want, double tol) {
  std::vector<double> g = got.to_vector<double>();
  REQUIRE(g.size() == want.size());
  size_t bad = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    const bool ok = std::isnan(want[i])   ? std::isnan(g[i])
                    : std::isinf(want[i]) ? g[i] == want[i]
                                          : std::fabs(g[i] - want[i]) <= tol * std::max(1.0, std::fabs(want[i]));
    if (!ok && bad++ < 5) FAIL_CHECK("element " << i << ": got " << g[i] << ", want " << want[i]);
  }
  CHECK(bad == 0);
}

// For suites that need a CUDA device throughout: without one, prints why and exits 77
// (ctest: skipped). Call from a static initialiser, before any case runs.
inline bool skip_without_cuda(const char* what) {
  if (mu::cuda::device_count() > 0) return true;
  std::printf("SKIPPED: no CUDA device on this machine%s; %s need one\n",
#ifdef MUMOE_CUDA
              " (the CUDA backend is compiled in)",
#else
              " (and this build has no CUDA backend)",
#endif
              what);
  std::fflush(stdout);
  std::exit(77);
}

// Random float64 inputs for gradchecks, seeded so a failure reproduces.
inline mu::Tensor rnd(const mu::Shape& s, uint64_t seed) {
  mu::manual_seed(seed);
  return mu::randn(s, mu::kFloat64);
}

// The devices every op test runs on. ctest runs each per-device suite twice (see
// mu_device_test in tests/CMakeLists.txt): as `unit` etc. with MUMOE_TEST_DEVICES=cpu, the
// CPU alone; and as `cuda` with MUMOE_TEST_DEVICES=cuda, the CPU and cuda:0, where a
// machine without a CUDA device prints why and exits 77 (ctest: skipped). Run by hand
// (variable unset), the CPU and the first CUDA device when one is present. A test body
// runs the op on each device and compares the CUDA result with the CPU one.
inline const std::vector<mu::Device>& test_devices() {
  static const std::vector<mu::Device> devices = [] {
    const char* env = std::getenv("MUMOE_TEST_DEVICES");
    const std::string want = env ? env : "";
    std::vector<mu::Device> d{mu::Device::cpu()};
    if (want == "cpu") return d;
    if (mu::cuda::device_count() > 0) {
      d.push_back(mu::Device::cuda(0));
      return d;
    }
    const char* why =
#ifdef MUMOE_CUDA
        "no CUDA device on this machine (the CUDA backend is compiled in)";
#else
        "this build has no CUDA backend";
#endif
    if (want == "cuda") {
      std::printf("SKIPPED: the CUDA cases need a CUDA device: %s\n", why);
      std::fflush(stdout);
      std::exit(77);
    }
    std::printf("note: CUDA cases skipped: %s\n", why);
    return d;
  }();
  return devices;
}

// gradcheck of m.forward with respect to x and the member tensors named in `members`.
// gradcheck calls fn with float64 leaves of its own; fn rebinds the members to them so
// the module's forward differentiates into those leaves, and the members are restored.
template <class M>
inline void check_module_grad(M& m, const mu::Tensor& x, std::vector<mu::Tensor*> members) {
  std::vector<mu::Tensor> saved;
  mu::autograd::TensorList inputs = {x};
  for (mu::Tensor* p : members) {
    saved.push_back(*p);
    inputs.push_back(*p);
  }
  auto fn = [&](const mu::autograd::TensorList& in) {
    for (size_t i = 0; i < members.size(); ++i) *members[i] = in[i + 1];
    return m.forward(in[0]);
  };
  auto r = mu::autograd::gradcheck(fn, inputs);
  for (size_t i = 0; i < members.size(); ++i) *members[i] = saved[i];
  CHECK_MESSAGE(r.ok, r.message);
}

// `t` (made on the CPU) moved to `dev`, keeping requires_grad as a fresh leaf.
inline mu::Tensor on(const mu::Tensor& t, mu::Device dev) {
  mu::Tensor d = t.detach().to(dev);
  if (t.requires_grad()) d.requires_grad_();
  return d;
}
