// Hostile input, each case in a forked child (tests/isolated.h): a crash, a hang or an
// exception that is not a mu::Error is a failure naming the case. Cases are generated per
// class of input (undefined and 0-dim operands for every op below, special values,
// integer edge cases, values near the float range's ends) and each asserts either the
// error (by a substring of its message) or the exact result, derived by hand.
#include <cmath>
#include <filesystem>
#include <cstdio>
#include <limits>
#include <map>

#include "helpers.h"
#include "isolated_checks.h"
#include "models/gpt2.h"
#include "nn/mumoe_block.h"
#include "optim/adamw.h"
#include "optim/sgd.h"

using namespace mu;

namespace {

// "shape=[2]; 1 nan -inf": a result's shape and values, as the child reports them.
std::string show(const Tensor& t) {
  std::string s = "shape=" + shape_str(t.shape()) + ";";
  for (double v : t.to_vector<double>()) {
    char buf[40];
    std::snprintf(buf, sizeof buf, " %.9g", std::isnan(v) ? std::fabs(v) : v);  // NaN's sign means nothing
    s += buf;
  }
  return s;
}

// Every op below, as a function of one tensor (the others made to fit it).
using UnaryCase = std::function<Tensor(const Tensor&)>;
std::map<std::string, UnaryCase> ops_of_one_tensor() {
  return {
      {"neg", [](const Tensor& x) { return neg(x); }},
      {"exp", [](const Tensor& x) { return exp(x); }},
      {"relu", [](const Tensor& x) { return relu(x); }},
      {"gelu", [](const Tensor& x) { return gelu(x); }},
      {"add", [](const Tensor& x) { return x + x; }},
      {"mul_scalar", [](const Tensor& x) { return x * 2.0; }},
      {"lt", [](const Tensor& x) { return x < 0.5; }},
      {"where", [](const Tensor& x) { return where(x > 0.0, x, 1.0); }},
      {"softmax", [](const Tensor& x) { return softmax(x, -1); }},
      {"log_softmax", [](const Tensor& x) { return log_softmax(x, 0); }},
      {"sum", [](const Tensor& x) { return x.sum(); }},
      {"sum_dim", [](const Tensor& x) { return x.sum({0}); }},
      {"mean", [](const Tensor& x) { return x.mean(); }},
      {"amax", [](const Tensor& x) { return amax(x, {0}); }},
      {"argmax", [](const Tensor& x) { return argmax(x, 0); }},
      {"cumsum", [](const Tensor& x) { return cumsum(x, 0); }},
      {"size0", [](const Tensor& x) { return scalar_tensor(double(x.size(0))); }},
      {"stride0", [](const Tensor& x) { return scalar_tensor(double(x.stride(0))); }},
      {"select", [](const Tensor& x) { return x.select(0, 0); }},
      {"narrow", [](const Tensor& x) { return x.narrow(0, 0, 1); }},
      {"slice", [](const Tensor& x) { return x.slice(0, 0, 1); }},
      {"cat", [](const Tensor& x) { return cat({x, x}, 0); }},
      {"stack", [](const Tensor& x) { return stack({x, x}, 0); }},
      {"split", [](const Tensor& x) { return split(x, 1, 0)[0]; }},
      {"chunk", [](const Tensor& x) { return chunk(x, 2, 0)[0]; }},
      {"unsqueeze", [](const Tensor& x) { return x.unsqueeze(0); }},
      {"squeeze", [](const Tensor& x) { return x.squeeze(0); }},
      {"flatten", [](const Tensor& x) { return x.flatten(); }},
      {"transpose", [](const Tensor& x) { return x.transpose(0, -1); }},
      {"t", [](const Tensor& x) { return x.t(); }},
      {"reshape", [](const Tensor& x) { return x.reshape({-1}); }},
      {"expand", [](const Tensor& x) { return x.expand({2}); }},
      {"matmul", [](const Tensor& x) { return matmul(x, x); }},
      {"mm", [](const Tensor& x) { return mm(x, x); }},
      {"embedding", [](const Tensor& x) { return embedding(ones({3, 2}), x.to(kInt64)); }},
      {"gather", [](const Tensor& x) { return gather(x, 0, zeros_like(x).to(kInt64)); }},
      {"index_select", [](const Tensor& x) { return index_select(x, 0, zeros({1}, kInt64)); }},
      {"cross_entropy", [](const Tensor& x) { return cross_entropy(x, zeros({}, kInt64)); }},
      {"mse_loss", [](const Tensor& x) { return mse_loss(x, x); }},
      {"layer_norm", [](const Tensor& x) { return layer_norm(x, x.shape()); }},
      {"to_f64", [](const Tensor& x) { return x.to(kFloat64); }},
      {"clone", [](const Tensor& x) { return x.clone(); }},
      {"item", [](const Tensor& x) { return scalar_tensor(x.item()); }},
      {"backward", [](const Tensor& x) {
         Tensor l = x.detach().requires_grad_();
         (l * l).sum().backward();
         return l.grad();
       }},
  };
}


}  // namespace

