// Mixed precision (autograd/autocast.h) on every device: which ops run in bfloat16 and
// which in float32, the values against float32 within bfloat16's precision, float32
// master gradients, a whole GPT-2 step (dense and CPμMoE), and the guard's scoping.
//
// Tolerances: bfloat16 keeps 8 significant bits, a relative rounding of at most 2^-9
// (0.2 %) per element. A product whose operands are rounded once and whose sums run in
// float32 is within a few 2^-9 of the float32 one, relative to the magnitude of its
// terms; a whole model's loss within 2 %, its gradient within 5 % (relative norm of the
// difference); the bounds below are those.
#include <cmath>

#include "helpers.h"
#include "models/gpt2.h"

using namespace mu;

namespace {

// ||a - b|| / ||b|| over all elements, in double.
double relative_error(const Tensor& a, const Tensor& b) {
  std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  REQUIRE(x.size() == y.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    num += (x[i] - y[i]) * (x[i] - y[i]);
    den += y[i] * y[i];
  }
  return std::sqrt(num / den);
}

// x rounded to bfloat16 and widened back: what autocast's cast hands the kernel.
Tensor rounded(const Tensor& x) { return x.detach().to(kBFloat16).to(kFloat64); }

// How far the worst element of a bfloat16 result lies past one rounding of the reference
// to 8 bits (2^-8 of its magnitude) plus `slack` (the float32 sums' own error): <= 0 when
// every element is within.
double worst_past_rounding(const Tensor& got_t, const Tensor& want_t, double slack) {
  const std::vector<double> got = got_t.to_vector<double>(), want = want_t.to_vector<double>();
  REQUIRE(got.size() == want.size());
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i)
    worst = std::max(worst, std::fabs(got[i] - want[i]) - std::ldexp(std::fabs(want[i]), -8) - slack);
  return worst;
}

}  // namespace

TEST_CASE("autocast: matmul runs in bfloat16 on rounded operands with float32 sums; float32 gradients") {
  manual_seed(1);
  const Tensor a0 = randn({33, 70}), b0 = randn({70, 21});
  // The reference: the bfloat16-rounded operands multiplied in double, then rounded once.
  const Tensor want = matmul(rounded(a0), rounded(b0));
  for (Device dev : test_devices()) {
    INFO(dev.str());
    Tensor a = on(a0, dev).requires_grad_(), b = on(b0, dev).requires_grad_();
    Tensor y;
    {
      AutocastGuard amp;
      y = matmul(a, b);
    }
    CHECK(y.dtype() == kBFloat16);
    // One rounding of the float32 result to 8 bits: within 2^-8 of each value, plus the
    // float32 sums' own error (tiny).
    std::vector<double> got = y.to_vector<double>(), w = want.to_vector<double>();
    for (size_t i = 0; i < got.size(); ++i) {
      INFO("element " << i << ": " << got[i] << " vs " << w[i]);
      CHECK(std::fabs(got[i] - w[i]) <= std::ldexp(std::fabs(w[i]), -8) + 1e-5);
    }
    y.to(kFloat32).sum().backward();
    REQUIRE(a.grad().defined());
    CHECK(a.grad().dtype() == kFloat32);  // the master weights' gradient stays float32
    CHECK(b.grad().dtype() == kFloat32);
    // d(sum(a b))/da = 1 · bᵀ: row sums of b, each rounded to bfloat16 and summed in float32.
    Tensor ga_want = ones({33, 21}, kFloat64).matmul(rounded(b0).t());
    CHECK(relative_error(a.grad(), ga_want) < 1e-2);
  }
}

// A decoding step's products: 1 to 12 rows (16 without AVX512_BF16) by a transposed
// weight, whose bfloat16 values the CPU reads in place (ops/cpu/gemm.h,
// gemm_bf16_weight), and more rows, by gemm_bf16 or widened. Depths below, at and past a
// vector and past a depth chunk; columns likewise.
TEST_CASE("autocast: a few rows by a transposed weight match the rounded operands' product") {
  manual_seed(3);
  for (int64_t K : {16, 37, 300, 2100})
    for (int64_t N : {16, 33, 257}) {
      const Tensor w0 = randn({N, K});
      for (int64_t M : {1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 16, 17}) {
        const Tensor x0 = randn({M, K});
        const Tensor want = matmul(rounded(x0), rounded(w0).t());
        for (Device dev : test_devices()) {
          INFO(dev.str() << ": " << M << " x " << K << " by (" << N << " x " << K << ")ᵀ");
          Tensor y;
          {
            AutocastGuard amp;
            y = linear(on(x0, dev), on(w0, dev));  // the weight cast, then seen transposed
          }
          REQUIRE(y.dtype() == kBFloat16);
          // One rounding to 8 bits, plus the float32 sums' error relative to the terms.
          CHECK(worst_past_rounding(y, want, 1e-5 * double(K)) <= 0);
        }
      }
    }
}

