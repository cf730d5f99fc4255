// Shared test helpers.
#pragma once
#include <doctest/doctest.h>

#include <string>

#include "mumoe.h"

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

// Max |a - b| over all elements (same shape), in double.
inline double max_abs_diff(const mu::Tensor& a, const mu::Tensor& b) {
  REQUIRE(a.shape() == b.shape());
  auto x = a.to_vector<double>(), y = b.to_vector<double>();
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i) m = std::max(m, std::abs(x[i] - y[i]));
  return m;
}
