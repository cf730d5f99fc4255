// Size arithmetic that cannot wrap. Every product or sum of sizes, strides, offsets and
// byte counts that user input reaches goes through these: a result beyond int64 is a
// mu::Error naming the op and the operands, never a wrapped value (a wrapped element
// count would allocate a tiny buffer and write far past it).
#pragma once
#include <cstdint>

#include "tensor/error.h"

namespace mu {

// a * b; `ctx` (streamed into the message) says what is being computed.
template <class... Ctx>
int64_t checked_mul(int64_t a, int64_t b, const Ctx&... ctx) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) MU_FAIL(ctx..., ": ", a, " * ", b, " does not fit in int64");
  return r;
}

// a + b, likewise.
template <class... Ctx>
int64_t checked_add(int64_t a, int64_t b, const Ctx&... ctx) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) MU_FAIL(ctx..., ": ", a, " + ", b, " does not fit in int64");
  return r;
}

// The most bytes one allocation may ask for: 2^48 (256 TiB), beyond every machine's
// address space, and small enough that rounding it up can never wrap.
inline constexpr int64_t kMaxAllocationBytes = int64_t(1) << 48;

}  // namespace mu
