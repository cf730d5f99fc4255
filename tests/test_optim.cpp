// Optimisers, parameter groups, gradient clipping, schedules and optimizer state dicts.
// Single steps are checked against numbers worked out by hand (float64 parameters, so
// the only error is rounding); the bit-level agreement with PyTorch over many steps is
// test_optim_parity's job. The optimisers run on every test device: parameters and
// gradients are made on the CPU and moved there, values are read back on the host.
#include <cmath>
#include <limits>
#include <numbers>

#include "helpers.h"
#include "nn/module.h"
#include "optim/optim.h"

using namespace mu;
using optim::ParamGroup;

namespace {

// A float64 leaf parameter holding `values`, on dev.
Tensor param64(std::initializer_list<double> values, Device dev) {
  return on(tensor(values, kFloat64).requires_grad_(), dev);
}

// Sets p's gradient to `values`, on p's device.
void set_grad64(const Tensor& p, std::initializer_list<double> values) {
  p.set_grad(on(tensor(values, kFloat64), p.device()));
}

// Textbook AdamW on one scalar (m̂ / (sqrt(v̂) + eps)), for comparison with the fused loop.
struct RefAdamW {
  double p, m = 0, v = 0;
  int t = 0;
  void step(double g, double lr, double b1, double b2, double eps, double wd) {
    ++t;
    p -= lr * wd * p;
    m = b1 * m + (1 - b1) * g;
    v = b2 * v + (1 - b2) * g * g;
    double mhat = m / (1 - std::pow(b1, t)), vhat = v / (1 - std::pow(b2, t));
    p -= lr * mhat / (std::sqrt(vhat) + eps);
  }
};

// check_close, by default to the 1e-12 the hand-computed steps here allow.
void check_values(const Tensor& t, const std::vector<double>& expected, double tol = 1e-12) {
  check_close(t, expected, tol);
}

bool bit_equal(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.to_vector<float>() == b.to_vector<float>();
}

}  // namespace

// ---------------------------------------------------------------- AdamW

TEST_CASE("AdamW: one step worked out by hand") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    // p = 1, g = 0.5, lr = 0.1, betas (0.9, 0.999), eps = 1e-8, wd = 0.01:
    //   decay:  p = 1 · (1 − 0.1·0.01)                  = 0.999
    //   m = 0.1·0.5 = 0.05,  v = 0.001·0.25 = 0.00025
    //   m̂ = 0.05/0.1 = 0.5,  v̂ = 0.00025/0.001 = 0.25,  sqrt(v̂) = 0.5
    //   p = 0.999 − 0.1 · 0.5/(0.5 + 1e-8)              = 0.899 + 0.1·1e-8/(0.5 + 1e-8)
    Tensor p = param64({1.0}, dev);
    optim::AdamW opt({p}, optim::AdamWOptions(0.1).betas(0.9, 0.999).eps(1e-8).weight_decay(0.01));
    set_grad64(p, {0.5});
    opt.step();
    check_values(p, {0.899 + 0.1 * 1e-8 / (0.5 + 1e-8)}, 1e-15);
    // The state after one step: t = 1 and the moment estimates computed above.
    const optim::ParamState& s = opt.state(0, 0);
    CHECK(s.at("step").dtype() == kInt64);
    CHECK(s.at("step").item() == 1);
    check_values(s.at("exp_avg"), {0.05}, 1e-15);
    check_values(s.at("exp_avg_sq"), {0.00025}, 1e-15);
    // The parameter is still a leaf that requires grad: the update recorded no graph.
    CHECK(p.is_leaf());
    CHECK(p.requires_grad());
  }
}

TEST_CASE("AdamW: several steps on a vector follow the textbook recurrences") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    const double lr = 0.05, b1 = 0.8, b2 = 0.95, eps = 1e-6, wd = 0.2;
    Tensor p = param64({1.0, -2.0, 3.0}, dev);
    std::vector<RefAdamW> ref{{1.0}, {-2.0}, {3.0}};
    optim::AdamW opt({p}, optim::AdamWOptions(lr).betas(b1, b2).eps(eps).weight_decay(wd));
    const double grads[4][3] = {{0.5, 0.5, -1.0}, {-0.25, 2.0, 0.0}, {1e-3, -3.0, 0.75}, {0.0, 0.1, -0.2}};
    for (const auto& g : grads) {
      p.set_grad(on(from_vector(std::vector<double>{g[0], g[1], g[2]}, {3}), dev));
      opt.step();
      for (int i = 0; i < 3; ++i) ref[size_t(i)].step(g[i], lr, b1, b2, eps, wd);
    }
    check_values(p, {ref[0].p, ref[1].p, ref[2].p}, 1e-13);
    CHECK(opt.state(0, 0).at("step").item() == 4);
  }
}

TEST_CASE("AdamW on a strided (transposed) parameter equals AdamW on a dense copy") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(3);
    Tensor base = on(randn({3, 4}), dev);
    Tensor strided = base.t();  // a [4, 3] leaf view that is not contiguous
    REQUIRE_FALSE(strided.is_contiguous());
    strided.requires_grad_();
    Tensor dense = strided.contiguous().detach().requires_grad_();
    optim::AdamW a({strided}, optim::AdamWOptions(0.1));
    optim::AdamW b({dense}, optim::AdamWOptions(0.1));
    for (int s = 0; s < 3; ++s) {
      Tensor g = randn({4, 3});
      strided.set_grad(on(g, dev));
      dense.set_grad(on(g.clone(), dev));
      a.step();
      b.step();
    }
    CHECK(bit_equal(strided, dense));
    // The update went through the view into the base tensor's memory.
    CHECK(bit_equal(base.t(), dense));
  }
}

// ---------------------------------------------------------------- SGD

