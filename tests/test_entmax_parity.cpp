// Parity of nn::entmax15 with PyTorch's autograd through the benchmark reference's
// entmax15 (tests/parity/torch_entmax.py, run by Debian's /usr/bin/python3): forward
// values and input gradients of sum(out * w), w a random upstream gradient, must agree to
// a relative error of 1e-5 in float32 (max |ours - torch| / max |torch|).
#include <cmath>

#include "nn/entmax.h"
#include "parity_io.h"

using namespace mu;
using namespace parity;
namespace fs = std::filesystem;

namespace {

struct Case {
  std::string name;
  Tensor x;  // float32, possibly a non-contiguous view (PyTorch gets its values)
  int64_t dim;
};

// float32 lines (L, n) in which every z = x/2 lies at least 1e-3 from its line's τ. The
// reference finds τ in float32 from cumulative sums; an entry within its rounding of τ
// could fall on the other side of the support's edge there, which is a kink, not a bug.
Tensor lines_away_from_kinks(int64_t L, int64_t n, double scale) {
  for (int attempt = 0; attempt < 1000; ++attempt) {
    Tensor x = randn({L, n}) * scale;
    // τ from the exact float64 result: at a line's largest p, z - τ = sqrt(p).
    std::vector<double> xv = x.to_vector<double>(), p = nn::entmax15(x.to(kFloat64)).to_vector<double>();
    bool ok = true;
    for (int64_t l = 0; l < L && ok; ++l) {
      int64_t top = l * n;
      for (int64_t j = l * n; j < (l + 1) * n; ++j) top = p[size_t(j)] > p[size_t(top)] ? j : top;
      double tau = xv[size_t(top)] / 2 - std::sqrt(p[size_t(top)]);
      for (int64_t j = l * n; j < (l + 1) * n; ++j) ok = ok && std::fabs(xv[size_t(j)] / 2 - tau) > 1e-3;
    }
    if (ok) return x;
  }
  FAIL("no input away from the kinks found");
  return {};
}

}  // namespace

TEST_CASE("entmax15 parity with PyTorch autograd on the reference definition") {
  manual_seed(2025);
  std::vector<Case> cases;
  cases.push_back({"last_dim", lines_away_from_kinks(16, 40, 2.0), -1});
  cases.push_back({"small_scale", lines_away_from_kinks(8, 12, 0.3), 1});
  cases.push_back({"wide", lines_away_from_kinks(4, 300, 3.0), -1});
  // Lines along dim 0 of a (30, 4, 3) tensor and dim 1 of a (3, 20, 5) tensor.
  cases.push_back({"dim0", lines_away_from_kinks(12, 30, 2.0).reshape({4, 3, 30}).permute({2, 0, 1}).contiguous(), 0});
  cases.push_back({"dim1", lines_away_from_kinks(15, 20, 2.0).reshape({3, 5, 20}).permute({0, 2, 1}).contiguous(), 1});
  // A transposed view: ours reads it through its strides, PyTorch gets the same values.
  cases.push_back({"transposed", lines_away_from_kinks(10, 25, 2.0).t(), 0});

  fs::path dir = make_temp_dir("entmax_parity");
  std::ofstream manifest(dir / "manifest.txt");
  std::vector<Tensor> outs, grads;
  for (const Case& c : cases) {
    Tensor leaf = c.x.detach().requires_grad_();
    Tensor out = nn::entmax15(leaf, c.dim);
    Tensor w = randn(out.shape());
    (out * w).sum().backward();
    outs.push_back(out.detach());
    grads.push_back(leaf.grad());
    write_raw(dir / (c.name + ".x.bin"), c.x);
    write_raw(dir / (c.name + ".w.bin"), w);
    manifest << c.name << ' ' << c.dim << " | " << c.name << ".x.bin:float32:" << shape_arg(c.x) << ' ' << c.name
             << ".w.bin:float32:" << shape_arg(w) << '\n';
  }
  manifest.close();

  run_torch_script("torch_entmax.py", dir);

  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    INFO("case " << c.name);
    Tensor ref = read_float(dir / (c.name + ".out.bin"), outs[i].shape());
    Tensor gref = read_float(dir / (c.name + ".grad0.bin"), grads[i].shape());
    double e_out = rel_error(outs[i], ref), e_grad = rel_error(grads[i], gref);
    INFO("relative error: output " << e_out << ", gradient " << e_grad);
    CHECK(e_out <= 1e-5);
    CHECK(e_grad <= 1e-5);
    // Same support: PyTorch's zeros are ours.
    std::vector<double> a = outs[i].to_vector<double>(), b = ref.to_vector<double>();
    for (size_t j = 0; j < a.size(); ++j) CHECK((a[j] == 0.0) == (b[j] == 0.0));
  }
  fs::remove_all(dir);
}
