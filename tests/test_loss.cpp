// The losses against brute-force loops in double written here: values from the
// definitions, input gradients by central differences of those loops. cross_entropy is
// run over every combination of its options and layouts, against the composed
// log_softmax + gather version, on degenerate inputs, and for its error messages.
#include <functional>
#include <limits>

#include "helpers.h"
#include "ops/cpu/vec_exp.h"

using namespace mu;

namespace {

using Vec = std::vector<double>;
const double kNaN = std::numeric_limits<double>::quiet_NaN();

// ---------------------------------------------------------------- reference loops

// Logits (C), (N, C) or (N, C, d1, ...) as N x C x D with the class dim in the middle.
struct Geo {
  int64_t N = 1, C = 0, D = 1;
  Shape target_shape;
};

Geo geo_of(const Shape& s) {
  Geo g;
  g.C = s.size() == 1 ? s[0] : s[1];
  if (s.size() > 1) {
    g.N = s[0];
    g.target_shape.push_back(s[0]);
    for (size_t k = 2; k < s.size(); ++k) {
      g.D *= s[k];
      g.target_shape.push_back(s[k]);
    }
  }
  return g;
}

size_t at(const Geo& g, int64_t n, int64_t c, int64_t d) { return size_t((n * g.C + c) * g.D + d); }

// -sum_c w_c q(c) log softmax(x)_c at position (n, d).
double soft_ce(const Vec& x, const Geo& g, int64_t n, int64_t d, const Vec& w, const std::function<double(int64_t)>& q) {
  double mx = -std::numeric_limits<double>::infinity();
  for (int64_t c = 0; c < g.C; ++c) mx = std::max(mx, x[at(g, n, c, d)]);
  double s = 0;
  for (int64_t c = 0; c < g.C; ++c) s += std::exp(x[at(g, n, c, d)] - mx);
  double lse = mx + std::log(s), l = 0;
  for (int64_t c = 0; c < g.C; ++c) l -= (w.empty() ? 1.0 : w[size_t(c)]) * q(c) * (x[at(g, n, c, d)] - lse);
  return l;
}

Vec reduce_ref(const Vec& per, Reduction r, double denom) {
  if (r == Reduction::None) return per;
  double s = 0;
  for (double v : per) s += v;
  return {r == Reduction::Sum ? s : s / denom};
}

// PyTorch's class-index cross_entropy: the target distribution (1 - eps) onehot(t) +
// eps / C, weighted per class; Mean divides by the sum of w[t] over kept positions.
Vec ref_ce_index(const Vec& x, const Shape& shape, const std::vector<int64_t>& t, const Vec& w, int64_t ignore,
                 double eps, Reduction r) {
  Geo g = geo_of(shape);
  Vec per(size_t(g.N * g.D), 0.0);
  double denom = 0;
  for (int64_t n = 0; n < g.N; ++n)
    for (int64_t d = 0; d < g.D; ++d) {
      int64_t tt = t[size_t(n * g.D + d)];
      if (tt == ignore) continue;
      per[size_t(n * g.D + d)] =
          soft_ce(x, g, n, d, w, [&](int64_t c) { return (1 - eps) * double(c == tt) + eps / double(g.C); });
      denom += w.empty() ? 1.0 : w[size_t(tt)];
    }
  return reduce_ref(per, r, denom);
}

// Probability targets p (the logits' shape): q = (1 - eps) p + eps / C; Mean divides by
// the number of positions.
Vec ref_ce_prob(const Vec& x, const Shape& shape, const Vec& p, const Vec& w, double eps, Reduction r) {
  Geo g = geo_of(shape);
  Vec per(size_t(g.N * g.D));
  for (int64_t n = 0; n < g.N; ++n)
    for (int64_t d = 0; d < g.D; ++d)
      per[size_t(n * g.D + d)] =
          soft_ce(x, g, n, d, w, [&](int64_t c) { return (1 - eps) * p[at(g, n, c, d)] + eps / double(g.C); });
  return reduce_ref(per, r, double(g.N * g.D));
}

Vec ref_nll(const Vec& x, const Shape& shape, const std::vector<int64_t>& t, const Vec& w, int64_t ignore,
            Reduction r) {
  Geo g = geo_of(shape);
  Vec per(size_t(g.N * g.D), 0.0);
  double denom = 0;
  for (int64_t n = 0; n < g.N; ++n)
    for (int64_t d = 0; d < g.D; ++d) {
      int64_t tt = t[size_t(n * g.D + d)];
      if (tt == ignore) continue;
      double wt = w.empty() ? 1.0 : w[size_t(tt)];
      per[size_t(n * g.D + d)] = -wt * x[at(g, n, tt, d)];
      denom += wt;
    }
  return reduce_ref(per, r, denom);
}

// Central differences of sum(f(x) * v) in every element of x.
Vec fd_grad(const std::function<Vec(const Vec&)>& f, Vec x, const Vec& v) {
  const double h = 1e-6;
  Vec g(x.size());
  auto dot = [&](const Vec& y) {
    double s = 0;
    for (size_t i = 0; i < y.size(); ++i) s += y[i] * v[i];
    return s;
  };
  for (size_t i = 0; i < x.size(); ++i) {
    double x0 = x[i];
    x[i] = x0 + h;
    double fp = dot(f(x));
    x[i] = x0 - h;
    double fm = dot(f(x));
    x[i] = x0;
    g[i] = (fp - fm) / (2 * h);
  }
  return g;
}

// ---------------------------------------------------------------- comparisons

// max |got - want| / max |want| <= tol (relative to the tensor's scale, so entries near
// zero do not dominate); a NaN in want asks for a NaN in got.
void check_rel(const Tensor& got, const Vec& want, double tol) {
  Vec g = got.to_vector<double>();
  REQUIRE(g.size() == want.size());
  double diff = 0, scale = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    if (std::isnan(want[i])) {
      CHECK_MESSAGE(std::isnan(g[i]), "element " << i << ": want NaN, got " << g[i]);
      continue;
    }
    diff = std::max(diff, std::abs(g[i] - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  CHECK_MESSAGE(diff <= tol * std::max(scale, 1e-30), "max diff " << diff << " at scale " << scale);
}

double tol_for(DType dt) { return dt == kFloat64 ? 1e-9 : 1e-5; }
// Central differences carry about 1e-9 of error; a float32 gradient about 1e-7.
double grad_tol_for(DType dt) { return dt == kFloat64 ? 1e-7 : 1e-5; }

// out.backward(v) for a loss of any shape; v random of out's shape, returned as doubles.
Vec backward_random(const Tensor& out, uint64_t seed) {
  manual_seed(seed);
  Tensor v = randn(out.shape(), kFloat64);
  out.backward(v.to(out.dtype()).to(out.device()));
  // What the reference is projected on: the values the library actually used.
  return v.to(out.dtype()).to_vector<double>();
}

const char* rname(Reduction r) { return r == Reduction::None ? "none" : r == Reduction::Sum ? "sum" : "mean"; }

std::vector<Shape> layouts() { return {{5}, {4, 5}, {3, 5, 2, 3}}; }

// Class targets for `tshape`, in [0, C); with `ignore` >= 0 every third position (and at
// least one, but never all of several) takes that value.
std::vector<int64_t> make_targets(const Shape& tshape, int64_t C, int64_t ignore, uint64_t seed) {
  manual_seed(seed);
  std::vector<int64_t> t = randint(0, C, tshape).to_vector<int64_t>();
  if (ignore >= 0)
    for (size_t i = 0; i < t.size(); i += 3) t[i] = ignore;
  return t;
}

}  // namespace

// ---------------------------------------------------------------- the vectorisable exp

TEST_CASE("exp_vec is within 3 ulp of exp over float's range, 0 below it, NaN for NaN") {
  double worst = 0;
  for (int64_t i = 0; i <= 2000000; ++i) {
    float x = float(-87.3 + (88.3 + 87.3) * double(i) / 2000000.0);
    double want = std::exp(double(x)), got = double(cpu::exp_vec(x));
    worst = std::max(worst, std::abs(got - want) / want);
  }
  INFO("worst relative error " << worst);
  CHECK(worst <= 3 * std::ldexp(1.0, -24));  // 3 ulp: an ulp is 2^-23 relative at most, 2^-24 at least
  CHECK(cpu::exp_vec(0.0f) == 1.0f);
  CHECK(cpu::exp_vec(-90.0f) == 0.0f);
  CHECK(cpu::exp_vec(-std::numeric_limits<float>::infinity()) == 0.0f);
  CHECK(std::isnan(cpu::exp_vec(std::numeric_limits<float>::quiet_NaN())));
}

// erf_vec (the CPU's float32 GELU) against the double erf, in float32 ulp of the value.
TEST_CASE("erf_vec is within 3 ulp of erf over [-6, 6], odd, ±1 beyond, NaN for NaN") {
  double worst = 0;
  float at = 0;
  for (int64_t i = 0; i <= 2400000; ++i) {
    const float x = float(-6.0 + 12.0 * double(i) / 2400000.0);
    const double want = std::erf(double(x)), got = double(cpu::erf_vec(x));
    const float w32 = std::fabs(float(want));
    const double ulp = double(std::nextafter(w32, 2.0f)) - double(w32);
    if (want != 0 && std::abs(got - want) / ulp > worst) {
      worst = std::abs(got - want) / ulp;
      at = x;
    }
  }
  INFO("worst " << worst << " ulp at " << at);
  CHECK(worst <= 3);
  CHECK(cpu::erf_vec(0.0f) == 0.0f);
  CHECK(cpu::erf_vec(1e-30f) == doctest::Approx(1.1283791670955126e-30).epsilon(1e-6));
  CHECK(cpu::erf_vec(-0.5f) == -cpu::erf_vec(0.5f));
  CHECK(cpu::erf_vec(7.0f) == 1.0f);
  CHECK(cpu::erf_vec(-std::numeric_limits<float>::infinity()) == -1.0f);
  CHECK(std::isnan(cpu::erf_vec(std::numeric_limits<float>::quiet_NaN())));
}

// ---------------------------------------------------------------- cross_entropy, class indices

TEST_CASE("cross_entropy with class indices: every option combination and layout against loops") {
  uint64_t seed = 100;
  for (Device dev : test_devices())
    for (DType dt : {kFloat64, kFloat32})
      for (const Shape& shape : layouts())
        for (bool weighted : {false, true})
          for (int64_t ignore : {int64_t(-100), int64_t(2)})  // -100: never a target; 2: a class, some targets
            for (double eps : {0.0, 0.3, 1.0})
              for (Reduction r : {Reduction::None, Reduction::Mean, Reduction::Sum}) {
                ++seed;
                INFO(dev.str() << " " << dtype_name(dt) << " shape " << shape_str(shape) << " weight " << weighted
                               << " ignore " << ignore << " smoothing " << eps << " " << rname(r));
                Geo g = geo_of(shape);
                manual_seed(seed);
                Tensor x = (randn(shape, kFloat64) * 2.0).to(dt);
                Tensor w = (rand({g.C}, kFloat64) + 0.5).to(dt);
                std::vector<int64_t> t = make_targets(g.target_shape, g.C, ignore, seed);
                Vec xv = x.to_vector<double>(), wv = weighted ? w.to_vector<double>() : Vec();

                Tensor xl = on(x, dev).requires_grad_();
                CrossEntropyOptions o = CrossEntropyOptions().ignore_index(ignore).label_smoothing(eps).reduction(r);
                if (weighted) o.weight(on(w, dev));
                Tensor out = cross_entropy(xl, from_vector(t, g.target_shape).to(dev), o);
                Vec want = ref_ce_index(xv, shape, t, wv, ignore, eps, r);
                CHECK(out.shape() == (r == Reduction::None ? g.target_shape : Shape{}));
                check_rel(out, want, tol_for(dt));
                // The (C) layout with its one target ignored has a NaN mean and no gradient.
                if (std::isnan(want[0])) {
                  out.backward();
                  CHECK(max(xl.grad().abs()).item() == 0);
                  continue;
                }
                Vec v = backward_random(out, seed);
                Vec gw = fd_grad([&](const Vec& xx) { return ref_ce_index(xx, shape, t, wv, ignore, eps, r); }, xv, v);
                check_rel(xl.grad(), gw, grad_tol_for(dt));
              }
}

// bfloat16 logits and class weights outside autocast: the kernels compute in float32, so
// the loss is the float32 loss of the same (bfloat16-exact) values, and the gradient that
// one rounded to bfloat16.
TEST_CASE("cross_entropy on bfloat16 logits with bfloat16 class weights equals float32 on the same values") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(77);
    const Tensor x = (randn({6, 9}) * 2.0).to(kBFloat16), w = (rand({9}) + 0.5).to(kBFloat16);
    const Tensor t = from_vector(std::vector<int64_t>{0, 8, 3, 3, 5, 1}, {6});
    for (double eps : {0.0, 0.2}) {
      INFO("smoothing " << eps);
      Tensor xb = on(x, dev).requires_grad_(), xf = on(x.to(kFloat32), dev).requires_grad_();
      Tensor lb = cross_entropy(xb, on(t, dev), CrossEntropyOptions().weight(on(w, dev)).label_smoothing(eps));
      Tensor lf = cross_entropy(xf, on(t, dev), CrossEntropyOptions().weight(on(w.to(kFloat32), dev)).label_smoothing(eps));
      CHECK(lb.dtype() == kFloat32);
      CHECK(std::abs(lb.item() - lf.item()) <= 1e-6 * std::abs(lf.item()));
      lb.backward();
      lf.backward();
      CHECK(xb.grad().dtype() == kBFloat16);
      CHECK(max_abs_diff(xb.grad(), xf.grad().to(kBFloat16)) == 0);
    }
  }
}