TEST_CASE("SGD: plain, momentum, Nesterov and dampening, worked out by hand") {
  // Two steps with g = 0.5 each, p0 = 1, lr = 0.1, wd = 0.01 unless stated.
  SUBCASE("no momentum, no decay") {
    for (Device dev : test_devices()) {
      INFO(dev.str());
      Tensor p = param64({1.0}, dev);
      optim::SGD opt({p}, optim::SGDOptions(0.1));
      set_grad64(p, {0.5});
      opt.step();
      check_values(p, {0.95});  // 1 − 0.1·0.5
      CHECK(opt.state(0, 0).empty());  // no momentum, no buffer
    }
  }
  SUBCASE("momentum 0.9") {
    for (Device dev : test_devices()) {
      INFO(dev.str());
      // step 1: d = 0.5 + 0.01·1 = 0.51, buf = d = 0.51, p = 1 − 0.051 = 0.949
      // step 2: d = 0.5 + 0.01·0.949 = 0.50949, buf = 0.9·0.51 + 0.50949 = 0.96849,
      //         p = 0.949 − 0.096849 = 0.852151
      Tensor p = param64({1.0}, dev);
      optim::SGD opt({p}, optim::SGDOptions(0.1).momentum(0.9).weight_decay(0.01));
      set_grad64(p, {0.5});
      opt.step();
      check_values(p, {0.949});
      check_values(opt.state(0, 0).at("momentum_buffer"), {0.51});
      opt.step();  // the gradient is still set: same g = 0.5
      check_values(p, {0.852151});
      check_values(opt.state(0, 0).at("momentum_buffer"), {0.96849});
    }
  }
  SUBCASE("Nesterov") {
    for (Device dev : test_devices()) {
      INFO(dev.str());
      // step 1: d = 0.51, buf = 0.51, d = 0.51 + 0.9·0.51 = 0.969, p = 1 − 0.0969 = 0.9031
      // step 2: d = 0.5 + 0.01·0.9031 = 0.509031, buf = 0.9·0.51 + 0.509031 = 0.968031,
      //         d = 0.509031 + 0.9·0.968031 = 1.3802589, p = 0.9031 − 0.13802589 = 0.76507411
      Tensor p = param64({1.0}, dev);
      optim::SGD opt({p}, optim::SGDOptions(0.1).momentum(0.9).weight_decay(0.01).nesterov(true));
      set_grad64(p, {0.5});
      opt.step();
      check_values(p, {0.9031});
      opt.step();
      check_values(p, {0.76507411});
      check_values(opt.state(0, 0).at("momentum_buffer"), {0.968031});
    }
  }
  SUBCASE("dampening applies from the second step on") {
    for (Device dev : test_devices()) {
      INFO(dev.str());
      // step 1: buf = d = 0.51 (no dampening on creation), p = 0.949
      // step 2: buf = 0.9·0.51 + (1 − 0.5)·0.50949 = 0.713745, p = 0.949 − 0.0713745 = 0.8776255
      Tensor p = param64({1.0}, dev);
      optim::SGD opt({p}, optim::SGDOptions(0.1).momentum(0.9).dampening(0.5).weight_decay(0.01));
      set_grad64(p, {0.5});
      opt.step();
      opt.step();
      check_values(p, {0.8776255});
    }
  }
}

// ---------------------------------------------------------------- common behaviour

TEST_CASE("parameters without a gradient are skipped and keep no state") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    Tensor a = param64({1.0}, dev), b = param64({2.0}, dev);
    optim::AdamW adam({a, b}, optim::AdamWOptions(0.1).weight_decay(0.5));
    set_grad64(a, {1.0});
    adam.step();
    CHECK(a.item() != 1.0);
    CHECK(b.item() == 2.0);  // not even weight decay touches it, as in torch
    CHECK(adam.state(0, 1).empty());
    CHECK(adam.state(0, 0).at("step").item() == 1);

    // zero_grad resets gradients to none, so the next step changes nothing.
    adam.zero_grad();
    CHECK_FALSE(a.grad().defined());
    double before = a.item();
    adam.step();
    CHECK(a.item() == before);
    CHECK(adam.state(0, 0).at("step").item() == 1);

    Tensor c = param64({3.0}, dev), d = param64({4.0}, dev);
    optim::SGD sgd({c, d}, optim::SGDOptions(0.1).momentum(0.9));
    set_grad64(d, {1.0});
    sgd.step();
    CHECK(c.item() == 3.0);
    CHECK(d.item() == doctest::Approx(3.9).epsilon(1e-15));
    CHECK(sgd.state(0, 0).empty());
  }
}

TEST_CASE("parameter groups carry their own lr, weight decay and options") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    Tensor a = param64({1.0}, dev), b = param64({1.0}, dev);
    optim::AdamW opt({ParamGroup{.params = {a}, .lr = 0.1, .weight_decay = 0.0},
                      ParamGroup{.params = {b}, .lr = 0.01, .weight_decay = 0.5, .options = {{"beta2", 0.9}}}},
                     optim::AdamWOptions(1.0).betas(0.9, 0.999).eps(1e-8));
    REQUIRE(opt.param_groups().size() == 2);
    CHECK(opt.param_groups()[0].option("beta2") == 0.999);  // the default filled in
    CHECK(opt.param_groups()[1].option("beta2") == 0.9);    // the group's own
    CHECK(opt.param_groups()[1].initial_lr == 0.01);
    set_grad64(a, {2.0});
    set_grad64(b, {2.0});
    opt.step();
    // First Adam step: m̂ = g, v̂ = g², so the step is lr·|g|/(|g| + eps) against the gradient.
    RefAdamW ra{1.0}, rb{1.0};
    ra.step(2.0, 0.1, 0.9, 0.999, 1e-8, 0.0);
    rb.step(2.0, 0.01, 0.9, 0.9, 1e-8, 0.5);
    check_values(a, {ra.p});
    check_values(b, {rb.p});
    CHECK(rb.p == doctest::Approx(1.0 * (1 - 0.005) - 0.01 * 2.0 / (2.0 + 1e-8)).epsilon(1e-14));

    // A schedule (or the user) can change a group's lr between steps.
    opt.param_groups()[0].lr = 0.0;
    double before = a.item();
    opt.step();
    CHECK(a.item() == before);

    // Per-group SGD options.
    Tensor c = param64({1.0}, dev), d = param64({1.0}, dev);
    optim::SGD sgd({ParamGroup{.params = {c}}, ParamGroup{.params = {d}, .options = {{"momentum", 0.0}}}},
                   optim::SGDOptions(0.1).momentum(0.9));
    set_grad64(c, {1.0});
    set_grad64(d, {1.0});
    sgd.step();
    sgd.step();
    check_values(c, {1.0 - 0.1 - 0.1 * 1.9});  // buf = 1, then 0.9·1 + 1 = 1.9
    check_values(d, {1.0 - 0.1 - 0.1});
    CHECK(sgd.state(1, 0).empty());
  }
}

