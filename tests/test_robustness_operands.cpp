// Hostile input to ops of several operands, to layers and to options, each case in a forked
// child (tests/isolated.h): every required operand in turn is made undefined, 0-dim or
// empty; every layer's forward gets the same; every option and hyper-parameter gets NaN,
// infinities, negatives and enums out of range. Each asserts the mu::Error (by a substring
// of its message) or, where the call is legal, that it returns.
#include <cmath>
#include <cstdio>
#include <limits>

#include "helpers.h"
#include "isolated.h"
#include "nn/activation.h"
#include "nn/embedding.h"
#include "nn/entmax.h"
#include "nn/expert_analysis.h"
#include "nn/init.h"
#include "nn/linear.h"
#include "nn/mumoe_block.h"
#include "nn/norm.h"
#include "optim/clip.h"
#include "optim/schedule.h"

using namespace mu;
using namespace mu::tensor_algebra;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN(), kInf = std::numeric_limits<double>::infinity();

// An op of several operands: `make` gives valid operands; `run` calls the op; `optional`
// marks positions where an undefined tensor means "absent" (a weight, a bias) and is legal.
struct ManyCase {
  std::string name;
  std::function<std::vector<Tensor>()> make;
  std::function<Tensor(const std::vector<Tensor>&)> run;
  std::vector<bool> optional;
};

Tensor ids(std::vector<int64_t> v, Shape s) { return from_vector(v, s); }

std::vector<ManyCase> ops_of_several_tensors() {
  auto two = [](Shape a, Shape b) {
    return [a, b] { return std::vector<Tensor>{rand(a), rand(b)}; };
  };
  return std::vector<ManyCase>{
      {"add", two({2, 3}, {2, 3}), [](auto& t) { return t[0] + t[1]; }, {}},
      {"maximum", two({2, 3}, {3}), [](auto& t) { return maximum(t[0], t[1]); }, {}},
      {"where", [] { return std::vector<Tensor>{rand({2, 3}) > 0.5, rand({2, 3}), rand({2, 3})}; },
       [](auto& t) { return where(t[0], t[1], t[2]); }, {}},
      {"masked_fill", [] { return std::vector<Tensor>{rand({2, 3}), rand({2, 3}) > 0.5}; },
       [](auto& t) { return masked_fill(t[0], t[1], 0.0); }, {}},
      {"gather", [] { return std::vector<Tensor>{rand({2, 3}), ids({0, 1, 2, 0, 1, 2}, {2, 3})}; },
       [](auto& t) { return gather(t[0], 1, t[1]); }, {}},
      {"scatter_add", [] { return std::vector<Tensor>{rand({2, 3}), ids({0, 1, 2, 0, 1, 2}, {2, 3}), rand({2, 3})}; },
       [](auto& t) { return scatter_add(t[0], 1, t[1], t[2]); }, {}},
      {"index_select", [] { return std::vector<Tensor>{rand({2, 3}), ids({1, 0}, {2})}; },
       [](auto& t) { return index_select(t[0], 0, t[1]); }, {}},
      {"embedding", [] { return std::vector<Tensor>{rand({4, 3}), ids({3, 0}, {2})}; },
       [](auto& t) { return embedding(t[0], t[1]); }, {}},
      {"einsum", two({2, 3}, {3, 4}), [](auto& t) { return einsum("ij,jk->ik", t); }, {}},
      {"einsum3", [] { return std::vector<Tensor>{rand({2, 3}), rand({3, 4}), rand({4})}; },
       [](auto& t) { return einsum("ij,jk,k->i", t); }, {}},
      {"matmul", two({2, 3}, {3, 4}), [](auto& t) { return matmul(t[0], t[1]); }, {}},
      {"mm", two({2, 3}, {3, 4}), [](auto& t) { return mm(t[0], t[1]); }, {}},
      {"bmm", two({2, 2, 3}, {2, 3, 4}), [](auto& t) { return bmm(t[0], t[1]); }, {}},
      {"cat", two({2, 3}, {1, 3}), [](auto& t) { return cat(t, 0); }, {}},
      {"stack", two({2, 3}, {2, 3}), [](auto& t) { return stack(t, 0); }, {}},
      {"kron", two({2, 3}, {2, 2}), [](auto& t) { return kron(t[0], t[1]); }, {}},
      {"khatri_rao", two({2, 3}, {4, 3}), [](auto& t) { return khatri_rao(t); }, {}},
      {"mode_n_product", two({2, 3, 4}, {5, 3}), [](auto& t) { return mode_n_product(t[0], t[1], 1); }, {}},
      {"cp_to_tensor", [] { return std::vector<Tensor>{rand({2, 3}), rand({4, 3}), rand({3})}; },
       [](auto& t) { return cp_to_tensor({t[0], t[1]}, t[2]); }, {false, false, true}},
      {"tucker_to_tensor", [] { return std::vector<Tensor>{rand({2, 3}), rand({4, 2}), rand({5, 3})}; },
       [](auto& t) { return tucker_to_tensor(t[0], {t[1], t[2]}); }, {}},
      {"cross_entropy", [] { return std::vector<Tensor>{rand({2, 3}), ids({2, 0}, {2}), rand({3})}; },
       [](auto& t) { return cross_entropy(t[0], t[1], CrossEntropyOptions().weight(t[2])); }, {false, false, true}},
      {"cross_entropy_probs", [] { return std::vector<Tensor>{rand({2, 3}), softmax(rand({2, 3}), 1)}; },
       [](auto& t) { return cross_entropy(t[0], t[1]); }, {}},
      {"nll_loss", [] { return std::vector<Tensor>{rand({2, 3}), ids({2, 0}, {2}), rand({3})}; },
       [](auto& t) { return nll_loss(t[0], t[1], t[2]); }, {false, false, true}},
      {"mse_loss", two({2, 3}, {2, 3}), [](auto& t) { return mse_loss(t[0], t[1]); }, {}},
      {"bce_with_logits", [] { return std::vector<Tensor>{rand({2, 3}), rand({2, 3}), rand({2, 3}), rand({3})}; },
       [](auto& t) { return binary_cross_entropy_with_logits(t[0], t[1], t[2], t[3]); }, {false, false, true, true}},
      {"layer_norm", [] { return std::vector<Tensor>{rand({2, 3}), rand({3}), rand({3})}; },
       [](auto& t) { return layer_norm(t[0], {3}, t[1], t[2]); }, {false, true, true}},
      {"batch_norm", [] { return std::vector<Tensor>{rand({4, 3}), zeros({3}), ones({3}), rand({3}), rand({3})}; },
       [](auto& t) { return batch_norm(t[0], t[1], t[2], t[3], t[4], true); }, {false, false, false, true, true}},
      {"attention", [] { return std::vector<Tensor>{rand({1, 2, 4, 8}), rand({1, 2, 4, 8}), rand({1, 2, 4, 8})}; },
       [](auto& t) { return scaled_dot_product_attention(t[0], t[1], t[2], true); }, {}},
  };
}

