// A number given to an op beside tensors (x + 2, x < 0.5, x.mul_(3)): it remembers
// whether it was written as a bool, an integer or a floating-point value, because type
// promotion treats those differently (as PyTorch treats Python's bool, int and float):
// arange(3) * 2 stays int64, arange(3) * 0.5 is float32.
#pragma once
#include <cstdint>
#include <type_traits>

namespace mu {

class Scalar {
 public:
  enum class Kind : uint8_t { Bool, Integral, Floating };

  // Implicit from any arithmetic type, so that x * 2, x * 2.0f and x * n all read as
  // they do in PyTorch. One template instead of one constructor per type: a size_t or
  // a long would otherwise be ambiguous between the int64_t and double overloads.
  template <class T, std::enable_if_t<std::is_arithmetic_v<T>, int> = 0>
  Scalar(T v)  // NOLINT: implicit on purpose
      : value_(static_cast<double>(v)),
        kind_(std::is_same_v<T, bool>        ? Kind::Bool
              : std::is_integral_v<T>        ? Kind::Integral
                                             : Kind::Floating) {}

  double to_double() const { return value_; }
  Kind kind() const { return kind_; }
  bool is_bool() const { return kind_ == Kind::Bool; }
  bool is_integral() const { return kind_ == Kind::Integral; }
  bool is_floating_point() const { return kind_ == Kind::Floating; }

 private:
  double value_;
  Kind kind_;
};

}  // namespace mu
