// Random calls of the ops (tests/random_calls.h draws them), three ways:
// - each call returns or throws a mu::Error (another exception, a crash or a hang fails the
//   suite; doctest names the op and the draw), and a result differentiates; with a CUDA
//   device each draw runs again there from the same inputs and gives the CPU's outcome (a
//   result on both or an error on both), output shape, dtype and values and input gradients;
// - the same under autocast (bfloat16), where the devices agree on outcome and dtypes;
// - with the float32 tensors made float64: the float32 kernels within 1e-4 of float64's;
// - in float64 on every device, the derivative of a random weighting of the output along a
//   random direction of all inputs, from the backward pass (run twice over the retained
//   graph), against a central difference of the forward pass.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>

#include "helpers.h"
#include "random_calls.h"

using namespace mu;
using namespace mu::random_calls;

namespace {

// What one call gave: an error's message, or the output and the input gradients after a
// backward of the output's sum (on the CPU, detached).
struct Outcome {
  bool ok = false;
  std::string error;
  Tensor out;
  std::vector<Tensor> grads;
};

Outcome run(const Op& op, uint64_t seed, Device dev, bool autocast = false, bool widen = false) {
  Draw d(seed, dev);
  d.widen = widen;
  Outcome o;
  try {
    Tensor y;
    {
      AutocastGuard guard(kBFloat16, autocast);
      y = op.call(d);
    }
    if (y.defined() && y.requires_grad() && is_floating(y.dtype())) {
      // An op that took its inputs must differentiate them: a refusal here is a failure.
      try {
        y.sum().backward();
      } catch (const mu::Error& e) {
        FAIL_CHECK("the call returned " << y.describe() << " but its backward raised: " << e.what());
        return o;
      }
    }
    o.ok = true;
    o.out = y.defined() ? y.detach().cpu() : y;
    for (const Tensor& l : d.leaves) o.grads.push_back(l.grad().defined() ? l.grad().cpu() : Tensor());
  } catch (const mu::Error& e) {
    o.error = e.what();
  } catch (const std::exception& e) {
    FAIL_CHECK("not a mu::Error but " << typeid(e).name() << ": " << e.what());
  }
  return o;
}

// Element by element: NaN for NaN, else within tol relative to max(1, |reference|).
void check_values(const Tensor& ref, const Tensor& got, double tol, const char* what) {
  const std::vector<double> u = ref.to(kFloat64).to_vector<double>(), v = got.to(kFloat64).to_vector<double>();
  for (size_t i = 0; i < u.size(); ++i) {
    const bool same = (std::isnan(u[i]) && std::isnan(v[i])) || u[i] == v[i] ||
                      std::abs(u[i] - v[i]) <= tol * std::max(1.0, std::abs(u[i]));
    if (!same) {
      FAIL_CHECK(what << " element " << i << ": " << u[i] << " expected, " << v[i] << " got");
      return;
    }
  }
}

// Another device's result against the CPU's: the same shape and dtype, and values within
// the dtype's tolerance (float64 1e-9, float32 2e-4, 16-bit floats 2e-2, integers and
// bools exactly).
void check_same(const Tensor& cpu, const Tensor& other, const char* what) {
  REQUIRE(cpu.defined() == other.defined());
  if (!cpu.defined()) return;
  INFO(what << ": cpu " << cpu.describe() << ", other " << other.describe());
  REQUIRE(cpu.shape() == other.shape());
  REQUIRE(cpu.dtype() == other.dtype());
  const double tol = cpu.dtype() == kFloat64   ? 1e-9
                     : cpu.dtype() == kFloat32 ? 2e-4
                     : is_floating(cpu.dtype()) ? 2e-2
                                                : 0;
  check_values(cpu, other, tol, what);
}

constexpr int kDraws = 200;  // per op and device

// MUMOE_RANDOM_CALLS_VERBOSE=1 names each draw's seed on stdout before it runs (a crash
// stops the suite without doctest's context).
const bool kVerbose = std::getenv("MUMOE_RANDOM_CALLS_VERBOSE") != nullptr;

// body(seed) for each of the kDraws draws of an op: the same seeds in every case.
template <class Body>
void for_each_draw(Body&& body) {
  for (int i = 0; i < kDraws; ++i) {
    const uint64_t seed = uint64_t(1000 * i + 17);
    if (kVerbose) std::printf("  draw seed %llu\n", (unsigned long long)seed), std::fflush(stdout);
    body(seed);
  }
}

}  // namespace

