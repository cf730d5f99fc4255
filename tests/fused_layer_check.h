// A μMoE layer's fused path (CPMuMoE / TRMuMoE ::set_fused) held to the same layer
// unfused and to the DenseMoE of its materialised tensor: values, and the gradients of
// the input, the coefficients and every factor. Shared by the suites of the fused ops
// (test_hadamard_gemm, test_ring_gemm).
#pragma once
#include <algorithm>
#include <cmath>
#include <vector>

#include "helpers.h"
#include "nn/mumoe_layer.h"

// max |a - b| / max |b|, in double.
inline double rel_err(const mu::Tensor& got, const mu::Tensor& want) {
  double scale = 0;
  for (double v : want.to_vector<double>()) scale = std::max(scale, std::abs(v));
  return max_abs_diff(got.to(mu::kFloat64), want.to(mu::kFloat64)) / std::max(scale, 1e-300);
}

// L(s, args...) twice, float64 on `dev`, with the same random factors (larger than the
// init's noise, so that every factor matters), one of them fused; a batch of (2, 35).
template <class L, class... Args>
void check_fused_layer(const mu::nn::MoEShape& s, mu::Device dev, const Args&... args) {
  using namespace mu;
  L plain(s, args...), fused(s, args...);
  plain.to(kFloat64);
  fused.to(kFloat64);
  {
    NoGradGuard g;
    for (size_t k = 0; k < plain.factors().size(); ++k) {
      Tensor(plain.factors()[k].param).copy_(randn(plain.factors()[k].param.shape(), kFloat64) * 0.5);
      Tensor(fused.factors()[k].param).copy_(plain.factors()[k].param);
    }
  }
  plain.to(dev);
  fused.to(dev);
  fused.set_fused(true);
  CHECK(fused.fused());
  CHECK(!plain.fused());
  const Tensor z = randn({2, 35, s.in}, kFloat64).to(dev);
  std::vector<Tensor> a;
  for (int64_t n : s.experts) a.push_back(softmax(randn({2, 35, n}, kFloat64), -1).to(dev));
  const Tensor yf = fused.forward(z, a), yp = plain.forward(z, a);
  CHECK(yf.shape() == Shape{2, 35, s.out});
  CHECK(rel_err(yf, yp) <= 1e-12);
  CHECK(rel_err(yf, nn::DenseMoE(s, plain.materialize()).forward(z, a)) <= 1e-10);
  // Gradients of every factor, the input and the coefficients match the unfused path's.
  const Tensor zf = z.clone().requires_grad_(), zp = z.clone().requires_grad_();
  std::vector<Tensor> af, ap;
  for (const Tensor& t : a) af.push_back(t.clone().requires_grad_()), ap.push_back(t.clone().requires_grad_());
  const Tensor w = randn({2, 35, s.out}, kFloat64).to(dev);
  sum(fused.forward(zf, af) * w).backward();
  sum(plain.forward(zp, ap) * w).backward();
  CHECK(rel_err(zf.grad(), zp.grad()) <= 1e-12);
  for (size_t e = 0; e < af.size(); ++e) CHECK(rel_err(af[e].grad(), ap[e].grad()) <= 1e-12);
  for (size_t k = 0; k < plain.factors().size(); ++k) {
    INFO("factor " << plain.factors()[k].name);
    CHECK(rel_err(fused.factors()[k].param.grad(), plain.factors()[k].param.grad()) <= 1e-12);
  }
}