TEST_CASE("every op refuses an undefined tensor with a mu::Error, in a child that survives") {
  for (const auto& [name, op] : ops_of_one_tensor()) {
    isolated::Outcome o = isolated::run([op = op] { return show(op(Tensor())); });
    INFO(name << "(undefined): " << o.describe());
    CHECK(o.kind == isolated::Outcome::MuError);
  }
}

TEST_CASE("every op takes a 0-dim tensor or refuses it with a mu::Error; the known ones as PyTorch") {
  // What PyTorch does with torch.tensor(1.5) (each checked by hand in torch 1.13).
  const std::map<std::string, std::string> want_result = {
      {"neg", "shape=[]; -1.5"},       {"relu", "shape=[]; 1.5"},       {"add", "shape=[]; 3"},
      {"softmax", "shape=[]; 1"},      {"log_softmax", "shape=[]; 0"},  {"sum", "shape=[]; 1.5"},
      {"sum_dim", "shape=[]; 1.5"},    {"amax", "shape=[]; 1.5"},       {"argmax", "shape=[]; 0"},
      {"cumsum", "shape=[]; 1.5"},     {"stack", "shape=[2]; 1.5 1.5"}, {"unsqueeze", "shape=[1]; 1.5"},
      {"squeeze", "shape=[]; 1.5"},    {"flatten", "shape=[1]; 1.5"},   {"transpose", "shape=[]; 1.5"},
      {"t", "shape=[]; 1.5"},          {"reshape", "shape=[1]; 1.5"},   {"expand", "shape=[2]; 1.5 1.5"},
      {"mse_loss", "shape=[]; 0"},     {"item", "shape=[]; 1.5"},       {"backward", "shape=[]; 3"},
      {"clone", "shape=[]; 1.5"},      {"to_f64", "shape=[]; 1.5"},     {"mean", "shape=[]; 1.5"},
  };
  const std::map<std::string, std::string> want_error = {
      {"size0", "size: dimension 0 was given but the tensor is 0-dimensional"},
      {"stride0", "stride: dimension 0 was given but the tensor is 0-dimensional"},
      {"select", "select: dimension 0 was given but the tensor is 0-dimensional"},
      {"narrow", "narrow: dimension 0 was given but the tensor is 0-dimensional"},
      {"slice", "slice: dimension 0 was given but the tensor is 0-dimensional"},
      {"cat", "cat: dimension 0 was given but the tensor is 0-dimensional"},
      {"split", "split: dimension 0 was given but the tensor is 0-dimensional"},
      {"chunk", "chunk: dimension 0 was given but the tensor is 0-dimensional"},
  };
  for (const auto& [name, op] : ops_of_one_tensor()) {
    auto body = [op = op] { return show(op(scalar_tensor(1.5))); };
    if (auto it = want_result.find(name); it != want_result.end()) {
      expect_result(name + "(0-dim)", body, it->second);
    } else if (auto e = want_error.find(name); e != want_error.end()) {
      expect_error(name + "(0-dim)", body, e->second);
    } else {
      isolated::Outcome o = isolated::run(body);
      INFO(name << "(0-dim): " << o.describe());
      CHECK((o.kind == isolated::Outcome::Returned || o.kind == isolated::Outcome::MuError));
    }
  }
}

TEST_CASE("every op on empty tensors of shapes [0] and [0, 3] answers or refuses, never crashes") {
  for (const Shape& s : {Shape{0}, Shape{0, 3}})
    for (const auto& [name, op] : ops_of_one_tensor()) {
      isolated::Outcome o = isolated::run([op = op, s] { return show(op(zeros(s))); });
      INFO(name << "(zeros " << shape_str(s) << "): " << o.describe());
      CHECK((o.kind == isolated::Outcome::Returned || o.kind == isolated::Outcome::MuError));
    }
}