// The same on every layout (lines along a strided class dimension included), unreduced,
// with ignored targets and smoothing: the bfloat16 logits are read in place (the CPU widens
// each as it reads it), the loss equals float32's on the same values bit for bit, and
// the gradient is float32's rounded once. Lines of 37 as well: whole vectors and a tail
// in the CPU's widening and rounding of a line.
TEST_CASE("cross_entropy on bfloat16 logits equals float32 on the same values on every layout") {
  uint64_t seed = 1300;
  std::vector<Shape> shapes = layouts();
  shapes.push_back({4, 37});
  for (Device dev : test_devices())
    for (const Shape& shape : shapes)
      for (double eps : {0.0, 0.3}) {
        ++seed;
        INFO(dev.str() << " shape " << shape_str(shape) << " smoothing " << eps);
        Geo g = geo_of(shape);
        manual_seed(seed);
        const Tensor x = (randn(shape, kFloat64) * 3.0).to(kBFloat16);
        const Tensor t = on(from_vector(make_targets(g.target_shape, g.C, 2, seed), g.target_shape), dev);
        const CrossEntropyOptions o = CrossEntropyOptions().ignore_index(2).label_smoothing(eps).reduction(Reduction::None);
        Tensor xb = on(x, dev).requires_grad_(), xf = on(x.to(kFloat32), dev).requires_grad_();
        Tensor lb = cross_entropy(xb, t, o), lf = cross_entropy(xf, t, o);
        CHECK(max_abs_diff(lb, lf) == 0);
        const Tensor up = on(randn(lf.shape()), dev);
        (lb * up).sum().backward();
        (lf * up).sum().backward();
        CHECK(max_abs_diff(xb.grad(), xf.grad().to(kBFloat16)) == 0);
      }
}