// Batched products large enough for the CPU's bfloat16 kernel entry by entry
// (ops/cpu/gemm_bf16.cpp where the CPU has AVX512_BF16): bmm, and a matrix shared by the
// batch (matmul broadcasting it), each against the rounded operands' product.
TEST_CASE("autocast: batched products match the rounded operands' product entry by entry") {
  manual_seed(4);
  const Tensor a0 = randn({3, 40, 300}), b0 = randn({3, 300, 50}), s0 = randn({40, 300});
  for (Device dev : test_devices()) {
    INFO(dev.str());
    Tensor y, ys;
    {
      AutocastGuard amp;
      y = bmm(on(a0, dev), on(b0, dev));
      ys = matmul(on(s0, dev), on(b0, dev));
    }
    for (auto [got_t, want_t] : {std::pair<Tensor, Tensor>{y, matmul(rounded(a0), rounded(b0))},
                                 {ys, matmul(rounded(s0), rounded(b0))}}) {
      REQUIRE(got_t.dtype() == kBFloat16);
      CHECK(worst_past_rounding(got_t, want_t, 3e-3) <= 0);
    }
  }
}

// An MLP-Mixer's token weights: a matrix shared by many small entries (64 x 49 by 49 x 128,
// each too small for the CPU's GEMM to split, so the entries are shared out among the
// threads), and its gradient, the batch's products summed (on VDPBF16PS as the operands
// lie, where the CPU has AVX512_BF16), each against the rounded operands in double.
TEST_CASE("autocast: a matrix shared by many small entries, and its gradient summed over the batch") {
  manual_seed(5);
  const Tensor s0 = randn({64, 49}), x0 = randn({24, 49, 128}), up0 = randn({24, 64, 128});
  const Tensor y_want = matmul(rounded(s0), rounded(x0));
  // The upstream gradient reaches the bfloat16 product rounded to bfloat16.
  const Tensor ds_want = matmul(rounded(up0), rounded(x0).transpose(1, 2)).sum({0});
  const Tensor ds_mag = matmul(rounded(up0).abs(), rounded(x0).abs().transpose(1, 2)).sum({0});
  for (Device dev : test_devices()) {
    INFO(dev.str());
    Tensor sp = on(s0, dev).requires_grad_(), y;
    {
      AutocastGuard amp;
      y = matmul(sp, on(x0, dev));
    }
    REQUIRE(y.dtype() == kBFloat16);
    CHECK(worst_past_rounding(y, y_want, 1e-4) <= 0);
    (y.to(kFloat32) * on(up0, dev)).sum().backward();
    REQUIRE(sp.grad().dtype() == kFloat32);
    // The float32 sum rounded once to bfloat16 (the product's dtype), then widened.
    std::vector<double> g = sp.grad().to_vector<double>(), gw = ds_want.to_vector<double>(),
                        mag = ds_mag.to_vector<double>();
    double worst = 0;
    for (size_t i = 0; i < g.size(); ++i)
      worst = std::max(worst, std::fabs(g[i] - gw[i]) - std::ldexp(std::fabs(gw[i]), -8) - 1e-5 * mag[i]);
    CHECK(worst <= 0);
  }
}

// Tiny batched products (a tensor ring's per-token chains: 4 x 9 by 9 x 4, 4 x 24 by 24 x
// 20), which the CPU multiplies in float32 from the bfloat16 values, B row-major and
// transposed: each against the rounded operands' product.
TEST_CASE("autocast: tiny batched products match the rounded operands' product") {
  manual_seed(6);
  for (auto [M, K, N] : {std::array<int64_t, 3>{4, 9, 4}, {4, 24, 20}, {3, 64, 32}}) {
    const Tensor a0 = randn({50, M, K}), b0 = randn({50, K, N}), bt0 = randn({50, N, K});
    for (Device dev : test_devices()) {
      INFO(dev.str() << ": " << M << " x " << K << " by " << K << " x " << N);
      Tensor y, yt;
      {
        AutocastGuard amp;
        y = bmm(on(a0, dev), on(b0, dev));
        yt = bmm(on(a0, dev), on(bt0, dev).transpose(1, 2));
      }
      for (auto [got_t, want_t] : {std::pair<Tensor, Tensor>{y, matmul(rounded(a0), rounded(b0))},
                                   {yt, matmul(rounded(a0), rounded(bt0).transpose(1, 2))}}) {
        REQUIRE(got_t.dtype() == kBFloat16);
        CHECK(worst_past_rounding(got_t, want_t, 1e-4) <= 0);
      }
    }
  }
}

