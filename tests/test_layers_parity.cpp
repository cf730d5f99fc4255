// Parity of LayerNorm and BatchNorm1d with torch.nn (Debian's python3-torch through
// /usr/bin/python3): the same inputs, parameters and upstream gradients go through both;
// forward values, input and parameter gradients, BatchNorm1d's running statistics after
// three training steps and its eval-mode output must agree to a relative error of 1e-5 in
// float32 (max |ours - torch| / max |torch|).
#include "nn/nn.h"
#include "parity_io.h"

using namespace mu;
using namespace parity;
namespace fs = std::filesystem;

namespace {

// Sets a parameter to the given values (outside any graph).
void assign(Tensor p, const Tensor& v) {
  NoGradGuard g;
  p.copy_(v);
}

void layer_norm_case(CaseWriter c, const Shape& x_shape, const Shape& normalized, bool affine, double eps) {
  nn::LayerNorm ln(nn::LayerNormOptions(normalized).elementwise_affine(affine).eps(eps));
  std::string shape_spec;
  for (int64_t d : normalized) shape_spec += (shape_spec.empty() ? "" : "x") + std::to_string(d);
  c.begin("layer_norm", "normalized=" + shape_spec + " eps=" + detail::str(eps));
  Tensor x = (randn(x_shape) * 2.0 + 0.5).requires_grad_();
  Tensor w = randn(x_shape);
  c.input("x", x);
  c.input("w", w);
  if (affine) {
    assign(ln.weight, randn(normalized) + 1.0);
    assign(ln.bias, randn(normalized));
    c.input("weight", ln.weight);
    c.input("bias", ln.bias);
  }
  c.end();
  Tensor out = ln(x);
  (out * w).sum().backward();
  c.expect("out", out);
  c.expect("grad_x", x.grad());
  if (affine) {
    c.expect("grad_weight", ln.weight.grad());
    c.expect("grad_bias", ln.bias.grad());
  }
}

void batch_norm_case(CaseWriter c, const Shape& x_shape, bool affine, double momentum, double eps) {
  const int steps = 3;
  // A 3-D case is token-major (B, T, C): the explicit channels-last option.
  nn::BatchNorm1d bn(nn::BatchNormOptions(x_shape.back())
                         .affine(affine)
                         .momentum(momentum)
                         .eps(eps)
                         .channels_last(x_shape.size() == 3));
  c.begin("batch_norm", detail::str("layout=", x_shape.size() == 2 ? "bc" : "btc", " steps=", steps,
                                    " momentum=", momentum, " eps=", eps));
  if (affine) {
    assign(bn.weight, randn({x_shape.back()}) + 1.0);
    assign(bn.bias, randn({x_shape.back()}));
    c.input("weight", bn.weight);
    c.input("bias", bn.bias);
  }
  for (int s = 0; s < steps; ++s) {
    // Batches of different offset and scale move the running statistics visibly.
    Tensor x = (randn(x_shape) * (1.0 + s) + 0.5 * s).requires_grad_();
    Tensor w = randn(x_shape);
    c.input("x" + std::to_string(s), x);
    c.input("w" + std::to_string(s), w);
    Tensor out = bn(x);
    (out * w).sum().backward();
    c.expect("out" + std::to_string(s), out);
    c.expect("grad_x" + std::to_string(s), x.grad());
  }
  c.expect("running_mean", bn.running_mean);
  c.expect("running_var", bn.running_var);
  if (affine) {
    c.expect("grad_weight", bn.weight.grad());
    c.expect("grad_bias", bn.bias.grad());
  }
  bn.eval();
  Tensor xe = randn(x_shape) * 1.5 + 0.5;
  c.input("xe", xe);
  c.expect("eval_out", bn(xe));
  c.end();
}

}  // namespace

TEST_CASE("parity with torch.nn: LayerNorm and BatchNorm1d") {
  manual_seed(2025);
  fs::path dir = make_temp_dir("layers_parity");
  std::ofstream manifest(dir / "manifest.txt");
  std::vector<std::pair<std::string, Tensor>> expected;
  auto writer = [&](const std::string& name) { return CaseWriter{dir, manifest, name, expected}; };

  layer_norm_case(writer("ln_affine"), {4, 7, 32}, {32}, true, 1e-5);
  layer_norm_case(writer("ln_two_dims"), {3, 5, 6}, {5, 6}, true, 1e-5);
  layer_norm_case(writer("ln_plain"), {16, 24}, {24}, false, 1e-3);
  batch_norm_case(writer("bn_bc"), {32, 12}, true, 0.1, 1e-5);
  batch_norm_case(writer("bn_btc"), {4, 9, 12}, true, 0.1, 1e-5);
  batch_norm_case(writer("bn_plain_momentum"), {10, 6}, false, 0.3, 1e-3);
  manifest.close();

  run_torch_script("torch_layers.py", dir);

  for (const auto& [what, ours] : expected) {
    INFO(what);
    Tensor ref = read_float(dir / (what + ".bin"), ours.shape());
    CHECK(rel_error(ours, ref) <= 1e-5);
  }
  CHECK(expected.size() == 3 * 2 + 2 * 2 + 3 * (2 * 3 + 2 + 1) + 2 * 2);
  fs::remove_all(dir);
}