TEST_CASE("cross_entropy on float16 logits equals float32 on the same values; the gradient is rounded once") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(77);
    const Tensor x = (randn({5, 11}, kFloat64) * 3.0).to(kFloat16);
    const Tensor t = on(from_vector(std::vector<int64_t>{0, 3, 10, 2, 7}, {5}), dev);
    Tensor xh = on(x, dev).requires_grad_(), xf = on(x.to(kFloat32), dev).requires_grad_();
    Tensor lh = cross_entropy(xh, t), lf = cross_entropy(xf, t);
    CHECK(lh.dtype() == kFloat32);
    CHECK(lh.item<double>() == lf.item<double>());
    lh.backward();
    lf.backward();
    CHECK(xh.grad().dtype() == kFloat16);
    CHECK(max_abs_diff(xh.grad(), xf.grad().to(kFloat16)) == 0);
  }
}

// When the logits are a temporary that only the loss keeps (a model's head output), the
// CPU and CUDA kernels write their gradient over them instead of into a new tensor; retaining the graph
// keeps them. The gradient must be the same bits either way, on every layout and option,
// for float32, float64 and autocast's bfloat16, and a retained graph run twice gives
// twice the gradient.
TEST_CASE("cross_entropy's gradient over its own logits equals the gradient into a new tensor") {
  uint64_t seed = 900;
  for (Device dev : test_devices())
    for (DType dt : {kFloat64, kFloat32, kBFloat16})
      for (const Shape& shape : layouts())
        for (bool weighted : {false, true})
          for (double eps : {0.0, 0.3}) {
            ++seed;
            INFO(dev.str() << " " << dtype_name(dt) << " shape " << shape_str(shape) << " weight " << weighted
                           << " smoothing " << eps);
            Geo g = geo_of(shape);
            manual_seed(seed);
            Tensor x = on((randn(shape, kFloat64) * 2.0).to(dt), dev);
            Tensor w = on((rand({g.C}, kFloat64) + 0.5).to(dt == kBFloat16 ? kFloat32 : dt), dev);
            Tensor t = on(from_vector(make_targets(g.target_shape, g.C, 2, seed), g.target_shape), dev);
            CrossEntropyOptions o = CrossEntropyOptions().ignore_index(2).label_smoothing(eps);
            if (weighted && dt != kBFloat16) o.weight(w);
            // Held: the logits are the leaf itself, which the caller keeps.
            Tensor held = x.clone().requires_grad_();
            cross_entropy(held, t, o).backward();
            // Temporary: the logits are held * 1, which only the loss keeps.
            Tensor leaf = x.clone().requires_grad_();
            cross_entropy(leaf * 1.0, t, o).backward();
            CHECK(max_abs_diff(leaf.grad(), held.grad()) == 0);
            CHECK(max_abs_diff(leaf, x) == 0);
            // Retained: run twice, the logits kept intact for the second run.
            Tensor twice = x.clone().requires_grad_();
            Tensor loss = cross_entropy(twice * 1.0, t, o);
            loss.backward(Tensor(), true);
            loss.backward();
            CHECK(max_abs_diff(twice.grad(), held.grad() * 2.0) <= (dt == kBFloat16 ? 1e-2 : 1e-12));
          }
}

TEST_CASE("cross_entropy with probability targets: every option combination and layout against loops") {
  uint64_t seed = 500;
  for (Device dev : test_devices())
    for (DType dt : {kFloat64, kFloat32})
      for (const Shape& shape : layouts())
        for (bool weighted : {false, true})
          for (double eps : {0.0, 0.3, 1.0})
            for (Reduction r : {Reduction::None, Reduction::Mean, Reduction::Sum}) {
              ++seed;
              INFO(dev.str() << " " << dtype_name(dt) << " shape " << shape_str(shape) << " weight " << weighted
                             << " smoothing " << eps << " " << rname(r));
              Geo g = geo_of(shape);
              int64_t cdim = shape.size() == 1 ? 0 : 1;
              manual_seed(seed);
              Tensor x = (randn(shape, kFloat64) * 2.0).to(dt);
              Tensor p = softmax(randn(shape, kFloat64), cdim).to(dt);
              Tensor w = (rand({g.C}, kFloat64) + 0.5).to(dt);
              Vec xv = x.to_vector<double>(), pv = p.to_vector<double>(), wv = weighted ? w.to_vector<double>() : Vec();

              Tensor xl = on(x, dev).requires_grad_(), pl = on(p, dev).requires_grad_();
              CrossEntropyOptions o = CrossEntropyOptions().label_smoothing(eps).reduction(r);
              if (weighted) o.weight(on(w, dev));
              Tensor out = cross_entropy(xl, pl, o);
              CHECK(out.shape() == (r == Reduction::None ? g.target_shape : Shape{}));
              check_rel(out, ref_ce_prob(xv, shape, pv, wv, eps, r), tol_for(dt));
              Vec v = backward_random(out, seed);
              check_rel(xl.grad(), fd_grad([&](const Vec& xx) { return ref_ce_prob(xx, shape, pv, wv, eps, r); }, xv, v),
                        grad_tol_for(dt));
              // The target is differentiable too, as in PyTorch.
              check_rel(pl.grad(), fd_grad([&](const Vec& pp) { return ref_ce_prob(xv, shape, pp, wv, eps, r); }, pv, v),
                        grad_tol_for(dt));
            }
}