// ---------------------------------------------------------------- rounding, element by element

namespace {

// a·b + c with one rounding where the CPU has FMA, as the update kernels compute it.
template <class T>
T fmadd_ref(T a, T b, T c) {
#ifdef __FMA__
  return std::fma(a, b, c);
#else
  return a * b + c;
#endif
}

// A leaf of n values drawn on the CPU in dtype T, moved to dev.
Tensor random_param(int64_t n, DType dt, Device dev) { return on(randn({n}, dt).requires_grad_(), dev); }

}  // namespace

// torch.optim.AdamW's chain of in-place ops, one element at a time, with its roundings:
// each step scalar rounded once to T; then p·decay; m·β1 + (1-β1)·g and
// v·β2 + ((1-β2)·g)·g with fused adds; (sqrt(v̂) / sqrt(bc2)) + eps; p + (-step·m)/denom.
// The kernels on every device must give these bits exactly (1,200,007 float32 elements: more
// than the 4224 blocks x 256 threads of a CUDA grid cover in one pass).
TEST_CASE("AdamW steps equal torch's rounding chain bit for bit, float32 and float64, amsgrad and maximize") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    for (DType dt : {kFloat32, kFloat64}) {
      for (bool amsgrad : {false, true}) {
        for (bool maximize : {false, true}) {
          INFO(dtype_name(dt) << " amsgrad " << amsgrad << " maximize " << maximize);
          manual_seed(30);
          const int64_t n = dt == kFloat32 ? 1'200'007 : 1000;
          // lr·wd exact (2^-12), so 1 - lr·wd is the same here whether or not it is fused.
          const double lr = 0.001953125, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.125;
          Tensor p = random_param(n, dt, dev);
          Tensor p_cpu = p.detach().cpu().clone().requires_grad_();
          optim::AdamW opt({p}, optim::AdamWOptions(lr).betas(b1, b2).eps(eps).weight_decay(wd).amsgrad(amsgrad).maximize(maximize));
          optim::AdamW opt_cpu({p_cpu}, optim::AdamWOptions(lr).betas(b1, b2).eps(eps).weight_decay(wd).amsgrad(amsgrad).maximize(maximize));
          auto run = [&](auto tag) {
            using T = decltype(tag);
            std::vector<T> rp = p.detach().to_vector<T>(), rm(size_t(n), T(0)), rv(size_t(n), T(0)), rvmax(size_t(n), T(0));
            for (int t = 1; t <= 3; ++t) {
              Tensor g = randn({n}, dt) * (t == 2 ? 1e-3 : 1.0);
              p.set_grad(on(g, dev));
              p_cpu.set_grad(g);
              opt.step();
              opt_cpu.step();
              const double bc1 = 1.0 - std::pow(b1, double(t)), bc2 = 1.0 - std::pow(b2, double(t));
              const T decay = T(1.0 - lr * wd), tb1 = T(b1), omb1 = T(1.0 - b1), tb2 = T(b2), omb2 = T(1.0 - b2),
                      bc2s = T(std::sqrt(bc2)), teps = T(eps), neg_step = T(-(lr / bc1));
              std::vector<T> gv = g.to_vector<T>();
              for (size_t i = 0; i < size_t(n); ++i) {
                const T gi = maximize ? -gv[i] : gv[i];
                const T pi = rp[i] * decay;
                const T mi = fmadd_ref(omb1, gi, rm[i] * tb1);
                const T vi = fmadd_ref(T(omb2 * gi), gi, T(rv[i] * tb2));
                T vd = vi;
                if (amsgrad) vd = rvmax[i] = std::max(rvmax[i], vi);
                const T denom = T(std::sqrt(vd) / bc2s) + teps;
                rp[i] = pi + T(T(neg_step * mi) / denom);
                rm[i] = mi;
                rv[i] = vi;
              }
            }
            CHECK(p.detach().to_vector<T>() == rp);
            CHECK(opt.state(0, 0).at("exp_avg").to_vector<T>() == rm);
            CHECK(opt.state(0, 0).at("exp_avg_sq").to_vector<T>() == rv);
            if (amsgrad) CHECK(opt.state(0, 0).at("max_exp_avg_sq").to_vector<T>() == rvmax);
            // And the device's step is the CPU's.
            CHECK(p.detach().to_vector<T>() == p_cpu.detach().to_vector<T>());
          };
          if (dt == kFloat32) run(float{});
          else run(double{});
        }
      }
    }
  }
}

// torch.optim.SGD's chain: d = g + wd·p (fused, skipped when wd = 0); b = d at the first
// step, else μ·b + (1-damp)·d (fused); d = d + μ·b (Nesterov, fused) or b; p + (-lr)·d (fused).
TEST_CASE("SGD steps equal torch's rounding chain bit for bit: plain, decay, momentum with dampening, Nesterov") {
  struct Config {
    double wd, momentum, dampening;
    bool nesterov;
  };
  for (Device dev : test_devices()) {
    INFO(dev.str());
    for (Config c : {Config{0.0, 0.0, 0.0, false}, Config{0.01, 0.0, 0.0, false}, Config{0.01, 0.9, 0.1, false},
                     Config{0.01, 0.9, 0.0, true}}) {
      INFO("wd " << c.wd << " momentum " << c.momentum << " dampening " << c.dampening << " nesterov " << c.nesterov);
      manual_seed(31);
      const int64_t n = 1'200'007;  // more than one pass of a CUDA grid
      const double lr = 0.05;
      Tensor p = random_param(n, kFloat32, dev);
      optim::SGD opt({p}, optim::SGDOptions(lr).weight_decay(c.wd).momentum(c.momentum).dampening(c.dampening).nesterov(c.nesterov));
      std::vector<float> rp = p.detach().to_vector<float>(), rb(size_t(n), 0.0f);
      const float neg_lr = float(-lr), wd = float(c.wd), mom = float(c.momentum), omd = float(1.0 - c.dampening);
      for (int t = 1; t <= 3; ++t) {
        Tensor g = randn({n});
        p.set_grad(on(g, dev));
        opt.step();
        std::vector<float> gv = g.to_vector<float>();
        for (size_t i = 0; i < size_t(n); ++i) {
          float d = gv[i];
          if (c.wd != 0.0) d = fmadd_ref(wd, rp[i], d);
          if (c.momentum != 0.0) {
            rb[i] = t == 1 ? d : fmadd_ref(omd, d, rb[i] * mom);
            d = c.nesterov ? fmadd_ref(mom, rb[i], d) : rb[i];
          }
          rp[i] = fmadd_ref(neg_lr, d, rp[i]);
        }
      }
      CHECK(p.detach().to_vector<float>() == rp);
      if (c.momentum != 0.0) CHECK(opt.state(0, 0).at("momentum_buffer").to_vector<float>() == rb);
    }
  }
}

