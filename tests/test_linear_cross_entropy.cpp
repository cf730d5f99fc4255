// linear_cross_entropy (ops/loss.h): the chunked head-and-loss against its materialised
// equivalent, cross_entropy(linear(x, W, b), t), on every test device: loss and every
// gradient for each option and chunk size, gradchecks, the upstream gradient's scaling,
// a weight reached by a second path, autocast, the memory it holds, and bad input.
#include <cmath>
#include <limits>

#include "helpers.h"
#include "tensor/allocator.h"
#include "tensor/cuda.h"

using namespace mu;
using autograd::TensorList;

namespace {

const Reduction kReductions[] = {Reduction::None, Reduction::Mean, Reduction::Sum};
const char* rname(Reduction r) { return r == Reduction::None ? "none" : r == Reduction::Sum ? "sum" : "mean"; }

// Targets in [0, classes), class 2 at every fifth position (the ignore_index of some
// cases), never all of them.
Tensor targets(const Shape& s, int64_t classes) {
  const int64_t n = numel_of(s);
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = i % 5 == 2 ? 2 : (i * 7 + 3) % classes;
  return from_vector(v, s);
}

// The loss and the gradients of input, weight and bias (undefined where absent) after a
// backward with upstream values `up` (a scalar, or one per position for None).
struct Run {
  Tensor loss, dx, dw, db;
};

Run run(bool fused, const Tensor& x0, const Tensor& w0, const Tensor& b0, const Tensor& t, const CrossEntropyOptions& o,
        int64_t chunk_rows, const Tensor& up) {
  Tensor x = x0.detach().requires_grad_(), w = w0.detach().requires_grad_();
  Tensor b = b0.defined() ? b0.detach().requires_grad_() : Tensor();
  // The unfused head: logits (..., classes) flattened to rows, as a language model's are
  // (cross_entropy's classes are along dim 1).
  Tensor loss = fused ? linear_cross_entropy(x, w, b, t, o, chunk_rows)
                      : cross_entropy(linear(x, w, b).reshape({-1, w.size(0)}), t.reshape({-1}), o);
  if (!fused && o.reduction() == Reduction::None) loss = loss.reshape(t.shape());
  loss.backward(up);
  return {loss.detach(), x.grad(), w.grad(), b.defined() ? b.grad() : Tensor()};
}

// max |a - b| treating two NaNs as equal, and a NaN against a number as infinitely far.
double diff(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined()) return a.defined() == b.defined() ? 0.0 : INFINITY;
  REQUIRE(a.shape() == b.shape());
  auto x = a.to_vector<double>(), y = b.to_vector<double>();
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(x[i]) && std::isnan(y[i])) continue;
    const double d = std::abs(x[i] - y[i]);
    m = std::max(m, std::isnan(d) ? INFINITY : d);
  }
  return m;
}

double max_abs(const Tensor& a) {
  double m = 0;
  for (double v : a.to_vector<double>()) m = std::max(m, std::abs(v));
  return m;
}

MemoryStats stats(Device dev) { return dev.is_cpu() ? cpu_allocator::stats() : cuda::memory_stats(dev.index); }
void reset_peak(Device dev) {
  if (dev.is_cpu()) cpu_allocator::reset_peak();
  else cuda::reset_peak_memory(dev.index);
}

}  // namespace