TEST_CASE("autocast: a Linear layer adds its bias in bfloat16, its output stays bfloat16, its gradients float32") {
  manual_seed(4);
  nn::Linear lin(nn::LinearOptions(12, 5));
  const Tensor x0 = randn({7, 12});
  // The reference: rounded operands multiplied in double, plus the rounded bias.
  const Tensor product = matmul(rounded(x0), rounded(lin.weight).t());
  const Tensor want = product + rounded(lin.bias);
  const std::vector<double> pv = product.to_vector<double>();
  for (Device dev : test_devices()) {
    INFO(dev.str());
    lin.to(dev);
    lin.zero_grad();
    Tensor y;
    {
      AutocastGuard amp;
      y = lin.forward(on(x0, dev));
    }
    CHECK(y.dtype() == kBFloat16);
    // Two roundings to 8 bits, each within 2^-8 of its value: the product's, then the
    // sum's with the bias (the float32 sums' own error is far below).
    std::vector<double> got = y.to_vector<double>(), w = want.to_vector<double>();
    for (size_t i = 0; i < got.size(); ++i) {
      INFO("element " << i << ": " << got[i] << " vs " << w[i]);
      CHECK(std::fabs(got[i] - w[i]) <= std::ldexp(std::fabs(pv[i]), -8) + std::ldexp(std::fabs(w[i]), -8) + 1e-5);
    }
    y.to(kFloat32).sum().backward();
    REQUIRE(lin.bias.grad().defined());
    CHECK(lin.bias.grad().dtype() == kFloat32);
    CHECK(lin.weight.grad().dtype() == kFloat32);
    // d(sum y)/d bias = the 7 rows' ones, summed exactly even in bfloat16.
    CHECK(lin.bias.grad().to_vector<double>() == std::vector<double>(5, 7.0));
    lin.to(Device::cpu());
  }
}

// A Linear layer over many rows (the blocked GEMM: on VDPBF16PS where the CPU has
// AVX512_BF16, else float32 with the operands widened as they are packed): the bias is
// added to the float32 sums and the total rounded once, for rows and columns past whole
// tiles; batched input (a leading dimension) likewise.
TEST_CASE("autocast: a Linear layer over many rows rounds its product plus bias once") {
  manual_seed(6);
  nn::Linear lin(nn::LinearOptions(300, 270));
  for (const Shape& shape : {Shape{301, 300}, Shape{2, 150, 300}}) {
    const Tensor x0 = randn(shape);
    const Tensor want = matmul(rounded(x0), rounded(lin.weight).t()) + rounded(lin.bias);
    for (Device dev : test_devices()) {
      INFO(dev.str() << ": input " << shape_str(shape));
      lin.to(dev);
      Tensor y;
      {
        AutocastGuard amp;
        y = lin.forward(on(x0, dev));
      }
      REQUIRE(y.dtype() == kBFloat16);
      CHECK(worst_past_rounding(y, want, 1e-5 * 300) <= 0);
      lin.to(Device::cpu());
    }
  }
}

TEST_CASE("autocast: softmax, log_softmax, layer_norm, entmax and cross_entropy compute in float32") {
  manual_seed(2);
  const Tensor x0 = randn({6, 10});
  const Tensor target0 = from_vector(std::vector<int64_t>{1, 0, 9, 3, 3, 7}, {6});
  for (Device dev : test_devices()) {
    INFO(dev.str());
    AutocastGuard amp;
    Tensor xb = on(x0, dev).to(kBFloat16);
    const Tensor xf = xb.to(kFloat32);  // the same values, in float32
    CHECK(softmax(xb, 1).dtype() == kFloat32);
    CHECK(max_abs_diff(softmax(xb, 1), softmax(xf, 1)) == 0.0);
    CHECK(max_abs_diff(log_softmax(xb, 1), log_softmax(xf, 1)) == 0.0);
    CHECK(max_abs_diff(layer_norm(xb, {10}), layer_norm(xf, {10})) == 0.0);
    CHECK(max_abs_diff(nn::entmax15(xb, 1), nn::entmax15(xf, 1)) == 0.0);
    Tensor t = on(target0, dev);
    CHECK(cross_entropy(xb, t).dtype() == kFloat32);
    CHECK(cross_entropy(xb, t).item() == cross_entropy(xf, t).item());
    // bfloat16 logits are read as they are: the gradient is the float32 one, rounded once.
    Tensor xg = xb.detach().requires_grad_(), xfg = xf.detach().requires_grad_();
    cross_entropy(xg, t).backward();
    cross_entropy(xfg, t).backward();
    REQUIRE(xg.grad().dtype() == kBFloat16);
    CHECK(max_abs_diff(xg.grad(), xfg.grad().to(kBFloat16)) == 0.0);
  }
}