TEST_CASE("one step over many parameters equals a step of each alone, and the same on every device") {
  // 60 parameters of mixed sizes (empty, one element, chunk edges) and one of 321 chunks
  // of 2^16 elements: more than one launch's parameter slots (24) and blocks (320) on
  // CUDA. A group step must equal one optimizer per parameter, and the CPU's, bit for bit.
  std::vector<int64_t> sizes;
  for (int i = 0; i < 60; ++i) sizes.push_back(i % 7 == 0 ? 0 : i % 5 == 0 ? 65536 + i : 1 + 37 * i);
  sizes.push_back(321 * 65536 + 3);
  // n values: random for small n; for the large one a random block of 2^16 repeated
  // (drawing 2·10^7 normals would dominate the test's time).
  auto values = [](int64_t n, Generator& gen) {
    if (n <= 65536 + 64) return randn({n}, {}, &gen);
    Tensor block = randn({1, 65536}, {}, &gen);
    return block.expand({n / 65536 + 1, 65536}).reshape({-1}).narrow(0, 0, n).contiguous();
  };
  for (bool sgd : {false, true}) {
    INFO(std::string(sgd ? "SGD" : "AdamW"));
    std::vector<Tensor> cpu_result;
    for (Device dev : test_devices()) {
      INFO(dev.str());
      Generator gen(4);
      std::vector<Tensor> group, alone;
      for (int64_t n : sizes) {
        Tensor p = values(n, gen).to(dev);
        group.push_back(p.detach().clone().requires_grad_());
        alone.push_back(p.detach().clone().requires_grad_());
      }
      auto make = [&](const std::vector<Tensor>& ps) -> std::unique_ptr<optim::Optimizer> {
        if (sgd) return std::make_unique<optim::SGD>(ps, optim::SGDOptions(0.01).momentum(0.9).weight_decay(0.01));
        return std::make_unique<optim::AdamW>(ps, optim::AdamWOptions(0.01).weight_decay(0.1));
      };
      auto opt = make(group);
      std::vector<std::unique_ptr<optim::Optimizer>> opts;
      for (const Tensor& p : alone) opts.push_back(make({p}));
      for (int step = 0; step < 2; ++step) {
        for (size_t i = 0; i < sizes.size(); ++i) {
          // Parameter 3 gets its first gradient only at step 1 (a later step count, a
          // fresh momentum buffer): it is updated apart from the others.
          if (i == 3 && step < 1) continue;
          Tensor g = values(sizes[i], gen).to(dev);
          group[i].set_grad(g.clone());
          alone[i].set_grad(g.clone());
        }
        opt->step();
        for (auto& o : opts) o->step();
      }
      for (size_t i = 0; i < sizes.size(); ++i) {
        INFO("parameter " << i << " of " << sizes[i] << " elements");
        CHECK(max_abs_diff(group[i], alone[i]) == 0.0);
        if (dev.is_cpu()) cpu_result.push_back(group[i].detach());
        else CHECK(max_abs_diff(group[i], cpu_result[i]) == 0.0);
      }
    }
  }
}

TEST_CASE("gradient norms over many chunks: p = 1, 3 and inf match sequential sums; a NaN makes them NaN") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(32);
    const int64_t n = 100003;  // four chunks of 2^15 and a partial one
    Tensor g = randn({n});
    Tensor p = zeros({n}, TensorOptions().device(dev)).requires_grad_();
    p.set_grad(on(g, dev));
    std::vector<float> v = g.to_vector<float>();
    double s1 = 0, s3 = 0, mx = 0;
    for (float x : v) {
      const double a = std::fabs(double(x));
      s1 += a;
      s3 += a * a * a;
      mx = std::max(mx, a);
    }
    const double inf = std::numeric_limits<double>::infinity();
    CHECK(optim::grad_norm({p}, 1.0) == doctest::Approx(s1).epsilon(1e-12));
    CHECK(optim::grad_norm({p}, 3.0) == doctest::Approx(std::cbrt(s3)).epsilon(1e-12));
    CHECK(optim::grad_norm({p}, inf) == mx);
    // The same sum twice: the reduction order is fixed.
    CHECK(optim::grad_norm({p}, 2.0) == optim::grad_norm({p}, 2.0));
    // A NaN in the last, partial chunk.
    g.set({n - 2}, std::nan(""));
    p.set_grad(on(g, dev));
    CHECK(std::isnan(optim::grad_norm({p}, inf)));
    CHECK(std::isnan(optim::grad_norm({p}, 2.0)));
  }
}