TEST_CASE("linear_cross_entropy equals cross_entropy(linear(...)) in float64: every option, layout and chunk size") {
  const int64_t V = 11, K = 5;
  const Tensor weight = rnd({V, K}, 1), bias = rnd({V}, 2) * 0.5, class_w = rand({V}, kFloat64) + 0.5;
  for (Device dev : test_devices()) {
    INFO(dev.str());
    for (Shape rows : {Shape{7}, Shape{2, 3}, Shape{1}}) {
      const Tensor x = on(rnd(rows == Shape{7} ? Shape{7, K} : rows == Shape{1} ? Shape{1, K} : Shape{2, 3, K}, 3) * 2.0, dev);
      const Tensor t = on(targets(rows, V), dev), w = on(weight, dev);
      for (bool with_bias : {false, true})
        for (bool weighted : {false, true})
          for (int64_t ignore : {int64_t(-100), int64_t(2)})
            for (double smoothing : {0.0, 0.2})
              for (Reduction r : kReductions)
                for (int64_t chunk : {0, 1, 3, 7, 100}) {
                  INFO("rows " << shape_str(rows) << " bias " << with_bias << " weighted " << weighted << " ignore "
                               << ignore << " smoothing " << smoothing << " " << rname(r) << " chunk " << chunk);
                  CrossEntropyOptions o = CrossEntropyOptions().ignore_index(ignore).label_smoothing(smoothing).reduction(r);
                  if (weighted) o.weight(on(class_w, dev));
                  const Tensor b = with_bias ? on(bias, dev) : Tensor();
                  // Upstream values: one per position for None (not all equal), 1.7 otherwise.
                  const Tensor up = r == Reduction::None ? on(rnd(rows, 4), dev) : on(full({}, 1.7, kFloat64), dev);
                  const Run f = run(true, x, w, b, t, o, chunk, up), c = run(false, x, w, b, t, o, chunk, up);
                  CHECK(f.loss.shape() == c.loss.shape());
                  CHECK(diff(f.loss, c.loss) < 1e-12);
                  CHECK(diff(f.dx, c.dx) < 1e-12);
                  CHECK(diff(f.dw, c.dw) < 1e-12);
                  CHECK(diff(f.db, c.db) < 1e-12);
                }
    }
  }
}

TEST_CASE("gradcheck linear_cross_entropy: input, weight and bias, each reduction, chunks that split the rows") {
  const Tensor class_w = rand({6}, kFloat64) + 0.5;
  for (Device dev : test_devices()) {
    INFO(dev.str());
    const Tensor t = on(targets({7}, 6), dev);
    for (Reduction r : kReductions)
      for (bool options_on : {false, true}) {
        INFO(rname(r) << " class weights, ignore_index and smoothing: " << options_on);
        CrossEntropyOptions o = CrossEntropyOptions().reduction(r);
        if (options_on) o.weight(on(class_w, dev)).ignore_index(2).label_smoothing(0.3);
        auto fn = [&](const TensorList& in) { return linear_cross_entropy(in[0], in[1], in[2], t, o, 3); };
        TensorList inputs{on(rnd({7, 4}, 11), dev).requires_grad_(), on(rnd({6, 4}, 12), dev).requires_grad_(),
                          on(rnd({6}, 13), dev).requires_grad_()};
        auto res = autograd::gradcheck(fn, inputs);
        CHECK_MESSAGE(res.ok, res.message);
        // Without a bias, and with only the weight asking for a gradient.
        auto fn_w = [&](const TensorList& in) {
          return linear_cross_entropy(on(rnd({7, 4}, 11), dev), in[0], Tensor(), t, o, 2);
        };
        auto res_w = autograd::gradcheck(fn_w, {on(rnd({6, 4}, 12), dev).requires_grad_()});
        CHECK_MESSAGE(res_w.ok, res_w.message);
      }
  }
}

TEST_CASE("linear_cross_entropy: loss.backward() hands its gradients over; retained, they are scaled and stay intact") {
  const int64_t V = 9, K = 4;
  for (Device dev : test_devices()) {
    INFO(dev.str());
    const Tensor x0 = on(rnd({6, K}, 21), dev), w0 = on(rnd({V, K}, 22), dev), t = on(targets({6}, V), dev);
    // The weight is also reached by a second path (as GPT-2's is by its embedding), so its
    // gradient is a sum that the engine may take in place over the first one it got.
    // The upstream value is 1 (handed over as they are) or 1.5 (scaled).
    for (double upstream : {1.0, 1.5})
    for (bool second_path : {false, true}) {
      INFO("weight also reached by a second path: " << second_path << ", upstream " << upstream);
      auto loss_of = [&](bool fused, const Tensor& x, const Tensor& w) {
        Tensor head = fused ? linear_cross_entropy(x, w, Tensor(), t, CrossEntropyOptions(), 4)
                            : cross_entropy(linear(x, w), t);
        if (upstream != 1.0) head = head * upstream;
        return second_path ? head + (w * w).sum() * 0.5 : head;
      };
      auto grads = [&](bool fused, int backwards) {
        Tensor x = x0.detach().requires_grad_(), w = w0.detach().requires_grad_();
        Tensor loss = loss_of(fused, x, w);
        for (int i = 0; i < backwards; ++i) loss.backward(Tensor(), i + 1 < backwards);
        return std::pair{x.grad(), w.grad()};
      };
      // Once, the graph freed: the gradients handed over.
      auto [fx, fw] = grads(true, 1);
      auto [cx, cw] = grads(false, 1);
      CHECK(max_abs_diff(fx, cx) < 1e-12);
      CHECK(max_abs_diff(fw, cw) < 1e-12);
      // Three times, the graph retained by the first two: three times the gradients, so the
      // sums taken into x.grad and w.grad did not change what the node holds.
      auto [fx3, fw3] = grads(true, 3);
      CHECK(max_abs_diff(fx3, cx * 3.0) < 1e-12);
      CHECK(max_abs_diff(fw3, cw * 3.0) < 1e-12);
    }
  }
}

