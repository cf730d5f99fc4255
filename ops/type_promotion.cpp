// PyTorch's type promotion (ops/type_promotion.h).
#include "ops/type_promotion.h"

namespace mu {

namespace {

// A slot of the promotion state that no operand has filled yet.
constexpr int kUndefined = -1;

int bits_of(DType t) { return int(element_size(t)) * 8; }

// The floats by rank; float16 and bfloat16 share one (neither holds the other).
int float_rank(DType t) {
  switch (t) {
    case DType::Float16:
    case DType::BFloat16: return 0;
    case DType::Float32: return 1;
    default: return 2;  // float64
  }
}

// promote_types where either side may be undefined.
int promote_skip_undefined(int a, int b) {
  if (a == kUndefined) return b;
  if (b == kUndefined) return a;
  return int(promote_types(DType(a), DType(b)));
}

bool floating(int t) { return t != kUndefined && is_floating(DType(t)); }

// torch's combine_categories: `higher` comes from operands that rank above those of
// `lower`; lower changes the result only where it is of a higher kind.
int combine_categories(int higher, int lower) {
  if (floating(higher)) return higher;
  if (higher == int(kBool) || floating(lower)) return promote_skip_undefined(higher, lower);
  return higher != kUndefined ? higher : lower;
}

// The three ranks of operand: tensors with dimensions, 0-dim tensors, C++ numbers.
struct State {
  int dim = kUndefined, zero = kUndefined, number = kUndefined;

  void add(const Tensor& t) {
    int& slot = t.dim() > 0 ? dim : zero;
    slot = promote_skip_undefined(slot, int(t.dtype()));
  }
  void add(Scalar s) {
    // A C++ number stands for the default dtype of its kind.
    DType t = s.is_bool() ? kBool : s.is_integral() ? kInt64 : kFloat32;
    number = promote_skip_undefined(number, int(t));
  }
  DType result() const { return DType(combine_categories(dim, combine_categories(zero, number))); }
};

}  // namespace

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  if (a == kBool) return b;
  if (b == kBool) return a;
  const bool fa = is_floating(a), fb = is_floating(b);
  if (fa && fb) {
    const int ra = float_rank(a), rb = float_rank(b);
    if (ra == rb) return kFloat32;  // float16 with bfloat16: float32 holds both
    return ra > rb ? a : b;
  }
  if (fa) return a;
  if (fb) return b;
  // Two integers. uint8 is the one unsigned type: with a signed type it needs a signed
  // type wider than 8 bits.
  if (a == kUInt8 || b == kUInt8) {
    const DType s = a == kUInt8 ? b : a;
    return bits_of(s) > 8 ? s : kInt16;
  }
  return bits_of(a) >= bits_of(b) ? a : b;
}

DType result_type(const Tensor& a, const Tensor& b) {
  State s;
  s.add(a);
  s.add(b);
  return s.result();
}

DType result_type(const Tensor* first, const Tensor* last) {
  State s;
  for (const Tensor* t = first; t != last; ++t) s.add(*t);
  return s.result();
}

DType result_type(const Tensor& a, Scalar b) {
  State s;
  s.add(a);
  s.add(b);
  return s.result();
}

bool can_cast(DType from, DType to) {
  if (is_floating(from) && !is_floating(to)) return false;
  if (from != kBool && to == kBool) return false;
  return true;
}

}  // namespace mu
