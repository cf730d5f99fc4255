// hadamard_gemm / cp_hadamard, the fused core of the CP μMoE layer, on every device:
// - the forward against a brute-force double loop and against the matmul/einsum
//   composition, in float64, float32 and bfloat16, on shapes that are not multiples of
//   the CUDA kernel's 64 x 64 tiles (several tiles in both directions), one and two
//   expert levels, with and without a scale, an empty inner size, and more products
//   than one CUDA launch takes (the chained path);
// - non-contiguous operands; a NaN / inf in one row of an operand reaches only that row;
// - gradcheck in float64, and each device's gradients against the einsum composition's
//   on that device and in float64 on the CPU;
// - the CP layer with the fused path on equals the layer without it and the DenseMoE of
//   its materialised tensor, values and gradients;
// - errors that name the problem.
#include <cmath>

#include "fused_layer_check.h"
#include "helpers.h"
#include "nn/mumoe_block.h"
#include "nn/mumoe_layer.h"

using namespace mu;
using autograd::TensorList;

namespace {

// scale ∗ Π_k (a_k · b_k) by plain loops in double, from the tensors' values.
std::vector<double> brute(const std::vector<Tensor>& a, const std::vector<Tensor>& b, const Tensor& scale) {
  const int64_t M = a[0].size(0), R = b[0].size(1);
  std::vector<double> out(size_t(M * R), 1.0);
  if (scale.defined()) out = scale.to_vector<double>();
  for (size_t k = 0; k < a.size(); ++k) {
    const auto av = a[k].to_vector<double>(), bv = b[k].to_vector<double>();
    const int64_t K = a[k].size(1);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t r = 0; r < R; ++r) {
        double s = 0;
        for (int64_t j = 0; j < K; ++j) s += av[size_t(m * K + j)] * bv[size_t(j * R + r)];
        out[size_t(m * R + r)] *= s;
      }
  }
  return out;
}

// The unfused composition: each product by einsum, multiplied elementwise.
Tensor composed(const std::vector<Tensor>& a, const std::vector<Tensor>& b, const Tensor& scale) {
  Tensor out = scale;
  for (size_t k = 0; k < a.size(); ++k) {
    Tensor p = einsum("m k, k r -> m r", {a[k], b[k]});
    out = out.defined() ? out * p : p;
  }
  return out;
}

// Random (rows, cols) in `dt` on `dev`, N(0, 1) scaled so products stay O(1).
Tensor mat(int64_t rows, int64_t cols, DType dt, Device dev, double s = 1.0) {
  return (randn({rows, cols}, kFloat64) * s).to(dt).to(dev);
}

struct Case {
  int64_t M, R;
  std::vector<int64_t> K;  // inner size of each product
  bool scale;
};

// Shapes around and across the 64 x 64 tiles, depth stages of 16 / 32, one to three factors.
const Case kCases[] = {
    {1, 1, {1}, false},          {5, 3, {4, 2}, true},          {65, 67, {37, 5}, false},
    {130, 70, {33, 17}, true},   {64, 64, {32, 16}, false},     {129, 131, {40, 7, 3}, true},
    {70, 66, {0, 5}, false},     {3, 200, {100, 2}, true},
};

double tolerance(DType dt) { return dt == kFloat64 ? 1e-12 : dt == kFloat32 ? 2e-5 : 2e-2; }

}  // namespace

TEST_CASE("hadamard_gemm equals a brute-force loop and the einsum composition (float64, float32, bfloat16)") {
  for (Device dev : test_devices())
    for (DType dt : {kFloat64, kFloat32, kBFloat16})
      for (const Case& c : kCases) {
        manual_seed(uint64_t(c.M * 1000 + c.R));
        std::vector<Tensor> a, b;
        for (int64_t K : c.K) {
          a.push_back(mat(c.M, K, dt, dev));
          b.push_back(mat(K, c.R, dt, dev, 1.0 / std::sqrt(double(std::max<int64_t>(K, 1)))));
        }
        const Tensor s = c.scale ? mat(c.M, c.R, dt, dev) : Tensor();
        INFO(dev.str() << " " << dtype_name(dt) << " M=" << c.M << " R=" << c.R << " factors=" << c.K.size());
        const Tensor y = hadamard_gemm(a, b, s);
        REQUIRE(y.shape() == Shape{c.M, c.R});
        CHECK(y.dtype() == dt);
        CHECK(y.device() == dev);
        // Against double loops on the same (rounded) inputs: only the op's own rounding.
        const Tensor want = from_vector(brute(a, b, s), {c.M, c.R});
        CHECK(rel_err(y, want) <= tolerance(dt));
        // Against the composition in the same dtype, which rounds each product too.
        CHECK(rel_err(y, composed(a, b, s)) <= 2 * tolerance(dt));
      }
}