TEST_CASE("decay_groups: dim >= 2 decays, biases and gains do not, named modules excluded") {
  struct Leaf : nn::Module {
    Leaf() : Module("Leaf") {}
  };
  struct Net : nn::Module {
    Tensor w, bias, gain, emb, frozen;
    Net() : Module("Net") {
      auto fc = register_module("fc", std::make_shared<Leaf>());
      w = fc->register_parameter("weight", randn({3, 4}));
      bias = fc->register_parameter("bias", zeros({3}));
      auto ln = register_module("ln", std::make_shared<Leaf>());
      gain = ln->register_parameter("weight", ones({4}));
      auto wte = register_module("wte", std::make_shared<Leaf>());
      emb = wte->register_parameter("weight", randn({10, 4}));
      auto head = register_module("head", std::make_shared<Leaf>());
      head->register_parameter("weight", emb);  // tied to the embedding
      frozen = register_parameter("frozen", randn({2, 2}), /*requires_grad=*/false);
    }
  };
  Net net;
  auto has = [](const ParamGroup& g, const Tensor& t) {
    for (const Tensor& p : g.params)
      if (p.is_same(t)) return true;
    return false;
  };

  auto groups = optim::decay_groups(net, 0.1);
  REQUIRE(groups.size() == 2);
  CHECK(*groups[0].weight_decay == 0.1);
  CHECK(*groups[1].weight_decay == 0.0);
  CHECK_FALSE(groups[0].lr.has_value());  // the optimizer's lr applies
  CHECK(groups[0].params.size() == 2);    // fc.weight and wte.weight (tied head listed once)
  CHECK(has(groups[0], net.w));
  CHECK(has(groups[0], net.emb));
  CHECK(groups[1].params.size() == 2);
  CHECK(has(groups[1], net.bias));
  CHECK(has(groups[1], net.gain));
  CHECK_FALSE(has(groups[0], net.frozen));
  CHECK_FALSE(has(groups[1], net.frozen));

  auto no_emb = optim::decay_groups(net, 0.1, {"wte"});
  CHECK(no_emb[0].params.size() == 1);
  CHECK(has(no_emb[0], net.w));
  CHECK(has(no_emb[1], net.emb));
  // A prefix matches whole name components only: "fc" excludes fc.*, "f" matches nothing.
  CHECK_THROWS_MU(optim::decay_groups(net, 0.1, {"f"}), "\"f\"");
  CHECK_THROWS_MU(optim::decay_groups(net, -1.0), "weight_decay");

  // The groups build an optimizer directly.
  optim::AdamW opt(groups, optim::AdamWOptions(6e-4).betas(0.9, 0.95));
  CHECK(*opt.param_groups()[1].lr == 6e-4);
  CHECK(*opt.param_groups()[0].weight_decay == 0.1);
}

// ---------------------------------------------------------------- clipping

TEST_CASE("clip_grad_norm: total norm, scaling, no-clip case, inf and p norms") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    Tensor a = param64({0.0, 0.0}, dev), b = param64({0.0}, dev), none = param64({0.0}, dev);
    auto set = [&] {
      set_grad64(a, {3.0, 0.0});
      set_grad64(b, {-4.0});
    };
    std::vector<Tensor> ps{a, b, none};  // `none` has no gradient and is ignored

    set();
    CHECK(optim::clip_grad_norm(ps, 10.0) == doctest::Approx(5.0).epsilon(1e-15));  // sqrt(9 + 16)
    check_values(a.grad(), {3.0, 0.0}, 0.0);  // below max_norm: untouched
    check_values(b.grad(), {-4.0}, 0.0);

    set();
    CHECK(optim::clip_grad_norm(ps, 1.0) == doctest::Approx(5.0).epsilon(1e-15));
    const double c = 1.0 / (5.0 + 1e-6);  // torch's coefficient max_norm / (total + 1e-6)
    check_values(a.grad(), {3.0 * c, 0.0}, 1e-15);
    check_values(b.grad(), {-4.0 * c}, 1e-15);
    CHECK(optim::grad_norm(ps) == doctest::Approx(1.0).epsilon(1e-6));  // clipped to max_norm

    set();
    const double inf = std::numeric_limits<double>::infinity();
    CHECK(optim::clip_grad_norm(ps, 2.0, inf) == 4.0);  // max |g|
    check_values(b.grad(), {-4.0 * 2.0 / (4.0 + 1e-6)}, 1e-15);

    set();
    CHECK(optim::grad_norm(ps, 1.0) == 7.0);
    CHECK(optim::grad_norm(ps, 3.0) == doctest::Approx(std::cbrt(27.0 + 64.0)).epsilon(1e-14));
    CHECK(optim::clip_grad_norm({none}, 1.0) == 0.0);  // no gradients at all

    CHECK_THROWS_MU(optim::clip_grad_norm(ps, 1.0, 0.0), "norm_type");
    CHECK_THROWS_MU(optim::clip_grad_norm(ps, -1.0), "max_norm");
  }
}

TEST_CASE("clip_grad_norm: non-finite totals behave as in torch 1.13") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    const double inf = std::numeric_limits<double>::infinity();
    Tensor a = param64({0.0, 0.0}, dev);
    // An infinite total: coefficient 0, so finite entries become 0 and inf·0 becomes NaN.
    set_grad64(a, {inf, 2.0});
    CHECK(std::isinf(optim::clip_grad_norm({a}, 1.0)));
    std::vector<double> g = a.grad().to_vector<double>();
    CHECK(std::isnan(g[0]));
    CHECK(g[1] == 0.0);
    // A NaN total: every gradient becomes NaN, so the caller sees it and can skip the step.
    set_grad64(a, {std::nan(""), 2.0});
    CHECK(std::isnan(optim::clip_grad_norm({a}, 1.0)));
    g = a.grad().to_vector<double>();
    CHECK(std::isnan(g[0]));
    CHECK(std::isnan(g[1]));
    set_grad64(a, {std::nan(""), 2.0});
    CHECK(std::isnan(optim::grad_norm({a}, inf)));
  }
}

TEST_CASE("clip_grad_norm on a large float32 gradient is independent of threading") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(11);
    Tensor p = zeros({300000}, TensorOptions().device(dev)).requires_grad_();
    Tensor g = randn({300000});
    p.set_grad(on(g.clone(), dev));
    double total = optim::clip_grad_norm({p}, 1.0);
    // Reference: one sequential double sum.
    std::vector<float> v = g.to_vector<float>();
    double s = 0;
    for (float x : v) s += double(x) * double(x);
    CHECK(total == doctest::Approx(std::sqrt(s)).epsilon(1e-12));
    CHECK(optim::grad_norm({p}) == doctest::Approx(1.0).epsilon(1e-5));
  }
}

// ---------------------------------------------------------------- schedules

