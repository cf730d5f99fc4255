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
                                             : Kind::Floating) {
    // An integer is also kept exactly: a double holds integers up to 2^53 only, and
    // int64 x + (2^62 + 1) must add exactly that. (An unsigned value above int64's range
    // has only its double.)
    if constexpr (std::is_integral_v<T>) {
      if (std::is_signed_v<T> || static_cast<uint64_t>(v) <= static_cast<uint64_t>(INT64_MAX)) {
        int_ = static_cast<int64_t>(v);
        exact_int_ = true;
      }
    }
  }

  double to_double() const { return value_; }
  // Whether the value is an integer held exactly (a bool or an integer up to int64's
  // range), and that integer.
  bool has_int64() const { return exact_int_; }
  int64_t to_int64() const { return int_; }
  Kind kind() const { return kind_; }
  bool is_bool() const { return kind_ == Kind::Bool; }
  bool is_integral() const { return kind_ == Kind::Integral; }
  bool is_floating_point() const { return kind_ == Kind::Floating; }

 private:
  double value_;
  int64_t int_ = 0;
  bool exact_int_ = false;
  Kind kind_;
};

}  // namespace mu
