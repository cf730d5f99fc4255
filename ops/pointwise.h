// Building blocks for elementwise ops (internal to ops/ and nn/): run one functor of
// ops/functors.h over one, two or three tensors on their device, after the checks every
// elementwise op shares (dtype and device agreement, the functor's dtypes, broadcast
// shapes). No autograd recording: gradient formulas use these to fuse a derivative
// into one pass.
#pragma once
#include <cmath>
#include <array>
#include <initializer_list>

#include "ops/functors.h"
#include "ops/kernels/copy.h"
#include "ops/kernels/map.h"
#include "ops/type_promotion.h"
#include "tensor/tensor.h"

namespace mu::detail {

inline void require_same(const Tensor& a, const Tensor& b, const char* op) {
  MU_CHECK(a.dtype() == b.dtype(), op, ": dtype mismatch: ", dtype_name(a.dtype()), " vs ",
           dtype_name(b.dtype()), " (shapes ", shape_str(a.shape()), " and ", shape_str(b.shape()),
           "); convert one with .to(dtype)");
  MU_CHECK(a.device() == b.device(), op, ": device mismatch: ", a.device().str(), " vs ", b.device().str());
}

// Refuses a dtype the functor F is not defined for, naming what it takes.
template <class F>
void require_functor_dtype(DType t) {
  constexpr fn::Types types = F::types;
  bool ok = types == fn::Types::Float     ? (t == kFloat32 || t == kFloat64)
            : types == fn::Types::Numeric ? (t == kFloat32 || t == kFloat64 || t == kInt64)
                                          : (t == kFloat32 || t == kFloat64 || t == kInt64 || t == kBool);
  MU_CHECK(ok, F::name, ": expected ",
           types == fn::Types::Float     ? "a floating-point tensor (float32 or float64)"
           : types == fn::Types::Numeric ? "float32, float64 or int64"
                                         : "float32, float64, int64 or bool",
           ", got ", dtype_name(t));
}

// t converted to dtype d, without an autograd record (the kernels below never record).
inline Tensor cast(const Tensor& t, DType d) {
  if (t.dtype() == d) return t;
  Tensor out = empty(t.shape(), TensorOptions(d).device(t.device()));
  kernels::copy(t.device(), out, t);
  return out;
}

// The dtype functor F computes in for value operands of dtype t: a storage dtype widens
// to its compute dtype (float32 for the 16-bit floats, int64 for the narrow integers);
// an integer or bool given to a floating-point functor computes in float32, as
// torch.exp(int_tensor) does.
// A bool given to an arithmetic functor computes in int64 and comes back as bool
// (nonzero is true): True + True is True, as in PyTorch.
template <class F>
DType compute_dtype_for(DType t) {
  if (F::types == fn::Types::Float && !is_floating(t)) return kFloat32;
  if (F::types == fn::Types::Numeric && t == kBool) return kInt64;
  return compute_dtype(t);
}

// The dtype of F's result for value operands of dtype t: bool for comparisons; float32
// for a floating-point functor over integers; else t itself, so a storage dtype comes
// back in its own dtype (float16 in, float16 out).
template <class F>
DType result_dtype_for(DType t) {
  if (F::result == fn::Result::Bool) return kBool;
  if (F::types == fn::Types::Float && !is_floating(t)) return kFloat32;
  return t;
}

// Whether a map kernel reads operands of dtype t as they are when the functor computes
// in c: t is c itself, or c is float32 and t a 16-bit float (widened as it is read).
inline bool kernel_reads(DType t, DType c) {
  return t == c || (c == kFloat32 && is_16bit_float(t));
}

// The checks of map() and map_into(): the value operands (all but where's condition)
// share one dtype, or are floats that all compute in float32 (bfloat16 beside
// float32); every operand is on one device. Returns the operands, those of a dtype
// the kernels do not read as they are (kernel_reads) converted to the dtype F
// computes in (compute_dtype_for).
template <class F>
std::array<Tensor, 3> checked_operands(std::initializer_list<Tensor> operands) {
  static_assert(F::arity >= 1 && F::arity <= 3, "a functor takes one to three operands");
  MU_CHECK(int(operands.size()) == F::arity, F::name, ": expected ", F::arity, " operands, got ", operands.size());
  std::array<Tensor, 3> in;
  size_t k = 0;
  for (const Tensor& t : operands) {
    MU_CHECK(t.defined(), F::name, ": operand ", k, " is an undefined tensor");
    in[k++] = t;
  }
  const size_t first = F::select ? 1 : 0;
  const DType c = compute_dtype_for<F>(in[first].dtype());
  for (size_t j = first + 1; j < size_t(F::arity); ++j) {
    const bool float32_mix = is_floating(in[first].dtype()) && is_floating(in[j].dtype()) && c == kFloat32 &&
                             compute_dtype_for<F>(in[j].dtype()) == kFloat32;
    if (!float32_mix) require_same(in[first], in[j], F::name);
    MU_CHECK(in[first].device() == in[j].device(), F::name, ": device mismatch: ", in[first].device().str(), " vs ",
             in[j].device().str());
  }
  if (F::select) {
    MU_CHECK(in[0].dtype() == kBool, F::name, ": the condition must be bool, got ", dtype_name(in[0].dtype()));
    MU_CHECK(in[0].device() == in[1].device(), F::name, ": condition on ", in[0].device().str(), ", values on ",
             in[1].device().str());
  }
  require_functor_dtype<F>(c);
  for (size_t j = first; j < size_t(F::arity); ++j)
    if (!kernel_reads(in[j].dtype(), c)) in[j] = cast(in[j], c);
  return in;
}

// The dtype the value operands as given promote to (they passed checked_operands), by
// torch's ranks (result_type): a 0-dim operand does not widen one with dimensions, so a
// float16 tensor and a float32 0-dim tensor (a number kept in float32, with_number) give
// float16, computed in float32 and rounded once.
template <class F>
DType promote_given(std::initializer_list<Tensor> operands) {
  return result_type(operands.begin() + (F::select ? 1 : 0), operands.end());
}

// Runs F's kernel into out, which has the result dtype: directly when the kernels
// write that dtype (the compute dtype c, bool for a comparison, a 16-bit float for c
// float32), else into a temporary of c then converted (a narrow integer, a bool sum).
template <class F>
void run_map(const Tensor& out, const std::array<Tensor, 3>& in, const F& f) {
  const DType c = compute_dtype_for<F>(in[F::select ? 1 : 0].dtype());
  if (F::result == fn::Result::Bool || kernel_reads(out.dtype(), c)) {
    kernels::map<F>()(out.device(), out, in, f);
    return;
  }
  Tensor wide = empty(out.shape(), TensorOptions(c).device(out.device()));
  kernels::map<F>()(out.device(), wide, in, f);
  kernels::copy(out.device(), out, wide);
}

// f over the operands, broadcast: a new tensor of the broadcast shape, in the dtype the
// operands promote to (bool for comparisons, see result_dtype_for), on their device.
template <class F>
Tensor map(const F& f, std::initializer_list<Tensor> operands) {
  std::array<Tensor, 3> in = checked_operands<F>(operands);
  const DType given = promote_given<F>(operands);
  Shape shape = in[0].shape();
  for (int k = 1; k < F::arity; ++k) shape = broadcast_shapes(shape, in[size_t(k)].shape(), F::name);
  Tensor out = empty(shape, TensorOptions(result_dtype_for<F>(given)).device(in[F::select ? 1 : 0].device()));
  run_map(out, in, f);
  return out;
}

// f over the operands, written into `out` (which may be one of them): every operand
// must broadcast to out's shape, and out must have the dtype map() would give. Bumps
// nothing: the caller owns versioning.
template <class F>
void map_into(const Tensor& out, const F& f, std::initializer_list<Tensor> operands) {
  MU_CHECK(int(operands.size()) == F::arity, F::name, ": expected ", F::arity, " operands, got ", operands.size());
  std::array<Tensor, 3> in = checked_operands<F>(operands);
  const DType out_dtype = result_dtype_for<F>(promote_given<F>(operands));
  MU_CHECK(out.dtype() == out_dtype, F::name, ": destination is ", dtype_name(out.dtype()), ", the result is ",
           dtype_name(out_dtype));
  const Tensor& typed = in[F::select ? 1 : 0];
  MU_CHECK(out.device() == typed.device(), F::name, ": destination on ", out.device().str(), ", operands on ",
           typed.device().str());
  for (int k = 0; k < F::arity; ++k)
    MU_CHECK(broadcast_shapes(out.shape(), in[size_t(k)].shape(), F::name) == out.shape(), F::name,
             ": operand of shape ", shape_str(in[size_t(k)].shape()), " does not broadcast to the destination's shape ",
             shape_str(out.shape()));
  run_map(out, in, f);
}

// A 0-dim tensor holding `v` in t's dtype and on t's device, for tensor-scalar arithmetic;
// in float32 beside a 16-bit float t with dimensions, whose ops compute in float32 (as
// torch keeps the number: float16 x + 1e5 is not x + inf, and x * (1/3) is not x times
// 1/3 in 8 bits). A 0-dim t takes it in its own dtype: two 0-dim operands promote as
// equals, and float32 would widen the result.
inline Tensor scalar_like(const Tensor& t, double v, const char* op) {
  MU_CHECK(t.is_floating_point() || (std::isfinite(v) && v == std::floor(v)), op, ": scalar ", v,
           " is not an integer but the tensor is ", dtype_name(t.dtype()), "; convert it with .to(kFloat32)");
  const DType d = t.is_floating_point() && t.dim() > 0 ? compute_dtype(t.dtype()) : t.dtype();
  if (!is_floating(d)) check_value_fits(v, d, op);  // named as the op, not as the fill inside full()
  return full({}, v, TensorOptions(d).device(t.device()));
}

}  // namespace mu::detail