TEST_CASE("schedules match their closed forms") {
  auto c = optim::constant_lr(0.3);
  CHECK(c(0) == 0.3);
  CHECK(c(123456) == 0.3);

  auto s = optim::step_lr(0.1, 10, 0.5);
  CHECK(s(0) == 0.1);
  CHECK(s(9) == 0.1);
  CHECK(s(10) == 0.05);
  CHECK(s(25) == 0.025);

  // nanoGPT: lr 6e-4, min_lr 6e-5, warmup 100, decay until 1000.
  auto w = optim::warmup_cosine_lr(6e-4, 6e-5, 100, 1000);
  CHECK(w(0) == 0.0);
  CHECK(w(50) == 6e-4 * 50 / 100);
  CHECK(w(99) == doctest::Approx(6e-4 * 0.99).epsilon(1e-15));
  // End of warm-up: cos(0) = 1, so min_lr + (lr − min_lr), equal to lr up to rounding.
  CHECK(w(100) == doctest::Approx(6e-4).epsilon(1e-15));
  // Quarter of the decay: coeff = (1 + cos(π/4))/2 = 1/2 + sqrt(2)/4.
  CHECK(w(325) == doctest::Approx(6e-5 + (0.5 + std::sqrt(2.0) / 4) * 5.4e-4).epsilon(1e-14));
  CHECK(w(550) == doctest::Approx(6e-5 + 0.5 * 5.4e-4).epsilon(1e-14));  // half way
  CHECK(w(1000) == doctest::Approx(6e-5).epsilon(1e-14));
  CHECK(w(1001) == 6e-5);
  CHECK(w(100000) == 6e-5);
  // The rate never rises after warm-up.
  for (int64_t it = 101; it <= 1001; ++it) CHECK(w(it) <= w(it - 1));

  CHECK_THROWS_MU(optim::warmup_cosine_lr(6e-4, 6e-5, 100, 100), "lr_decay_iters");
  CHECK_THROWS_MU(optim::warmup_cosine_lr(6e-4, 1e-3, 10, 100), "min_lr");
  CHECK_THROWS_MU(optim::step_lr(0.1, 0), "step_size");
  CHECK_THROWS_MU(w(-1), "iteration");
  CHECK_THROWS_MU(optim::constant_lr(0.0), "base learning rate");
}

TEST_CASE("apply_lr keeps per-group ratios and survives a state-dict round trip") {
  Tensor a = param64({1.0}, Device::cpu()), b = param64({1.0}, Device::cpu());
  auto make = [&] {
    return std::make_unique<optim::AdamW>(
        std::vector<ParamGroup>{ParamGroup{.params = {a}, .lr = 6e-4}, ParamGroup{.params = {b}, .lr = 3e-4}},
        optim::AdamWOptions());
  };
  auto opt = make();
  auto w = optim::warmup_cosine_lr(6e-4, 6e-5, 10, 100);
  for (int64_t it : {0, 5, 10, 40, 100, 200}) {
    double lr = optim::apply_lr(*opt, w, it);
    CHECK(lr == w(it));
    CHECK(*opt->param_groups()[0].lr == w(it));  // the base group gets the schedule exactly
    CHECK(*opt->param_groups()[1].lr == doctest::Approx(w(it) / 2).epsilon(1e-15));
  }
  // After a reload the groups still scale from their initial rates, not the last ones.
  nn::StateDict sd = opt->state_dict();
  auto fresh = make();
  fresh->param_groups()[1].initial_lr = 1.0;  // overwritten by the load
  fresh->load_state_dict(sd);
  CHECK(*fresh->param_groups()[0].lr == w(200));
  optim::apply_lr(*fresh, w, 50);
  CHECK(*fresh->param_groups()[1].lr == doctest::Approx(w(50) / 2).epsilon(1e-15));
}

TEST_CASE("LRScheduler sets the schedule's rate of each iteration, as torch's scheduler.step()") {
  Tensor a = param64({1.0}, Device::cpu()), b = param64({1.0}, Device::cpu());
  optim::AdamW opt({ParamGroup{.params = {a}, .lr = 0.1}, ParamGroup{.params = {b}, .lr = 0.05}}, optim::AdamWOptions());
  // torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5): lrs 0.1, 0.1, 0.05, 0.05, 0.025
  // after construction and each of four step() calls (the closed form 0.1 · 0.5^floor(it / 2)).
  optim::LRScheduler sched(opt, optim::step_lr(0.1, 2, 0.5));
  const std::vector<double> want = {0.1, 0.1, 0.05, 0.05, 0.025};
  for (size_t it = 0; it < want.size(); ++it) {
    CHECK(sched.iteration() == int64_t(it));
    CHECK(sched.last_lr() == want[it]);
    CHECK(*opt.param_groups()[0].lr == want[it]);
    CHECK(*opt.param_groups()[1].lr == doctest::Approx(want[it] / 2).epsilon(1e-15));
    a.set_grad(ones({1}, kFloat64));
    b.set_grad(ones({1}, kFloat64));
    opt.step();
    sched.step();
  }
  // A resumed run starts at its iteration.
  auto w = optim::warmup_cosine_lr(6e-4, 6e-5, 10, 100);
  optim::LRScheduler resumed(opt, w, 40);
  // Group 0 was created with lr 0.1, so it follows the curve scaled by 0.1 / 6e-4.
  CHECK(*opt.param_groups()[0].lr == doctest::Approx(w(40) * (0.1 / 6e-4)).epsilon(1e-14));
  CHECK(resumed.last_lr() == w(40));
  resumed.step();
  CHECK(resumed.iteration() == 41);
  CHECK(resumed.last_lr() == w(41));
  CHECK_THROWS_MU(optim::LRScheduler(opt, w, -1), "start iteration must be >= 0, got -1");
}

// ---------------------------------------------------------------- state dicts

namespace {

// Three float32 parameters drawn on the CPU, on dev.
std::vector<Tensor> make_params(Device dev) {
  manual_seed(7);
  return {on(randn({4, 3}).requires_grad_(), dev), on(randn({3}).requires_grad_(), dev),
          on(randn({2, 2}).requires_grad_(), dev)};
}

std::vector<Tensor> copy_params(const std::vector<Tensor>& ps) {
  std::vector<Tensor> out;
  for (const Tensor& p : ps) out.push_back(p.detach().clone().requires_grad_());
  return out;
}

// Gives both parameter lists the same fresh gradients (parameter 2 none on odd steps).
void same_grads(const std::vector<Tensor>& a, const std::vector<Tensor>& b, int step) {
  for (size_t k = 0; k < a.size(); ++k) {
    if (k == 2 && step % 2 == 1) {
      a[k].zero_grad();
      b[k].zero_grad();
      continue;
    }
    Tensor g = randn(a[k].shape());  // drawn on the CPU, moved to the parameters' device
    a[k].set_grad(on(g, a[k].device()));
    b[k].set_grad(on(g.clone(), b[k].device()));
  }
}

template <class Opt, class Make>
void check_round_trip(Make make, Device dev) {
  std::vector<Tensor> pa = make_params(dev);
  std::unique_ptr<Opt> a = make(pa);
  for (int s = 0; s < 3; ++s) {
    same_grads(pa, pa, s);
    a->step();
  }
  std::vector<Tensor> pb = copy_params(pa);
  std::unique_ptr<Opt> b = make(pb);
  // Disturb the fresh optimizer's hyper-parameters: the load must restore them.
  for (auto& g : b->param_groups()) g.lr = 123.0;
  b->load_state_dict(a->state_dict());
  CHECK(*b->param_groups()[0].lr == *a->param_groups()[0].lr);
  for (int s = 3; s < 6; ++s) {
    same_grads(pa, pb, s);
    a->step();
    b->step();
  }
  for (size_t k = 0; k < pa.size(); ++k) {
    INFO("parameter " << k);
    CHECK(bit_equal(pa[k], pb[k]));
  }
  // The state itself matches entry for entry.
  nn::StateDict sa = a->state_dict(), sb = b->state_dict();
  REQUIRE(sa.size() == sb.size());
  for (size_t i = 0; i < sa.size(); ++i) {
    INFO("entry " << sa[i].first);
    CHECK(sa[i].first == sb[i].first);
    CHECK(sa[i].second.dtype() == sb[i].second.dtype());
    CHECK(sa[i].second.to_vector<double>() == sb[i].second.to_vector<double>());
  }
}

}  // namespace

