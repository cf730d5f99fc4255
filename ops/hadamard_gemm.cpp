// hadamard_gemm: out = scale ∗ Π_k (a_k · b_k), one differentiable op over the fused
// kernel of ops/kernels/hadamard_gemm.h, and cp_hadamard, the CP μMoE layer's core.
//
// Gradients, with P_k = a_k · b_k and G_k = d(out) ∗ scale ∗ Π_{j≠k} P_j (the gradient
// reaching the k-th product):  d a_k = G_k · b_kᵀ,  d b_k = a_kᵀ · G_k,
// d scale = d(out) ∗ Π_k P_k. Each G_k is the same fused kernel again, on the other
// factors, with d(out) ∗ scale as its scale, so that no product is ever written out.
//
// Recompute, not save: the forward keeps only its inputs (what the einsum composition
// keeps too) and the backward recomputes each P_j inside the fused kernel. Saving the
// products instead would make the forward write (n + 1) (M, R) tensors, the memory and
// traffic the fusion exists to avoid (GPT-2's CP MLP: M = 8192 tokens, R = 556, 18 MB per
// product in float32, per layer, kept until the backward). The price is FLOPs: with n
// factors each G_k recomputes n - 1 products, i.e. for the one-level layer (n = 2) one
// more pass over the forward's two GEMMs, about half the backward's own four GEMMs.
#include "ops/hadamard_gemm.h"

#include "autograd/autocast.h"
#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "ops/kernels/hadamard_gemm.h"
#include "ops/ops.h"