std::string show_shape(const Tensor& t) { return t.defined() ? shape_str(t.shape()) : "undefined"; }

}  // namespace

TEST_CASE("ops of several tensors: each one valid call returns (the cases below are meaningful)") {
  for (const ManyCase& c : ops_of_several_tensors()) {
    isolated::Outcome o = isolated::run([&] { return show_shape(c.run(c.make())); });
    INFO(c.name << ": " << o.describe());
    CHECK(o.kind == isolated::Outcome::Returned);
  }
}

TEST_CASE("ops of several tensors refuse an undefined required operand in any position") {
  for (const ManyCase& c : ops_of_several_tensors()) {
    const size_t n = c.make().size();
    for (size_t i = 0; i < n; ++i) {
      const bool optional = i < c.optional.size() && c.optional[i];
      isolated::Outcome o = isolated::run([&] {
        std::vector<Tensor> t = c.make();
        t[i] = Tensor();
        return show_shape(c.run(t));
      });
      INFO(c.name << " with operand " << i << " undefined: " << o.describe());
      if (optional)
        CHECK(o.kind == isolated::Outcome::Returned);  // undefined means "absent"
      else
        CHECK(o.kind == isolated::Outcome::MuError);
    }
  }
}

TEST_CASE("ops of several tensors take or refuse a 0-dim or an empty operand in any position") {
  for (const ManyCase& c : ops_of_several_tensors()) {
    const size_t n = c.make().size();
    for (size_t i = 0; i < n; ++i)
      for (const char* form : {"0-dim", "empty"}) {
        isolated::Outcome o = isolated::run([&] {
          std::vector<Tensor> t = c.make();
          const TensorOptions opts(t[i].dtype());
          t[i] = std::string(form) == "0-dim" ? zeros({}, opts) : zeros({0}, opts);
          return show_shape(c.run(t));
        });
        INFO(c.name << " with operand " << i << " " << form << ": " << o.describe());
        CHECK((o.kind == isolated::Outcome::Returned || o.kind == isolated::Outcome::MuError));
      }
  }
}

