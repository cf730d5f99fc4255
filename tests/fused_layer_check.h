// Checks shared by the suites of the fused μMoE ops (test_hadamard_gemm, test_ring_gemm):
// an op's gradients against its composition's, and a layer's fused path
// (CPMuMoE / TRMuMoE ::set_fused) held to the same layer unfused and to the DenseMoE of
// its materialised tensor: values, and the gradients of the input, the coefficients and
// every factor.
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

// The gradients of the leaves f (the fused op's graph, in dt on dev) against those of
// the same leaves in the composition's graph in dt (p) and in float64 on the CPU (r).
// bfloat16: the two graphs round their intermediates differently.
inline void check_fused_grads(const mu::autograd::TensorList& f, const mu::autograd::TensorList& p,
                              const mu::autograd::TensorList& r, mu::Device dev, mu::DType dt) {
  using namespace mu;
  for (size_t i = 0; i < f.size(); ++i) {
    INFO(dev.str() << " " << dtype_name(dt) << " input " << i);
    REQUIRE(f[i].grad().defined());
    CHECK(f[i].grad().device() == dev);
    CHECK(f[i].grad().dtype() == dt);
    CHECK(rel_err(f[i].grad(), p[i].grad()) <= (dt == kFloat32 ? 1e-5 : 5e-2));
    CHECK(rel_err(f[i].grad(), r[i].grad()) <= (dt == kFloat32 ? 1e-5 : 3e-2));
  }
}

// The layers' shape in these checks: 37 -> 11 with E levels of 5, then 3, experts.
inline mu::nn::MoEShape fused_check_shape(int64_t E, bool bias) {
  mu::nn::MoEShape s;
  s.in = 37, s.out = 11, s.bias = bias;
  for (int64_t e = 0; e < E; ++e) s.experts.push_back(e == 0 ? 5 : 3);
  return s;
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

// L(s, args...) in `dt` on `dev` (float32 or bfloat16), 130 rows: the fused forward
// within the dtype's rounding of the unfused one (in the same dtype).
template <class L, class... Args>
void check_fused_layer_in(mu::DType dt, const mu::nn::MoEShape& s, mu::Device dev, const Args&... args) {
  using namespace mu;
  L l(s, args...);
  l.to(dt);
  l.to(dev);
  const Tensor z = randn({130, s.in}).to(dt).to(dev);
  const Tensor a = softmax(randn({130, s.experts[0]}), -1).to(dt).to(dev);
  l.set_fused(false);
  const Tensor plain = l.forward(z, {a});
  l.set_fused(true);
  const Tensor fused = l.forward(z, {a});
  INFO(dev.str() << " " << dtype_name(dt));
  CHECK(fused.dtype() == dt);
  CHECK(rel_err(fused, plain) <= (dt == kFloat32 ? 1e-5 : 3e-2));
}

// gradcheck (float64, CPU) of the fused L(s, args...) with respect to the input, the
// coefficients of its two levels and every factor. s has two levels of 3 and 2 experts.
template <class L, class... Args>
void gradcheck_fused_layer(const mu::nn::MoEShape& s, const Args&... args) {
  using namespace mu;
  REQUIRE(s.experts == std::vector<int64_t>{3, 2});
  L l(s, args...);
  l.to(kFloat64);
  l.set_fused(true);
  std::vector<Tensor> values;
  for (const auto& f : l.factors()) values.push_back(f.param.detach().clone().requires_grad_());
  autograd::TensorList in = {rnd({2, s.in}, 91).requires_grad_(), softmax(rnd({2, 3}, 92), -1).detach().requires_grad_(),
                             softmax(rnd({2, 2}, 93), -1).detach().requires_grad_()};
  in.insert(in.end(), values.begin(), values.end());
  auto fn = [&l](const autograd::TensorList& x) {
    return l.forward_with(x[0], {x[1], x[2]}, std::vector<Tensor>(x.begin() + 3, x.end()));
  };
  CHECK_GRAD(fn, in);
}
