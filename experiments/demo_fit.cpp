// The core end to end, with optim::SGD: a two-layer tanh network learns y = sin(3 x1) cos(2 x2) + x1 x2
// on [-1, 1]^2 by full-batch gradient descent with momentum. Prints the training and
// held-out losses as they fall; exits non-zero if the network fails to fit.
#include <cmath>
#include <cstdio>
#include <vector>

#include "mumoe.h"

using namespace mu;

// Inputs uniform on [-1, 1]^2 and their targets, computed on the host.
static std::pair<Tensor, Tensor> make_data(int64_t n) {
  Tensor x = rand({n, 2}) * 2.0 - 1.0;
  std::vector<float> xs = x.to_vector<float>(), ys(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    float x1 = xs[size_t(2 * i)], x2 = xs[size_t(2 * i + 1)];
    ys[size_t(i)] = std::sin(3 * x1) * std::cos(2 * x2) + x1 * x2;
  }
  return {x, from_vector(ys, {n, 1})};
}

int main(int argc, char** argv) {
  int steps = argc > 1 ? std::atoi(argv[1]) : 2000;
  manual_seed(0);
  const int64_t hidden = 64;
  auto [x_train, y_train] = make_data(2048);
  auto [x_test, y_test] = make_data(512);

  // Parameters, initialised like nn.Linear: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
  auto uniform = [](Shape s, double bound) { return ((rand(s) * 2.0 - 1.0) * bound).detach().requires_grad_(); };
  Tensor w1 = uniform({2, hidden}, 1 / std::sqrt(2.0)), b1 = uniform({hidden}, 1 / std::sqrt(2.0));
  Tensor w2 = uniform({hidden, 1}, 1 / std::sqrt(double(hidden))), b2 = uniform({1}, 1 / std::sqrt(double(hidden)));
  optim::SGD opt({w1, b1, w2, b2}, optim::SGDOptions(0.1).momentum(0.9));

  auto forward = [&](const Tensor& x) { return tanh(x.matmul(w1) + b1).matmul(w2) + b2; };
  auto mse = [](const Tensor& pred, const Tensor& y) { return square(pred - y).mean(); };

  double first = 0, last = 0;
  std::printf("two-layer network (2 -> %lld tanh -> 1), %d steps of SGD with momentum\n", (long long)hidden, steps);
  for (int step = 0; step <= steps; ++step) {
    Tensor loss = mse(forward(x_train), y_train);
    opt.zero_grad();
    loss.backward();
    opt.step();
    if (step % (steps / 10 > 0 ? steps / 10 : 1) == 0) {
      NoGradGuard no_grad;
      double test = mse(forward(x_test), y_test).item();
      std::printf("step %5d  train mse %.5f  test mse %.5f\n", step, loss.item(), test);
      if (step == 0) first = test;
      last = test;
    }
  }
  bool ok = last < first / 10;
  std::printf("%s: test mse fell from %.4f to %.5f\n", ok ? "fitted" : "FAILED to fit", first, last);
  return ok ? 0 : 1;
}
