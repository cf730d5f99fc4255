// Degenerate inputs behave as PyTorch's do: a scalar-only einsum, empty tensors through
// reductions, products and elementwise ops, a batch whose every target is ignored. The
// same inputs go through both sides; values, shapes and the gradient of sum(result)
// with respect to the first input must agree (NaN where torch gives NaN).
#include <sstream>

#include "parity_io.h"

using namespace mu;
using autograd::TensorList;
using namespace parity;
namespace fs = std::filesystem;

namespace {

// The Python side's lin(): 0.25 steps from `start`, row-major.
Tensor lin(const Shape& shape, double start = 1.0) {
  return (arange(0, double(numel_of(shape)), 1, kFloat32) * 0.25 + start).reshape(shape);
}

struct Case {
  std::string name;
  TensorList inputs;
  std::function<Tensor(const TensorList&)> fn;
};

std::vector<Case> cases() {
  Tensor ignored = tensor({-100, -100, -100}), none = zeros({0}, kInt64);
  auto ce = [](const Tensor& t, Reduction r) {
    return [t, r](const TensorList& in) { return cross_entropy(in[0], t, r); };
  };
  return {
      {"einsum_scalars", {lin({}), lin({}, 2.0)}, [](const TensorList& in) { return einsum(",->", in); }},
      {"einsum_scalar_only", {lin({})}, [](const TensorList& in) { return einsum("->", in); }},
      {"einsum_implicit_scalars", {lin({}), lin({}, 2.0)}, [](const TensorList& in) { return einsum(",", in); }},
      {"einsum_vector_scalar", {lin({3}), lin({}, 2.0)}, [](const TensorList& in) { return einsum("i,->i", in); }},
      {"einsum_empty", {lin({0, 3}), lin({3, 2})}, [](const TensorList& in) { return einsum("ij,jk->ik", in); }},
      {"sum_empty", {lin({0, 3})}, [](const TensorList& in) { return in[0].sum(); }},
      {"mean_empty", {lin({0, 3})}, [](const TensorList& in) { return in[0].mean(); }},
      {"sum_dim0_empty", {lin({0, 3})}, [](const TensorList& in) { return in[0].sum({0}); }},
      {"softmax_empty", {lin({0, 3})}, [](const TensorList& in) { return softmax(in[0], 1); }},
      {"matmul_empty", {lin({0, 3}), lin({3, 2})}, [](const TensorList& in) { return in[0].matmul(in[1]); }},
      {"matmul_k0", {lin({2, 0}), lin({0, 2})}, [](const TensorList& in) { return in[0].matmul(in[1]); }},
      {"exp_empty", {lin({0, 3})}, [](const TensorList& in) { return exp(in[0]); }},
      {"cumsum_empty", {lin({0, 3})}, [](const TensorList& in) { return cumsum(in[0], 0); }},
      {"ce_all_ignored_mean", {lin({3, 4})}, ce(ignored, Reduction::Mean)},
      {"ce_all_ignored_sum", {lin({3, 4})}, ce(ignored, Reduction::Sum)},
      {"ce_all_ignored_none", {lin({3, 4})}, ce(ignored, Reduction::None)},
      {"ce_empty_mean", {lin({0, 4})}, ce(none, Reduction::Mean)},
      {"ce_empty_sum", {lin({0, 4})}, ce(none, Reduction::Sum)},
  };
}

std::string shape_text(const Tensor& t) { return shape_arg(t); }

// "a b c" -> values; NaN is written by Python as 'nan'.
std::vector<double> parse_values(const std::string& s) {
  std::istringstream is(s);
  std::vector<double> v;
  std::string tok;
  while (is >> tok) v.push_back(tok == "nan" ? NAN : std::stod(tok));
  return v;
}

std::vector<std::string> split_bars(const std::string& line) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    size_t bar = line.find(" | ", start);
    std::string part = line.substr(start, bar == std::string::npos ? std::string::npos : bar - start);
    parts.push_back(part);
    if (bar == std::string::npos) break;
    start = bar + 3;
  }
  return parts;
}

}  // namespace

TEST_CASE("degenerate inputs give PyTorch's values, shapes and gradients") {
  fs::path dir = make_temp_dir("degenerate");
  run_torch_script("torch_degenerate.py", dir);
  std::ifstream f(dir / "torch.txt");
  std::map<std::string, std::vector<std::string>> want;
  for (std::string line; std::getline(f, line);) {
    auto parts = split_bars(line);
    want[parts[0]] = parts;
  }
  for (const Case& c : cases()) {
    CAPTURE(c.name);
    REQUIRE(want.count(c.name) == 1);
    const auto& w = want[c.name];
    TensorList leaves;
    for (const Tensor& t : c.inputs) leaves.push_back(t.detach().requires_grad_());
    Tensor y = c.fn(leaves);
    CHECK(shape_text(y) == w[1]);
    check_elements_close(y, parse_values(w[2]), 1e-6, /*nan_matches=*/true);
    y.sum().backward();
    Tensor g = leaves[0].grad();
    if (w[3] == "-") {
      CHECK_FALSE(g.defined());
    } else {
      REQUIRE(g.defined());
      CHECK(shape_text(g) == w[3]);
      check_elements_close(g, parse_values(w.size() > 4 ? w[4] : ""), 1e-6, /*nan_matches=*/true);
    }
  }
}