namespace mu {

using autograd::record;
using autograd::save;
using autograd::SavedTensor;
using autograd::TensorList;

namespace {

// The checks every call makes; `scale` may be undefined.
void check_inputs(const std::vector<Tensor>& a, const std::vector<Tensor>& b, const Tensor& scale, const char* op) {
  MU_CHECK(!a.empty(), op, ": needs at least one product (got no left operands)");
  MU_CHECK(a.size() == b.size(), op, ": got ", a.size(), " left operands but ", b.size(), " right operands");
  for (size_t k = 0; k < a.size(); ++k) {
    MU_CHECK(a[k].defined() && b[k].defined(), op, ": operand pair ", k, " has an undefined tensor");
    MU_CHECK(a[k].dim() == 2 && b[k].dim() == 2, op, ": operand pair ", k, " must be two matrices, got shapes ",
             shape_str(a[k].shape()), " and ", shape_str(b[k].shape()));
  }
  const int64_t M = a[0].size(0), R = b[0].size(1);
  const DType dt = a[0].dtype();
  const Device dev = a[0].device();
  MU_CHECK(dt == kFloat32 || dt == kFloat64 || dt == kBFloat16, op, ": ", dtype_name(dt),
           " tensors are not supported, only float32, float64 and bfloat16");
  for (size_t k = 0; k < a.size(); ++k) {
    MU_CHECK(a[k].size(1) == b[k].size(0), op, ": operand pair ", k, " has shapes ", shape_str(a[k].shape()), " and ",
             shape_str(b[k].shape()), ", which cannot be multiplied (", a[k].size(1), " != ", b[k].size(0), ")");
    MU_CHECK(a[k].size(0) == M && b[k].size(1) == R, op, ": product ", k, " has shape ",
             shape_str({a[k].size(0), b[k].size(1)}), " but product 0 has shape ", shape_str({M, R}),
             "; every product must have the same shape");
    for (const Tensor* t : {&a[k], &b[k]}) {
      MU_CHECK(t->dtype() == dt, op, ": dtype mismatch: ", dtype_name(t->dtype()), " in operand pair ", k, " vs ",
               dtype_name(dt), " in pair 0; convert with .to(dtype)");
      MU_CHECK(t->device() == dev, op, ": device mismatch: ", t->device().str(), " in operand pair ", k, " vs ",
               dev.str(), " in pair 0");
    }
  }
  if (scale.defined()) {
    MU_CHECK(scale.shape() == Shape({M, R}), op, ": scale has shape ", shape_str(scale.shape()),
             "; expected the products' shape ", shape_str({M, R}));
    MU_CHECK(scale.dtype() == dt, op, ": scale is ", dtype_name(scale.dtype()), " but the operands are ",
             dtype_name(dt));
    MU_CHECK(scale.device() == dev, op, ": scale is on ", scale.device().str(), " but the operands on ", dev.str());
  }
}

// The kernel on dense copies, outside any graph. No factors: the product is scale itself.
Tensor fused(const std::vector<Tensor>& a, const std::vector<Tensor>& b, const Tensor& scale) {
  NoGradGuard no_grad;
  if (a.empty()) return scale.contiguous();
  std::vector<Tensor> ac, bc;
  for (size_t k = 0; k < a.size(); ++k) {
    ac.push_back(a[k].contiguous());
    bc.push_back(b[k].contiguous());
  }
  const Tensor sc = scale.defined() ? scale.contiguous() : Tensor();
  Tensor out = empty({a[0].size(0), b[0].size(1)}, TensorOptions(a[0].dtype()).device(a[0].device()));
  kernels::hadamard_gemm(out.device(), out, ac, bc, sc);
  return out;
}

// The list without entry k.
std::vector<Tensor> without(const std::vector<Tensor>& v, size_t k) {
  std::vector<Tensor> w;
  for (size_t j = 0; j < v.size(); ++j)
    if (j != k) w.push_back(v[j]);
  return w;
}

}  // namespace

Tensor hadamard_gemm(const std::vector<Tensor>& a_in, const std::vector<Tensor>& b_in, const Tensor& scale_in) {
  // Under autocast float32 operands run in bfloat16, as matmul's do; the casts are graph
  // nodes, so gradients reach the float32 originals.
  std::vector<Tensor> a, b;
  for (const Tensor& t : a_in) a.push_back(t.defined() ? autograd::autocast::to_low(t) : t);
  for (const Tensor& t : b_in) b.push_back(t.defined() ? autograd::autocast::to_low(t) : t);
  const Tensor scale = scale_in.defined() ? autograd::autocast::to_low(scale_in) : Tensor();
  check_inputs(a, b, scale, "hadamard_gemm");
  Tensor out = fused(a, b, scale);

  // Inputs in the order a_0.., b_0.., then scale when given; the gradients follow it.
  TensorList inputs = a;
  inputs.insert(inputs.end(), b.begin(), b.end());
  if (scale.defined()) inputs.push_back(scale);
  if (!autograd::needs_grad(inputs)) return out;
  const size_t n = a.size();
  std::vector<bool> needs;
  for (const Tensor& t : inputs) needs.push_back(t.requires_grad());
  std::vector<SavedTensor> as, bs;
  for (size_t k = 0; k < n; ++k) {
    as.push_back(save(a[k]));
    bs.push_back(save(b[k]));
  }
  SavedTensor ss = scale.defined() ? save(scale) : SavedTensor();
  const bool has_scale = scale.defined();
  return record("HadamardGemmBackward", out, inputs,
                [as, bs, ss, needs, n, has_scale](const Tensor& g) -> TensorList {
    std::vector<Tensor> av, bv;
    for (size_t k = 0; k < n; ++k) {
      av.push_back(as[k].get());
      bv.push_back(bs[k].get());
    }
    // d(out) ∗ scale: the scale every G_k carries.
    const Tensor gs = has_scale ? g * ss.get() : g;
    TensorList grads(needs.size());
    for (size_t k = 0; k < n; ++k) {
      if (!needs[k] && !needs[n + k]) continue;
      const Tensor gk = fused(without(av, k), without(bv, k), gs);  // G_k, the products recomputed
      if (needs[k]) grads[k] = mm(gk, bv[k].t());
      if (needs[n + k]) grads[n + k] = mm(av[k].t(), gk);
    }
    if (has_scale && needs[2 * n]) grads[2 * n] = fused(av, bv, g);
    return grads;
  });
}

Tensor cp_hadamard(const Tensor& z, const Tensor& u_in, const std::vector<Tensor>& a, const std::vector<Tensor>& u) {
  MU_CHECK(a.size() == u.size(), "cp_hadamard: got ", a.size(), " coefficient matrices but ", u.size(),
           " expert factors");
  std::vector<Tensor> left{z}, right{u_in};
  left.insert(left.end(), a.begin(), a.end());
  right.insert(right.end(), u.begin(), u.end());
  return hadamard_gemm(left, right);
}

}  // namespace mu