TEST_CASE("NaN propagates through activations, extrema, clamps and the softmax family") {
  auto x = [] { return tensor({NAN, 1.0, -2.0}); };
  expect_result("relu", [&] { return show(relu(x())); }, "shape=[3]; nan 1 0");
  expect_result("gelu", [&] { return show(gelu(x()).narrow(0, 0, 1)); }, "shape=[1]; nan");
  expect_result("sigmoid", [&] { return show(sigmoid(x()).narrow(0, 0, 1)); }, "shape=[1]; nan");
  expect_result("maximum", [&] { return show(maximum(x(), zeros({3}))); }, "shape=[3]; nan 1 0");
  expect_result("minimum", [&] { return show(minimum(zeros({3}), x())); }, "shape=[3]; nan 0 -2");
  expect_result("clamp", [&] { return show(clamp(x(), -1.0, 0.5)); }, "shape=[3]; nan 0.5 -1");
  expect_result("amax", [&] { return show(amax(x(), {0})); }, "shape=[]; nan");
  expect_result("amin", [&] { return show(amin(x(), {0})); }, "shape=[]; nan");
  expect_result("softmax", [&] { return show(softmax(x(), 0)); }, "shape=[3]; nan nan nan");
  expect_result("log_softmax", [&] { return show(log_softmax(x(), 0)); }, "shape=[3]; nan nan nan");
}

TEST_CASE("integers: wrap-around, rounding division, division by zero and exact int64 values") {
  const int64_t kMax = std::numeric_limits<int64_t>::max(), kMin = std::numeric_limits<int64_t>::min();
  auto big = [=] { return from_vector(std::vector<int64_t>{kMax, kMin, 7, -7}, {4}); };
  // Two's complement wrap-around, as PyTorch's int64 arithmetic.
  expect_result("add wraps", [&] { return show((big() + 1).to(kFloat64).narrow(0, 0, 1)); }, "shape=[1]; -9.22337204e+18");
  expect_result("neg of INT64_MIN", [&] { return std::to_string(neg(big()).to_vector<int64_t>()[1]); }, std::to_string(kMin));
  expect_result("mul wraps", [&] { return std::to_string((big() * 2).to_vector<int64_t>()[0]); }, "-2");
  // int64 values survive arithmetic exactly (no detour through double).
  expect_result("exact above 2^53", [&] { return std::to_string((big() - 1).to_vector<int64_t>()[0]); },
                std::to_string(kMax - 1));
  // True division gives float; rounding modes keep integers; zero divisors refused.
  expect_result("true division", [&] { return show(big().narrow(0, 2, 2) / 2); }, "shape=[2]; 3.5 -3.5");
  expect_result("trunc", [&] { return show(div(big().narrow(0, 2, 2), full({2}, 2, kInt64), "trunc")); },
                "shape=[2]; 3 -3");
  expect_result("floor", [&] { return show(div(big().narrow(0, 2, 2), full({2}, 2, kInt64), "floor")); },
                "shape=[2]; 3 -4");
  expect_result("INT64_MIN / -1", [&] {
    return std::to_string(div(big().narrow(0, 1, 1), full({1}, -1, kInt64), "trunc").to_vector<int64_t>()[0]);
  }, std::to_string(kMin));
  expect_error("integer division by zero", [&] { return show(div(big(), zeros({4}, kInt64), "floor")); },
               "div: integer division by zero");
  expect_result("float floor division by zero", [&] { return show(div(tensor({1.0, -1.0}), zeros({2}), "floor")); },
                "shape=[2]; inf -inf");
  expect_error("in-place true division of integers", [&] {
    Tensor i = big();
    i.div_(full({4}, 2, kInt64));
    return show(i);
  }, "div_: the result type of true division is floating point");
}

TEST_CASE("softmax, log_softmax and layer_norm stay finite and exact near the float range's ends") {
  expect_result("softmax of 3e38", [] { return show(softmax(tensor({3e38, 3e38}), 0)); }, "shape=[2]; 0.5 0.5");
  expect_result("log_softmax of +-3e38", [] { return show(log_softmax(tensor({3e38, -3e38}), 0)); },
                "shape=[2]; 0 -inf");
  expect_result("softmax of -3e38", [] { return show(softmax(tensor({-3e38, -3e38}), 0)); }, "shape=[2]; 0.5 0.5");
  // mean 0 and variance 1e76 overflow float but not the double sums: the output is +-1.
  expect_result("layer_norm of +-1e38", [] { return show(layer_norm(tensor({1e38, -1e38, 1e38, -1e38}), {4})); },
                "shape=[4]; 1 -1 1 -1");
  expect_result("layer_norm of tiny values", [] { return show(layer_norm(tensor({1e-30, -1e-30}), {2}, Tensor(), Tensor(), 0)); },
                "shape=[2]; 1 -1");
}

