// nn::Module: registration, traversal order and dotted names, modes, dtype moves, state
// dicts and their refusals, the printed tree; Sequential and ModuleList.
#include <cmath>

#include "helpers.h"
#include "nn/nn.h"

using namespace mu;

namespace {

// A module with its own parameters and buffers (one int64, which dtype moves must skip).
struct Leaf : nn::Module {
  Tensor w, b, stat, count;
  explicit Leaf(int64_t n) : Module("Leaf") {
    w = register_parameter("w", randn({n, 2}));
    b = register_parameter("b", zeros({n}));
    stat = register_buffer("stat", rand({n}));
    count = register_buffer("count", zeros({}, kInt64));
  }
};

// Parameters at the top, a plain child and a Sequential of layers:
// scale (1) + a (3x2 + 3) + body (2x3 + 3 + 3x1 + 1) = 1 + 9 + 13 = 23 parameters.
struct Net : nn::Module {
  Tensor scale;
  std::shared_ptr<Leaf> a;
  std::shared_ptr<nn::Sequential> body;
  Net() : Module("Net") {
    scale = register_parameter("scale", ones({1}));
    a = register_module("a", std::make_shared<Leaf>(3));
    body = register_module("body", std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::UnaryModule>>{
                                       std::make_shared<nn::Linear>(2, 3), std::make_shared<nn::ReLU>(),
                                       std::make_shared<nn::Linear>(3, 1)}));
  }
  // (N, 2) -> (N, 1); uses every parameter so a backward pass reaches all of them.
  Tensor forward(const Tensor& x) { return body->forward(matmul(x, a->w.t()).matmul(a->w) + a->b.sum()) * scale; }
};

std::vector<std::string> names(const nn::StateDict& sd) {
  std::vector<std::string> out;
  for (const auto& [n, t] : sd) out.push_back(n);
  return out;
}

// Deep copies of every entry, to compare against after a refused load.
nn::StateDict snapshot(const nn::Module& m) {
  nn::StateDict out;
  for (const auto& [n, t] : m.state_dict()) out.emplace_back(n, t.detach().clone());
  return out;
}

void check_same_values(const nn::StateDict& a, const nn::StateDict& b) {
  REQUIRE(names(a) == names(b));
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("entry " << a[i].first);
    CHECK(a[i].second.dtype() == b[i].second.dtype());
    CHECK(max_abs_diff(a[i].second, b[i].second) == 0);
  }
}

}  // namespace

TEST_CASE("parameters are registered by name as leaves that require grad") {
  manual_seed(0);
  Net net;
  CHECK(names(net.named_parameters()) ==
        std::vector<std::string>{"scale", "a.w", "a.b", "body.0.weight", "body.0.bias", "body.2.weight", "body.2.bias"});
  CHECK(names(net.named_parameters(false)) == std::vector<std::string>{"scale"});
  auto params = net.parameters();
  REQUIRE(params.size() == 7);
  for (const Tensor& p : params) {
    CHECK(p.requires_grad());
    CHECK(p.is_leaf());
  }
  // The handles the members hold are the registered tensors themselves.
  CHECK(params[1].is_same(net.a->w));
  CHECK(params[3].is_same(net.body->at<nn::Linear>(0)->weight));

  nn::Module m("M");
  Tensor frozen = m.register_parameter("frozen", ones({2}), /*requires_grad=*/false);
  CHECK_FALSE(frozen.requires_grad());
  // A value computed by a graph becomes a leaf of its own.
  Tensor x = ones({2}).requires_grad_();
  Tensor derived = m.register_parameter("derived", x * 2.0);
  CHECK(derived.is_leaf());
  CHECK(derived.requires_grad());
  CHECK(derived.at({1}) == 2.0);
}

TEST_CASE("duplicate, invalid and null registrations are refused by name") {
  nn::Module m("Owner");
  m.register_parameter("w", zeros({2}));
  CHECK_THROWS_MU(m.register_parameter("w", zeros({2})), "\"w\" is already registered");
  CHECK_THROWS_MU(m.register_buffer("w", zeros({2})), "\"w\" is already registered");
  CHECK_THROWS_MU(m.register_module("w", std::make_shared<nn::ReLU>()), "\"w\" is already registered");
  m.register_module("child", std::make_shared<nn::ReLU>());
  CHECK_THROWS_MU(m.register_parameter("child", zeros({2})), "\"child\" is already registered");
  CHECK_THROWS_MU(m.register_parameter("a.b", zeros({2})), "invalid name \"a.b\"");
  CHECK_THROWS_MU(m.register_buffer("", zeros({2})), "invalid name \"\"");
  CHECK_THROWS_MU(m.register_parameter("u", Tensor()), "\"u\" is an undefined tensor");
  CHECK_THROWS_MU(m.register_module("n", std::shared_ptr<nn::ReLU>()), "child module \"n\" is null");
  // Nothing refused was added.
  CHECK(names(m.named_parameters()) == std::vector<std::string>{"w"});
  CHECK(m.children().size() == 1);
}

