// A user's program: includes the umbrella header, multiplies, differentiates and runs a
// layer. Exit code 0 only when every value is the one worked out by hand below.
#include <cstdio>
#include <vector>

#include "mumoe.h"

int main() {
  using namespace mu;
  // [[1, 2], [3, 4]]^2 = [[7, 10], [15, 22]].
  Tensor a = tensor({1.0, 2.0, 3.0, 4.0}).reshape({2, 2}).requires_grad_();
  Tensor c = matmul(a, a);
  const std::vector<float> want = {7, 10, 15, 22};
  if (c.to_vector<float>() != want) return 1;
  // d/da sum(a * a) = 2a.
  (a * a).sum().backward();
  if (a.grad().to_vector<float>() != std::vector<float>{2, 4, 6, 8}) return 2;
  // A layer and the module machinery: Linear(2, 3) has 2 * 3 + 3 parameters.
  nn::Linear fc(2, 3);
  if (fc.num_parameters() != 9) return 3;
  if (fc(ones({4, 2})).shape() != Shape{4, 3}) return 4;
  std::printf("uses_mumoe: ok\n");
  return 0;
}