TEST_CASE("construction refuses values an integer or bool dtype cannot hold") {
  expect_error("full 0.5 int64", [] { return show(full({2}, 0.5, kInt64)); },
               "fill_: value 0.5 is not an integer but the dtype is int64");
  expect_error("full NaN int32", [] { return show(full({2}, NAN, kInt32)); }, "is not an integer");
  expect_error("full 300 uint8", [] { return show(full({1}, 300, kUInt8)); },
               "fill_: value 300 does not fit in uint8 (range [0, 255])");
  expect_error("full -1 uint8", [] { return show(full({1}, -1, kUInt8)); }, "does not fit in uint8");
  expect_error("full 2^63 int64", [] { return show(full({1}, 9223372036854775808.0, kInt64)); },
               "does not fit in int64");
  expect_error("full 2 bool", [] { return show(full({1}, 2, kBool)); }, "value 2 is not a bool");
  expect_error("tensor 1.5 int64", [] { return show(tensor({1.5}, kInt64)); },
               "from_vector: value 1.5 is not an integer but the dtype is int64");
  expect_error("from_vector 200 int8", [] { return show(from_vector(std::vector<int64_t>{200}, {1}, kInt8)); },
               "value 200 does not fit in int8");
  expect_error("set 0.25 int64", [] {
    Tensor t = zeros({2}, kInt64);
    t.set({0}, 0.25);
    return show(t);
  }, "set: value 0.25 is not an integer");
  expect_result("full -128 int8", [] { return show(full({1}, -128, kInt8)); }, "shape=[1]; -128");
  expect_result("full 2^62 int64", [] { return std::to_string(full({1}, 4611686018427387904.0, kInt64).to_vector<int64_t>()[0]); },
                "4611686018427387904");
}

TEST_CASE("options: NaN or out-of-range hyper-parameters and enums are refused at construction and in counts") {
  expect_error("AdamW lr NaN", [] {
    optim::AdamW opt(std::vector<Tensor>{ones({2}).requires_grad_()}, optim::AdamWOptions().lr(NAN));
    return std::string("constructed");
  }, "invalid learning rate nan");
  expect_error("AdamW eps NaN", [] {
    optim::AdamW opt(std::vector<Tensor>{ones({2}).requires_grad_()}, optim::AdamWOptions().eps(NAN));
    return std::string("constructed");
  }, "invalid eps nan");
  expect_error("SGD momentum NaN", [] {
    optim::SGD opt(std::vector<Tensor>{ones({2}).requires_grad_()}, optim::SGDOptions(0.1).momentum(NAN));
    return std::string("constructed");
  }, "invalid momentum nan");
  auto bad_kind = [] { return nn::MuMoEOptions(8, 4).experts({4}).rank(2).kind(static_cast<nn::MoEKind>(17)); };
  expect_error("MuMoE bad kind", [&] { return std::to_string(nn::MuMoE(bad_kind()).num_parameters()); },
               "MuMoE: kind 17 is not a MoEKind");
  expect_error("MuMoE count bad kind", [&] { return std::to_string(nn::MuMoE::count_parameters(bad_kind())); },
               "MuMoE: kind 17 is not a MoEKind");
  expect_error("MuMoE bad gate norm", [] {
    return std::to_string(nn::MuMoE::count_parameters(
        nn::MuMoEOptions(8, 4).experts({4}).rank(2).gate_norm(static_cast<nn::GateNorm>(-1))));
  }, "MuMoE: gate_norm -1 is not a GateNorm");
  expect_error("MuMoE NaN gate_eps", [] {
    return std::to_string(nn::MuMoE::count_parameters(nn::MuMoEOptions(8, 4).experts({4}).rank(2).gate_eps(NAN)));
  }, "gate_eps must be a finite non-negative number, got nan");
}