TEST_CASE("state_dict names every entry as documented") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    std::vector<Tensor> ps = make_params(dev);
    optim::AdamW opt({ParamGroup{.params = {ps[0], ps[2]}, .weight_decay = 0.1}, ParamGroup{.params = {ps[1]}}},
                     optim::AdamWOptions(6e-4).betas(0.9, 0.95).weight_decay(0.0));
    ps[0].set_grad(ones({4, 3}, TensorOptions().device(dev)));
    ps[1].set_grad(ones({3}, TensorOptions().device(dev)));
    opt.step();  // parameters 0 of group 0 and 0 of group 1 get state; ps[2] has no gradient
    nn::StateDict sd = opt.state_dict();
    auto get = [&](const std::string& n) {
      Tensor t = nn::find(sd, n);
      REQUIRE_MESSAGE(t.defined(), "missing " << n);
      return t;
    };
    CHECK(get("group.0.num_params").dtype() == kInt64);
    CHECK(get("group.0.num_params").item() == 2);
    CHECK(get("group.0.lr").dtype() == kFloat64);
    CHECK(get("group.0.lr").dim() == 0);
    CHECK(get("group.0.lr").item() == 6e-4);
    CHECK(get("group.0.initial_lr").item() == 6e-4);
    CHECK(get("group.0.weight_decay").item() == 0.1);
    CHECK(get("group.1.weight_decay").item() == 0.0);
    CHECK(get("group.1.beta1").item() == 0.9);
    CHECK(get("group.1.beta2").item() == 0.95);
    CHECK(get("group.1.eps").item() == 1e-8);
    CHECK(get("state.0.0.step").dtype() == kInt64);
    CHECK(get("state.0.0.step").item() == 1);
    CHECK(get("state.0.0.exp_avg").shape() == Shape{4, 3});
    CHECK(get("state.0.0.exp_avg_sq").dtype() == kFloat32);
    CHECK(get("state.1.0.exp_avg").shape() == Shape{3});
    CHECK_FALSE(nn::find(sd, "state.0.1.exp_avg").defined());  // never updated: no state
    CHECK(get("group.1.amsgrad").item() == 0.0);
    CHECK(get("group.1.maximize").item() == 0.0);
    CHECK(sd.size() == 2 * 9 + 2 * 3);  // 9 scalars per group, 3 buffers per updated parameter

    optim::SGD sgd(ps, optim::SGDOptions(0.1).momentum(0.9).nesterov(true));
    sgd.step();
    nn::StateDict ss = sgd.state_dict();
    CHECK(nn::find(ss, "group.0.nesterov").item() == 1.0);
    CHECK(nn::find(ss, "group.0.momentum").item() == 0.9);
    CHECK(nn::find(ss, "group.0.dampening").item() == 0.0);
    CHECK(nn::find(ss, "state.0.0.momentum_buffer").shape() == Shape{4, 3});
  }
}

TEST_CASE("a reloaded optimizer continues bit-identically") {
  SUBCASE("AdamW, two groups") {
    for (Device dev : test_devices()) {
      INFO(dev.str());
      check_round_trip<optim::AdamW>([](const std::vector<Tensor>& p) {
        return std::make_unique<optim::AdamW>(
            std::vector<ParamGroup>{ParamGroup{.params = {p[0], p[2]}, .weight_decay = 0.1},
                                    ParamGroup{.params = {p[1]}, .lr = 3e-2, .weight_decay = 0.0}},
            optim::AdamWOptions(1e-2).betas(0.9, 0.95));
      }, dev);
    }
  }
  SUBCASE("SGD, Nesterov") {
    for (Device dev : test_devices()) {
      INFO(dev.str());
      check_round_trip<optim::SGD>([](const std::vector<Tensor>& p) {
        return std::make_unique<optim::SGD>(p, optim::SGDOptions(0.05).momentum(0.9).nesterov(true).weight_decay(1e-2));
      }, dev);
    }
  }
}

