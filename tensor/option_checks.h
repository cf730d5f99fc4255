// Checks of hyper-parameters and enum options, shared by ops, layers, initialisers and
// optimizers so that every entry point refuses the same values in the same words. NaN
// fails every comparison, so each check is written to be false for NaN.
#pragma once
#include <cmath>

#include "tensor/error.h"

namespace mu {

// A finite number (NaN and the infinities refused).
inline void check_finite(const char* op, const char* what, double v) {
  MU_CHECK(std::isfinite(v), op, ": ", what, " must be a finite number, got ", v);
}

// The eps a normalization adds to a variance: finite and non-negative.
inline void check_eps(const char* op, double eps) {
  MU_CHECK(std::isfinite(eps) && eps >= 0, op, ": eps must be a finite non-negative number, got ", eps);
}

// A probability or a moving-average weight: in [0, 1].
inline void check_unit_interval(const char* op, const char* what, double v) {
  MU_CHECK(v >= 0 && v <= 1, op, ": ", what, " must lie in [0, 1], got ", v);
}

// An enum read from a file or cast from an integer may hold a value no enumerator has:
// `last` is the highest enumerator (enumerators run from 0), `names` lists them.
template <class Enum>
void check_enum(const char* op, const char* what, Enum v, Enum last, const char* type, const char* names) {
  const long long i = static_cast<long long>(v);
  MU_CHECK(i >= 0 && i <= static_cast<long long>(last), op, ": ", what, " ", i, " is not a ", type, " (", names, ")");
}

}  // namespace mu
