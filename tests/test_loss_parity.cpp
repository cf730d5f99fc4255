// Parity of the losses with PyTorch 1.13 (tests/parity/torch_loss.py through Debian's
// /usr/bin/python3): the same float32 inputs go through both, for every combination of
// options and layouts; the loss and the gradients of sum(loss * v), v a random upstream
// gradient, of every differentiable input (logits, and probability targets, the mse
// target, the BCE target) must agree to a relative error of 1e-5
// (max |ours - torch| / max |torch|).
#include "parity_io.h"

using namespace mu;
using autograd::TensorList;
using namespace parity;
namespace fs = std::filesystem;

namespace {

// One operand and its role for the Python side: "input", "target", "weight",
// "pos_weight" (keyword arguments of torch.nn.functional's loss).
struct Arg {
  std::string role;
  Tensor t;
  bool grad;  // compare its gradient (PyTorch differentiates it too)
};

struct Case {
  std::string name, op, options;  // options: key=value words for the Python side
  std::vector<Arg> args;
  std::function<Tensor(const TensorList&)> fn;  // called with the args' tensors, in order
};

void run_cases(std::vector<Case>& cases) {
  fs::path dir = make_temp_dir("loss_parity");
  std::ofstream manifest(dir / "manifest.txt");
  std::vector<Tensor> outs;
  std::vector<TensorList> grads;
  for (size_t i = 0; i < cases.size(); ++i) {
    Case& c = cases[i];
    TensorList leaves;
    for (const Arg& a : c.args) leaves.push_back(a.grad ? a.t.detach().requires_grad_() : a.t);
    Tensor out = c.fn(leaves);
    manual_seed(7000 + i);
    Tensor v = randn(out.shape());
    (out * v).sum().backward();
    outs.push_back(out.detach());
    TensorList g;
    for (size_t k = 0; k < c.args.size(); ++k)
      if (c.args[k].grad) g.push_back(leaves[k].grad());
    grads.push_back(g);

    manifest << c.name << ' ' << c.op << (c.options.empty() ? "" : " " + c.options) << " |";
    for (size_t k = 0; k <= c.args.size(); ++k) {
      const Tensor& t = k < c.args.size() ? c.args[k].t : v;
      std::string role = k < c.args.size() ? c.args[k].role : "upstream";
      bool grad = k < c.args.size() && c.args[k].grad;
      std::string file = c.name + ".in" + std::to_string(k) + ".bin";
      write_raw(dir / file, t);
      manifest << ' ' << file << ':' << dtype_name(t.dtype()) << ':' << shape_arg(t) << ':' << role << ':' << grad;
    }
    manifest << '\n';
  }
  manifest.close();

  run_torch_script("torch_loss.py", dir);

  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    INFO("case " << c.name << " (" << c.op << " " << c.options << ")");
    Tensor ref = read_float(dir / (c.name + ".out.bin"), outs[i].shape());
    CHECK(rel_error(outs[i], ref) <= 1e-5);
    for (size_t k = 0; k < grads[i].size(); ++k) {
      INFO("gradient " << k);
      REQUIRE(grads[i][k].defined());
      Tensor gref = read_float(dir / (c.name + ".grad" + std::to_string(k) + ".bin"), grads[i][k].shape());
      CHECK(rel_error(grads[i][k], gref) <= 1e-5);
    }
  }
  fs::remove_all(dir);
}

const char* rname(Reduction r) { return r == Reduction::None ? "none" : r == Reduction::Sum ? "sum" : "mean"; }
const Reduction kReductions[] = {Reduction::None, Reduction::Mean, Reduction::Sum};

struct Layout {
  std::string tag;
  Shape logits, target;
};
// (C), (N, C), (N, C, d1, d2), and two larger ones that take the kernels' vectorised,
// multi-threaded and strided paths.
const std::vector<Layout> kLayouts = {{"c", {10}, {}}, {"nc", {16, 10}, {16}}, {"ncd", {4, 10, 3, 2}, {4, 3, 2}}};
const std::vector<Layout> kLarge = {{"big", {64, 1000}, {64}}, {"bigd", {4, 300, 5}, {4, 5}}};

// Class targets in [0, C); with `ignore`, every third position from the second holds it
// (never the only position, so no Mean is 0/0).
Tensor class_targets(const Shape& s, int64_t C, int64_t ignore) {
  std::vector<int64_t> t = randint(0, C, s).to_vector<int64_t>();
  if (ignore >= 0)
    for (size_t i = 1; i < t.size(); i += 3) t[i] = ignore;
  return from_vector(t, s);
}

}  // namespace