TEST_CASE("a module cannot hold itself, directly or through its children: the tree stays finite") {
  auto a = std::make_shared<nn::Module>("A"), b = std::make_shared<nn::Module>("B"), c = std::make_shared<nn::Module>("C");
  a->register_parameter("w", zeros({2}));
  a->register_module("b", b);
  b->register_module("c", c);
  CHECK_THROWS_MU(a->register_module("self", a), "A: child module \"self\" (A) is this module itself");
  CHECK_THROWS_MU(c->register_module("a", a), "C: child module \"a\" (A) already holds this module");
  CHECK_THROWS_MU(b->register_module("a", a), "modules must form a tree, not a cycle");
  // Refused, so nothing was added, and every walk of the tree ends.
  CHECK(c->children().empty());
  CHECK(names(a->named_parameters()) == std::vector<std::string>{"w"});
  CHECK(a->state_dict().size() == 1);
  // A child shared by two parents (no cycle) is still taken.
  auto d = std::make_shared<nn::Module>("D");
  b->register_module("d", d);
  c->register_module("d", d);
  CHECK(a->modules().size() == 4);
}

TEST_CASE("buffers are listed apart from parameters and take no gradient") {
  manual_seed(1);
  Net net;
  CHECK(names(net.named_buffers()) == std::vector<std::string>{"a.stat", "a.count"});
  CHECK(net.named_buffers(false).empty());
  for (const Tensor& b : net.buffers()) CHECK_FALSE(b.requires_grad());
  CHECK(net.buffers()[0].is_same(net.a->stat));
  // The state dict holds parameters then buffers of each module, depth first.
  CHECK(names(net.state_dict()) == std::vector<std::string>{"scale", "a.w", "a.b", "a.stat", "a.count", "body.0.weight",
                                                             "body.0.bias", "body.2.weight", "body.2.bias"});
}

TEST_CASE("children and modules come in registration order, depth first") {
  manual_seed(2);
  Net net;
  auto kids = net.named_children();
  REQUIRE(kids.size() == 2);
  CHECK(kids[0].first == "a");
  CHECK(kids[1].first == "body");
  CHECK(net.children()[0] == net.a);
  CHECK(net.children()[1] == net.body);
  std::vector<std::string> types;
  for (nn::Module* m : net.modules()) types.push_back(m->type_name());
  CHECK(types == std::vector<std::string>{"Net", "Leaf", "Sequential", "Linear", "ReLU", "Linear"});
  CHECK(net.modules()[0] == &net);
}

TEST_CASE("train and eval reach every descendant") {
  manual_seed(3);
  Net net;
  for (nn::Module* m : net.modules()) CHECK(m->is_training());
  net.eval();
  for (nn::Module* m : net.modules()) CHECK_FALSE(m->is_training());
  net.body->train();  // a subtree can be switched alone
  CHECK_FALSE(net.is_training());
  CHECK_FALSE(net.a->is_training());
  for (nn::Module* m : net.body->modules()) CHECK(m->is_training());
  net.train();
  for (nn::Module* m : net.modules()) CHECK(m->is_training());
}