// A crash stops the suite without doctest's context, so each op is named on stdout before
// its draws run (and, with MUMOE_RANDOM_CALLS_VERBOSE=1, each draw's seed).
TEST_CASE("every random call returns or raises a mu::Error; other devices give the CPU's outcome") {
  for (const Op& op : ops()) {
    std::printf("%s: %d draws\n", op.name, kDraws);
    std::fflush(stdout);
    int results = 0;
    for_each_draw([&](uint64_t seed) {
      INFO("op " << op.name << ", draw seed " << seed);
      const Outcome cpu = run(op, seed, Device::cpu());
      results += cpu.ok;
      for (Device dev : test_devices()) {
        if (dev.is_cpu()) continue;
        INFO("on " << dev.str());
        const Outcome other = run(op, seed, dev);
        INFO("cpu: " << (cpu.ok ? "a result" : cpu.error) << "; other: " << (other.ok ? "a result" : other.error));
        REQUIRE(cpu.ok == other.ok);
        if (!cpu.ok) continue;
        if (op.random_values) {
          REQUIRE(cpu.out.shape() == other.out.shape());
          continue;
        }
        check_same(cpu.out, other.out, "output");
        REQUIRE(cpu.grads.size() == other.grads.size());
        for (size_t g = 0; g < cpu.grads.size(); ++g) check_same(cpu.grads[g], other.grads[g], "gradient");
      }
    });
    // The draws reach the op's valid calls too, not only its errors.
    INFO("op " << op.name);
    CHECK(results > 0);
  }
}

// Under autocast (bfloat16) the same draws: each returns or raises a mu::Error, a result
// differentiates, and on a CUDA device the outcome, the output's shape and dtype and which
// inputs get gradients are the CPU's (the values differ within bfloat16's precision).
TEST_CASE("under autocast every random call returns or raises a mu::Error and differentiates") {
  for (const Op& op : ops()) {
    INFO("op " << op.name);
    for_each_draw([&](uint64_t seed) {
      INFO("draw seed " << seed);
      const Outcome cpu = run(op, seed, Device::cpu(), true);
      for (Device dev : test_devices()) {
        if (dev.is_cpu()) continue;
        const Outcome other = run(op, seed, dev, true);
        INFO("cpu: " << (cpu.ok ? "a result" : cpu.error) << "; " << dev.str() << ": " << (other.ok ? "a result" : other.error));
        REQUIRE(cpu.ok == other.ok);
        if (!cpu.ok) continue;
        REQUIRE(cpu.out.defined() == other.out.defined());
        if (cpu.out.defined()) {
          CHECK(cpu.out.shape() == other.out.shape());
          CHECK(cpu.out.dtype() == other.out.dtype());
        }
        REQUIRE(cpu.grads.size() == other.grads.size());
        for (size_t g = 0; g < cpu.grads.size(); ++g) CHECK(cpu.grads[g].defined() == other.grads[g].defined());
      }
    });
  }
}

