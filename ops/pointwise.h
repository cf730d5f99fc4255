// Building blocks for elementwise ops (internal to ops/ and nn/): run one functor of
// ops/functors.h over one, two or three tensors on their device, after the checks every
// elementwise op shares (dtype and device agreement, the functor's dtypes, broadcast
// shapes). No autograd recording: gradient formulas use these to fuse a derivative
// into one pass.
#pragma once
#include <array>
#include <initializer_list>

#include "ops/functors.h"
#include "ops/kernels/copy.h"
#include "ops/kernels/map.h"
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

// The checks of map() and map_into(): the value operands (all but where's condition)
// share one dtype; every operand is on one device. Returns the operands converted to
// the dtype F computes in (compute_dtype_for), which F takes.
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
  for (size_t j = first + 1; j < size_t(F::arity); ++j) require_same(in[first], in[j], F::name);
  if (F::select) {
    MU_CHECK(in[0].dtype() == kBool, F::name, ": the condition must be bool, got ", dtype_name(in[0].dtype()));
    MU_CHECK(in[0].device() == in[1].device(), F::name, ": condition on ", in[0].device().str(), ", values on ",
             in[1].device().str());
  }
  const DType c = compute_dtype_for<F>(in[first].dtype());
  require_functor_dtype<F>(c);
  for (size_t j = first; j < size_t(F::arity); ++j) in[j] = cast(in[j], c);
  return in;
}

// f over the operands, broadcast: a new tensor of the broadcast shape, in the operands'
// dtype (bool for comparisons, see result_dtype_for), on their device.
template <class F>
Tensor map(const F& f, std::initializer_list<Tensor> operands) {
  const DType given = operands.begin()[F::select ? 1 : 0].dtype();
  std::array<Tensor, 3> in = checked_operands<F>(operands);
  Shape shape = in[0].shape();
  for (int k = 1; k < F::arity; ++k) shape = broadcast_shapes(shape, in[size_t(k)].shape(), F::name);
  const Tensor& typed = in[F::select ? 1 : 0];
  DType out_dtype = F::result == fn::Result::Bool ? kBool : typed.dtype();
  Tensor out = empty(shape, TensorOptions(out_dtype).device(typed.device()));
  kernels::map<F>()(out.device(), out, in, f);
  // A storage dtype computed wider is rounded back to itself.
  return cast(out, result_dtype_for<F>(given));
}

// f over the operands, written into `out` (which may be one of them): every operand
// must broadcast to out's shape, and out must have the dtype map() would give. Bumps
// nothing: the caller owns versioning.
template <class F>
void map_into(const Tensor& out, const F& f, std::initializer_list<Tensor> operands) {
  MU_CHECK(int(operands.size()) == F::arity, F::name, ": expected ", F::arity, " operands, got ", operands.size());
  const DType given = operands.begin()[F::select ? 1 : 0].dtype();
  const DType out_dtype = result_dtype_for<F>(given);
  MU_CHECK(out.dtype() == out_dtype, F::name, ": destination is ", dtype_name(out.dtype()), ", the result is ",
           dtype_name(out_dtype));
  std::array<Tensor, 3> in = checked_operands<F>(operands);
  const Tensor& typed = in[F::select ? 1 : 0];
  MU_CHECK(out.device() == typed.device(), F::name, ": destination on ", out.device().str(), ", operands on ",
           typed.device().str());
  for (int k = 0; k < F::arity; ++k)
    MU_CHECK(broadcast_shapes(out.shape(), in[size_t(k)].shape(), F::name) == out.shape(), F::name,
             ": operand of shape ", shape_str(in[size_t(k)].shape()), " does not broadcast to the destination's shape ",
             shape_str(out.shape()));
  if (is_compute_dtype(out.dtype())) {
    kernels::map<F>()(out.device(), out, in, f);
    return;
  }
  // A storage-dtype destination: computed wide into a temporary, then rounded into out.
  Shape shape = out.shape();
  Tensor wide = empty(shape, TensorOptions(F::result == fn::Result::Bool ? kBool : typed.dtype()).device(out.device()));
  kernels::map<F>()(out.device(), wide, in, f);
  kernels::copy(out.device(), out, wide);
}

// A 0-dim tensor holding `v` in t's dtype and on t's device, for tensor-scalar arithmetic.
inline Tensor scalar_like(const Tensor& t, double v, const char* op) {
  MU_CHECK(t.is_floating_point() || v == double(int64_t(v)), op, ": scalar ", v,
           " is not an integer but the tensor is ", dtype_name(t.dtype()), "; convert it with .to(kFloat32)");
  return full({}, v, TensorOptions(t.dtype()).device(t.device()));
}

}  // namespace mu::detail
