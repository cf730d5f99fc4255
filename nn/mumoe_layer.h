// Factorized multilinear mixture-of-experts (μMoE) layers, for any number E >= 1 of
// expert levels. Every variant is the same computation on a different factorization
// of one weight tensor W of shape (N_1, ..., N_E, I(+1), O):
//
//   y = W ×_1 a_1 ×_2 a_2 ... ×_E a_E ×_{E+1} [z; 1]
//
// A layer is a list of factors, each a parameter whose modes carry axis names:
// "n1".."nE" for the expert modes, "i" for the input, "o" for the output, and rank
// names shared between factors. From that list alone, one skeleton derives the forward
// pass (an einsum of the coefficients, the input and the factors, ordered by the
// planner so the weight tensor is never formed), the materialised tensor, one expert's
// matrix, and the counterfactual passes used for expert analysis.
#pragma once
#include <string>
#include <vector>

#include "tensor/random.h"
#include "nn/module.h"

namespace mu::nn {

// Shape of a μMoE layer: input and output features, experts per level, folded bias.
struct MoEShape {
  int64_t in = 0, out = 0;
  std::vector<int64_t> experts;  // N_1, ..., N_E
  bool bias = true;              // append 1 to the input: a per-expert bias row
  int64_t in_rows() const { return in + (bias ? 1 : 0); }
  int64_t levels() const { return int64_t(experts.size()); }
  int64_t total_experts() const;
};

class MuMoELayer : public Module {
 public:
  // z: (..., I); a: one coefficient tensor (..., N_e) per level, same leading dims as z.
  Tensor forward(const Tensor& z, const std::vector<Tensor>& a) const;
  Tensor operator()(const Tensor& z, const std::vector<Tensor>& a) const { return forward(z, a); }
  // The same pass with `factor_values` (one per factor, in factors() order, same shapes)
  // in place of the layer's parameters: a functional call, for gradient checks with
  // respect to the factors and for anything that differentiates through new values.
  Tensor forward_with(const Tensor& z, const std::vector<Tensor>& a, const std::vector<Tensor>& factor_values) const;

  // The full weight tensor (N_1, ..., N_E, I(+1), O), built from the factors.
  Tensor materialize() const;
  // Expert (n_1, ..., n_E)'s matrix (I(+1), O): y = W_nᵀ [z; 1] when its coefficients are 1.
  Tensor expert_weight(const std::vector<int64_t>& index) const;

  // ---- counterfactuals (expert analysis): the forward pass with experts removed,
  // computed in factorized form and equal to zeroing slices of the materialised tensor.
  // Removes expert n at level `level` (0-based): W[..., n (at mode level), ...] = 0.
  Tensor forward_without_expert(const Tensor& z, const std::vector<Tensor>& a, int64_t level, int64_t n) const;
  // Removes one combination (n_1, ..., n_E): W[n_1, ..., n_E, :, :] = 0.
  Tensor forward_without_combination(const Tensor& z, const std::vector<Tensor>& a,
                                     const std::vector<int64_t>& index) const;

  const MoEShape& moe_shape() const { return shape_; }
  // Multiply-adds of one token's forward pass, by the paper's formula for this variant.
  virtual int64_t flops_per_token() const = 0;
  int64_t flops(int64_t tokens) const;

  // A named factor: the parameter and the axis name of each of its modes.
  struct Factor {
    std::string name;
    Tensor param;
    std::vector<std::string> axes;
  };
  const std::vector<Factor>& factors() const { return factors_; }
  std::string extra_repr() const override;

 protected:
  MuMoELayer(std::string type_name, MoEShape shape);
  void add_factor(const std::string& name, Tensor value, std::vector<std::string> axes);
  static std::string expert_axis(int64_t level) { return "n" + std::to_string(level + 1); }
  // A variant's own forward contraction: y (B, O) from the flattened input z2 (B, I),
  // without the 1 (a variant with a bias adds the input factor's last row itself, or
  // appends the 1 with with_one), coefficients af (B, N_e) and the factor values; or an
  // undefined Tensor to use the planner's einsum on [z2, 1] (the default).
  virtual Tensor own_forward(const Tensor& z2, const std::vector<Tensor>& af,
                             const std::vector<Tensor>& factor_values) const;
  // [z2, 1] when the layer has a bias (the 1 appended to every row), else z2.
  Tensor with_one(const Tensor& z2) const;
  MoEShape shape_;

 private:
  // Checks shapes of z and a; returns z and coefficients flattened to (B, ·), with the 1
  // appended to z when append_one (and the layer has a bias).
  std::pair<Tensor, std::vector<Tensor>> flatten_inputs(const Tensor& z, const std::vector<Tensor>& a,
                                                        const char* op, bool append_one = true) const;
  Tensor restore_leading(const Tensor& y, const Tensor& z) const;
  std::vector<Factor> factors_;
};

// ---------------------------------------------------------------- variants

// CP: W = Σ_r u_r^(1) ∘ ... ∘ u_r^(E) ∘ u_r^(I) ∘ u_r^(O); factors U_e (N_e, R), U_I (I+1, R),
// U_O (O, R). y = U_O ((U_1ᵀa_1) ∗ ... ∗ (U_Eᵀa_E) ∗ (U_Iᵀz)). Params R(ΣN_e + I + 1 + O).
class CPMuMoE : public MuMoELayer {
 public:
  CPMuMoE(MoEShape shape, int64_t rank, Generator* gen = nullptr);
  int64_t rank() const { return rank_; }
  int64_t flops_per_token() const override;
  static int64_t count_parameters(const MoEShape& s, int64_t rank);