TEST_CASE("layers refuse undefined input and take or refuse 0-dim and empty input") {
  manual_seed(1);
  const std::vector<std::pair<std::string, std::function<std::shared_ptr<nn::UnaryModule>()>>> layers = {
      {"Linear", [] { return std::make_shared<nn::Linear>(nn::LinearOptions(3, 2)); }},
      {"Embedding", [] { return std::make_shared<nn::Embedding>(nn::EmbeddingOptions(5, 3)); }},
      {"LayerNorm", [] { return std::make_shared<nn::LayerNorm>(nn::LayerNormOptions({3})); }},
      {"BatchNorm1d", [] { return std::make_shared<nn::BatchNorm1d>(3); }},
      {"ReLU", [] { return std::make_shared<nn::ReLU>(); }},
      {"GELU", [] { return std::make_shared<nn::GELU>(); }},
      {"Dropout", [] { return std::make_shared<nn::Dropout>(0.5); }},
      {"CPMuMoE", [] { return std::make_shared<nn::MuMoE>(nn::MuMoEOptions(3, 2).experts({4}).rank(2)); }},
      {"TRMuMoE", [] {
         return std::make_shared<nn::MuMoE>(nn::MuMoEOptions(3, 2).experts({4, 2}).rank(2).kind(nn::MoEKind::TR));
       }},
  };
  for (const auto& [name, make] : layers) {
    isolated::Outcome u = isolated::run([&] { return show_shape((*make())(Tensor())); });
    INFO(name << "(undefined): " << u.describe());
    CHECK(u.kind == isolated::Outcome::MuError);
    for (const Shape& s : {Shape{}, Shape{0}, Shape{0, 3}, Shape{2, 0}}) {
      isolated::Outcome o = isolated::run([&] {
        Tensor x = name == "Embedding" ? zeros(s, kInt64) : zeros(s);
        return show_shape((*make())(x));
      });
      INFO(name << "(zeros " << shape_str(s) << "): " << o.describe());
      CHECK((o.kind == isolated::Outcome::Returned || o.kind == isolated::Outcome::MuError));
    }
  }
}

