// ring_gemm, the fused output GEMM of the TR μMoE layer, on every device:
// - the forward against a brute-force double loop and against the composition (batched
//   matmul, then matmul), in float64, float32 and bfloat16, on shapes across the CUDA
//   kernel's 64 x 64 tiles and its stage depths (16 / 32), with P = 1 (tensor train), an
//   empty inner size (R = 0) and an empty product (S = 0), and empty outputs;
// - non-contiguous operands; a NaN in one row of h reaches only that row;
// - gradcheck in float64, and each device's gradients against the composition's on that
//   device and in float64 on the CPU; autocast;
// - the TR and TT layers with the fused path equal the layer without it and the DenseMoE
//   of their materialised tensor, values and gradients; the block option turns it on;
// - errors that name the problem.
#include <cmath>

#include "fused_layer_check.h"
#include "helpers.h"
#include "nn/mumoe_block.h"
#include "nn/mumoe_layer.h"

using namespace mu;
using autograd::TensorList;

namespace {

// out[m, n] = Σ_{s,p} (Σ_r c[m,p,r] h[m,r,s]) w[s P + p, n] by plain loops in double.
std::vector<double> brute(const Tensor& c, const Tensor& h, const Tensor& w) {
  const int64_t M = c.size(0), P = c.size(1), R = c.size(2), S = h.size(2), N = w.size(1);
  const auto cv = c.to_vector<double>(), hv = h.to_vector<double>(), wv = w.to_vector<double>();
  std::vector<double> out(size_t(M * N), 0.0);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t p = 0; p < P; ++p)
      for (int64_t s = 0; s < S; ++s) {
        double q = 0;
        for (int64_t r = 0; r < R; ++r) q += cv[size_t((m * P + p) * R + r)] * hv[size_t((m * R + r) * S + s)];
        for (int64_t n = 0; n < N; ++n) out[size_t(m * N + n)] += q * wv[size_t((s * P + p) * N + n)];
      }
  return out;
}

// The unfused composition: q = c h by batched matmul, its rows flattened s-major, times w.
Tensor composed(const Tensor& c, const Tensor& h, const Tensor& w) {
  const int64_t M = c.size(0), P = c.size(1), S = h.size(2);
  return c.matmul(h).transpose(1, 2).reshape({M, S * P}).matmul(w);
}

// Random tensor in `dt` on `dev`, N(0, s²).
Tensor draw(const Shape& shape, DType dt, Device dev, double s = 1.0) {
  return (randn(shape, kFloat64) * s).to(dt).to(dev);
}

struct Case {
  int64_t M, P, R, S, N;
};

// Around and across the 64 x 64 tiles and the stage depths (K = S P of 16 and 32 and
// neither); P = 1 is the tensor train; R = 0 makes every entry 0; S = 0 an empty GEMM.
const Case kCases[] = {
    {1, 1, 1, 1, 1},    {5, 4, 4, 3, 7},    {130, 4, 4, 37, 67}, {65, 1, 3, 20, 130}, {70, 3, 5, 11, 64},
    {64, 4, 4, 8, 64},  {64, 2, 0, 5, 9},   {9, 3, 2, 0, 5},     {3, 16, 4, 5, 200},  {129, 5, 7, 13, 3},
};

double tolerance(DType dt) { return dt == kFloat64 ? 1e-12 : dt == kFloat32 ? 2e-5 : 2e-2; }

Tensor make_c(const Case& k, DType dt, Device dev) { return draw({k.M, k.P, k.R}, dt, dev); }
Tensor make_h(const Case& k, DType dt, Device dev) {
  return draw({k.M, k.R, k.S}, dt, dev, 1.0 / std::sqrt(double(std::max<int64_t>(k.R, 1))));
}
Tensor make_w(const Case& k, DType dt, Device dev) {
  return draw({k.S * k.P, k.N}, dt, dev, 1.0 / std::sqrt(double(std::max<int64_t>(k.S * k.P, 1))));
}

}  // namespace

