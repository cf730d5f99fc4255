// Finite-difference checks (float64) of scaled_dot_product_attention's gradients with
// respect to q, k and v: causal and not, Tq != Tk, a length across a block edge, views,
// and dropout on with a fixed seed (the mask is then the same in every evaluation).
#include "helpers.h"

using namespace mu;
using autograd::TensorList;

namespace {

void check_grad(const autograd::GradcheckFn& fn, const TensorList& inputs) {
  auto r = autograd::gradcheck(fn, inputs);
  CHECK_MESSAGE(r.ok, r.message);
}

}  // namespace

TEST_CASE("gradcheck attention, causal and not") {
  for (Device dev : test_devices())
    for (bool causal : {false, true}) {
      INFO((causal ? "causal" : "full") << " on " << dev.str());
      auto f = [&](const TensorList& in) { return scaled_dot_product_attention(in[0], in[1], in[2], causal); };
      check_grad(f, {on(rnd({2, 2, 5, 4}, 1), dev), on(rnd({2, 2, 5, 4}, 2), dev), on(rnd({2, 2, 5, 4}, 3), dev)});
      check_grad(f, {on(rnd({1, 1, 1, 3}, 4), dev), on(rnd({1, 1, 1, 3}, 5), dev), on(rnd({1, 1, 1, 3}, 6), dev)});
      // 67 rows: two key and query blocks, the second of 3 rows.
      check_grad(f, {on(rnd({1, 1, 67, 2}, 7), dev), on(rnd({1, 1, 67, 2}, 8), dev), on(rnd({1, 1, 67, 2}, 9), dev)});
    }
}

TEST_CASE("gradcheck attention with Tq != Tk, a given scale, and transposed views") {
  for (Device dev : test_devices()) {
    check_grad([](const TensorList& in) { return scaled_dot_product_attention(in[0], in[1], in[2]); },
               {on(rnd({1, 2, 3, 4}, 10), dev), on(rnd({1, 2, 7, 4}, 11), dev), on(rnd({1, 2, 7, 4}, 12), dev)});
    check_grad(
        [](const TensorList& in) { return scaled_dot_product_attention(in[0], in[1], in[2], false, 0.0, true, 0.9); },
        {on(rnd({2, 1, 6, 3}, 13), dev), on(rnd({2, 1, 2, 3}, 14), dev), on(rnd({2, 1, 2, 3}, 15), dev)});
    // (B, T, H, D) tensors viewed as (B, H, T, D) inside the checked function.
    check_grad(
        [](const TensorList& in) {
          return scaled_dot_product_attention(in[0].transpose(1, 2), in[1].transpose(1, 2), in[2].transpose(1, 2), true);
        },
        {on(rnd({1, 6, 2, 3}, 16), dev), on(rnd({1, 6, 2, 3}, 17), dev), on(rnd({1, 6, 2, 3}, 18), dev)});
  }
}

TEST_CASE("gradcheck attention with dropout (a fixed seed: the same mask in every evaluation)") {
  for (Device dev : test_devices())
    for (bool causal : {false, true})
      for (double p : {0.2, 0.6}) {
        INFO((causal ? "causal" : "full") << " p = " << p << " on " << dev.str());
        auto f = [&](const TensorList& in) {
          return scaled_dot_product_attention(in[0], in[1], in[2], causal, p, true, std::nullopt, 77);
        };
        check_grad(f, {on(rnd({2, 2, 6, 3}, 20), dev), on(rnd({2, 2, 6, 3}, 21), dev), on(rnd({2, 2, 6, 3}, 22), dev)});
        check_grad(f, {on(rnd({1, 1, 66, 2}, 23), dev), on(rnd({1, 1, 66, 2}, 24), dev), on(rnd({1, 1, 66, 2}, 25), dev)});
      }
}

TEST_CASE("gradcheck attention at D = 64 with T one past a tile, and an odd D with Tq != Tk") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    // Causal with dropout: the mask and the causal band cross the tile edges.
    check_grad(
        [](const TensorList& in) {
          return scaled_dot_product_attention(in[0], in[1], in[2], true, 0.3, true, std::nullopt, 91);
        },
        {on(rnd({1, 1, 33, 64}, 30), dev), on(rnd({1, 1, 33, 64}, 31), dev), on(rnd({1, 1, 33, 64}, 32), dev)});
    check_grad([](const TensorList& in) { return scaled_dot_product_attention(in[0], in[1], in[2]); },
               {on(rnd({1, 2, 35, 5}, 33), dev), on(rnd({1, 2, 37, 5}, 34), dev), on(rnd({1, 2, 37, 5}, 35), dev)});
  }
}