TEST_CASE("hadamard_gemm: an empty inner size makes that product zero; empty outputs") {
  for (Device dev : test_devices()) {
    const Tensor y = hadamard_gemm({mat(3, 0, kFloat32, dev), mat(3, 2, kFloat32, dev)},
                                   {mat(0, 4, kFloat32, dev), mat(2, 4, kFloat32, dev)});
    CHECK(y.shape() == Shape{3, 4});
    for (double v : y.to_vector<double>()) CHECK(v == 0.0);
    CHECK(hadamard_gemm({mat(0, 3, kFloat32, dev)}, {mat(3, 5, kFloat32, dev)}).shape() == Shape{0, 5});
    CHECK(hadamard_gemm({mat(4, 3, kFloat32, dev)}, {mat(3, 0, kFloat32, dev)}).shape() == Shape{4, 0});
  }
}

TEST_CASE("hadamard_gemm: more products than one CUDA launch takes (9 and 17 factors)") {
  for (Device dev : test_devices())
    for (int n : {9, 17}) {
      manual_seed(uint64_t(n));
      std::vector<Tensor> a, b;
      for (int k = 0; k < n; ++k) {
        a.push_back(mat(70, 3, kFloat64, dev));
        // Factors near 1 keep a 17-fold product of O(1) values in range.
        b.push_back((mat(3, 66, kFloat64, dev, 0.1) + 1.0 / 3.0));
      }
      const Tensor s = mat(70, 66, kFloat64, dev);
      CHECK(rel_err(hadamard_gemm(a, b, s), from_vector(brute(a, b, s), {70, 66})) <= 1e-12);
    }
}

TEST_CASE("hadamard_gemm: non-contiguous operands (transposed views, column slices) give the dense result") {
  for (Device dev : test_devices())
    for (DType dt : {kFloat32, kBFloat16}) {
      manual_seed(15);
      const Tensor a0 = mat(70, 9, dt, dev), b0 = mat(9, 66, dt, dev), a1 = mat(70, 5, dt, dev), b1 = mat(5, 66, dt, dev);
      const Tensor want = hadamard_gemm({a0, a1}, {b0, b1});
      // a0 as the transpose of its transpose, b1 as a slice of a wider matrix.
      const Tensor a0t = a0.t().contiguous().t(), wide = cat({b1, mat(5, 3, dt, dev)}, 1);
      REQUIRE(!a0t.is_contiguous());
      const Tensor b1s = wide.narrow(1, 0, 66);
      REQUIRE(!b1s.is_contiguous());
      INFO(dev.str() << " " << dtype_name(dt));
      CHECK(max_abs_diff(hadamard_gemm({a0t, a1}, {b0, b1s}), want) == 0.0);
    }
}

TEST_CASE("hadamard_gemm: a NaN or an inf in one row of an operand reaches only that row") {
  for (Device dev : test_devices())
    for (DType dt : {kFloat32, kFloat64, kBFloat16}) {
      manual_seed(16);
      Tensor a0 = mat(70, 20, kFloat64, Device::cpu());
      a0.set({3, 7}, std::nan(""));
      a0.set({68, 19}, INFINITY);
      const Tensor y = hadamard_gemm({a0.to(dt).to(dev), mat(70, 4, dt, dev)}, {mat(20, 66, dt, dev), mat(4, 66, dt, dev)});
      const auto v = y.to_vector<double>();
      INFO(dev.str() << " " << dtype_name(dt));
      for (int64_t m = 0; m < 70; ++m)
        for (int64_t r = 0; r < 66; ++r) {
          const double x = v[size_t(m * 66 + r)];
          if (m == 3) CHECK(std::isnan(x));
          else if (m == 68) CHECK(!std::isfinite(x));  // ±inf, or NaN where inf meets a zero sum
          else CHECK(std::isfinite(x));
        }
    }
}