TEST_CASE("load_state_dict refuses a mismatched structure, naming the entry, and changes nothing") {
  std::vector<Tensor> ps = make_params(Device::cpu());
  auto two_groups = [&] {
    return std::make_unique<optim::AdamW>(
        std::vector<ParamGroup>{ParamGroup{.params = {ps[0], ps[1]}}, ParamGroup{.params = {ps[2]}}},
        optim::AdamWOptions(0.1));
  };
  auto src = two_groups();
  for (const Tensor& p : ps) p.set_grad(ones(p.shape()));
  src->step();
  const nn::StateDict sd = src->state_dict();
  auto without = [&](const std::string& name) {
    nn::StateDict out;
    for (const auto& e : sd)
      if (e.first != name) out.push_back(e);
    return out;
  };
  auto replaced = [&](const std::string& name, const Tensor& t) {
    nn::StateDict out = sd;
    for (auto& e : out)
      if (e.first == name) e.second = t;
    return out;
  };

  auto dst = two_groups();
  dst->param_groups()[0].lr = 0.5;
  CHECK_THROWS_MU(dst->load_state_dict(without("group.1.lr")), "missing entry \"group.1.lr\"");
  CHECK_THROWS_MU(dst->load_state_dict(without("state.0.1.exp_avg_sq")), "\"state.0.1.exp_avg_sq\" is missing");
  CHECK_THROWS_MU(dst->load_state_dict(replaced("state.0.0.exp_avg", zeros({3, 4}))), "\"state.0.0.exp_avg\" has shape [3, 4]");
  CHECK_THROWS_MU(dst->load_state_dict(replaced("group.0.lr", zeros({2}))), "\"group.0.lr\" must hold one number");
  CHECK_THROWS_MU(dst->load_state_dict(replaced("state.1.0.step", scalar_tensor(1.5, kFloat64))), "whole number");
  nn::StateDict extra = sd;
  extra.emplace_back("state.0.0.max_exp_avg_sq", zeros({4, 3}));
  CHECK_THROWS_MU(dst->load_state_dict(extra), "unexpected entry \"state.0.0.max_exp_avg_sq\"");
  // Nothing was applied by the refused loads.
  CHECK(*dst->param_groups()[0].lr == 0.5);
  CHECK(dst->state(0, 0).empty());

  // Fewer groups here than in the dict.
  optim::AdamW one_group(ps, optim::AdamWOptions(0.1));
  CHECK_THROWS_MU(one_group.load_state_dict(sd), "group.0.num_params");
  optim::AdamW first_two({ParamGroup{.params = {ps[0], ps[1]}}}, optim::AdamWOptions(0.1));
  CHECK_THROWS_MU(first_two.load_state_dict(sd), "unexpected entry \"group.1.");
  // Another optimizer's state.
  optim::SGD sgd(ps, optim::SGDOptions(0.1).momentum(0.9));
  sgd.step();
  CHECK_THROWS_MU(two_groups()->load_state_dict(sgd.state_dict()), "group.0.num_params");
  optim::AdamW adam_all(ps, optim::AdamWOptions(0.1));
  CHECK_THROWS_MU(adam_all.load_state_dict(sgd.state_dict()), "missing entry \"group.0.amsgrad\"");
}

TEST_CASE("bad hyper-parameters and parameters are refused with clear errors") {
  Tensor p = param64({1.0}, Device::cpu());
  CHECK_THROWS_MU(optim::AdamW(std::vector<Tensor>{}, optim::AdamWOptions()), "empty parameter list");
  CHECK_THROWS_MU(optim::AdamW({p}, optim::AdamWOptions(-1.0)), "learning rate -1");
  CHECK_THROWS_MU(optim::AdamW({p}, optim::AdamWOptions().betas(1.0, 0.9)), "beta1");
  CHECK_THROWS_MU(optim::AdamW({p}, optim::AdamWOptions().betas(0.9, -0.1)), "beta2");
  CHECK_THROWS_MU(optim::AdamW({p}, optim::AdamWOptions().weight_decay(-0.1)), "weight_decay");
  CHECK_THROWS_MU(optim::AdamW({p}, optim::AdamWOptions().eps(std::nan(""))), "eps");
  CHECK_THROWS_MU(optim::SGD({p}, optim::SGDOptions(0.1).nesterov(true)), "Nesterov");
  CHECK_THROWS_MU(optim::SGD({p}, optim::SGDOptions(0.1).momentum(0.9).dampening(0.1).nesterov(true)), "dampening");
  CHECK_THROWS_MU(optim::SGD({p}, optim::SGDOptions(0.1).momentum(-0.5)), "momentum");
  CHECK_THROWS_MU(optim::SGD({p, p}, optim::SGDOptions(0.1)), "appears");
  CHECK_THROWS_MU(optim::SGD({ParamGroup{.params = {p}}, ParamGroup{.params = {p}}}, optim::SGDOptions(0.1)),
                  "parameter 0 of group 1 also appears as parameter 0 of group 0");
  CHECK_THROWS_MU(optim::SGD({ParamGroup{.params = {p}, .options = {{"beta1", 0.9}}}}, optim::SGDOptions(0.1)),
                  "unknown option \"beta1\"");
  CHECK_THROWS_MU(optim::SGD({arange(3)}, optim::SGDOptions(0.1)), "floating-point");
  Tensor leaf = param64({1.0, 2.0}, Device::cpu());
  CHECK_THROWS_MU(optim::SGD({leaf * 2.0}, optim::SGDOptions(0.1)), "not a leaf");

  // A gradient of the wrong dtype is refused when it is set (test_autograd), before any step.
  optim::SGD sgd({p}, optim::SGDOptions(0.1));
  CHECK_THROWS_MU(p.set_grad(tensor({1.0}, kFloat32)), "set_grad: gradient of dtype float32");
  CHECK_THROWS_MU(sgd.param_groups()[0].option("beta1"), "no option \"beta1\"");
}

// A step refused for one group's parameter (here an expanded view, which cannot be
// written element by element) changes nothing in any group: parameters, step counts
// and moments stay as they were, so the same optimizer steps on once the cause is fixed.
TEST_CASE("a refused step changes nothing: every group is checked before any is updated") {
  Tensor a = tensor({1.0, 2.0}, kFloat64).requires_grad_();
  Tensor b = tensor({3.0}, kFloat64).expand({2}).requires_grad_();  // a leaf of stride 0
  optim::AdamW opt({ParamGroup{.params = {a}}, ParamGroup{.params = {b}}}, optim::AdamWOptions(0.1));
  a.set_grad(tensor({0.5, 0.5}, kFloat64));
  b.set_grad(tensor({0.5, 0.5}, kFloat64));
  CHECK_THROWS_MU(opt.step(), "AdamW: more than one element of the written-to tensor");
  CHECK(a.to_vector<double>() == std::vector<double>{1.0, 2.0});
  for (const auto& [key, t] : opt.state_dict()) {
    INFO(key);
    CHECK(key.rfind("state.", 0) != 0);  // no state was made
  }
  // With the expanded parameter out of the way the first group steps as a fresh optimizer's.
  b.set_grad(Tensor());
  opt.step();
  Tensor fresh = tensor({1.0, 2.0}, kFloat64).requires_grad_();
  optim::AdamW ref({fresh}, optim::AdamWOptions(0.1));
  fresh.set_grad(tensor({0.5, 0.5}, kFloat64));
  ref.step();
  CHECK(a.to_vector<double>() == fresh.to_vector<double>());
}