TEST_CASE("to(kFloat64) converts in place: member handles stay valid") {
  manual_seed(4);
  Net net;
  Tensor w_member = net.a->w;  // a copy of the handle, as a user's own struct would keep
  std::vector<double> before = w_member.to_vector<double>();
  Tensor x = randn({5, 2});
  Tensor y32 = net.forward(x);
  y32.sum().backward();
  REQUIRE(w_member.grad().defined());

  net.to(kFloat64);
  CHECK(w_member.dtype() == kFloat64);
  CHECK(w_member.is_same(net.named_parameters()[1].second));
  CHECK(w_member.to_vector<double>() == before);  // float32 values are exact in float64
  CHECK(w_member.requires_grad());
  CHECK_FALSE(w_member.grad().defined());  // a gradient of the old dtype does not carry over
  for (const Tensor& p : net.parameters()) CHECK(p.dtype() == kFloat64);
  CHECK(net.a->stat.dtype() == kFloat64);
  CHECK(net.a->count.dtype() == kInt64);  // integer buffers keep their dtype

  // The module computes in float64 now, with the same values up to float32 rounding.
  Tensor y64 = net.forward(x.to(kFloat64));
  CHECK(y64.dtype() == kFloat64);
  CHECK(max_abs_diff(y64, y32.detach().to(kFloat64)) < 1e-5);
  y64.sum().backward();
  CHECK(w_member.grad().dtype() == kFloat64);

  // Moving to the dtype it already has keeps the gradients.
  net.to(kFloat64);
  CHECK(w_member.grad().defined());
  net.to(Device::cpu());
  CHECK(w_member.grad().defined());
  CHECK_THROWS_MU(net.to(kInt64), "floating-point dtypes only");
}

TEST_CASE("zero_grad clears every gradient; num_parameters counts elements") {
  manual_seed(5);
  Net net;
  net.forward(randn({4, 2})).sum().backward();
  for (const Tensor& p : net.parameters()) CHECK(p.grad().defined());
  net.zero_grad();
  for (const Tensor& p : net.parameters()) CHECK_FALSE(p.grad().defined());
  CHECK(net.num_parameters() == 23);
  CHECK(net.a->num_parameters() == 9);
  CHECK(net.body->num_parameters() == 13);
  CHECK(nn::ReLU().num_parameters() == 0);
}

TEST_CASE("a tensor or module registered twice is listed once but saved under both names") {
  manual_seed(6);
  nn::Module shared("Shared");
  auto leaf = std::make_shared<Leaf>(2);
  shared.register_module("first", leaf);
  shared.register_module("second", leaf);
  // An optimizer must see the shared tensors once, and the count must not double.
  CHECK(names(shared.named_parameters()) == std::vector<std::string>{"first.w", "first.b"});
  CHECK(shared.num_parameters() == 6);
  CHECK(shared.modules().size() == 2);
  CHECK(names(shared.state_dict()) ==
        std::vector<std::string>{"first.w", "first.b", "first.stat", "first.count", "second.w", "second.b",
                                 "second.stat", "second.count"});
  // The same tensor registered as a parameter of two modules (weight tying).
  nn::Module owner("Owner");
  auto l1 = std::make_shared<nn::Linear>(3, 3, false);
  owner.register_module("l1", l1);
  auto other = std::make_shared<nn::Module>("Other");
  CHECK(other->register_parameter("tied", l1->weight).is_same(l1->weight));
  owner.register_module("other", other);
  CHECK(owner.parameters().size() == 1);
  CHECK(owner.num_parameters() == 9);
  CHECK(owner.state_dict().size() == 2);
}

TEST_CASE("state_dict round trip into a fresh module") {
  manual_seed(7);
  Net src;
  src.a->count.fill_(7);
  manual_seed(8);  // different initial values
  Net dst;
  REQUIRE(max_abs_diff(src.a->w, dst.a->w) > 0);
  nn::StateDict sd = src.state_dict();
  dst.load_state_dict(sd);
  check_same_values(dst.state_dict(), snapshot(src));
  // Loaded by value: the module's tensors are its own, not the source's.
  CHECK_FALSE(dst.a->w.is_same(src.a->w));
  Tensor x = randn({3, 2});
  CHECK(max_abs_diff(dst.forward(x), src.forward(x)) == 0);
  {
    NoGradGuard g;
    src.a->w.fill_(42);
  }
  CHECK(dst.a->w.at({0, 0}) != 42);
  // Values convert to the module's dtype.
  Net dst64;
  dst64.to(kFloat64);
  dst64.load_state_dict(sd);
  CHECK(dst64.a->w.dtype() == kFloat64);
  CHECK(max_abs_diff(dst64.a->stat, sd[3].second.to(kFloat64)) == 0);
  CHECK(dst64.a->count.item() == 7);
}

