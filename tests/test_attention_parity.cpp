// Parity of scaled_dot_product_attention with PyTorch's autograd through the composed
// definition softmax(q kᵀ/√D + mask) v (tests/parity/torch_attention.py, run by Debian's
// /usr/bin/python3): the output and the gradients of sum(out * w) with respect to q, k and
// v, w a random upstream gradient, agree to a relative error of 1e-5 in float32
// (max |ours - torch| / max |torch|).
#include "parity_io.h"

using namespace mu;
using namespace parity;
namespace fs = std::filesystem;

namespace {

struct Case {
  std::string name;
  bool causal;
  Shape q, kv;  // (B, H, Tq, D) and (B, H, Tk, D)
};

}  // namespace

TEST_CASE("scaled_dot_product_attention parity with PyTorch (values and gradients, float32)") {
  const std::vector<Case> cases = {
      {"small", false, {2, 3, 17, 8}, {2, 3, 17, 8}},
      {"small_causal", true, {2, 3, 17, 8}, {2, 3, 17, 8}},
      {"gpt_block", true, {2, 4, 128, 64}, {2, 4, 128, 64}},
      {"ragged_causal", true, {1, 2, 150, 64}, {1, 2, 150, 64}},
      {"cross", false, {2, 2, 9, 16}, {2, 2, 70, 16}},
      {"one_query", false, {1, 3, 1, 32}, {1, 3, 40, 32}},
      {"long_causal", true, {1, 2, 512, 64}, {1, 2, 512, 64}},
  };
  manual_seed(2024);
  fs::path dir = make_temp_dir("attention_parity");
  std::ofstream manifest(dir / "manifest.txt");
  struct Ours {
    Tensor out, dq, dk, dv;
  };
  std::vector<Ours> ours;
  for (const Case& c : cases) {
    Tensor q = randn(c.q).requires_grad_(), k = randn(c.kv).requires_grad_(), v = randn(c.kv).requires_grad_();
    Tensor w = randn(c.q);
    Tensor out = scaled_dot_product_attention(q, k, v, c.causal);
    (out * w).sum().backward();
    ours.push_back({out.detach(), q.grad(), k.grad(), v.grad()});
    manifest << c.name << ' ' << (c.causal ? 1 : 0) << " |";
    for (auto [t, tag] : {std::pair{q, "q"}, {k, "k"}, {v, "v"}, {w, "w"}}) {
      std::string file = c.name + "." + tag + ".bin";
      write_raw(dir / file, t.detach());
      manifest << ' ' << file << ":float32:" << shape_arg(t);
    }
    manifest << '\n';
  }
  manifest.close();

  run_torch_script("torch_attention.py", dir);

  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const Ours& o = ours[i];
    for (auto [t, tag] : {std::pair{o.out, "out"}, {o.dq, "dq"}, {o.dk, "dk"}, {o.dv, "dv"}}) {
      Tensor ref = read_float(dir / (c.name + "." + tag + ".bin"), t.shape());
      double e = rel_error(t, ref);
      const std::string what = c.name + ", " + tag;
      INFO(what << ": relative error " << e);
      CHECK(e <= 1e-5);
    }
  }
  fs::remove_all(dir);
}