TEST_CASE("options: every hyper-parameter refuses NaN and out-of-range values with a named error") {
  struct Case {
    std::string name;
    std::function<void()> call;
    std::string error;
  };
  auto x = [] { return rand({4, 3}); };
  const std::vector<Case> cases = {
      {"LayerNorm eps NaN", [] { nn::LayerNorm m(nn::LayerNormOptions({3}).eps(kNaN)); }, "LayerNorm: eps"},
      {"LayerNorm eps inf", [] { nn::LayerNorm m(nn::LayerNormOptions({3}).eps(kInf)); }, "LayerNorm: eps"},
      {"layer_norm eps NaN", [&] { layer_norm(x(), {3}, Tensor(), Tensor(), kNaN); }, "layer_norm: eps"},
      {"layer_norm eps -1", [&] { layer_norm(x(), {3}, Tensor(), Tensor(), -1); }, "layer_norm: eps"},
      {"BatchNorm eps NaN", [] { nn::BatchNorm1d m(nn::BatchNormOptions(3).eps(kNaN)); }, "BatchNorm1d: eps"},
      {"BatchNorm momentum NaN", [] { nn::BatchNorm1d m(nn::BatchNormOptions(3).momentum(kNaN)); },
       "BatchNorm1d: momentum"},
      {"batch_norm momentum 2", [&] { batch_norm(x(), zeros({3}), ones({3}), Tensor(), Tensor(), true, 2.0); },
       "batch_norm: momentum"},
      {"batch_norm eps NaN", [&] { batch_norm(x(), zeros({3}), ones({3}), Tensor(), Tensor(), true, 0.1, kNaN); },
       "batch_norm: eps"},
      {"batch_norm layout 9", [&] {
         batch_norm(x(), Tensor(), Tensor(), Tensor(), Tensor(), true, 0.1, 1e-5, static_cast<ChannelLayout>(9));
       }, "batch_norm: layout 9 is not a ChannelLayout"},
      {"Dropout p NaN", [] { nn::Dropout m(kNaN); }, "Dropout: probability"},
      {"dropout p 1.5", [&] { dropout(x(), 1.5); }, "dropout: probability"},
      {"attention dropout NaN", [] {
         Tensor q = rand({1, 1, 2, 4});
         scaled_dot_product_attention(q, q, q, false, kNaN);
       }, "dropout_p"},
      {"attention scale NaN", [] {
         Tensor q = rand({1, 1, 2, 4});
         scaled_dot_product_attention(q, q, q, false, 0.0, true, kNaN);
       }, "scale"},
      {"GELU approximate", [] { nn::GELU m(nn::GELUOptions().approximate("fast")); }, "fast"},
      {"entmax alpha NaN", [&] { nn::entmax_bisect(x(), kNaN); }, "alpha"},
      {"entmax alpha 1", [&] { nn::entmax_bisect(x(), 1.0); }, "alpha"},
      {"cross_entropy smoothing NaN", [&] {
         cross_entropy(x(), ids({0, 1, 2, 0}, {4}), CrossEntropyOptions().label_smoothing(kNaN));
       }, "label_smoothing"},
      {"cross_entropy reduction 5", [&] {
         cross_entropy(x(), ids({0, 1, 2, 0}, {4}), static_cast<Reduction>(5));
       }, "reduction 5 is not a Reduction"},
      {"mse_loss reduction -1", [&] { mse_loss(x(), x(), static_cast<Reduction>(-1)); },
       "reduction -1 is not a Reduction"},
      {"nll_loss reduction 3", [&] { nll_loss(x(), ids({0, 1, 2, 0}, {4}), Tensor(), static_cast<Reduction>(3)); },
       "reduction 3 is not a Reduction"},
      {"bce reduction 4", [&] {
         binary_cross_entropy_with_logits(x(), x(), Tensor(), Tensor(), static_cast<Reduction>(4));
       }, "reduction 4 is not a Reduction"},
      {"init uniform_ infinite", [] { nn::init::uniform_(zeros({3}), -kInf, kInf); }, "uniform_"},
      {"init uniform_ NaN", [] { nn::init::uniform_(zeros({3}), kNaN, 1); }, "uniform_"},
      {"init normal_ mean NaN", [] { nn::init::normal_(zeros({3}), kNaN, 1); }, "normal_: mean"},
      {"init normal_ std inf", [] { nn::init::normal_(zeros({3}), 0, kInf); }, "normal_: std"},
      {"init trunc_normal_ NaN bound", [] { nn::init::trunc_normal_(zeros({3}), 0, 1, kNaN, 2); }, "trunc_normal_"},
      {"init kaiming mode 7", [] {
         nn::init::kaiming_uniform_(zeros({3, 3}), 0, static_cast<nn::init::FanMode>(7));
       }, "mode 7 is not a FanMode"},
      {"init gain nonlinearity 11", [] { nn::init::calculate_gain(static_cast<nn::init::Nonlinearity>(11)); },
       "nonlinearity 11 is not a Nonlinearity"},
      {"init gain NaN param", [] { nn::init::calculate_gain(nn::init::Nonlinearity::LeakyReLU, kNaN); },
       "calculate_gain"},
      {"init xavier gain NaN", [] { nn::init::xavier_uniform_(zeros({3, 3}), kNaN); }, "xavier_uniform_: gain"},
      {"clip max_norm NaN", [] {
         Tensor p = ones({2}).requires_grad_();
         (p * p).sum().backward();
         optim::clip_grad_norm({p}, kNaN);
       }, "max_norm"},
      {"clip norm_type NaN", [] {
         Tensor p = ones({2}).requires_grad_();
         (p * p).sum().backward();
         optim::clip_grad_norm({p}, 1.0, kNaN);
       }, "norm_type"},
      {"step_lr gamma NaN", [] { optim::step_lr(0.1, 10, kNaN); }, "gamma"},
      {"constant_lr inf", [] { optim::constant_lr(kInf); }, "learning rate"},
      {"warmup_cosine min_lr NaN", [] { optim::warmup_cosine_lr(0.1, kNaN, 10, 100); }, "min_lr"},
      {"dtype 99", [] { zeros({2}, static_cast<DType>(99)); }, "dtype 99"},
      {"MuMoE gate_momentum NaN", [] {
         nn::MuMoE::count_parameters(nn::MuMoEOptions(8, 4).experts({4}).rank(2).gate_momentum(kNaN));
       }, "gate_momentum"},
      {"MuMoE activation 9", [] {
         nn::MuMoE::count_parameters(nn::MuMoEOptions(8, 4).experts({4}).rank(2).activation(static_cast<nn::GateActivation>(9)));
       }, "activation 9 is not a GateActivation"},
      {"MuMoE hidden -3", [] {
         nn::MuMoE::count_parameters(nn::MuMoEOptions(8, 4).experts({4}).rank(2).hidden(-3));
       }, "hidden"},
  };
  for (const Case& c : cases) {
    isolated::Outcome o = isolated::run([&] {
      c.call();
      return std::string("accepted");
    });
    INFO(c.name << ": " << o.describe() << "; expected an error containing \"" << c.error << "\"");
    CHECK(o.kind == isolated::Outcome::MuError);
    CHECK(o.text.find(c.error) != std::string::npos);
  }
}