TEST_CASE("load_state_dict refuses missing, unexpected and mis-shaped entries and changes nothing") {
  manual_seed(9);
  Net src;
  manual_seed(10);
  Net dst;
  const nn::StateDict before = snapshot(dst);
  nn::StateDict good = src.state_dict();

  nn::StateDict missing;
  for (const auto& e : good)
    if (e.first != "a.w" && e.first != "body.2.bias") missing.push_back(e);
  CHECK_THROWS_MU(dst.load_state_dict(missing), "missing entries: a.w, body.2.bias");
  check_same_values(snapshot(dst), before);

  nn::StateDict unexpected = good;
  unexpected.emplace_back("a.extra", zeros({1}));
  CHECK_THROWS_MU(dst.load_state_dict(unexpected), "unexpected entries: a.extra");
  check_same_values(snapshot(dst), before);

  nn::StateDict both = missing;
  both.emplace_back("ghost", zeros({1}));
  CHECK_THROWS_MU(dst.load_state_dict(both), "missing entries: a.w, body.2.bias; unexpected entries: ghost");

  // A wrong shape late in the list must not leave the earlier entries written.
  nn::StateDict misshaped = good;
  for (auto& e : misshaped)
    if (e.first == "body.2.weight") e.second = zeros({3, 1});
  CHECK_THROWS_MU(dst.load_state_dict(misshaped), "entry \"body.2.weight\" has shape [3, 1] but the module's tensor has shape [1, 3]");
  check_same_values(snapshot(dst), before);
  // Even when not strict.
  CHECK_THROWS_MU(dst.load_state_dict(misshaped, /*strict=*/false), "body.2.weight");
  check_same_values(snapshot(dst), before);

  nn::StateDict undefined_entry = good;
  undefined_entry[0].second = Tensor();
  CHECK_THROWS_MU(dst.load_state_dict(undefined_entry), "entry \"scale\" is an undefined tensor");
  check_same_values(snapshot(dst), before);

  // Not strict: the entries present are loaded, the missing ones kept, the extra ignored.
  both.emplace_back("also_ignored", zeros({2}));
  dst.load_state_dict(both, /*strict=*/false);
  CHECK(max_abs_diff(dst.a->b, src.a->b) == 0);
  CHECK(max_abs_diff(dst.body->at<nn::Linear>(0)->weight, src.body->at<nn::Linear>(0)->weight) == 0);
  CHECK(max_abs_diff(dst.a->w, nn::find(before, "a.w")) == 0);
  CHECK(max_abs_diff(dst.body->at<nn::Linear>(2)->bias, nn::find(before, "body.2.bias")) == 0);
}

TEST_CASE("the printed tree shows each module, its settings and parameter counts") {
  manual_seed(11);
  Net net;
  CHECK(net.str() ==
        "Net  [23 params, 1 own]\n"
        "  (a): Leaf  [9 params]\n"
        "  (body): Sequential  [13 params]\n"
        "    (0): Linear(in_features=2, out_features=3, bias=true)  [9 params]\n"
        "    (1): ReLU  [0 params]\n"
        "    (2): Linear(in_features=3, out_features=1, bias=true)  [4 params]\n");
  nn::Linear big(768, 1000);
  CHECK(big.str() == "Linear(in_features=768, out_features=1000, bias=true)  [769,000 params]\n");
}

TEST_CASE("Sequential chains its layers; ModuleList holds modules by index") {
  manual_seed(12);
  auto l1 = std::make_shared<nn::Linear>(4, 3);
  auto l2 = std::make_shared<nn::Linear>(3, 2);
  nn::Sequential seq;
  seq.push_back(l1);
  seq.push_back(std::make_shared<nn::ReLU>());
  seq.push_back(l2);
  REQUIRE(seq.size() == 3);
  Tensor x = randn({5, 4});
  CHECK(max_abs_diff(seq(x), l2->forward(relu(l1->forward(x)))) == 0);
  CHECK(seq[2] == l2);
  CHECK(seq.at<nn::Linear>(2) == l2);
  CHECK_THROWS_MU(seq.at<nn::Linear>(1), "layer 1 is a ReLU, not the requested type");
  CHECK_THROWS_MU(seq[3], "index 3 out of range for 3 layers");
  CHECK(names(seq.named_parameters()) == std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"});

  nn::ModuleList list;
  list.push_back(std::make_shared<nn::Embedding>(5, 2));
  list.push_back(l1);
  REQUIRE(list.size() == 2);
  CHECK(list.at<nn::Linear>(1) == l1);
  CHECK_THROWS_MU(list.at<nn::Linear>(0), "item 0 is a Embedding, not the requested type");
  CHECK_THROWS_MU(list[2], "index 2 out of range for 2 modules");
  CHECK(names(list.named_parameters()) == std::vector<std::string>{"0.weight", "1.weight", "1.bias"});
  CHECK(list.num_parameters() == 10 + 15);
}