// The float32 kernels (the CPU's vector paths, their tails and strides) against float64 on
// the same values: each draw again with its float32 tensors made float64, nothing else
// changed. Outputs and input gradients must agree within float32's rounding of sums of up
// to 729 terms of size up to about 100 (1e-4 of max(1, |value|)).
TEST_CASE("random calls in float32 agree with the same calls in float64") {
  for (Device dev : test_devices()) {
    INFO("on " << dev.str());
    for (const Op& op : ops()) {
      INFO("op " << op.name);
      for_each_draw([&](uint64_t seed) {
        INFO("draw seed " << seed);
        const Outcome narrow = run(op, seed, dev), wide = run(op, seed, dev, false, true);
        INFO("float32: " << (narrow.ok ? "a result" : narrow.error) << "; float64: " << (wide.ok ? "a result" : wide.error));
        // (A call that mixes float32 with float64 may be refused where the widened one is not.)
        if (!narrow.ok) return;
        REQUIRE(wide.ok);
        if (!narrow.out.defined()) return;
        REQUIRE(narrow.out.shape() == wide.out.shape());
        // The float64 result is the reference; 16-bit and integer results are not compared.
        auto close = [](const Tensor& f32, const Tensor& f64, const char* what) {
          if (f32.dtype() == kFloat32 || f32.dtype() == kFloat64) check_values(f64, f32, 1e-4, what);
        };
        if (!op.random_values) close(narrow.out, wide.out, "output");
        REQUIRE(narrow.grads.size() == wide.grads.size());
        for (size_t g = 0; g < narrow.grads.size(); ++g) {
          REQUIRE(narrow.grads[g].defined() == wide.grads[g].defined());
          if (narrow.grads[g].defined() && !op.random_values) close(narrow.grads[g], wide.grads[g], "gradient");
        }
      });
    }
  }
}

namespace {

// A draw's forward pass in float64 with leaf k moved by shift[k], or an undefined tensor
// when the call raises. With `leaves`: the output on dev with its graph (the caller runs
// the backward) and the draw's leaves there; without: the output on the CPU.
Tensor forward64(const Op& op, uint64_t seed, Device dev, const std::vector<Tensor>& shift,
                 std::vector<Tensor>* leaves = nullptr) {
  Draw d(seed, dev);
  d.f64 = true;
  d.shift = shift;
  Tensor y;
  try {
    y = op.call(d);
  } catch (const mu::Error&) {
    return Tensor();
  }
  if (leaves) {
    *leaves = d.leaves;
    return y;
  }
  return y.defined() ? y.detach().cpu() : y;
}

// Σ w_i y_i over the elements where w is defined, or NaN when one of them is not finite.
double weighted(const Tensor& y, const std::vector<double>& w) {
  const std::vector<double> v = y.to(kFloat64).to_vector<double>();
  double s = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    if (w[i] == 0) continue;
    if (!std::isfinite(v[i])) return NAN;
    s += w[i] * v[i];
  }
  return s;
}

}  // namespace