  // The forward is y = h U_outᵀ with h = ([z, 1] U_in) ∗ (a_1 U_1) ∗ ... (matmul_with_one:
  // the bias row added to the product rather than a 1 appended to every input row, which
  // would copy z). The fused path (off by default) computes h in one hadamard_gemm kernel
  // (ops/hadamard_gemm.h), the products never stored; the same values up to rounding.
  // Kept off until a GPU benchmark (bench_gpu_fused_mumoe) shows it faster.
  CPMuMoE& set_fused(bool on) {
    fused_ = on;
    return *this;
  }
  bool fused() const { return fused_; }

 protected:
  Tensor own_forward(const Tensor& z2, const std::vector<Tensor>& af,
                     const std::vector<Tensor>& factor_values) const override;

 private:
  int64_t rank_;
  bool fused_ = false;
};

// Tensor ring: cores U_e (R_e, N_e, R_{e+1}), U_I (R_{E+1}, I+1, R_{E+2}),
// U_O (R_{E+2}, O, R_1); w = tr(U_1[:,n_1,:] ... U_E[:,n_E,:] U_I[:,i,:] U_O[:,o,:]).
// ranks = (R_1, ..., R_{E+2}).
class TRMuMoE : public MuMoELayer {
 public:
  TRMuMoE(MoEShape shape, std::vector<int64_t> ranks, Generator* gen = nullptr);
  const std::vector<int64_t>& ranks() const { return ranks_; }
  int64_t flops_per_token() const override;
  static int64_t count_parameters(const MoEShape& s, const std::vector<int64_t>& ranks);
  TRMuMoE& set_fused(bool on) {
    fused_ = on;
    return *this;
  }
  bool fused() const { return fused_; }

 protected:
  TRMuMoE(std::string type_name, MoEShape shape, std::vector<int64_t> ranks, Generator* gen);
  // h = [z, 1] U_in by matmul_with_one (the bias row added, no 1 appended to z); c_e = a_e U_e (B, R_e, R_{e+1}); q = c_1 ... c_E h (B, R_1, R_{E+2})
  // by batched products from R_1 along the ring; y = q U_out. The planner's einsum made
  // the same products, and two copies of z for the appended 1 (z and its gradient).
  // The fused path (off by default) forms q inside the output GEMM (ring_gemm,
  // ops/ring_gemm.h): y = ring_gemm(c_1 ... c_E, h, U_out), q never stored; the same values
  // up to rounding. Kept off until a GPU benchmark (bench_gpu_fused_mumoe) shows it faster.
  Tensor own_forward(const Tensor& z2, const std::vector<Tensor>& af,
                     const std::vector<Tensor>& factor_values) const override;

 private:
  std::vector<int64_t> ranks_;
  bool fused_ = false;
};

// Tensor train: a tensor ring whose closing rank R_1 is 1. ranks = (R_2, ..., R_{E+2}).
class TTMuMoE : public TRMuMoE {
 public:
  TTMuMoE(MoEShape shape, std::vector<int64_t> ranks, Generator* gen = nullptr);
};

// Tucker: core Z (R_O, R_I, R_{N_1}, ..., R_{N_E}) and one factor per mode: U_e (N_e, R_{N_e}),
// U_I (I+1, R_I), U_O (O, R_O). ranks = (R_{N_1}, ..., R_{N_E}, R_I, R_O).
class TuckerMuMoE : public MuMoELayer {
 public:
  TuckerMuMoE(MoEShape shape, std::vector<int64_t> ranks, Generator* gen = nullptr);
  int64_t flops_per_token() const override;
  static int64_t count_parameters(const MoEShape& s, const std::vector<int64_t>& ranks);

 private:
  std::vector<int64_t> ranks_;
};

// Hadamard (MxD): W(n_1..n_E, i, :) = C_1[n_1] ∗ ... ∗ C_E[n_E] ∗ D[i]; factors C_e (N_e, O),
// D (I+1, O). y = (C_1ᵀa_1) ∗ ... ∗ (C_Eᵀa_E) ∗ (Dᵀz).
class HadamardMoE : public MuMoELayer {
 public:
  explicit HadamardMoE(MoEShape shape, Generator* gen = nullptr);
  int64_t flops_per_token() const override;
  static int64_t count_parameters(const MoEShape& s);
};

// The unfactorized (soft, dense) MoE: the weight tensor itself is the parameter.
class DenseMoE : public MuMoELayer {
 public:
  explicit DenseMoE(MoEShape shape, Generator* gen = nullptr);
  // A dense layer holding a given weight tensor (e.g. another layer's materialize()).
  DenseMoE(MoEShape shape, const Tensor& weight);
  int64_t flops_per_token() const override;

 protected:
  // Up to N_1 ⋯ N_E inputs: the coefficients first (see the definition); more: the planner's order.
  Tensor own_forward(const Tensor& z2, const std::vector<Tensor>& af,
                     const std::vector<Tensor>& factor_values) const override;

 public:
  // N_1 ⋯ N_E (I+1) O, without allocating anything.
  static int64_t count_parameters(const MoEShape& s);
};

}  // namespace mu::nn