TEST_CASE("analysis calls check their arguments before the block reads its input") {
  // The input is undefined: an error naming the bad argument shows it was checked first.
  auto block = [] { return nn::MuMoE(nn::MuMoEOptions(4, 3).experts({5, 2}).rank(2)); };
  struct Case {
    std::string name;
    std::function<void(nn::MuMoE&)> call;
    std::string error;
  };
  std::vector<Case> cases = {
      {"level 2", [](nn::MuMoE& b) { nn::forward_without_expert(b, Tensor(), 2, 0); },
       "forward_without_expert: level 2 out of range (the block has 2 levels)"},
      {"level -1", [](nn::MuMoE& b) { nn::forward_without_expert(b, Tensor(), -1, 0); }, "level -1 out of range"},
      {"expert 5", [](nn::MuMoE& b) { nn::forward_without_expert(b, Tensor(), 0, 5); },
       "expert 5 out of range at level 0 (5 experts)"},
      {"combination of 1", [](nn::MuMoE& b) { nn::forward_without_combination(b, Tensor(), {1}); },
       "the combination [1] names 1 experts but the block has 2 levels"},
      {"combination out of range", [](nn::MuMoE& b) { nn::forward_without_combination(b, Tensor(), {1, 2}); },
       "the combination [1, 2] is out of range at level 1"},
      {"head 3", [](nn::MuMoE& b) { nn::forward_with_rewrite(b, Tensor(), zeros({5, 2}), {3}); },
       "output head 3 out of range (3 outputs)"},
      {"mean shape", [](nn::MuMoE& b) { nn::forward_with_rewrite(b, Tensor(), zeros({5}), {0}); },
       "mean coefficients have shape [5]; the block's experts are [5, 2]"},
      {"lambda NaN", [](nn::MuMoE& b) { nn::forward_with_rewrite(b, Tensor(), zeros({5, 2}), {0}, kNaN); },
       "lambda must be a finite number"},
      {"rewrite_term lambda inf", [](nn::MuMoE&) { nn::rewrite_term({ones({2, 5})}, ones({5}), kInf); },
       "rewrite_term: lambda must be a finite number"},
  };
  // Sizes refused by counting, before any allocation (an allocation attempt of that size
  // would abort under the address sanitizer instead of throwing).
  cases.push_back({"collector of 2^62 experts", [](nn::MuMoE&) { nn::CoefficientCollector c({int64_t(1) << 62}, 4, 10); },
                   "CoefficientCollector: bytes of the tables"});
  cases.push_back({"collector of 2^50 classes", [](nn::MuMoE&) { nn::CoefficientCollector c({4}, 4, int64_t(1) << 50); },
                   "classes need 54043195528446048 bytes, more than any machine can address"});
  for (const Case& c : cases) {
    isolated::Outcome o = isolated::run([&] {
      nn::MuMoE b = block();
      c.call(b);
      return std::string("accepted");
    });
    INFO(c.name << ": " << o.describe() << "; expected an error containing \"" << c.error << "\"");
    CHECK(o.kind == isolated::Outcome::MuError);
    CHECK(o.text.find(c.error) != std::string::npos);
  }
}