// The fused kernels against the same loss composed of library ops (log_softmax, gather,
// sums), values and gradients, on shapes that take the kernels' every path: one thread
// and several, unit-stride lines and strided ones, contiguous and transposed logits.
TEST_CASE("fused cross_entropy equals the composed log_softmax + gather version") {
  auto composed = [](const Tensor& x, const std::vector<int64_t>& t, const Shape& tshape, const Tensor& w,
                     int64_t ignore, double eps, Reduction r) {
    int64_t cdim = x.dim() == 1 ? 0 : 1, C = x.shape()[size_t(cdim)];
    Tensor lp = log_softmax(x, cdim);
    std::vector<int64_t> safe(t);
    Vec wt(t.size()), keep(t.size());
    Vec wv = w.defined() ? w.to_vector<double>() : Vec();
    double denom = 0;
    for (size_t i = 0; i < t.size(); ++i) {
      bool ign = t[i] == ignore;
      safe[i] = ign ? 0 : t[i];
      keep[i] = ign ? 0 : 1;
      wt[i] = ign ? 0 : wv.empty() ? 1 : wv[size_t(t[i])];
      denom += wt[i];
    }
    Shape ishape = x.shape();
    ishape[size_t(cdim)] = 1;
    Tensor picked = gather(lp, cdim, from_vector(safe, ishape)).reshape(tshape);
    Tensor nll = -(picked * from_vector(wt, tshape, x.dtype()));
    Shape wshape(size_t(x.dim()), 1);
    wshape[size_t(cdim)] = C;
    Tensor wl = w.defined() ? lp * w.reshape(wshape) : lp;
    Tensor smooth = -wl.sum({cdim}) * from_vector(keep, tshape, x.dtype());
    Tensor per = nll * (1 - eps) + smooth * (eps / double(C));
    return r == Reduction::None ? per : r == Reduction::Sum ? per.sum() : per.sum() / denom;
  };
  struct Case {
    Shape shape;
    bool transpose;
  };
  std::vector<Case> cases = {{{64, 1000}, false},     // several threads, unit-stride lines
                             {{2, 3000}, false},      // long lines, one per thread
                             {{4, 300, 5}, false},    // strided lines on several threads
                             {{2, 7, 3, 2}, false},   // strided, small
                             {{300, 40}, true}};      // a transposed view: copied contiguous first
  uint64_t seed = 900;
  for (Device dev : test_devices())
    for (DType dt : {kFloat64, kFloat32})
      for (const Case& k : cases)
        for (bool weighted : {false, true})
          for (double eps : {0.0, 0.2})
            for (Reduction r : {Reduction::None, Reduction::Mean, Reduction::Sum}) {
              ++seed;
              Shape shape = k.transpose ? Shape{k.shape[1], k.shape[0]} : k.shape;
              INFO(dtype_name(dt) << " shape " << shape_str(shape) << (k.transpose ? " transposed" : "") << " weight "
                                  << weighted << " smoothing " << eps << " " << rname(r));
              Geo g = geo_of(shape);
              manual_seed(seed);
              Tensor base = (randn(k.shape, kFloat64) * 3.0).to(dt);
              Tensor w = weighted ? (rand({g.C}, kFloat64) + 0.5).to(dt) : Tensor();
              std::vector<int64_t> t = make_targets(g.target_shape, g.C, 1, seed);
              Tensor a = on(base, dev).requires_grad_(), b = base.detach().requires_grad_();
              CrossEntropyOptions o = CrossEntropyOptions().ignore_index(1).label_smoothing(eps).reduction(r);
              if (weighted) o.weight(on(w, dev));
              Tensor fused = cross_entropy(k.transpose ? a.t() : a, from_vector(t, g.target_shape).to(dev), o);
              Tensor comp = composed(k.transpose ? b.t() : b, t, g.target_shape, w, 1, eps, r);
              double tol = dt == kFloat64 ? 1e-12 : 2e-6;
              check_rel(fused, comp.to_vector<double>(), tol);
              Vec v = backward_random(fused, seed);
              comp.backward(from_vector(v, comp.shape(), dt));
              check_rel(a.grad(), b.grad().to_vector<double>(), tol);
            }
}

TEST_CASE("cross_entropy: all targets ignored, empty batches") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    // Every target ignored: Mean is 0/0 = NaN as in PyTorch, Sum 0, None zeros; no gradient.
    for (double eps : {0.0, 0.1})
      for (bool weighted : {false, true}) {
        INFO("smoothing " << eps << " weight " << weighted);
        Tensor x = on(randn({3, 4}), dev).requires_grad_();
        Tensor t = on(full({3}, -100, kInt64), dev);
        CrossEntropyOptions o = CrossEntropyOptions().label_smoothing(eps);
        if (weighted) o.weight(on(rand({4}) + 0.5, dev));
        Tensor mean = cross_entropy(x, t, o);
        CHECK(std::isnan(mean.item()));
        mean.backward();
        CHECK(max(x.grad().abs()).item() == 0);
        CHECK(cross_entropy(x, t, CrossEntropyOptions(o).reduction(Reduction::Sum)).item() == 0);
        check_close(cross_entropy(x, t, CrossEntropyOptions(o).reduction(Reduction::None)), {3}, {0, 0, 0}, 0);
      }
    // N = 0: Mean NaN, Sum 0, None empty, a gradient of the logits' (empty) shape.
    for (const Shape& shape : std::vector<Shape>{{0, 4}, {0, 4, 3}}) {
      INFO("shape " << shape_str(shape));
      Geo g = geo_of(shape);
      Tensor x = on(zeros(shape), dev).requires_grad_();
      Tensor t = on(zeros(g.target_shape, kInt64), dev);
      CHECK(std::isnan(cross_entropy(x, t).item()));
      CHECK(std::isnan(cross_entropy(x, t, CrossEntropyOptions().label_smoothing(0.2)).item()));
      CHECK(cross_entropy(x, t, Reduction::None).shape() == g.target_shape);
      Tensor s = cross_entropy(x, t, Reduction::Sum);
      CHECK(s.item() == 0);
      s.backward();
      CHECK(x.grad().shape() == shape);
      // Probability targets of an empty batch: the same.
      CHECK(std::isnan(cross_entropy(x, on(zeros(shape), dev)).item()));
      CHECK(cross_entropy(x, on(zeros(shape), dev), Reduction::Sum).item() == 0);
    }
  }
}