TEST_CASE("cp_hadamard is the CP layer's core, one and two expert levels") {
  for (Device dev : test_devices())
    for (int levels : {1, 2}) {
      manual_seed(uint64_t(10 + levels));
      const int64_t M = 77, I = 41, R = 69;
      const Tensor z = mat(M, I, kFloat32, dev), u_in = mat(I, R, kFloat32, dev, 0.2);
      std::vector<Tensor> a, u;
      for (int e = 0; e < levels; ++e) {
        a.push_back(softmax(mat(M, 5 + e, kFloat32, dev), -1));
        u.push_back(mat(5 + e, R, kFloat32, dev) + 1.0);
      }
      Tensor want = einsum("b i, i r -> b r", {z, u_in});
      for (int e = 0; e < levels; ++e) want = want * einsum("b n, n r -> b r", {a[size_t(e)], u[size_t(e)]});
      CHECK(rel_err(cp_hadamard(z, u_in, a, u), want) <= 1e-5);
    }
}

TEST_CASE("hadamard_gemm: gradcheck in float64 (one and two levels, with a scale)") {
  for (Device dev : test_devices())
    for (int factors : {1, 2, 3}) {
      manual_seed(uint64_t(20 + factors));
      TensorList in;
      const int64_t M = 4, R = 3;
      for (int k = 0; k < factors; ++k) in.push_back(on(rnd({M, 2 + k}, 30 + k).requires_grad_(), dev));
      for (int k = 0; k < factors; ++k) in.push_back(on(rnd({2 + k, R}, 40 + k).requires_grad_(), dev));
      in.push_back(on(rnd({M, R}, 50).requires_grad_(), dev));
      INFO(dev.str() << " factors=" << factors);
      auto with_scale = [factors](const TensorList& x) {
        std::vector<Tensor> a(x.begin(), x.begin() + factors), b(x.begin() + factors, x.begin() + 2 * factors);
        return hadamard_gemm(a, b, x[size_t(2 * factors)]);
      };
      CHECK_GRAD(with_scale, in);
      // Without a scale.
      TensorList in2(in.begin(), in.end() - 1);
      auto without_scale = [factors](const TensorList& x) {
        std::vector<Tensor> a(x.begin(), x.begin() + factors), b(x.begin() + factors, x.end());
        return hadamard_gemm(a, b);
      };
      CHECK_GRAD(without_scale, in2);
    }
}

TEST_CASE("hadamard_gemm: gradients on each device equal the einsum composition's and the CPU's float64 ones (float32, bfloat16)") {
  for (Device dev : test_devices())
    for (DType dt : {kFloat32, kBFloat16}) {
      manual_seed(60);
      const int64_t M = 70, R = 67;
      const std::vector<int64_t> K = {37, 6};
      // The same values for both graphs: leaves in dt on dev.
      std::vector<Tensor> a0, b0;
      for (int64_t k : K) {
        a0.push_back(mat(M, k, dt, dev));
        b0.push_back(mat(k, R, dt, dev, 1.0 / std::sqrt(double(k))));
      }
      const Tensor s0 = mat(M, R, dt, dev), w = mat(M, R, dt, dev);
      auto leaves = [&] {
        TensorList l;
        for (const Tensor& t : a0) l.push_back(t.detach().clone().requires_grad_());
        for (const Tensor& t : b0) l.push_back(t.detach().clone().requires_grad_());
        l.push_back(s0.detach().clone().requires_grad_());
        return l;
      };
      TensorList f = leaves(), c = leaves();
      sum(hadamard_gemm({f[0], f[1]}, {f[2], f[3]}, f[4]) * w).backward();
      sum(composed({c[0], c[1]}, {c[2], c[3]}, c[4]) * w).backward();
      // The reference every device is held to: the composition in float64 on the CPU, from
      // the same (rounded) values.
      TensorList r;
      for (const Tensor& t : leaves()) r.push_back(t.detach().to(kFloat64).cpu().requires_grad_());
      sum(composed({r[0], r[1]}, {r[2], r[3]}, r[4]) * w.to(kFloat64).cpu()).backward();
      check_fused_grads(f, c, r, dev, dt);
    }
}

