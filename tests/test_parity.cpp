// Parity with PyTorch (Debian's python3-torch through /usr/bin/python3): the same random
// inputs go through both, and forward values and input gradients of sum(out * w), w a
// random upstream gradient, must agree to a relative error of 1e-5 in float32
// (max |ours - torch| / max |torch|).
#include "parity_io.h"

using namespace mu;
using autograd::TensorList;
using namespace parity;
namespace fs = std::filesystem;

namespace {

struct Case {
  std::string name, op, args;
  TensorList inputs;  // float32 operands get gradients; int64 ones are indices/targets
  std::function<Tensor(const TensorList&)> fn;
};

// Runs every case through PyTorch in one interpreter start, then compares.
void run_parity(std::vector<Case>& cases) {
  fs::path dir = make_temp_dir("parity");
  std::ofstream manifest(dir / "manifest.txt");
  std::vector<Tensor> outs, ws;
  std::vector<TensorList> grads;
  for (Case& c : cases) {
    TensorList leaves;
    for (const Tensor& t : c.inputs) leaves.push_back(t.is_floating_point() ? t.detach().requires_grad_() : t);
    Tensor out = c.fn(leaves);
    Tensor w = randn(out.shape());
    (out * w).sum().backward();
    outs.push_back(out.detach());
    ws.push_back(w);
    TensorList g;
    for (const Tensor& t : leaves)
      if (t.is_floating_point()) g.push_back(t.grad());
    grads.push_back(g);

    manifest << c.name << ' ' << c.op << (c.args.empty() ? "" : " " + c.args) << " |";
    for (size_t k = 0; k <= c.inputs.size(); ++k) {
      const Tensor& t = k < c.inputs.size() ? c.inputs[k] : w;
      std::string file = c.name + ".in" + std::to_string(k) + ".bin";
      write_raw(dir / file, t);
      manifest << ' ' << file << ':' << dtype_name(t.dtype()) << ':' << shape_arg(t);
    }
    manifest << '\n';
  }
  manifest.close();

  run_torch_script("torch_ops.py", dir);

  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    INFO("case " << c.name);
    Tensor ref = read_float(dir / (c.name + ".out.bin"), outs[i].shape());
    CHECK(rel_error(outs[i], ref) <= 1e-5);
    for (size_t k = 0; k < grads[i].size(); ++k) {
      INFO("gradient of float input " << k);
      REQUIRE(grads[i][k].defined());
      Tensor gref = read_float(dir / (c.name + ".grad" + std::to_string(k) + ".bin"), grads[i][k].shape());
      CHECK(rel_error(grads[i][k], gref) <= 1e-5);
    }
  }
  fs::remove_all(dir);
}

}  // namespace

TEST_CASE("parity with PyTorch: forward values and gradients") {
  manual_seed(2024);
  std::vector<Case> cases;
  auto add = [&](std::string name, std::string op, std::string args, TensorList in,
                 std::function<Tensor(const TensorList&)> fn) {
    cases.push_back({std::move(name), std::move(op), std::move(args), std::move(in), std::move(fn)});
  };
  auto mm = [](const TensorList& t) { return matmul(t[0], t[1]); };
  add("matmul_2d", "matmul", "", {randn({33, 64}), randn({64, 17})}, mm);
  add("matmul_batched", "matmul", "", {randn({4, 9, 32}), randn({4, 32, 7})}, mm);
  add("matmul_broadcast", "matmul", "", {randn({2, 1, 5, 16}), randn({3, 16, 6})}, mm);
  add("matmul_vec_mat", "matmul", "", {randn({16}), randn({3, 16, 5})}, mm);
  add("matmul_mat_vec", "matmul", "", {randn({2, 5, 16}), randn({16})}, mm);
  add("matmul_dot", "matmul", "", {randn({40}), randn({40})}, mm);
  add("softmax_last", "softmax", "-1", {randn({6, 50}) * 3.0}, [](const TensorList& t) { return softmax(t[0], -1); });
  add("softmax_dim0", "softmax", "0", {randn({7, 4, 3})}, [](const TensorList& t) { return softmax(t[0], 0); });
  add("log_softmax_last", "log_softmax", "-1", {randn({6, 50}) * 3.0},
      [](const TensorList& t) { return log_softmax(t[0], -1); });
  add("log_softmax_mid", "log_softmax", "1", {randn({3, 8, 5})}, [](const TensorList& t) { return log_softmax(t[0], 1); });
  Tensor targets = randint(0, 10, {32});
  add("cross_entropy_mean", "cross_entropy", "mean -100", {randn({32, 10}), targets},
      [](const TensorList& t) { return cross_entropy(t[0], t[1]); });
  add("cross_entropy_sum", "cross_entropy", "sum -100", {randn({32, 10}), targets},
      [](const TensorList& t) { return cross_entropy(t[0], t[1], Reduction::Sum); });
  add("cross_entropy_none", "cross_entropy", "none -100", {randn({32, 10}), targets},
      [](const TensorList& t) { return cross_entropy(t[0], t[1], Reduction::None); });
  Tensor ignored = targets.clone();
  for (int64_t i = 0; i < 32; i += 3) ignored.set({i}, 3);  // some targets equal ignore_index 3
  add("cross_entropy_ignore", "cross_entropy", "mean 3", {randn({32, 10}), ignored},
      [](const TensorList& t) { return cross_entropy(t[0], t[1], Reduction::Mean, 3); });
  add("gelu_erf", "gelu", "none", {randn({40, 30}) * 2.0}, [](const TensorList& t) { return gelu(t[0]); });
  add("gelu_tanh", "gelu", "tanh", {randn({40, 30}) * 2.0}, [](const TensorList& t) { return gelu(t[0], "tanh"); });
  add("var_last", "var", "-1 1 0", {randn({8, 100})}, [](const TensorList& t) { return var(t[0], {-1}); });
  add("var_two_dims", "var", "0,2 0 1", {randn({5, 3, 7})},
      [](const TensorList& t) { return var(t[0], {0, 2}, 0, true); });
  add("cumsum_last", "cumsum", "-1", {randn({4, 60})}, [](const TensorList& t) { return cumsum(t[0], -1); });
  add("cumsum_first", "cumsum", "0", {randn({30, 3, 2})}, [](const TensorList& t) { return cumsum(t[0], 0); });
  add("gather_dim1", "gather", "1", {randn({6, 9}), randint(0, 9, {6, 4})},
      [](const TensorList& t) { return gather(t[0], 1, t[1]); });
  add("gather_dim0", "gather", "0", {randn({5, 4, 3}), randint(0, 5, {7, 4, 2})},
      [](const TensorList& t) { return gather(t[0], 0, t[1]); });
  run_parity(cases);
}
