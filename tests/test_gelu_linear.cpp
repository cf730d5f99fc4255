// gelu_linear (ops/linalg.h) against its materialised equivalent linear(gelu(h), w, b), on
// every test device: values and gradients for both GELU forms, with and without a bias,
// any subset of inputs asking for gradients; gradchecks; the bytes it does not keep; a
// retained graph; autocast; bad input.
#include "helpers.h"
#include "tensor/allocator.h"
#include "tensor/cuda.h"

using namespace mu;
using autograd::TensorList;

namespace {

MemoryStats stats(Device dev) { return dev.is_cpu() ? cpu_allocator::stats() : cuda::memory_stats(dev.index); }

}  // namespace

TEST_CASE("gelu_linear equals linear(gelu(h), w, b) in float64: both forms, bias or none, any inputs requiring grad") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    for (const char* form : {"none", "tanh"})
      for (bool with_bias : {false, true})
        for (Shape hs : {Shape{5, 6}, Shape{2, 3, 6}})
          for (int wanted = 1; wanted < 8; ++wanted) {  // bit 0: h, 1: w, 2: b
            INFO(form << " bias " << with_bias << " h " << shape_str(hs) << " wanted " << wanted);
            if (!with_bias && wanted == 4) continue;
            auto leaf = [&](const Tensor& t, bool grad) {
              Tensor d = on(t, dev);
              return grad ? d.requires_grad_() : d;
            };
            Tensor h1 = leaf(rnd(hs, 1) * 2.0, wanted & 1), w1 = leaf(rnd({4, 6}, 2), wanted & 2);
            Tensor b1 = with_bias ? leaf(rnd({4}, 3), wanted & 4) : Tensor();
            Tensor h2 = leaf(rnd(hs, 1) * 2.0, wanted & 1), w2 = leaf(rnd({4, 6}, 2), wanted & 2);
            Tensor b2 = with_bias ? leaf(rnd({4}, 3), wanted & 4) : Tensor();
            Tensor fused = gelu_linear(h1, w1, b1, form), plain = linear(gelu(h2, form), w2, b2);
            CHECK(max_abs_diff(fused, plain) < 1e-12);
            const Tensor up = on(rnd(plain.shape(), 4), dev);
            if (!fused.requires_grad()) continue;
            fused.backward(up);
            plain.backward(up);
            if (wanted & 1) CHECK(max_abs_diff(h1.grad(), h2.grad()) < 1e-12);
            if (wanted & 2) CHECK(max_abs_diff(w1.grad(), w2.grad()) < 1e-12);
            if (with_bias && (wanted & 4)) CHECK(max_abs_diff(b1.grad(), b2.grad()) < 1e-12);
          }
  }
}

TEST_CASE("gradcheck gelu_linear") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    for (const char* form : {"none", "tanh"}) {
      INFO(form);
      auto fn = [&](const TensorList& in) { return gelu_linear(in[0], in[1], in[2], form); };
      auto r = autograd::gradcheck(fn, {on(rnd({3, 5}, 11) * 2.0, dev).requires_grad_(),
                                        on(rnd({4, 5}, 12), dev).requires_grad_(), on(rnd({4}, 13), dev).requires_grad_()});
      CHECK_MESSAGE(r.ok, r.message);
    }
  }
}

TEST_CASE("gelu_linear keeps h, not gelu(h): the bytes held after the forward, one activation fewer") {
  const int64_t M = 64, in = 32, out = 16;
  for (Device dev : test_devices()) {
    INFO(dev.str());
    const Tensor h0 = on(randn({M, in}), dev), w0 = on(randn({out, in}), dev), b0 = on(randn({out}), dev);
    auto held_after_forward = [&](bool fused) {
      Tensor h = h0.detach().requires_grad_(), w = w0.detach().requires_grad_(), b = b0.detach().requires_grad_();
      const int64_t before = stats(dev).allocated_bytes;
      Tensor y = fused ? gelu_linear(h, w, b, "tanh") : linear(gelu(h, "tanh"), w, b);
      const int64_t held = stats(dev).allocated_bytes - before;
      y.backward(ones_like(y));
      return held;
    };
    const int64_t fused = held_after_forward(true), plain = held_after_forward(false);
    MESSAGE(dev.str() << ": bytes held after the forward, fused " << fused << ", unfused " << plain);
    // Both hold y; the unfused pair also holds gelu(h), (M, in) float32, for w's gradient.
    CHECK(plain - fused == M * in * 4);
  }
}

TEST_CASE("gelu_linear: a retained graph gives the same gradients every time") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    Tensor h = on(rnd({4, 6}, 21), dev).requires_grad_(), w = on(rnd({3, 6}, 22), dev).requires_grad_();
    Tensor y = gelu_linear(h, w, Tensor(), "none").sum();
    y.backward(Tensor(), true);
    const Tensor gh = h.grad().clone(), gw = w.grad().clone();
    y.backward();
    CHECK(max_abs_diff(h.grad(), gh * 2.0) < 1e-12);
    CHECK(max_abs_diff(w.grad(), gw * 2.0) < 1e-12);
  }
}

TEST_CASE("gelu_linear under autocast: bfloat16 product as linear's, float32 parameter gradients") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    const Tensor x0 = on(randn({24, 16}), dev), w10 = on(randn({32, 16}) * 0.3, dev);
    const Tensor w0 = on(randn({8, 32}) * 0.2, dev), b0 = on(randn({8}) * 0.1, dev);
    auto run = [&](bool fused) {
      Tensor x = x0.detach().requires_grad_(), w1 = w10.detach().requires_grad_();
      Tensor w = w0.detach().requires_grad_(), b = b0.detach().requires_grad_();
      Tensor y;
      {
        AutocastGuard amp;
        Tensor h = linear(x, w1);  // bfloat16, as an MLP's first layer gives it
        y = fused ? gelu_linear(h, w, b, "tanh") : linear(gelu(h, "tanh"), w, b);
      }
      CHECK(y.dtype() == kBFloat16);
      y.to(kFloat32).sum().backward();
      return std::vector<Tensor>{y.detach(), x.grad(), w1.grad(), w.grad(), b.grad()};
    };
    const auto f = run(true), p = run(false);
    CHECK(max_abs_diff(f[0], p[0]) == 0.0);  // the same bfloat16 operations forward
    for (size_t i = 1; i < f.size(); ++i) {
      INFO("gradient " << i);
      CHECK(f[i].dtype() == kFloat32);
      CHECK(max_abs_diff(f[i], p[i]) == 0.0);  // and backward: the same products of the same values
    }
  }
}

TEST_CASE("gelu_linear: bad input is refused by name") {
  const Tensor h = randn({4, 6}), w = randn({3, 6});
  CHECK_THROWS_MU(gelu_linear(h, w, Tensor(), "fast"), "gelu_linear: approximate must be \"none\" or \"tanh\", got \"fast\"");
  CHECK_THROWS_MU(gelu_linear(h, randn({3, 5})), "gelu_linear: input of shape [4, 6] does not end in the weight's in_features 5");
  CHECK_THROWS_MU(gelu_linear(h, randn({6})), "gelu_linear: weight must be 2-D (out_features, in_features), got shape [6]");
  CHECK_THROWS_MU(gelu_linear(h, w, randn({4})), "gelu_linear: bias must have shape (3), got [4]");
  CHECK_THROWS_MU(gelu_linear(h.to(kInt64), w), "gelu_linear: input must be floating point, got int64");
  CHECK_THROWS_MU(gelu_linear(h.to(kFloat64), w), "dtype mismatch");
}