TEST_CASE("ring_gemm equals a brute-force loop and the matmul composition (float64, float32, bfloat16)") {
  for (Device dev : test_devices())
    for (DType dt : {kFloat64, kFloat32, kBFloat16})
      for (const Case& k : kCases) {
        manual_seed(uint64_t(k.M * 1000 + k.S * 10 + k.P));
        const Tensor c = make_c(k, dt, dev), h = make_h(k, dt, dev), w = make_w(k, dt, dev);
        INFO(dev.str() << " " << dtype_name(dt) << " M=" << k.M << " P=" << k.P << " R=" << k.R
                       << " S=" << k.S << " N=" << k.N);
        const Tensor y = ring_gemm(c, h, w);
        REQUIRE(y.shape() == Shape{k.M, k.N});
        CHECK(y.dtype() == dt);
        CHECK(y.device() == dev);
        const Tensor want = from_vector(brute(c, h, w), {k.M, k.N});
        if (k.R == 0 || k.S == 0) {
          for (double v : y.to_vector<double>()) CHECK(v == 0.0);
          continue;
        }
        // Against double loops on the same (rounded) inputs: only the op's own rounding.
        CHECK(rel_err(y, want) <= tolerance(dt));
        // Against the composition in the same dtype, which rounds q too.
        CHECK(rel_err(y, composed(c, h, w)) <= 2 * tolerance(dt));
      }
}

TEST_CASE("ring_gemm: empty outputs") {
  for (Device dev : test_devices()) {
    const Case none{0, 4, 4, 3, 5}, narrow{6, 4, 4, 3, 0};
    CHECK(ring_gemm(make_c(none, kFloat32, dev), make_h(none, kFloat32, dev), make_w(none, kFloat32, dev)).shape() ==
          Shape{0, 5});
    CHECK(ring_gemm(make_c(narrow, kFloat32, dev), make_h(narrow, kFloat32, dev), make_w(narrow, kFloat32, dev))
              .shape() == Shape{6, 0});
  }
}

TEST_CASE("ring_gemm: gradients of empty sizes are zeros of the operands' shapes") {
  for (Device dev : test_devices())
    for (const Case& k : {Case{0, 4, 4, 3, 5}, Case{6, 4, 0, 3, 5}, Case{6, 4, 4, 0, 5}, Case{6, 4, 4, 3, 0}}) {
      const Tensor c = make_c(k, kFloat64, dev).requires_grad_(), h = make_h(k, kFloat64, dev).requires_grad_();
      const Tensor w = make_w(k, kFloat64, dev).requires_grad_();
      sum(ring_gemm(c, h, w)).backward();
      INFO(dev.str() << " M=" << k.M << " R=" << k.R << " S=" << k.S << " N=" << k.N);
      for (const Tensor* t : {&c, &h, &w}) {
        REQUIRE(t->grad().defined());
        CHECK(t->grad().shape() == t->shape());
        for (double v : t->grad().to_vector<double>()) CHECK(v == 0.0);
      }
    }
}

TEST_CASE("ring_gemm: non-contiguous operands (transposed views, slices) give the dense result") {
  for (Device dev : test_devices())
    for (DType dt : {kFloat32, kBFloat16}) {
      manual_seed(15);
      const Case k{70, 4, 4, 17, 66};
      const Tensor c = make_c(k, dt, dev), h = make_h(k, dt, dev), w = make_w(k, dt, dev);
      const Tensor want = ring_gemm(c, h, w);
      // c as the transpose of a transpose, h as a slice of a longer tensor, w likewise.
      const Tensor ct = c.transpose(1, 2).contiguous().transpose(1, 2);
      REQUIRE(!ct.is_contiguous());
      const Tensor hs = cat({h, make_h(k, dt, dev)}, 2).narrow(2, 0, k.S);
      REQUIRE(!hs.is_contiguous());
      const Tensor wt = w.t().contiguous().t();
      REQUIRE(!wt.is_contiguous());
      INFO(dev.str() << " " << dtype_name(dt));
      CHECK(max_abs_diff(ring_gemm(ct, hs, wt), want) == 0.0);
    }
}