TEST_CASE("cross_entropy: the convenience signature, unbatched logits, NaN and -inf logits") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    Tensor logits = on(tensor({0.5, -1.0, 2.0}, kFloat64), dev);
    Tensor target = on(full({}, 2, kInt64), dev);
    double s = std::exp(0.5) + std::exp(-1.0) + std::exp(2.0);
    Tensor l = cross_entropy(logits, target, Reduction::None);
    CHECK(l.dim() == 0);
    CHECK(l.item() == doctest::Approx(std::log(s) - 2.0).epsilon(1e-12));
    CHECK(cross_entropy(logits, target).item() == doctest::Approx(std::log(s) - 2.0).epsilon(1e-12));
    // The positional (reduction, ignore_index) form is the options form.
    Tensor x = on(randn({6, 5}), dev);
    Tensor t = on(from_vector(std::vector<int64_t>{0, 3, 3, 1, 4, 3}, {6}), dev);
    CHECK(cross_entropy(x, t, Reduction::Sum, 3).item() ==
          cross_entropy(x, t, CrossEntropyOptions().reduction(Reduction::Sum).ignore_index(3)).item());
    // A NaN logit makes its row's loss NaN; -inf logits (masked classes) are fine when not
    // the target, and give +inf when they are.
    Tensor y = on(tensor({{0.0, NAN, 1.0}, {0.0, -INFINITY, 1.0}, {0.0, -INFINITY, 1.0}}), dev);
    Tensor ty = on(from_vector(std::vector<int64_t>{0, 2, 1}, {3}), dev);
    Vec per = cross_entropy(y, ty, Reduction::None).to_vector<double>();
    CHECK(std::isnan(per[0]));
    CHECK(per[1] == doctest::Approx(std::log(1 + std::exp(1.0)) - 1.0).epsilon(1e-6));
    CHECK(std::isinf(per[2]));
  }
}

TEST_CASE("cross_entropy errors name the problem and the values") {
  Tensor logits = zeros({2, 4});
  auto ti = [](std::vector<int64_t> v, Shape s) { return from_vector(v, s); };
  CHECK_THROWS_MU(cross_entropy(logits, ti({1, 4}, {2})),
                  "cross_entropy: target 4 is out of bounds for 4 classes (at position 1)");
  CHECK_THROWS_MU(cross_entropy(logits, ti({-3, 0}, {2})), "cross_entropy: target -3 is out of bounds for 4 classes (at position 0)");
  // In (N, d1, d2) targets the position is a multi-index.
  std::vector<int64_t> t3(12, 0);
  t3[size_t(flat({2, 2, 3}, {1, 0, 2}))] = 9;
  CHECK_THROWS_MU(cross_entropy(zeros({2, 4, 2, 3}), ti(t3, {2, 2, 3})),
                  "cross_entropy: target 9 is out of bounds for 4 classes (at position [1, 0, 2])");
  // An ignored value is never out of range, a negative one that is not ignored is.
  CHECK_NOTHROW(cross_entropy(logits, ti({-1, 0}, {2}), Reduction::Mean, -1));
  CHECK_THROWS_MU(cross_entropy(logits, ti({-1, 0}, {2})), "target -1 is out of bounds");
  CHECK_THROWS_MU(cross_entropy(logits, zeros({2})), "cross_entropy: target must hold int64 class indices, got float32");
  CHECK_THROWS_MU(cross_entropy(logits, zeros({3}, kInt64)),
                  "cross_entropy: target of shape [3] does not match input of shape [2, 4] (expected [2])");
  CHECK_THROWS_MU(cross_entropy(zeros({2, 3, 4}), zeros({2}, kInt64)),
                  "target of shape [2] does not match input of shape [2, 3, 4] (expected [2, 4])");
  CHECK_THROWS_MU(cross_entropy(logits.to(kInt64), zeros({2}, kInt64)), "cross_entropy: input must be floating point, got int64");
  CHECK_THROWS_MU(cross_entropy(zeros({}), zeros({}, kInt64)), "input must be (C), (N, C) or (N, C, d1, ...), got shape []");
  CHECK_THROWS_MU(cross_entropy(logits, zeros({2, 4}, kInt64)),
                  "a target of the input's shape [2, 4] holds class probabilities and must be floating point, got int64");
  CHECK_THROWS_MU(cross_entropy(logits, zeros({2, 4}), CrossEntropyOptions().ignore_index(3)),
                  "ignore_index (3) is not supported with class-probability targets");
  CHECK_THROWS_MU(cross_entropy(logits, zeros({2}, kInt64), CrossEntropyOptions().label_smoothing(1.5)),
                  "cross_entropy: label_smoothing must be between 0.0 and 1.0, got 1.5");
  CHECK_THROWS_MU(cross_entropy(logits, zeros({2}, kInt64), CrossEntropyOptions().label_smoothing(-0.1)),
                  "label_smoothing must be between 0.0 and 1.0, got -0.1");
  CHECK_THROWS_MU(cross_entropy(logits, zeros({2}, kInt64), CrossEntropyOptions().weight(ones({3}))),
                  "cross_entropy: weight must hold one value per class, shape [4], got shape [3]");
  CHECK_THROWS_MU(cross_entropy(logits, zeros({2, 4}), CrossEntropyOptions().weight(ones({4}, kFloat64))),
                  "cross_entropy: weight is float64 but the input is float32");
  CHECK_THROWS_MU(cross_entropy(logits, zeros({2}, kInt64), CrossEntropyOptions().weight(ones({4}).requires_grad_())),
                  "cross_entropy: weight requires grad, but its gradient is not implemented");
  {
    NoGradGuard g;  // without grad mode a weight that requires grad is just a constant
    CHECK_NOTHROW(cross_entropy(logits, zeros({2}, kInt64), CrossEntropyOptions().weight(ones({4}).requires_grad_())));
  }
}