TEST_CASE("randint covers int64's whole range without overflow and keeps values exact") {
  const int64_t kMin = std::numeric_limits<int64_t>::min(), kMax = std::numeric_limits<int64_t>::max();
  // [2^62 + 1, 2^62 + 3): every draw is one of two odd values above 2^53, exactly.
  expect_result("exact above 2^53", [] {
    manual_seed(5);
    std::vector<int64_t> v = randint((int64_t(1) << 62) + 1, (int64_t(1) << 62) + 3, {64}).to_vector<int64_t>();
    for (int64_t x : v)
      if (x != (int64_t(1) << 62) + 1 && x != (int64_t(1) << 62) + 2) return "drew " + std::to_string(x);
    return std::string("ok");
  }, "ok");
  // The full range: high - low does not fit in int64; draws land in range on both sides.
  expect_result("full range", [=] {
    manual_seed(6);
    std::vector<int64_t> v = randint(kMin, kMax, {256}).to_vector<int64_t>();
    bool neg = false, pos = false;
    for (int64_t x : v) neg = neg || x < 0, pos = pos || x > 0;
    return std::string(neg && pos ? "both signs" : "one sign");
  }, "both signs");
}

TEST_CASE("GPT-2: sizes past int64 or any machine, hostile ids and damaged weight files are mu::Errors") {
  auto tiny = [] {
    models::GPT2Config c;
    c.n_layer = 1;
    c.n_head = 1;
    c.n_embd = 4;
    c.block_size = 4;
    c.vocab_size = 5;
    return c;
  };
  expect_error("GPT2 n_layer 2^62 counted", [&] {
    models::GPT2Config c = tiny();
    c.n_layer = int64_t(1) << 62;
    return std::to_string(models::GPT2::count_parameters(c));
  }, "does not fit in int64");
  expect_error("GPT2 n_layer 2^50 built", [&] {
    models::GPT2Config c = tiny();
    c.n_layer = int64_t(1) << 50;
    return std::to_string(models::GPT2(c).num_parameters());
  }, "are more than any machine holds");
  expect_error("GPT2 n_embd 2^62", [&] {
    models::GPT2Config c = tiny();
    c.n_embd = int64_t(1) << 62;
    return std::to_string(models::GPT2(c).num_parameters());
  }, "4 * n_embd");
  expect_error("GPT2 negative id", [&] {
    models::GPT2 m(tiny());
    return show(m.forward(tensor({0, -3}).reshape({1, 2})));
  }, "-3");
  expect_error("GPT2 generate NaN temperature", [&] {
    models::GPT2 m(tiny());
    return show(m.generate(tensor({0}).reshape({1, 1}), 1, NAN));
  }, "temperature must be a finite number > 0, got nan");
  // Weight files: truncated, integer-valued, a directory.
  const std::string dir = "/tmp/mumoe_gpt2_robust_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  {
    models::GPT2 src(tiny());
    std::vector<std::pair<std::string, Tensor>> t;
    for (auto& [name, v] : src.state_dict())
      if (name != "lm_head.weight") {
        const bool conv = name.find("c_attn.weight") != std::string::npos ||
                          name.find("c_proj.weight") != std::string::npos || name.find("c_fc.weight") != std::string::npos;
        t.emplace_back(name.substr(12), conv ? v.t().contiguous() : v);
      }
    save_safetensors(dir + "/ok.safetensors", t);
    for (auto& [name, v] : t)
      if (name == "ln_f.bias") v = zeros({4}, kInt64);
    save_safetensors(dir + "/int.safetensors", t);
  }
  std::filesystem::copy_file(dir + "/ok.safetensors", dir + "/cut.safetensors");
  std::filesystem::resize_file(dir + "/cut.safetensors", std::filesystem::file_size(dir + "/ok.safetensors") - 9);
  expect_result("GPT2 loads its own file", [&] {
    models::GPT2 m(tiny());
    models::load_hf_gpt2_safetensors(m, dir + "/ok.safetensors");
    return std::string("loaded");
  }, "loaded");
  expect_error("GPT2 truncated file", [&] {
    models::GPT2 m(tiny());
    models::load_hf_gpt2_safetensors(m, dir + "/cut.safetensors");
    return std::string("loaded");
  }, "cut.safetensors");
  expect_error("GPT2 integer weights", [&] {
    models::GPT2 m(tiny());
    models::load_hf_gpt2_safetensors(m, dir + "/int.safetensors");
    return std::string("loaded");
  }, "ln_f.bias holds int64, expected floating-point values");
  expect_error("GPT2 directory as file", [&] {
    models::GPT2 m(tiny());
    models::load_hf_gpt2_safetensors(m, dir);
    return std::string("loaded");
  }, dir);
  std::filesystem::remove_all(dir);
}