TEST_CASE("linear_cross_entropy under autocast: bfloat16 products, float32 losses and gradients, as the unfused head") {
  const int64_t V = 50, K = 24, N = 40;
  for (Device dev : test_devices()) {
    INFO(dev.str());
    const Tensor x = on(randn({N, K}), dev), w = on(randn({V, K}) * 0.3, dev), b = on(randn({V}) * 0.1, dev);
    const Tensor t = on(targets({N}, V), dev);
    const CrossEntropyOptions o = CrossEntropyOptions().ignore_index(2);
    const Tensor up = on(full({}, 1.0), dev);
    Run f, c;
    {
      AutocastGuard amp;
      f = run(true, x, w, b, t, o, 16, up);
      c = run(false, x, w, b, t, o, 16, up);
    }
    // The float64 reference, to which both are bfloat16-close.
    const Run ref = run(false, x.to(kFloat64), w.to(kFloat64), b.to(kFloat64), t, o, 0, up.to(kFloat64));
    CHECK(f.loss.dtype() == kFloat32);
    CHECK(f.dx.dtype() == kFloat32);
    CHECK(f.dw.dtype() == kFloat32);
    CHECK(f.db.dtype() == kFloat32);
    // The loss reads the same bfloat16 logits in both.
    CHECK(diff(f.loss, c.loss) < 1e-5 * std::abs(c.loss.item()));
    CHECK(diff(f.loss, ref.loss) < 2e-2 * std::abs(ref.loss.item()));
    // Gradients: the unfused head rounds dx and dW to bfloat16 (2^-8 relative), the fused
    // one keeps them in float32.
    for (auto [g, gc, gr, name] : {std::tuple{f.dx, c.dx, ref.dx, "dx"}, std::tuple{f.dw, c.dw, ref.dw, "dw"},
                                   std::tuple{f.db, c.db, ref.db, "db"}}) {
      INFO(name);
      CHECK(diff(g, gc) < 1e-2 * max_abs(gc));
      CHECK(diff(g, gr) < 3e-2 * max_abs(gr));
    }
  }
}

TEST_CASE("linear_cross_entropy on bfloat16 tensors, without autocast: bfloat16 gradients, float32 loss") {
  const int64_t V = 30, K = 16, N = 24;
  for (Device dev : test_devices()) {
    INFO(dev.str());
    const Tensor x = on(randn({N, K}).to(kBFloat16), dev), w = on((randn({V, K}) * 0.3).to(kBFloat16), dev);
    const Tensor t = on(targets({N}, V), dev), up = on(full({}, 1.0), dev);
    const Run f = run(true, x, w, Tensor(), t, CrossEntropyOptions(), 7, up);
    const Run c = run(false, x, w, Tensor(), t, CrossEntropyOptions(), 7, up);
    CHECK(f.loss.dtype() == kFloat32);
    CHECK(f.dx.dtype() == kBFloat16);
    CHECK(f.dw.dtype() == kBFloat16);
    CHECK(diff(f.loss, c.loss) < 1e-5 * std::abs(c.loss.item()));
    // Both round dx and dW to bfloat16 once; the fused dW sums its chunks in float32 first.
    CHECK(diff(f.dx, c.dx) < 1e-2 * max_abs(c.dx));
    CHECK(diff(f.dw, c.dw) < 1e-2 * max_abs(c.dw));
  }
}