// ---------------------------------------------------------------- cross_entropy: every line scheme

namespace {

// Per-line losses and the logits' gradient of class-index cross_entropy in double, from
// the closed forms (too many logits here for central differences): lse = log sum exp x,
// loss = (1 - s) w[t] (lse - x[t]) + (s / C) sum_c w[c] (lse - x[c]) and
// dx = v (a softmax - (s / C) w - (1 - s) w[t] onehot(t)), a = (1 - s) w[t] + (s / C) sum w,
// v the upstream value of the line; ignored lines 0.
struct CeRef {
  Vec loss, grad;
  double weight_sum = 0;  // of the lines kept
};
CeRef ref_ce_lines(const Vec& x, const Shape& shape, const std::vector<int64_t>& t, const Vec& w, int64_t ignore,
                   double eps, const Vec& v) {
  Geo g = geo_of(shape);
  CeRef r{Vec(size_t(g.N * g.D), 0.0), Vec(x.size(), 0.0)};
  auto wc = [&](int64_t c) { return w.empty() ? 1.0 : w[size_t(c)]; };
  double wsum = 0;
  for (int64_t c = 0; c < g.C; ++c) wsum += wc(c);
  for (int64_t n = 0; n < g.N; ++n)
    for (int64_t d = 0; d < g.D; ++d) {
      const size_t l = size_t(n * g.D + d);
      const int64_t tt = t[l];
      if (tt == ignore) continue;
      double m = -std::numeric_limits<double>::infinity();
      bool nan = false;
      for (int64_t c = 0; c < g.C; ++c) {
        nan = nan || std::isnan(x[at(g, n, c, d)]);
        m = std::max(m, x[at(g, n, c, d)]);
      }
      double s = 0, sx = 0;
      for (int64_t c = 0; c < g.C; ++c) s += std::exp(x[at(g, n, c, d)] - m);
      const double lse = nan ? kNaN : m + std::log(s);
      for (int64_t c = 0; c < g.C; ++c) sx += wc(c) * x[at(g, n, c, d)];
      r.loss[l] = (1 - eps) * wc(tt) * (lse - x[at(g, n, tt, d)]) + (eps > 0 ? eps / double(g.C) * (wsum * lse - sx) : 0);
      r.weight_sum += wc(tt);
      const double a = (1 - eps) * wc(tt) + eps / double(g.C) * wsum;
      for (int64_t c = 0; c < g.C; ++c)
        r.grad[at(g, n, c, d)] =
            v[l] * (a * std::exp(x[at(g, n, c, d)] - lse) - eps / double(g.C) * wc(c) - (c == tt ? (1 - eps) * wc(tt) : 0));
    }
  return r;
}

}  // namespace

// Shapes for each mapping of the CUDA kernels (ops/cuda/lines.cuh): more (N, C) lines than
// the grid has warps, lines longer than a warp's reach (a block per line), strided lines
// (N, C, d) with d not a multiple of the tile, and more tiles of strided lines than the
// grid has blocks. The first three lines not ignored hold a NaN, a -inf class and a -inf
// target. Per-line losses, and gradients for per-line and mean upstreams, on
// every device against the closed forms in double.
TEST_CASE("cross_entropy on every line scheme, with NaN and -inf logits: losses and gradients") {
  const std::vector<Shape> shapes = {{17000, 3}, {6, 1500}, {2, 1500, 3}, {2, 5, 70000}};
  uint64_t seed = 1200;
  for (Device dev : test_devices())
    for (DType dt : {kFloat64, kFloat32})
      for (const Shape& shape : shapes)
        for (bool weighted : {false, true})
          for (double eps : {0.0, 0.2}) {
            ++seed;
            INFO(dev.str() << " " << dtype_name(dt) << " shape " << shape_str(shape) << " weight " << weighted
                           << " smoothing " << eps);
            Geo g = geo_of(shape);
            manual_seed(seed);
            Vec xv = (randn(shape, kFloat64) * 2.0).to(dt).to_vector<double>();
            Tensor w = (rand({g.C}, kFloat64) + 0.5).to(dt);
            Vec wv = weighted ? w.to_vector<double>() : Vec();
            std::vector<int64_t> t = make_targets(g.target_shape, g.C, 1, seed);
            REQUIRE(t[0] == 1);  // ignored lines: every third, and those drawn as class 1
            // The first three kept lines get the specials.
            std::vector<int64_t> kept;
            for (size_t l = 0; l < t.size() && kept.size() < 3; ++l)
              if (t[l] != 1) kept.push_back(int64_t(l));
            REQUIRE(kept.size() == 3);
            // The element of class c in line l (= n * D + d).
            auto elem = [&](int64_t l, int64_t c) { return at(g, l / g.D, c, l % g.D); };
            xv[elem(kept[0], (t[size_t(kept[0])] + 1) % g.C)] = kNaN;
            xv[elem(kept[1], (t[size_t(kept[1])] + 1) % g.C)] = -std::numeric_limits<double>::infinity();
            xv[elem(kept[2], t[size_t(kept[2])])] = -std::numeric_limits<double>::infinity();
            Tensor target = from_vector(t, g.target_shape).to(dev);
            CrossEntropyOptions o = CrossEntropyOptions().ignore_index(1).label_smoothing(eps);
            if (weighted) o.weight(on(w, dev));
            const double tol = dt == kFloat64 ? 1e-10 : 1e-5;

            Tensor xl = on(from_vector(xv, shape, dt), dev).requires_grad_();
            Tensor per = cross_entropy(xl, target, CrossEntropyOptions(o).reduction(Reduction::None));
            Vec v = backward_random(per, seed);
            CeRef ref = ref_ce_lines(xv, shape, t, wv, 1, eps, v);
            // The specials show: a NaN loss, an infinite one (a -inf target), a finite one
            // for a -inf class without smoothing.
            CHECK(std::isnan(ref.loss[size_t(kept[0])]));
            CHECK(std::isfinite(ref.loss[size_t(kept[1])]) == (eps == 0));
            CHECK(std::isinf(ref.loss[size_t(kept[2])]));
            check_close_special(per, ref.loss, tol);
            check_close_special(xl.grad(), ref.grad, tol);

            // The mean: one upstream value for every line, scaled by 1 / sum of w[t].
            Tensor xm = on(from_vector(xv, shape, dt), dev).requires_grad_();
            cross_entropy(xm, target, CrossEntropyOptions(o).reduction(Reduction::Mean)).backward();
            CeRef mref = ref_ce_lines(xv, shape, t, wv, 1, eps, Vec(t.size(), 1.0 / ref.weight_sum));
            check_close_special(xm.grad(), mref.grad, tol);
          }
}