TEST_CASE("autocast: einsum and attention run in bfloat16 and stay close to float32") {
  manual_seed(3);
  const Tensor x0 = randn({4, 5, 16}), w0 = randn({16, 3, 8});
  const Tensor q0 = randn({2, 2, 9, 16}), k0 = randn({2, 2, 9, 16}), v0 = randn({2, 2, 9, 16});
  for (Device dev : test_devices()) {
    INFO(dev.str());
    Tensor x = on(x0, dev), w = on(w0, dev);
    Tensor q = on(q0, dev).requires_grad_(), k = on(k0, dev).requires_grad_(), v = on(v0, dev).requires_grad_();
    Tensor e, att;
    {
      AutocastGuard amp;
      e = einsum("bti,ioe->bote", {x, w});
      att = scaled_dot_product_attention(q, k, v, /*causal=*/true);
    }
    CHECK(e.dtype() == kBFloat16);
    CHECK(relative_error(e, einsum("bti,ioe->bote", {x, w})) < 1e-2);
    CHECK(att.dtype() == kBFloat16);
    Tensor ref = scaled_dot_product_attention(q.detach(), k.detach(), v.detach(), true);
    CHECK(relative_error(att, ref) < 1e-2);
    att.to(kFloat32).pow(2).sum().backward();
    for (Tensor* t : {&q, &k, &v}) CHECK(t->grad().dtype() == kFloat32);
    Tensor q2 = on(q0, dev).requires_grad_(), k2 = on(k0, dev).requires_grad_(), v2 = on(v0, dev).requires_grad_();
    scaled_dot_product_attention(q2, k2, v2, true).pow(2).sum().backward();
    CHECK(relative_error(q.grad(), q2.grad()) < 3e-2);
    CHECK(relative_error(k.grad(), k2.grad()) < 3e-2);
    CHECK(relative_error(v.grad(), v2.grad()) < 3e-2);
  }
}

TEST_CASE("autocast: a GPT-2 step (dense and CPμMoE MLPs) stays within 2 % of the loss and 5 % of the gradient") {
  for (const std::string mlp : {"dense", "cp"}) {
    INFO("mlp " << mlp);
    models::GPT2Config c;
    c.n_layer = 2;
    c.n_head = 2;
    c.n_embd = 32;
    c.block_size = 16;
    c.vocab_size = 50;
    if (mlp == "cp") c.mlp = models::mlp::cp_mumoe(8, 16);
    Generator data(9);
    const Tensor idx0 = randint(0, 50, {3, 16}, TensorOptions(kInt64), &data);
    const Tensor tgt0 = randint(0, 50, {3, 16}, TensorOptions(kInt64), &data);
    for (Device dev : test_devices()) {
      INFO(dev.str());
      Generator g1(4), g2(4);
      models::GPT2 full(c, &g1), mixed(c, &g2);  // equal weights
      full.to(dev);
      mixed.to(dev);
      const Tensor idx = idx0.to(dev), tgt = tgt0.to(dev);
      Tensor lf = full.forward(idx, tgt).loss;
      lf.backward();
      Tensor lm;
      {
        AutocastGuard amp;
        lm = mixed.forward(idx, tgt).loss;
        lm.backward();
      }
      CHECK(lm.dtype() == kFloat32);
      MESSAGE(mlp << " on " << dev.str() << ": loss " << lf.item() << " float32, " << lm.item() << " autocast");
      CHECK(std::fabs(lm.item() - lf.item()) < 0.02 * std::fabs(lf.item()));
      CHECK(lm.item() != lf.item());  // the bfloat16 products did run
      std::vector<Tensor> pf = full.parameters(), pm = mixed.parameters();
      REQUIRE(pf.size() == pm.size());
      double num = 0, den = 0;
      for (size_t i = 0; i < pf.size(); ++i) {
        REQUIRE(pm[i].grad().defined());
        CHECK(pm[i].dtype() == kFloat32);
        CHECK(pm[i].grad().dtype() == kFloat32);
        Tensor d = (pm[i].grad() - pf[i].grad()).to(kFloat64);
        num += (d * d).sum().item();
        den += (pf[i].grad().to(kFloat64).pow(2)).sum().item();
      }
      MESSAGE(mlp << " on " << dev.str() << ": gradient relative error " << std::sqrt(num / den));
      CHECK(std::sqrt(num / den) < 0.05);
      CHECK(num > 0);
    }
  }
}