TEST_CASE("linear_cross_entropy holds one chunk of logits, not all of them") {
  // 512 rows, 4096 classes: 8 MiB of float32 logits; chunks of 32 rows hold 512 KiB.
  const int64_t N = 512, K = 16, V = 4096, rows = 32;
  for (Device dev : test_devices()) {
    INFO(dev.str());
    const Tensor x0 = on(randn({N, K}), dev), w0 = on(randn({V, K}) * 0.1, dev), t = on(targets({N}, V), dev);
    // The peak above what was held before the forward, and the backward's own.
    auto peak_of = [&](bool fused) {
      Tensor x = x0.detach().requires_grad_(), w = w0.detach().requires_grad_();
      const int64_t before = stats(dev).allocated_bytes;
      reset_peak(dev);
      int64_t forward_peak = 0, backward_peak = 0;
      {
        Tensor loss = fused ? linear_cross_entropy(x, w, Tensor(), t, CrossEntropyOptions(), rows)
                            : cross_entropy(linear(x, w), t);
        forward_peak = stats(dev).peak_bytes - before;
        const int64_t held = stats(dev).allocated_bytes;
        reset_peak(dev);
        loss.backward();
        backward_peak = stats(dev).peak_bytes - held;
      }
      return std::pair{std::max(forward_peak, backward_peak), backward_peak};
    };
    const auto [fused, fused_backward] = peak_of(true);
    const auto [plain, plain_backward] = peak_of(false);
    const int64_t f32 = 4, logits = N * V * f32, chunk = rows * V * f32, grads = (N * K + V * K) * f32;
    MESSAGE(dev.str() << ": peak above the inputs, fused " << fused << " bytes, unfused " << plain << "; logits "
                      << logits << ", one chunk " << chunk);
    // Unfused: at least the logits. Fused: a chunk, the gradients of x and W (twice: the
    // accumulators and x.grad / w.grad) and the per-row losses and log-sum-exps, plus 64 KiB
    // for the allocator's rounding and the scalars.
    CHECK(plain >= logits);
    CHECK(fused <= chunk + 2 * grads + N * (f32 + 8) + 65536);
    // The unfused backward writes the logits' gradient over them (ops/loss.cpp): it
    // allocates the gradients of x and W, not another (N, V).
    CHECK(plain_backward <= 2 * grads + 65536);
    // The backward hands the gradients computed in the forward over to x.grad and w.grad,
    // without a copy: it allocates at most the scalars of the loss's own gradient.
    MESSAGE(dev.str() << ": the backward's own peak, fused " << fused_backward << " bytes, unfused " << plain_backward);
    CHECK(fused_backward < 4096);
  }
}

TEST_CASE("linear_cross_entropy: no rows, every target ignored, no grad mode") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    const Tensor w = on(rnd({5, 3}, 31), dev);
    for (Reduction r : kReductions) {
      INFO(rname(r));
      const Tensor up = r == Reduction::None ? Tensor() : on(full({}, 1.0, kFloat64), dev);
      // No rows: Mean is 0 / 0 (NaN), Sum 0, None empty, with empty and zero gradients, as
      // the unfused head gives.
      const Tensor x0 = on(zeros({0, 3}, kFloat64), dev), t0 = on(zeros({0}, kInt64), dev);
      const CrossEntropyOptions o = CrossEntropyOptions().reduction(r).ignore_index(1);
      const Tensor up0 = r == Reduction::None ? on(zeros({0}, kFloat64), dev) : up;
      Run f = run(true, x0, w, Tensor(), t0, o, 0, up0), c = run(false, x0, w, Tensor(), t0, o, 0, up0);
      CHECK(diff(f.loss, c.loss) == 0.0);
      CHECK(diff(f.dw, c.dw) == 0.0);
      CHECK(f.dx.shape() == Shape{0, 3});
      // Every target ignored.
      const Tensor x = on(rnd({4, 3}, 32), dev), t = on(full({4}, 1.0, kInt64), dev);
      const Tensor up4 = r == Reduction::None ? on(rnd({4}, 33), dev) : up;
      f = run(true, x, w, Tensor(), t, o, 3, up4);
      c = run(false, x, w, Tensor(), t, o, 3, up4);
      CHECK(diff(f.loss, c.loss) == 0.0);
      CHECK(diff(f.dx, c.dx) == 0.0);
      CHECK(diff(f.dw, c.dw) == 0.0);
    }
    // No grad mode: the loss alone, no graph.
    const Tensor x = on(rnd({4, 3}, 34), dev).requires_grad_(), t = on(targets({4}, 5), dev);
    const Tensor wg = w.detach().requires_grad_();
    Tensor plain = cross_entropy(linear(x, wg), t);
    NoGradGuard no_grad;
    Tensor fused = linear_cross_entropy(x, wg, Tensor(), t, CrossEntropyOptions(), 3);
    CHECK(!fused.requires_grad());
    CHECK(std::abs(fused.item() - plain.item()) < 1e-12);
  }
}

