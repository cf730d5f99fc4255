// Parity of the fused layer_norm and batch_norm ops with torch.nn.functional (Debian's
// python3-torch through /usr/bin/python3, tests/parity/torch_norm.py): the same inputs,
// parameters and upstream gradients go through both; outputs, gradients of x, weight and
// bias, and batch_norm's running statistics after three training steps and its eval
// step must agree to a relative error of 1e-5 in float32 (max |ours - torch| / max |torch|).
#include "parity_io.h"

using namespace mu;
using namespace parity;
namespace fs = std::filesystem;

namespace {

Tensor leaf_on(const Tensor& t, Device dev) { return t.detach().to(dev).requires_grad_(); }

void layer_norm_case(CaseWriter c, Device dev, const Shape& x_shape, const Shape& ns, bool weight, bool bias,
                     double eps) {
  c.begin("layer_norm", "normalized=" + shape_arg(ns) + " eps=" + detail::str(eps));
  Tensor x = randn(x_shape) * 2.0 + 0.5, g = randn(x_shape);
  Tensor w = weight ? randn(ns) + 1.0 : Tensor(), b = bias ? randn(ns) : Tensor();
  c.input("x", x);
  c.input("g", g);
  if (weight) c.input("weight", w);
  if (bias) c.input("bias", b);
  c.end();
  Tensor xd = leaf_on(x, dev), wd = weight ? leaf_on(w, dev) : Tensor(), bd = bias ? leaf_on(b, dev) : Tensor();
  Tensor out = layer_norm(xd, ns, wd, bd, eps);
  out.backward(g.to(dev));
  c.expect("out", out);
  c.expect("grad_x", xd.grad());
  if (weight) c.expect("grad_weight", wd.grad());
  if (bias) c.expect("grad_bias", bd.grad());
}

void batch_norm_case(CaseWriter c, Device dev, const Shape& x_shape, ChannelLayout layout, bool affine,
                     double momentum, double eps) {
  const int steps = 3;
  const bool last = layout == ChannelLayout::Last;
  const int64_t C = x_shape[last ? x_shape.size() - 1 : 1];
  c.begin("batch_norm", detail::str("layout=", last ? "last" : "first", " channels=", C, " steps=", steps,
                                    " momentum=", momentum, " eps=", eps));
  Tensor w = randn({C}) + 1.0, b = randn({C});
  Tensor wd = affine ? leaf_on(w, dev) : Tensor(), bd = affine ? leaf_on(b, dev) : Tensor();
  if (affine) {
    c.input("weight", w);
    c.input("bias", b);
  }
  Tensor rm = zeros({C}).to(dev), rv = ones({C}).to(dev);
  for (int s = 0; s < steps; ++s) {
    // Batches of different offset and scale move the running statistics visibly.
    Tensor x = randn(x_shape) * (1.0 + s) + 0.5 * s, g = randn(x_shape);
    c.input("x" + std::to_string(s), x);
    c.input("g" + std::to_string(s), g);
    Tensor xd = leaf_on(x, dev);
    Tensor out = batch_norm(xd, rm, rv, wd, bd, true, momentum, eps, layout);
    out.backward(g.to(dev));
    c.expect("out" + std::to_string(s), out);
    c.expect("grad_x" + std::to_string(s), xd.grad());
  }
  c.expect("running_mean", rm);
  c.expect("running_var", rv);
  if (affine) {
    c.expect("grad_weight", wd.grad());
    c.expect("grad_bias", bd.grad());
    wd.zero_grad();
    bd.zero_grad();
  }
  Tensor xe = randn(x_shape) * 1.5 + 0.5, ge = randn(x_shape);
  c.input("xe", xe);
  c.input("ge", ge);
  Tensor xd = leaf_on(xe, dev);
  Tensor out = batch_norm(xd, rm, rv, wd, bd, false, momentum, eps, layout);
  out.backward(ge.to(dev));
  c.expect("eval_out", out);
  c.expect("eval_grad_x", xd.grad());
  if (affine) {
    c.expect("eval_grad_weight", wd.grad());
    c.expect("eval_grad_bias", bd.grad());
  }
  c.end();
}

}  // namespace

TEST_CASE("parity with torch.nn.functional: layer_norm and batch_norm") {
  for (Device dev : test_devices()) {
    INFO(dev.str());
    manual_seed(2026);
    fs::path dir = make_temp_dir("norm_parity");
    std::ofstream manifest(dir / "manifest.txt");
    std::vector<std::pair<std::string, Tensor>> expected;
    auto writer = [&](const std::string& name) { return CaseWriter{dir, manifest, name, expected}; };

    layer_norm_case(writer("ln_affine"), dev, {4, 7, 32}, {32}, true, true, 1e-5);
    layer_norm_case(writer("ln_two_dims"), dev, {3, 5, 6}, {5, 6}, true, true, 1e-5);
    layer_norm_case(writer("ln_plain"), dev, {16, 24}, {24}, false, false, 1e-3);
    layer_norm_case(writer("ln_weight_only"), dev, {6, 10}, {10}, true, false, 1e-5);
    layer_norm_case(writer("ln_wide"), dev, {64, 768}, {768}, true, true, 1e-5);  // several threads
    batch_norm_case(writer("bn_nc"), dev, {32, 12}, ChannelLayout::First, true, 0.1, 1e-5);
    batch_norm_case(writer("bn_ncl"), dev, {8, 6, 10}, ChannelLayout::First, true, 0.1, 1e-5);
    batch_norm_case(writer("bn_nc_plain"), dev, {10, 6}, ChannelLayout::First, false, 0.3, 1e-3);
    batch_norm_case(writer("bn_ncl_large"), dev, {16, 32, 64}, ChannelLayout::First, true, 0.1, 1e-5);
    batch_norm_case(writer("bn_nlc"), dev, {4, 9, 12}, ChannelLayout::Last, true, 0.1, 1e-5);
    manifest.close();

    run_torch_script("torch_norm.py", dir);

    double worst = 0;
    std::string worst_at;
    for (const auto& [what, ours] : expected) {
      INFO(what);
      Tensor ref = read_float(dir / (what + ".bin"), ours.shape());
      double e = rel_error(ours, ref);
      CHECK(e <= 1e-5);
      if (e > worst) worst = e, worst_at = what;
    }
    MESSAGE("largest relative error " << worst << " (" << worst_at << ")");
    // Layer norm: out and grad_x per case, plus 2 + 2 + 0 + 1 + 2 parameter gradients;
    // batch norm: 3 steps x 2, running mean and var, eval out and grad_x, and 4
    // parameter gradients for each of the 4 affine cases.
    CHECK(expected.size() == 5 * 2 + 7 + 5 * (3 * 2 + 2 + 2) + 4 * 4);
    fs::remove_all(dir);
  }
}