TEST_CASE("loss parity with PyTorch: values and gradients for every option combination") {
  manual_seed(2025);
  std::vector<Case> cases;
  int id = 0;
  auto name = [&](const std::string& op) { return op + "_" + std::to_string(id++); };

  // cross_entropy, class indices.
  std::vector<Layout> ce_layouts = kLayouts;
  ce_layouts.insert(ce_layouts.end(), kLarge.begin(), kLarge.end());
  for (const Layout& L : ce_layouts) {
    int64_t C = L.logits.size() == 1 ? L.logits[0] : L.logits[1];
    Tensor w = rand({C}) + 0.5;
    for (bool weighted : {false, true})
      for (int64_t ignore : {int64_t(-100), int64_t(3)})
        for (double eps : {0.0, 0.1, 1.0})
          for (Reduction r : kReductions) {
            std::string opt = detail::str("reduction=", rname(r), " ignore_index=", ignore, " label_smoothing=", eps);
            std::vector<Arg> args = {{"input", randn(L.logits) * 3.0, true},
                                     {"target", class_targets(L.target, C, ignore), false}};
            if (weighted) args.push_back({"weight", w, false});
            cases.push_back({name("ce_" + L.tag), "cross_entropy", opt, args, [=](const TensorList& t) {
              CrossEntropyOptions o = CrossEntropyOptions().reduction(r).ignore_index(ignore).label_smoothing(eps);
              if (weighted) o.weight(t[2]);
              return cross_entropy(t[0], t[1], o);
            }});
          }
  }
  // cross_entropy, class probabilities (differentiable in the target too).
  for (const Layout& L : kLayouts) {
    int64_t C = L.logits.size() == 1 ? L.logits[0] : L.logits[1];
    int64_t cdim = L.logits.size() == 1 ? 0 : 1;
    Tensor w = rand({C}) + 0.5;
    for (bool weighted : {false, true})
      for (double eps : {0.0, 0.1, 1.0})
        for (Reduction r : kReductions) {
          std::string opt = detail::str("reduction=", rname(r), " label_smoothing=", eps);
          std::vector<Arg> args = {{"input", randn(L.logits) * 3.0, true},
                                   {"target", softmax(randn(L.logits), cdim), true}};
          if (weighted) args.push_back({"weight", w, false});
          cases.push_back({name("ceprob_" + L.tag), "cross_entropy", opt, args, [=](const TensorList& t) {
            CrossEntropyOptions o = CrossEntropyOptions().reduction(r).label_smoothing(eps);
            if (weighted) o.weight(t[2]);
            return cross_entropy(t[0], t[1], o);
          }});
        }
  }
  // nll_loss.
  for (const Layout& L : kLayouts) {
    int64_t C = L.logits.size() == 1 ? L.logits[0] : L.logits[1];
    int64_t cdim = L.logits.size() == 1 ? 0 : 1;
    Tensor w = rand({C}) + 0.5;
    for (bool weighted : {false, true})
      for (int64_t ignore : {int64_t(-100), int64_t(3)})
        for (Reduction r : kReductions) {
          std::string opt = detail::str("reduction=", rname(r), " ignore_index=", ignore);
          std::vector<Arg> args = {{"input", log_softmax(randn(L.logits), cdim), true},
                                   {"target", class_targets(L.target, C, ignore), false}};
          if (weighted) args.push_back({"weight", w, false});
          cases.push_back({name("nll_" + L.tag), "nll_loss", opt, args, [=](const TensorList& t) {
            return nll_loss(t[0], t[1], weighted ? t[2] : Tensor(), r, ignore);
          }});
        }
  }
  // mse_loss.
  for (const Shape& s : std::vector<Shape>{{40}, {6, 5, 4}})
    for (Reduction r : kReductions)
      cases.push_back({name("mse"), "mse_loss", detail::str("reduction=", rname(r)),
                       {{"input", randn(s), true}, {"target", randn(s), true}},
                       [=](const TensorList& t) { return mse_loss(t[0], t[1], r); }});
  // binary_cross_entropy_with_logits: PyTorch differentiates the input and the target.
  for (int weight_kind : {0, 1, 2})  // none, per class (7), full (9, 7)
    for (bool pos : {false, true})
      for (Reduction r : kReductions) {
        std::vector<Arg> args = {{"input", randn({9, 7}) * 4.0, true}, {"target", rand({9, 7}), true}};
        if (weight_kind) args.push_back({"weight", rand(weight_kind == 1 ? Shape{7} : Shape{9, 7}) + 0.5, false});
        if (pos) args.push_back({"pos_weight", rand({7}) * 3.0, false});
        cases.push_back({name("bce"), "binary_cross_entropy_with_logits", detail::str("reduction=", rname(r)), args,
                         [=](const TensorList& t) {
          return binary_cross_entropy_with_logits(t[0], t[1], weight_kind ? t[2] : Tensor(),
                                                  pos ? t[weight_kind ? 3 : 2] : Tensor(), r);
        }});
      }
  run_cases(cases);
}