TEST_CASE("ring_gemm: a NaN in one row of h reaches only that row") {
  for (Device dev : test_devices())
    for (DType dt : {kFloat32, kFloat64, kBFloat16}) {
      manual_seed(16);
      const Case k{70, 4, 4, 9, 66};
      Tensor h = make_h(k, kFloat64, Device::cpu());
      h.set({3, 2, 7}, std::nan(""));
      const Tensor y = ring_gemm(make_c(k, dt, dev), h.to(dt).to(dev), make_w(k, dt, dev));
      const auto v = y.to_vector<double>();
      INFO(dev.str() << " " << dtype_name(dt));
      for (int64_t m = 0; m < k.M; ++m)
        for (int64_t n = 0; n < k.N; ++n) {
          if (m == 3) CHECK(std::isnan(v[size_t(m * k.N + n)]));
          else CHECK(std::isfinite(v[size_t(m * k.N + n)]));
        }
    }
}

TEST_CASE("ring_gemm: gradcheck in float64 (ring and train)") {
  for (Device dev : test_devices())
    for (const Case& k : {Case{4, 3, 2, 3, 5}, Case{3, 1, 4, 2, 3}}) {
      TensorList in = {on(rnd({k.M, k.P, k.R}, 30).requires_grad_(), dev),
                       on(rnd({k.M, k.R, k.S}, 31).requires_grad_(), dev),
                       on(rnd({k.S * k.P, k.N}, 32).requires_grad_(), dev)};
      INFO(dev.str() << " P=" << k.P);
      CHECK_GRAD([](const TensorList& x) { return ring_gemm(x[0], x[1], x[2]); }, in);
    }
}

TEST_CASE("ring_gemm: gradients on each device equal the composition's and the CPU's float64 ones (float32, bfloat16)") {
  for (Device dev : test_devices())
    for (DType dt : {kFloat32, kBFloat16}) {
      manual_seed(60);
      const Case k{70, 4, 4, 37, 67};
      const Tensor c0 = make_c(k, dt, dev), h0 = make_h(k, dt, dev), w0 = make_w(k, dt, dev);
      const Tensor g = draw({k.M, k.N}, dt, dev);
      auto leaves = [&] {
        return TensorList{c0.detach().clone().requires_grad_(), h0.detach().clone().requires_grad_(),
                          w0.detach().clone().requires_grad_()};
      };
      TensorList f = leaves(), p = leaves();
      sum(ring_gemm(f[0], f[1], f[2]) * g).backward();
      sum(composed(p[0], p[1], p[2]) * g).backward();
      // The reference every device is held to: the composition in float64 on the CPU.
      TensorList r;
      for (const Tensor& t : leaves()) r.push_back(t.detach().to(kFloat64).cpu().requires_grad_());
      sum(composed(r[0], r[1], r[2]) * g.to(kFloat64).cpu()).backward();
      check_fused_grads(f, p, r, dev, dt);
    }
}

TEST_CASE("ring_gemm under autocast runs float32 operands in bfloat16, gradients reach float32") {
  for (Device dev : test_devices()) {
    manual_seed(70);
    const Case k{9, 4, 4, 5, 7};
    Tensor c = make_c(k, kFloat32, dev).requires_grad_(), h = make_h(k, kFloat32, dev).requires_grad_();
    Tensor w = make_w(k, kFloat32, dev).requires_grad_();
    Tensor y;
    {
      AutocastGuard amp;
      y = ring_gemm(c, h, w);
    }
    CHECK(y.dtype() == kBFloat16);
    CHECK(rel_err(y, composed(c.detach(), h.detach(), w.detach())) <= 2e-2);
    sum(y).backward();
    for (const Tensor* t : {&c, &h, &w}) {
      REQUIRE(t->grad().defined());
      CHECK(t->grad().dtype() == kFloat32);
    }
  }
}