TEST_CASE("hadamard_gemm under autocast runs float32 operands in bfloat16, gradients reach float32") {
  for (Device dev : test_devices()) {
    manual_seed(70);
    Tensor a = mat(9, 5, kFloat32, dev).requires_grad_(), b = mat(5, 7, kFloat32, dev).requires_grad_();
    Tensor y;
    {
      AutocastGuard amp;
      y = hadamard_gemm({a}, {b});
    }
    CHECK(y.dtype() == kBFloat16);
    CHECK(rel_err(y, a.detach().matmul(b.detach())) <= 2e-2);
    sum(y).backward();
    REQUIRE(b.grad().defined());
    CHECK(b.grad().dtype() == kFloat32);
  }
}

TEST_CASE("CP layer: the fused path equals the einsum path and the DenseMoE of its materialised tensor") {
  for (Device dev : test_devices())
    for (int64_t E : {1, 2})
      for (bool bias : {true, false}) {
        manual_seed(uint64_t(80 + E));
        const nn::MoEShape s = fused_check_shape(E, bias);
        INFO(dev.str() << " E=" << E << " bias=" << bias);
        check_fused_layer<nn::CPMuMoE>(s, dev, int64_t(70));
      }
}

TEST_CASE("CP layer: fused and einsum paths agree in float32 and bfloat16 (GPT-2-like proportions, small)") {
  for (Device dev : test_devices())
    for (DType dt : {kFloat32, kBFloat16}) {
      manual_seed(85);
      // I + 1 = 97 and R = 70: neither a multiple of the CUDA tiles nor of their depth.
      check_fused_layer_in<nn::CPMuMoE>(dt, nn::MoEShape{96, 40, {16}, true}, dev, int64_t(70));
    }
}

TEST_CASE("CP layer: gradcheck through the fused path; the block option turns it on") {
  manual_seed(90);
  gradcheck_fused_layer<nn::CPMuMoE>(nn::MoEShape{3, 2, {3, 2}, true}, int64_t(4));
  nn::MuMoE block(nn::MuMoEOptions(6, 4).experts({3}).kind(nn::MoEKind::CP).rank(5).fused_cp(true));
  auto* cp = dynamic_cast<const nn::CPMuMoE*>(block.layer(0).get());
  REQUIRE(cp != nullptr);
  CHECK(cp->fused());
}

TEST_CASE("hadamard_gemm: errors name the problem") {
  const Tensor a = zeros({4, 3}), b = zeros({3, 5});
  CHECK_THROWS_MU(hadamard_gemm({}, {}), "needs at least one product");
  CHECK_THROWS_MU(hadamard_gemm({a, a}, {b}), "2 left operands but 1 right operands");
  CHECK_THROWS_MU(hadamard_gemm({a}, {zeros({2, 5})}), "cannot be multiplied (3 != 2)");
  CHECK_THROWS_MU(hadamard_gemm({a, zeros({4, 2})}, {b, zeros({2, 6})}),
                  "product 1 has shape [4, 6] but product 0 has shape [4, 5]");
  CHECK_THROWS_MU(hadamard_gemm({a}, {b.to(kFloat64)}), "dtype mismatch: float64");
  CHECK_THROWS_MU(hadamard_gemm({a.to(kInt64)}, {b.to(kInt64)}), "int64 tensors are not supported");
  CHECK_THROWS_MU(hadamard_gemm({a}, {b}, zeros({4, 4})), "scale has shape [4, 4]; expected the products' shape [4, 5]");
  CHECK_THROWS_MU(hadamard_gemm({zeros({4})}, {b}), "must be two matrices");
  CHECK_THROWS_MU(cp_hadamard(a, b, {a}, {}), "1 coefficient matrices but 0 expert factors");
}
