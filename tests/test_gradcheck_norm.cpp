// gradcheck (float64 central differences against one backward pass) of the fused
// layer_norm and batch_norm ops w.r.t. x, weight and bias; batch_norm in training (the
// batch statistics depend on x) and in eval (the running statistics are constants), in
// both channel layouts.
#include "helpers.h"

using namespace mu;
using autograd::TensorList;

TEST_CASE("gradcheck: layer_norm w.r.t. x, weight and bias") {
  manual_seed(31);
  struct Case {
    Shape x, ns;
    bool weight, bias;
  };
  const std::vector<Case> cases = {{{3, 5}, {5}, true, true},
                                   {{2, 3, 4}, {3, 4}, true, true},
                                   {{2, 2, 3}, {2, 3}, false, false},
                                   {{4, 6}, {6}, true, false},
                                   {{4, 6}, {6}, false, true},
                                   {{7}, {7}, true, true}};
  for (Device dev : test_devices())
    for (const Case& c : cases) {
      INFO(dev.str() << " x " << shape_str(c.x) << " over " << shape_str(c.ns) << (c.weight ? " weight" : "")
                     << (c.bias ? " bias" : ""));
      TensorList in{on(randn(c.x, kFloat64) * 2.0 + 0.5, dev),
                    c.weight ? on(randn(c.ns, kFloat64) + 1.0, dev) : Tensor(),
                    c.bias ? on(randn(c.ns, kFloat64), dev) : Tensor()};
      Shape ns = c.ns;
      CHECK_GRAD([ns](const TensorList& t) { return layer_norm(t[0], ns, t[1], t[2], 1e-5); }, in);
    }
  // A transposed input: the op reads it through a contiguous copy.
  Tensor xt = randn({5, 4}, kFloat64).t();
  CHECK_GRAD([](const TensorList& t) { return layer_norm(t[0], {5}, t[1], t[2]); },
             (TensorList{xt, randn({5}, kFloat64), randn({5}, kFloat64)}));
}

TEST_CASE("gradcheck: batch_norm w.r.t. x, weight and bias, training and eval, both layouts") {
  manual_seed(32);
  struct Case {
    Shape x;
    ChannelLayout layout;
  };
  const std::vector<Case> cases = {{{5, 4}, ChannelLayout::First},
                                   {{3, 4, 5}, ChannelLayout::First},
                                   {{3, 5, 4}, ChannelLayout::Last},
                                   {{2, 4, 2, 2}, ChannelLayout::First}};
  for (Device dev : test_devices())
    for (const Case& c : cases)
      for (bool training : {true, false})
        for (bool affine : {true, false}) {
          const int64_t C = 4;
          INFO(dev.str() << " x " << shape_str(c.x) << (c.layout == ChannelLayout::Last ? " channels-last" : "")
                         << (training ? " training" : " eval") << (affine ? " affine" : ""));
          // Running statistics away from (0, 1), so that eval is not the identity map.
          Tensor rm = on(randn({C}, kFloat64), dev), rv = on(rand({C}, kFloat64) + 0.5, dev);
          TensorList in{on(randn(c.x, kFloat64) * 1.5 + 0.3, dev),
                        affine ? on(randn({C}, kFloat64) + 1.0, dev) : Tensor(),
                        affine ? on(randn({C}, kFloat64), dev) : Tensor()};
          ChannelLayout layout = c.layout;
          // Training moves rm and rv on every evaluation; the output does not read them.
          auto fn = [&, layout, training](const TensorList& t) {
            return batch_norm(t[0], rm, rv, t[1], t[2], training, 0.1, 1e-5, layout);
          };
          CHECK_GRAD(fn, in);
        }
}
