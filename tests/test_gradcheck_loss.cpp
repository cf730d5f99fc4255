// Finite-difference checks (float64) of every loss's gradient, over every combination
// of its options and input layouts, including non-contiguous logits made inside the
// checked function; on every test device, with inputs, targets and weights made on the
// CPU and moved there.
#include "helpers.h"

using namespace mu;
using autograd::TensorList;

namespace {

// gradcheck of fn on `inputs` moved to dev.
void check_grad(Device dev, const autograd::GradcheckFn& fn, const TensorList& inputs) {
  TensorList moved;
  for (const Tensor& t : inputs) moved.push_back(on(t, dev));
  auto r = autograd::gradcheck(fn, moved);
  CHECK_MESSAGE(r.ok, r.message);
}

const char* rname(Reduction r) { return r == Reduction::None ? "none" : r == Reduction::Sum ? "sum" : "mean"; }

const Reduction kReductions[] = {Reduction::None, Reduction::Mean, Reduction::Sum};

// Layouts (C), (N, C), (N, C, d1, d2) with their target shapes.
struct Layout {
  Shape logits, target;
};
const Layout kLayouts[] = {{{5}, {}}, {{4, 5}, {4}}, {{3, 5, 2, 2}, {3, 2, 2}}};

// Targets in [0, 5), with class 2 at a few positions (the ignore_index of some checks);
// never all of them, so a Mean is finite.
Tensor targets(const Shape& s) {
  int64_t n = numel_of(s);
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = n == 1 ? 4 : (i * 3 + 1) % 5;  // hits 2 at i = 2, 7, ...
  return from_vector(v, s);
}

}  // namespace

TEST_CASE("gradcheck cross_entropy with class indices: weight x ignore_index x smoothing x reduction x layout") {
  const Tensor weight = rand({5}, kFloat64) + 0.5;  // drawn once: the same on every device
  for (Device dev : test_devices()) {
    INFO(dev.str());
    Tensor w = on(weight, dev);
    uint64_t seed = 10;
    for (const Layout& L : kLayouts)
      for (bool weighted : {false, true})
        for (int64_t ignore : {int64_t(-100), int64_t(2)})
          for (double eps : {0.0, 0.3, 1.0})
            for (Reduction r : kReductions) {
              INFO("shape " << shape_str(L.logits) << " weight " << weighted << " ignore " << ignore << " smoothing "
                            << eps << " " << rname(r));
              Tensor t = on(targets(L.target), dev);
              CrossEntropyOptions o = CrossEntropyOptions().ignore_index(ignore).label_smoothing(eps).reduction(r);
              if (weighted) o.weight(w);
              check_grad(dev, [&](const TensorList& in) { return cross_entropy(in[0], t, o); },
                         {rnd(L.logits, ++seed)});
            }
    // Non-contiguous logits (a transposed view, a strided slice), and logits computed by
    // a broadcasting op in front.
    Tensor t = on(targets({4}), dev);
    CrossEntropyOptions o = CrossEntropyOptions().weight(w).label_smoothing(0.2);
    check_grad(dev, [&](const TensorList& in) { return cross_entropy(in[0].t(), t, o); }, {rnd({5, 4}, 60)});
    check_grad(dev, [&](const TensorList& in) { return cross_entropy(in[0].slice(1, 0, 10, 2), t, o); },
               {rnd({4, 10}, 61)});
    check_grad(dev, [&](const TensorList& in) { return cross_entropy(in[0] + in[1], t, o); },
               {rnd({4, 5}, 62), rnd({5}, 63)});
  }
}

TEST_CASE("gradcheck cross_entropy with probability targets: logits and target, weight x smoothing x reduction x layout") {
  const Tensor weight = rand({5}, kFloat64) + 0.5;  // drawn once: the same on every device
  for (Device dev : test_devices()) {
    INFO(dev.str());
    Tensor w = on(weight, dev);
    uint64_t seed = 100;
    for (const Layout& L : kLayouts)
      for (bool weighted : {false, true})
        for (double eps : {0.0, 0.3, 1.0})
          for (Reduction r : kReductions) {
            INFO("shape " << shape_str(L.logits) << " weight " << weighted << " smoothing " << eps << " " << rname(r));
            CrossEntropyOptions o = CrossEntropyOptions().label_smoothing(eps).reduction(r);
            if (weighted) o.weight(w);
            int64_t cdim = L.logits.size() == 1 ? 0 : 1;
            Tensor p = softmax(rnd(L.logits, ++seed), cdim);  // on the CPU; check_grad moves it
            check_grad(dev, [&](const TensorList& in) { return cross_entropy(in[0], in[1], o); },
                       {rnd(L.logits, ++seed), p});
          }
  }
}

TEST_CASE("gradcheck nll_loss: weight x ignore_index x reduction x layout") {
  const Tensor weight = rand({5}, kFloat64) + 0.5;  // drawn once: the same on every device
  for (Device dev : test_devices()) {
    INFO(dev.str());
    Tensor w = on(weight, dev);
    uint64_t seed = 200;
    for (const Layout& L : kLayouts)
      for (bool weighted : {false, true})
        for (int64_t ignore : {int64_t(-100), int64_t(2)})
          for (Reduction r : kReductions) {
            INFO("shape " << shape_str(L.logits) << " weight " << weighted << " ignore " << ignore << " " << rname(r));
            Tensor t = on(targets(L.target), dev), wt = weighted ? w : Tensor();
            check_grad(dev, [&](const TensorList& in) { return nll_loss(in[0], t, wt, r, ignore); },
                       {rnd(L.logits, ++seed)});
          }
  }
}

TEST_CASE("gradcheck mse_loss: both arguments, every reduction") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    for (Reduction r : kReductions) {
      INFO(rname(r));
      check_grad(dev, [&](const TensorList& in) { return mse_loss(in[0], in[1], r); },
                 {rnd({3, 4}, 300), rnd({3, 4}, 301)});
      check_grad(dev, [&](const TensorList& in) { return mse_loss(in[0].t(), in[1], r); },
                 {rnd({4, 3}, 302), rnd({3, 4}, 303)});
    }
  }
}

TEST_CASE("gradcheck binary_cross_entropy_with_logits: every argument, weight x pos_weight x reduction") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    uint64_t seed = 400;
    for (int weight_kind : {0, 1, 2})  // none, per class (4), full (3, 4)
      for (bool pos : {false, true})
        for (Reduction r : kReductions) {
          INFO("weight " << weight_kind << " pos_weight " << pos << " " << rname(r));
          TensorList in{rnd({3, 4}, ++seed) * 3.0, rand({3, 4}, kFloat64)};
          if (weight_kind) in.push_back(rand(weight_kind == 1 ? Shape{4} : Shape{3, 4}, kFloat64) + 0.5);
          if (pos) in.push_back(rand({4}, kFloat64) * 3.0);
          check_grad(dev, [&](const TensorList& v) {
            Tensor weight = weight_kind ? v[2] : Tensor(), pw = pos ? v[weight_kind ? 3 : 2] : Tensor();
            return binary_cross_entropy_with_logits(v[0], v[1], weight, pw, r);
          }, in);
        }
  }
}