TEST_CASE("TR and TT layers: the fused path equals the unfused one and the DenseMoE of the materialised tensor") {
  for (Device dev : test_devices())
    for (int64_t E : {1, 2})
      for (bool bias : {true, false}) {
        manual_seed(uint64_t(80 + E));
        const nn::MoEShape s = fused_check_shape(E, bias);
        INFO(dev.str() << " E=" << E << " bias=" << bias);
        // TR ranks (R_1, ..., R_{E+2}), all different so that a swapped mode shows.
        std::vector<int64_t> tr = E == 1 ? std::vector<int64_t>{3, 4, 6} : std::vector<int64_t>{3, 2, 4, 5};
        check_fused_layer<nn::TRMuMoE>(s, dev, tr);
        // TT: (R_2, ..., R_{E+2}), the closing rank 1.
        check_fused_layer<nn::TTMuMoE>(s, dev, std::vector<int64_t>(tr.begin() + 1, tr.end()));
      }
}

TEST_CASE("TR layer: fused and unfused paths agree in float32 and bfloat16 (paper proportions, small)") {
  for (Device dev : test_devices())
    for (DType dt : {kFloat32, kBFloat16}) {
      manual_seed(85);
      // S P = 4 · 37 = 148: neither a multiple of the CUDA tiles nor of their depth.
      check_fused_layer_in<nn::TRMuMoE>(dt, nn::MoEShape{96, 70, {16}, true}, dev, std::vector<int64_t>{4, 4, 37});
    }
}

TEST_CASE("TR layer: gradcheck through the fused path; the block option turns it on") {
  manual_seed(90);
  gradcheck_fused_layer<nn::TRMuMoE>(nn::MoEShape{3, 2, {3, 2}, true}, std::vector<int64_t>{2, 3, 2, 2});
  for (nn::MoEKind kind : {nn::MoEKind::TR, nn::MoEKind::TT}) {
    nn::MuMoE block(nn::MuMoEOptions(6, 4).experts({3}).kind(kind).ranks(kind == nn::MoEKind::TR
                                                                             ? std::vector<int64_t>{2, 2, 3}
                                                                             : std::vector<int64_t>{2, 3})
                        .fused_tr(true));
    auto* tr = dynamic_cast<const nn::TRMuMoE*>(block.layer(0).get());
    REQUIRE(tr != nullptr);
    CHECK(tr->fused());
  }
}

TEST_CASE("ring_gemm: errors name the problem") {
  const Tensor c = zeros({4, 2, 3}), h = zeros({4, 3, 5}), w = zeros({10, 6});
  CHECK_THROWS_MU(ring_gemm(zeros({4, 6}), h, w), "needs c (M, P, R), h (M, R, S) and w (S P, N)");
  CHECK_THROWS_MU(ring_gemm(c, zeros({5, 3, 5}), w), "c has 4 rows but h has 5");
  CHECK_THROWS_MU(ring_gemm(c, zeros({4, 2, 5}), w), "cannot be multiplied row by row (3 != 2)");
  CHECK_THROWS_MU(ring_gemm(c, h, zeros({9, 6})), "w has 9 rows; expected S P = 5 * 2 = 10");
  CHECK_THROWS_MU(ring_gemm(c, h, w.to(kFloat64)), "dtype mismatch: c float32, h float32, w float64");
  CHECK_THROWS_MU(ring_gemm(c.to(kInt64), h.to(kInt64), w.to(kInt64)), "int64 tensors are not supported");
  CHECK_THROWS_MU(ring_gemm(Tensor(), h, w), "an operand is undefined");
}
