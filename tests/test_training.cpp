// Short training runs that must reach a stated quality (label: slow).
#include <cmath>

#include "helpers.h"
#include "optim/sgd.h"

using namespace mu;

static Tensor uniform_param(Shape s, double bound) { return ((rand(s) * 2.0 - 1.0) * bound).detach().requires_grad_(); }

TEST_CASE("a two-layer network fits a smooth 2-D function to mse < 0.01") {
  manual_seed(0);
  Tensor x = rand({1024, 2}) * 2.0 - 1.0;
  std::vector<float> xs = x.to_vector<float>(), ys(1024);
  for (size_t i = 0; i < 1024; ++i) ys[i] = std::sin(3 * xs[2 * i]) * std::cos(2 * xs[2 * i + 1]);
  Tensor y = from_vector(ys, {1024, 1});
  double var_y = var(y.to(kFloat64)).item();
  Tensor w1 = uniform_param({2, 64}, 0.7), b1 = uniform_param({64}, 0.7);
  Tensor w2 = uniform_param({64, 1}, 0.125), b2 = uniform_param({1}, 0.125);
  optim::SGD opt({w1, b1, w2, b2}, optim::SGDOptions(0.1).momentum(0.9));
  double loss = 0;
  for (int step = 0; step < 3000; ++step) {
    Tensor l = square(tanh(x.matmul(w1) + b1).matmul(w2) + b2 - y).mean();
    opt.zero_grad();
    l.backward();
    opt.step();
    loss = l.item();
  }
  INFO("final mse " << loss << ", target variance " << var_y);
  CHECK(loss < 0.01);
  CHECK(loss < var_y / 20);
}

TEST_CASE("a softmax classifier separates three interleaved spirals to > 95% accuracy") {
  manual_seed(1);
  const int64_t per_class = 200, classes = 3;
  std::vector<float> pts;
  std::vector<int64_t> labels;
  for (int64_t c = 0; c < classes; ++c)
    for (int64_t i = 0; i < per_class; ++i) {
      double r = double(i) / per_class;
      double th = 4.0 * double(c) + 4.0 * r + 0.2 * randn({1}, kFloat64).item();
      pts.push_back(float(r * std::sin(th)));
      pts.push_back(float(r * std::cos(th)));
      labels.push_back(c);
    }
  Tensor x = from_vector(pts, {per_class * classes, 2}), y = from_vector(labels, {per_class * classes});
  Tensor w1 = uniform_param({2, 100}, 0.7), b1 = uniform_param({100}, 0.7);
  Tensor w2 = uniform_param({100, 3}, 0.1), b2 = uniform_param({3}, 0.1);
  optim::SGD opt({w1, b1, w2, b2}, optim::SGDOptions(0.5).momentum(0.9));
  for (int step = 0; step < 2000; ++step) {
    Tensor logits = relu(x.matmul(w1) + b1).matmul(w2) + b2;
    opt.zero_grad();
    cross_entropy(logits, y).backward();
    opt.step();
  }
  NoGradGuard g;
  Tensor pred = argmax(relu(x.matmul(w1) + b1).matmul(w2) + b2, 1);
  double acc = (pred == y).to(kFloat64).mean().item();
  INFO("training accuracy " << acc);
  CHECK(acc > 0.95);
}