TEST_CASE("linear_cross_entropy: bad input is refused by name") {
  const Tensor x = randn({4, 3}), w = randn({5, 3}), t = from_vector(std::vector<int64_t>{0, 4, 2, 1}, {4});
  const CrossEntropyOptions o;
  CHECK_THROWS_MU(linear_cross_entropy(x, randn({5, 2}), Tensor(), t),
                  "linear_cross_entropy: input of shape [4, 3] does not end in the weight's in_features 2");
  CHECK_THROWS_MU(linear_cross_entropy(x, randn({5}), Tensor(), t), "linear_cross_entropy: weight must be 2-D (out_features, in_features), got shape [5]");
  CHECK_THROWS_MU(linear_cross_entropy(x, w, randn({4}), t), "bias must have shape (5), got [4]");
  CHECK_THROWS_MU(linear_cross_entropy(x, w, Tensor(), from_vector(std::vector<int64_t>{0, 1, 2}, {3})),
                  "target of shape [3] does not match input of shape [4, 3] (expected [4])");
  CHECK_THROWS_MU(linear_cross_entropy(x, w, Tensor(), from_vector(std::vector<int64_t>{0, 5, 2, 1}, {4})),
                  "linear_cross_entropy: target 5 is out of bounds for 5 classes (at position 1)");
  CHECK_THROWS_MU(linear_cross_entropy(x, w, Tensor(), t.to(kFloat32)), "target must hold int64 class indices, got float32");
  CHECK_THROWS_MU(linear_cross_entropy(x.to(kFloat64), w, Tensor(), t), "dtype mismatch: input float64, weight float32");
  CHECK_THROWS_MU(linear_cross_entropy(x, w, Tensor(), t, o, -2), "chunk_rows must be positive (or 0 for the default), got -2");
  CHECK_THROWS_MU(linear_cross_entropy(x, w, Tensor(), t, CrossEntropyOptions().label_smoothing(1.5)),
                  "label_smoothing must be between 0.0 and 1.0, got 1.5");
  CHECK_THROWS_MU(linear_cross_entropy(x, w, Tensor(), t, CrossEntropyOptions().weight(randn({4}))),
                  "weight must hold one value per class, shape [5], got shape [4]");
  CHECK_THROWS_MU(linear_cross_entropy(x, w, Tensor(), t, CrossEntropyOptions().weight(randn({5}).requires_grad_())),
                  "weight requires grad, but its gradient is not implemented");
  CHECK_THROWS_MU(linear_cross_entropy(x, w, Tensor(), t, CrossEntropyOptions().reduction(Reduction(7))), "reduction");
  CHECK_THROWS_MU(linear_cross_entropy(x.to(kInt64), w.to(kInt64), Tensor(), t),
                  "input must be float32, float64 or bfloat16, got int64");
  for (Device dev : test_devices()) {
    if (dev.is_cpu()) continue;
    INFO(dev.str());
    CHECK_THROWS_MU(linear_cross_entropy(x, w.to(dev), Tensor(), t), "device mismatch: input on cpu, weight on cuda:0");
    CHECK_THROWS_MU(linear_cross_entropy(x.to(dev), w.to(dev), Tensor(), t), "target on cpu, input on cuda:0");
  }
}