// For each draw that gives a float64 output depending on float64 leaves: L = Σ w_i y_i with
// random w (0 where y_i is not finite), its gradient g from backward, a random direction u
// over all leaves; g·u must equal (L(x + h u) - L(x - h u)) / 2h. A draw whose difference
// lands on a kink of the op (relu at 0, a tie of sort, the step of a rounding division) can
// disagree at one h; it passes when any of h = 1e-6, 1e-4, 1e-8 agrees, so a wrong gradient
// must disagree at all three.
TEST_CASE("the gradients of random calls in float64 match central differences") {
  for (Device dev : test_devices()) {
    INFO("on " << dev.str());
    int64_t total = 0;
    for (const Op& op : ops()) {
      std::printf("%s on %s: gradients of %d draws\n", op.name, dev.str().c_str(), kDraws);
      std::fflush(stdout);
      int checked = 0;
      for_each_draw([&](uint64_t seed) {
        INFO("op " << op.name << ", draw seed " << seed);
        std::vector<Tensor> leaves;
        Tensor y = forward64(op, seed, dev, {}, &leaves);
        if (!y.defined() || y.dtype() != kFloat64 || !y.requires_grad() || y.numel() == 0) return;
        // The weights: a normal draw for each finite output, 0 for the others.
        std::mt19937_64 rng(seed ^ 0x9e3779b97f4a7c15ull);
        std::normal_distribution<double> normal;
        const std::vector<double> yv = y.detach().cpu().to_vector<double>();
        std::vector<double> w(yv.size());
        bool finite = true;
        for (size_t j = 0; j < yv.size(); ++j) {
          finite = finite && std::isfinite(yv[j]);
          w[j] = std::isfinite(yv[j]) ? normal(rng) : 0.0;
        }
        const double L0 = weighted(y.detach().cpu(), w);
        if (!std::isfinite(L0)) return;
        // Twice over the same graph: a backward that changed what the op saved (or freed it
        // with the graph retained) shows as a second pass that does not add the same again.
        std::vector<Tensor> once;
        try {
          const Tensor seed_grad = from_vector(w, y.shape()).to(dev);
          y.backward(seed_grad, true);
          for (const Tensor& leaf : leaves) once.push_back(leaf.grad().defined() ? leaf.grad().cpu().clone() : Tensor());
          y.backward(seed_grad);
        } catch (const mu::Error& e) {
          FAIL_CHECK("backward raised: " << e.what());
          return;
        }
        for (size_t k = 0; k < leaves.size(); ++k) {
          const Tensor& leaf = leaves[k];
          REQUIRE(leaf.grad().defined() == once[k].defined());
          if (!once[k].defined()) continue;
          const std::vector<double> a = once[k].to_vector<double>(), b2 = leaf.grad().cpu().to_vector<double>();
          for (size_t j = 0; j < a.size(); ++j)
            // (a GPU's atomic sums may add in another order the second time: not exactly)
            if (std::isfinite(a[j]) && std::abs(b2[j] - 2 * a[j]) > 1e-12 * std::max(1.0, std::abs(a[j]))) {
              FAIL_CHECK("leaf " << k << " element " << j << ": one backward gives " << a[j] << ", two give " << b2[j]);
              break;
            }
          // The derivative below is of one pass.
          NoGradGuard ng;
          leaf.set_grad(once[k].to(dev));
        }
        // g·u over every leaf, and Σ|g_i u_i|, the scale of its rounding.
        std::vector<Tensor> dir;
        double gu = 0, scale = 0;
        for (const Tensor& leaf : leaves) {
          std::vector<double> u(size_t(leaf.numel()));
          for (double& e : u) e = normal(rng);
          if (!leaf.grad().defined()) {
            dir.push_back(from_vector(u, leaf.shape()));
            continue;
          }
          const std::vector<double> g = leaf.grad().to(kFloat64).to_vector<double>();
          REQUIRE(g.size() == u.size());
          for (size_t j = 0; j < g.size(); ++j) {
            // Where an output is NaN or infinite its weight is 0 but its gradient is 0 × ∞
            // (as torch's): the direction leaves out the input elements that gives. With every
            // output finite, a gradient that is not is a failure.
            if (!finite && !std::isfinite(g[j])) {
              u[j] = 0;
              continue;
            }
            gu += g[j] * u[j], scale += std::abs(g[j] * u[j]);
          }
          dir.push_back(from_vector(u, leaf.shape()));
        }
        // L's own size bounds the rounding of the difference quotient.
        double size = 0;
        for (size_t j = 0; j < yv.size(); ++j)
          if (w[j] != 0) size += std::abs(w[j] * yv[j]);
        bool agree = false, conclusive = false;
        double fd_first = NAN;
        for (double h : {1e-6, 1e-4, 1e-8}) {
          std::vector<Tensor> plus, minus;
          for (const Tensor& u : dir) plus.push_back(u * h), minus.push_back(u * -h);
          const Tensor yp = forward64(op, seed, dev, plus), ym = forward64(op, seed, dev, minus);
          if (!yp.defined() || !ym.defined() || yp.shape() != y.shape() || ym.shape() != y.shape()) continue;
          const double lp = weighted(yp, w), lm = weighted(ym, w);
          if (!std::isfinite(lp) || !std::isfinite(lm)) continue;
          conclusive = true;
          const double fd = (lp - lm) / (2 * h);
          if (std::isnan(fd_first)) fd_first = fd;
          const double tol = 1e-5 * (scale + std::abs(gu)) + 1e-12 + 1e3 * 2.2e-16 * size / h;
          if (std::abs(fd - gu) <= tol) {
            agree = true;
            break;
          }
        }
        if (!conclusive) return;
        ++checked;
        if (!agree) FAIL_CHECK("backward gives " << gu << ", the central difference " << fd_first);
      });
      if (kVerbose) std::printf("  %d draws checked\n", checked);
      total += checked;
    }
    CHECK(total > 0);
  }
}