TEST_CASE("autocast: the guard nests and restores; backward runs without it; float16 is refused") {
  CHECK(!autograd::is_autocast_enabled());
  {
    AutocastGuard amp;
    CHECK(autograd::is_autocast_enabled());
    {
      AutocastGuard off(kBFloat16, false);
      CHECK(!autograd::is_autocast_enabled());
      CHECK(matmul(ones({2, 2}), ones({2, 2})).dtype() == kFloat32);
    }
    CHECK(autograd::is_autocast_enabled());
    // float64 is left alone: only float32 operands are cast.
    CHECK(matmul(ones({2, 2}, kFloat64), ones({2, 2}, kFloat64)).dtype() == kFloat64);
    // mixed float32 and bfloat16 operands meet in bfloat16
    CHECK(matmul(ones({2, 2}), ones({2, 2}).to(kBFloat16)).dtype() == kBFloat16);
  }
  CHECK(!autograd::is_autocast_enabled());
  // Without autocast, mixed dtypes are an error naming both.
  CHECK_THROWS_MU(matmul(ones({2, 2}), ones({2, 2}).to(kBFloat16)), "matmul: dtype mismatch: float32 vs bfloat16");
  CHECK_THROWS_MU(AutocastGuard(kFloat16), "the autocast dtype is bfloat16, got float16");
  // A float32 tensor's gradient through a float32 product, the backward called inside a
  // guard: the gradient formulas use the forward's dtypes, not the guard's.
  Tensor a = ones({2, 3}).requires_grad_();
  Tensor y = matmul(a, ones({3, 2}));
  {
    AutocastGuard amp;
    y.sum().backward();
  }
  CHECK(a.grad().dtype() == kFloat32);
  CHECK(a.grad().to_vector<float>() == std::vector<float>(6, 2.0f));
}

// Parameters cast where no graph is recorded are cast once per outermost guard: the
// cached copy is the one a fresh cast makes, it is made again after the parameter changes
// in place, it is not kept for casts inside a recorded graph (whose gradient must reach
// the parameter), views and non-parameters are not kept, and the last guard empties it.
TEST_CASE("autocast: a parameter's cast is kept while no graph is recorded, until it changes or the guard ends") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(3);
    Tensor w = on(randn({8, 4}), dev).requires_grad_(), x = on(randn({3, 4}), dev);
    const Tensor want = matmul(x.to(kBFloat16), w.detach().to(kBFloat16).t()).cpu();
    {
      AutocastGuard amp;
      {
        NoGradGuard no_grad;
        const Tensor first = linear(x, w), second = linear(x, w);
        CHECK(autograd::autocast::cached_casts() == 1);
        CHECK(max_abs_diff(first.cpu(), want) == 0);
        CHECK(max_abs_diff(second.cpu(), want) == 0);
        // Views made without a graph (w.t()) and tensors that are not parameters are cast
        // on every use, not kept.
        matmul(x, w.t());
        linear(x, w.detach());
        CHECK(autograd::autocast::cached_casts() == 1);
        // Given other data (set_data, as Module::to does; both storages at version 0):
        // cast again from it.
        w.set_data(on(randn({8, 4}), dev));
        CHECK(max_abs_diff(linear(x, w).cpu(), matmul(x.to(kBFloat16), w.detach().to(kBFloat16).t()).cpu()) == 0);
        CHECK(autograd::autocast::cached_casts() == 1);
        // Changed in place: cast again, and the new cast kept in the old one's place.
        w.mul_(2.0);
        CHECK(max_abs_diff(linear(x, w).cpu(), matmul(x.to(kBFloat16), w.detach().to(kBFloat16).t()).cpu()) == 0);
        CHECK(autograd::autocast::cached_casts() == 1);
        // A nested guard leaves the cache to the outer one.
        { AutocastGuard inner; }
        CHECK(autograd::autocast::cached_casts() == 1);
      }
      // With a graph: a fresh cast, whose gradient reaches w in float32.
      Tensor y = linear(x, w);
      y.to(kFloat32).sum().backward();
      REQUIRE(w.grad().defined());
      CHECK(w.grad().dtype() == kFloat32);
      CHECK(max_abs_diff(w.grad().cpu(), x.to(kBFloat16).to(kFloat32).sum({0}, true).expand({8, 4}).cpu()) <= 1e-2);
    }
    CHECK(autograd::autocast::cached_casts() == 0);
  }
}
