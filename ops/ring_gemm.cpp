// ring_gemm: out = A · w with A's rows the per-row products c[m] · h[m] (s-major), one
// differentiable op over the fused kernel of ops/kernels/ring_gemm.h.
//
// Gradients, with q[m] = c[m] · h[m] (P, S) and Q the (M, S P) matrix of the qᵀ rows:
//   d w = Qᵀ · d(out);   d Q = d(out) · wᵀ, read back as dq[m] (P, S);
//   d c[m] = dq[m] · h[m]ᵀ;   d h[m] = c[m]ᵀ · dq[m].
// Recompute, not save: the forward keeps only its inputs and the backward forms Q again
// with one batched matmul, (h[m]ᵀ · c[m]ᵀ) = q[m]ᵀ, which lands in Q's s-major order with
// no copy. Keeping Q from the forward would cost the (M, S P) tensor per layer the fusion
// exists to avoid writing.
#include "ops/ring_gemm.h"

#include "autograd/autocast.h"
#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "ops/kernels/ring_gemm.h"
#include "ops/ops.h"

namespace mu {

using autograd::record;
using autograd::save;
using autograd::SavedTensor;
using autograd::TensorList;

namespace {

void check_inputs(const Tensor& c, const Tensor& h, const Tensor& w) {
  const char* op = "ring_gemm";
  MU_CHECK(c.defined() && h.defined() && w.defined(), op, ": an operand is undefined");
  MU_CHECK(c.dim() == 3 && h.dim() == 3 && w.dim() == 2, op,
           ": needs c (M, P, R), h (M, R, S) and w (S P, N); got shapes ", shape_str(c.shape()), ", ",
           shape_str(h.shape()), " and ", shape_str(w.shape()));
  MU_CHECK(c.size(0) == h.size(0), op, ": c has ", c.size(0), " rows but h has ", h.size(0), " (shapes ",
           shape_str(c.shape()), " and ", shape_str(h.shape()), ")");
  MU_CHECK(c.size(2) == h.size(1), op, ": c ", shape_str(c.shape()), " and h ", shape_str(h.shape()),
           " cannot be multiplied row by row (", c.size(2), " != ", h.size(1), ")");
  MU_CHECK(w.size(0) == h.size(2) * c.size(1), op, ": w has ", w.size(0), " rows; expected S P = ", h.size(2),
           " * ", c.size(1), " = ", h.size(2) * c.size(1), " (w ", shape_str(w.shape()), ", c ",
           shape_str(c.shape()), ", h ", shape_str(h.shape()), ")");
  const DType dt = c.dtype();
  MU_CHECK(dt == kFloat32 || dt == kFloat64 || dt == kBFloat16, op, ": ", dtype_name(dt),
           " tensors are not supported, only float32, float64 and bfloat16");
  MU_CHECK(h.dtype() == dt && w.dtype() == dt, op, ": dtype mismatch: c ", dtype_name(dt), ", h ",
           dtype_name(h.dtype()), ", w ", dtype_name(w.dtype()), "; convert with .to(dtype)");
  MU_CHECK(h.device() == c.device() && w.device() == c.device(), op, ": device mismatch: c on ", c.device().str(),
           ", h on ", h.device().str(), ", w on ", w.device().str());
}

}  // namespace

Tensor ring_gemm(const Tensor& c_in, const Tensor& h_in, const Tensor& w_in) {
  // Under autocast float32 operands run in bfloat16, as matmul's do; the casts are graph
  // nodes, so gradients reach the float32 originals.
  const Tensor c = c_in.defined() ? autograd::autocast::to_low(c_in) : c_in;
  const Tensor h = h_in.defined() ? autograd::autocast::to_low(h_in) : h_in;
  const Tensor w = w_in.defined() ? autograd::autocast::to_low(w_in) : w_in;
  check_inputs(c, h, w);
  const int64_t M = c.size(0), P = c.size(1), S = h.size(2);
  Tensor out = empty({M, w.size(1)}, TensorOptions(c.dtype()).device(c.device()));
  {
    NoGradGuard no_grad;
    kernels::ring_gemm(out.device(), out, c.contiguous(), h.contiguous(), w.contiguous());
  }

  const TensorList inputs = {c, h, w};
  if (!autograd::needs_grad(inputs)) return out;
  const bool need_c = c.requires_grad(), need_h = h.requires_grad(), need_w = w.requires_grad();
  return record("RingGemmBackward", out, inputs,
                [cs = save(c), hs = save(h), ws = save(w), need_c, need_h, need_w, M, P, S](const Tensor& g) -> TensorList {
    const Tensor c = cs.get(), h = hs.get(), w = ws.get();
    TensorList grads(3);
    if (need_w) {
      const Tensor q = h.transpose(1, 2).matmul(c.transpose(1, 2));  // (M, S, P): the rows of Q
      grads[2] = mm(q.reshape({M, S * P}).t(), g);
    }
    if (need_c || need_h) {
      const Tensor dq = mm(g, w.t()).reshape({M, S, P}).transpose(1, 2);  // (M, P, S)
      if (need_c) grads[0] = dq.matmul(h.transpose(1, 2));
      if (need_h) grads[1] = c.transpose(1, 2).matmul(dq);
    }
    return grads;
  });
}

}  // namespace mu