// Long contiguous lines (the CPU reads them in chunks of 1024, keeping a running max and
// rescaling its sums when a later chunk raises it): a max found only in the last chunk,
// one in the first, leading classes masked with -inf for two chunks, a NaN among masked
// classes before the finite ones (NaN, however late the finite values come), and a line
// of only -inf (NaN, as -inf - -inf). Losses and gradients against the closed forms in
// double, float32 and bfloat16 (the reference on the bfloat16 values), with and without
// smoothing and class weights.
TEST_CASE("cross_entropy on long lines: late and early maxima, masked leading classes, NaN among them") {
  const int64_t N = 6, C = 3000;  // C: two whole chunks of 1024, then 944 and a partial vector
  const double inf = std::numeric_limits<double>::infinity();
  manual_seed(31);
  const Vec noise = randn({N * C}, kFloat64).to_vector<double>();
  Vec xv(size_t(N * C));
  for (int64_t c = 0; c < C; ++c) {
    auto x = [&](int64_t n) -> double& { return xv[size_t(n * C + c)]; };
    const double r = noise[size_t(c)];
    x(0) = -10.0 + 0.01 * double(c) + 0.1 * r;  // rising: every chunk raises the max
    x(1) = 20.0 - 0.01 * double(c) + 0.1 * r;   // falling: the first chunk holds it
    x(2) = c < 2100 ? -inf : 3.0 * r;           // masked through two chunks
    x(3) = c == 700 ? kNaN : c < 1500 ? -inf : r;  // a NaN in a masked chunk
    x(4) = -inf;
    x(5) = 4.0 * noise[size_t(C + c)];  // spread: the max rarely in one chunk
  }
  const std::vector<int64_t> t = {2999, 5, 2500, 2000, 7, 1234};
  for (Device dev : test_devices())
    for (DType dt : {kFloat64, kFloat32, kBFloat16})
      for (bool weighted : {false, true})
        for (double eps : {0.0, 0.1}) {
          INFO(dev.str() << " " << dtype_name(dt) << " weight " << weighted << " smoothing " << eps);
          manual_seed(32);
          const Tensor w = (rand({C}, kFloat64) + 0.5).to(dt);
          const Tensor x = from_vector(xv, {N, C}, kFloat64).to(dt);
          const Vec xr = x.to_vector<double>();  // the values the kernel sees
          Tensor xl = on(x, dev).requires_grad_();
          CrossEntropyOptions o = CrossEntropyOptions().label_smoothing(eps).reduction(Reduction::None);
          if (weighted) o.weight(on(w, dev));
          Tensor per = cross_entropy(xl, on(from_vector(t, {N}), dev), o);
          const Vec v = backward_random(per, 33);
          const CeRef ref = ref_ce_lines(xr, {N, C}, t, weighted ? w.to_vector<double>() : Vec(), -100, eps, v);
          REQUIRE(std::isnan(ref.loss[3]));
          REQUIRE(std::isnan(ref.loss[4]));
          check_close_special(per, ref.loss, dt == kFloat64 ? 1e-10 : 1e-5);
          // bfloat16's gradient is float32's rounded: within half its ulp, 2^-9 relative.
          check_close_special(xl.grad(), ref.grad, dt == kFloat64 ? 1e-10 : dt == kFloat32 ? 1e-5 : 4e-3);
        }
}

// ---------------------------------------------------------------- nll_loss

TEST_CASE("nll_loss: every option combination and layout against loops") {
  uint64_t seed = 1500;
  for (Device dev : test_devices())
    for (DType dt : {kFloat64, kFloat32})
      for (const Shape& shape : layouts())
        for (bool weighted : {false, true})
          for (int64_t ignore : {int64_t(-100), int64_t(2)})
            for (Reduction r : {Reduction::None, Reduction::Mean, Reduction::Sum}) {
              ++seed;
              INFO(dev.str() << " " << dtype_name(dt) << " shape " << shape_str(shape) << " weight " << weighted
                             << " ignore " << ignore << " " << rname(r));
              Geo g = geo_of(shape);
              int64_t cdim = shape.size() == 1 ? 0 : 1;
              manual_seed(seed);
              Tensor x = log_softmax(randn(shape, kFloat64), cdim).to(dt);
              Tensor w = (rand({g.C}, kFloat64) + 0.5).to(dt);
              std::vector<int64_t> t = make_targets(g.target_shape, g.C, ignore, seed);
              Vec xv = x.to_vector<double>(), wv = weighted ? w.to_vector<double>() : Vec();
              Tensor xl = on(x, dev).requires_grad_();
              Tensor out = nll_loss(xl, from_vector(t, g.target_shape).to(dev), weighted ? on(w, dev) : Tensor(), r, ignore);
              Vec want = ref_nll(xv, shape, t, wv, ignore, r);
              check_rel(out, want, tol_for(dt));
              if (std::isnan(want[0])) continue;  // (C) with its target ignored: checked below
              Vec v = backward_random(out, seed);
              check_rel(xl.grad(), fd_grad([&](const Vec& xx) { return ref_nll(xx, shape, t, wv, ignore, r); }, xv, v),
                        grad_tol_for(dt));
            }
}

TEST_CASE("nll_loss: ignored -inf entries stay out of the loss; degenerate inputs; errors") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    // Ignored targets pick class 0 internally: a -inf there must not turn into NaN.
    Tensor x = on(tensor({{-INFINITY, -0.5}, {-1.0, -0.25}}), dev).requires_grad_();
    Tensor t = on(from_vector(std::vector<int64_t>{-100, 0}, {2}), dev);
    Tensor l = nll_loss(x, t);
    CHECK(l.item() == doctest::Approx(1.0));
    l.backward();
    check_close(x.grad(), {2, 2}, {0, 0, -1, 0}, 0);
    CHECK(std::isnan(nll_loss(on(zeros({2, 3}), dev), on(full({2}, -100, kInt64), dev)).item()));
    CHECK(std::isnan(nll_loss(on(zeros({0, 3}), dev), on(zeros({0}, kInt64), dev)).item()));
    CHECK(nll_loss(on(zeros({0, 3}), dev), on(zeros({0}, kInt64), dev), Tensor(), Reduction::Sum).item() == 0);
  }
  CHECK_THROWS_MU(nll_loss(zeros({2, 4}), from_vector(std::vector<int64_t>{0, 7}, {2})),
                  "nll_loss: target 7 is out of bounds for 4 classes (at position 1)");
  CHECK_THROWS_MU(nll_loss(zeros({2, 4}), zeros({2, 1}, kInt64)), "nll_loss: target of shape [2, 1] does not match");
  CHECK_THROWS_MU(nll_loss(zeros({2, 4}), zeros({2}, kInt64), ones({5})), "nll_loss: weight must hold one value per class");
}

// ---------------------------------------------------------------- mse_loss

TEST_CASE("mse_loss against loops, every reduction") {
  uint64_t seed = 2000;
  for (Device dev : test_devices())
    for (DType dt : {kFloat64, kFloat32})
      for (const Shape& shape : std::vector<Shape>{{7}, {3, 4, 2}, {}})
        for (Reduction r : {Reduction::None, Reduction::Mean, Reduction::Sum}) {
          ++seed;
          INFO(dtype_name(dt) << " shape " << shape_str(shape) << " " << rname(r));
          manual_seed(seed);
          Tensor a = randn(shape, dt), b = randn(shape, dt);
          Vec av = a.to_vector<double>(), bv = b.to_vector<double>();
          auto ref = [&](const Vec& x, const Vec& y) {
            Vec per(x.size());
            for (size_t i = 0; i < x.size(); ++i) per[i] = (x[i] - y[i]) * (x[i] - y[i]);
            return reduce_ref(per, r, double(x.size()));
          };
          Tensor al = on(a, dev).requires_grad_(), bl = on(b, dev).requires_grad_();
          Tensor out = mse_loss(al, bl, r);
          check_rel(out, ref(av, bv), tol_for(dt));
          Vec v = backward_random(out, seed);
          check_rel(al.grad(), fd_grad([&](const Vec& x) { return ref(x, bv); }, av, v), grad_tol_for(dt));
          check_rel(bl.grad(), fd_grad([&](const Vec& y) { return ref(av, y); }, bv, v), grad_tol_for(dt));
        }
  CHECK(std::isnan(mse_loss(zeros({0}), zeros({0})).item()));
  CHECK_THROWS_MU(mse_loss(zeros({4, 1}), zeros({4})), "mse_loss: input of shape [4, 1] and target of shape [4] differ");
}

// ---------------------------------------------------------------- binary_cross_entropy_with_logits

TEST_CASE("binary_cross_entropy_with_logits against loops: weight x pos_weight x reduction") {
  // log(1 + exp(-x)) without overflow, in double.
  auto softplus_neg = [](double x) { return x >= 0 ? std::log1p(std::exp(-x)) : -x + std::log1p(std::exp(x)); };
  uint64_t seed = 2500;
  const Shape shape{5, 3};
  for (Device dev : test_devices())
    for (DType dt : {kFloat64, kFloat32})
      for (int weight_kind : {0, 1, 2})  // none, per class (3), full (5, 3)
        for (bool pos : {false, true})
          for (Reduction r : {Reduction::None, Reduction::Mean, Reduction::Sum}) {
            ++seed;
            INFO(dtype_name(dt) << " weight " << weight_kind << " pos_weight " << pos << " " << rname(r));
            manual_seed(seed);
            Tensor x = (randn(shape, kFloat64) * 4.0).to(dt), y = rand(shape, dt);
            Tensor w = weight_kind == 0 ? Tensor() : rand(weight_kind == 1 ? Shape{3} : shape, dt) + 0.5;
            Tensor pw = pos ? rand({3}, dt) * 3.0 : Tensor();
            Vec xv = x.to_vector<double>(), yv = y.to_vector<double>();
            Vec wv = w.defined() ? w.to_vector<double>() : Vec(), pv = pw.defined() ? pw.to_vector<double>() : Vec();
            auto ref = [&](const Vec& xx, const Vec& yy, const Vec& ww, const Vec& pp) {
              Vec per(xx.size());
              for (size_t i = 0; i < xx.size(); ++i) {
                size_t c = i % 3;
                double lw = pp.empty() ? 1 : 1 + (pp[c] - 1) * yy[i];
                double wi = ww.empty() ? 1 : ww[ww.size() == 3 ? c : i];
                per[i] = wi * ((1 - yy[i]) * xx[i] + lw * softplus_neg(xx[i]));
              }
              return reduce_ref(per, r, double(xx.size()));
            };
            Tensor xl = on(x, dev).requires_grad_(), yl = on(y, dev).requires_grad_();
            Tensor wl = w.defined() ? on(w, dev).requires_grad_() : Tensor();
            Tensor pl = pw.defined() ? on(pw, dev).requires_grad_() : Tensor();
            Tensor out = binary_cross_entropy_with_logits(xl, yl, wl, pl, r);
            check_rel(out, ref(xv, yv, wv, pv), tol_for(dt));
            Vec v = backward_random(out, seed);
            check_rel(xl.grad(), fd_grad([&](const Vec& a) { return ref(a, yv, wv, pv); }, xv, v), grad_tol_for(dt));
            check_rel(yl.grad(), fd_grad([&](const Vec& a) { return ref(xv, a, wv, pv); }, yv, v), grad_tol_for(dt));
            if (wl.defined())
              check_rel(wl.grad(), fd_grad([&](const Vec& a) { return ref(xv, yv, a, pv); }, wv, v), grad_tol_for(dt));
            if (pl.defined())
              check_rel(pl.grad(), fd_grad([&](const Vec& a) { return ref(xv, yv, wv, a); }, pv, v), grad_tol_for(dt));
          }
}

TEST_CASE("binary_cross_entropy_with_logits: large logits, the gradient at 0, errors") {
  // Far from 0 the stable form neither overflows nor loses the small term.
  Tensor x = tensor({-100.0, 100.0, 0.0}, kFloat64).requires_grad_();
  Tensor y = tensor({1.0, 0.0, 1.0}, kFloat64);
  Tensor l = binary_cross_entropy_with_logits(x, y, Tensor(), Tensor(), Reduction::None);
  check_close(l, {3}, {100.0, 100.0, std::log(2.0)}, 1e-12);
  // d/dx at x = 0 with t = 1 is sigmoid(0) - 1 = -1/2 (not the -1 a kink would give).
  l.sum().backward();
  check_close(x.grad(), {3}, {-1.0, 1.0, -0.5}, 1e-12);
  CHECK_THROWS_MU(binary_cross_entropy_with_logits(zeros({3, 4}), zeros({3, 5})),
                  "binary_cross_entropy_with_logits: target of shape [3, 5] must have the shape of the input, [3, 4]");
  CHECK_THROWS_MU(binary_cross_entropy_with_logits(zeros({3, 4}), zeros({3, 4}), zeros({2, 3, 4})),
                  "weight of shape [2, 3, 4] does not broadcast to the input's shape [3, 4]");
  CHECK_THROWS_MU(binary_cross_entropy_with_logits(zeros({3, 4}), zeros({3, 4}), Tensor(), zeros({5})),
                  "binary_cross_entropy_with_logits");
}
