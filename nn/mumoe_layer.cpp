#include "nn/mumoe_layer.h"

#include <cmath>
#include <numeric>

#include "autograd/grad_mode.h"
#include "ops/ops.h"
#include "tensor/checked.h"

namespace mu::nn {

int64_t MoEShape::total_experts() const {
  int64_t n = 1;
  for (int64_t e : experts) n = checked_mul(n, e, "MoEShape: the number of experts ", ShapeText{experts});
  return n;
}

namespace {

// A parameter or FLOP count: a sum of products of sizes, each step checked, so a huge
// configuration is an error naming the layer, never a wrapped (or negative) count.
struct Count {
  const char* what;
  int64_t n = 0;
  Count& add(std::initializer_list<int64_t> factors) {
    int64_t p = 1;
    for (int64_t f : factors) p = checked_mul(p, f, what, ": the count overflows");
    n = checked_add(n, p, what, ": the count overflows");
    return *this;
  }
};

void check_ranks(const std::vector<int64_t>& r, size_t want, const char* what, const char* layout) {
  MU_CHECK(r.size() == want, what, ": needs ", want, " ranks (", layout, "), got ", r.size(), ": ", shape_str(r));
  for (int64_t k : r) MU_CHECK(k > 0, what, ": ranks must be positive, got ", shape_str(r));
}

}  // namespace

static void check_shape(const MoEShape& s, const char* type) {
  MU_CHECK(s.in > 0 && s.out > 0, type, ": input and output features must be positive, got in=", s.in,
           ", out=", s.out);
  MU_CHECK(!s.experts.empty(), type, ": needs at least one level of experts");
  for (size_t e = 0; e < s.experts.size(); ++e)
    MU_CHECK(s.experts[e] > 0, type, ": level ", e, " has ", s.experts[e], " experts; each level needs at least one");
}

// U(-sqrt(k), sqrt(k)) with k = 1/fan_in, PyTorch's linear-layer initialisation.
// Drawn from `gen` (the global generator when null), as every initialisation here.
static Tensor uniform_init(const Shape& shape, int64_t fan_in, Generator* gen) {
  double b = 1.0 / std::sqrt(double(fan_in));
  return rand(shape, {}, gen) * (2 * b) - b;
}

// Entries N(1, sigma^2): replicates one weight matrix along an expert mode, plus noise.
static Tensor replicate_init(const Shape& shape, double sigma, Generator* gen) {
  return randn(shape, {}, gen) * sigma + 1.0;
}

// The paper's noise on expert modes: sigma = 1 on the first level, 0 on further ones.
static double expert_sigma(int64_t level) { return level == 0 ? 1.0 : 0.0; }

// ---------------------------------------------------------------- the shared skeleton

int64_t MuMoELayer::flops(int64_t tokens) const {
  MU_CHECK(tokens >= 0, type_name(), ".flops: negative token count ", tokens);
  return checked_mul(tokens, flops_per_token(), type_name(), ".flops: ", tokens, " tokens");
}

MuMoELayer::MuMoELayer(std::string type, MoEShape shape) : Module(std::move(type)), shape_(std::move(shape)) {
  check_shape(shape_, type_name().c_str());
}

void MuMoELayer::add_factor(const std::string& name, Tensor value, std::vector<std::string> axes) {
  MU_CHECK(int64_t(axes.size()) == value.dim(), type_name(), ": factor ", name, " has ", value.dim(), " modes but ",
           axes.size(), " axis names");
  Tensor p = register_parameter(name, value);
  factors_.push_back({name, p, std::move(axes)});
}

// "n1 r" for a factor's axes.
static std::string term(const std::vector<std::string>& axes) {
  std::string t;
  for (const auto& a : axes) t += (t.empty() ? "" : " ") + a;
  return t;
}

std::pair<Tensor, std::vector<Tensor>> MuMoELayer::flatten_inputs(const Tensor& z, const std::vector<Tensor>& a,
                                                                   const char* op, bool append_one) const {
  const MoEShape& s = shape_;
  MU_CHECK(z.dim() >= 1 && z.size(-1) == s.in, type_name(), ".", op, ": input has shape ", shape_str(z.shape()),
           "; expected (..., ", s.in, ")");
  MU_CHECK(int64_t(a.size()) == s.levels(), type_name(), ".", op, ": got ", a.size(), " coefficient tensors for ",
           s.levels(), " expert level", s.levels() == 1 ? "" : "s");
  Shape lead(z.shape().begin(), z.shape().end() - 1);
  int64_t B = numel_of(lead);
  std::vector<Tensor> flat;
  for (size_t e = 0; e < a.size(); ++e) {
    Shape want = lead;
    want.push_back(s.experts[e]);
    MU_CHECK(a[e].shape() == want, type_name(), ".", op, ": coefficients of level ", e, " have shape ",
             shape_str(a[e].shape()), "; expected ", shape_str(want), " (the input's leading dims, then N_", e + 1,
             " = ", s.experts[e], ")");
    flat.push_back(a[e].reshape({B, s.experts[e]}));
  }
  Tensor zf = z.reshape({B, s.in});
  return {append_one ? with_one(zf) : zf, flat};
}

Tensor MuMoELayer::with_one(const Tensor& z2) const {
  if (!shape_.bias) return z2;
  return cat({z2, ones({z2.size(0), 1}, TensorOptions(z2.dtype()).device(z2.device()))}, 1);
}

Tensor MuMoELayer::restore_leading(const Tensor& y, const Tensor& z) const {
  Shape out(z.shape().begin(), z.shape().end() - 1);
  out.push_back(shape_.out);
  return y.reshape(out);
}

Tensor MuMoELayer::forward(const Tensor& z, const std::vector<Tensor>& a) const {
  std::vector<Tensor> values;
  for (const Factor& f : factors_) values.push_back(f.param);
  return forward_with(z, a, values);
}

Tensor MuMoELayer::forward_with(const Tensor& z, const std::vector<Tensor>& a,
                                const std::vector<Tensor>& factor_values) const {
  MU_CHECK(factor_values.size() == factors_.size(), type_name(), ".forward_with: got ", factor_values.size(),
           " factor values for ", factors_.size(), " factors");
  for (size_t k = 0; k < factors_.size(); ++k)
    MU_CHECK(factor_values[k].shape() == factors_[k].param.shape(), type_name(), ".forward_with: value for factor ",
             factors_[k].name, " has shape ", shape_str(factor_values[k].shape()), "; expected ",
             shape_str(factors_[k].param.shape()));
  auto [z2, af] = flatten_inputs(z, a, "forward", false);
  if (Tensor y = own_forward(z2, af, factor_values); y.defined()) return restore_leading(y, z);
  const Tensor zf = with_one(z2);
  // "b n1, ..., b nE, b i, <factors> -> b o": the planner orders the contraction.
  std::string spec;
  std::vector<Tensor> ops;
  for (int64_t e = 0; e < shape_.levels(); ++e) {
    spec += "b " + expert_axis(e) + ", ";
    ops.push_back(af[size_t(e)]);
  }
  spec += "b i";
  ops.push_back(zf);
  for (size_t k = 0; k < factors_.size(); ++k) {
    spec += ", " + term(factors_[k].axes);
    ops.push_back(factor_values[k]);
  }
  return restore_leading(einsum(spec + " -> b o", ops), z);
}

Tensor MuMoELayer::own_forward(const Tensor&, const std::vector<Tensor>&, const std::vector<Tensor>&) const {
  return Tensor();
}

Tensor MuMoELayer::materialize() const {
  std::string spec, out;
  std::vector<Tensor> ops;
  for (const Factor& f : factors_) {
    spec += (spec.empty() ? "" : ", ") + term(f.axes);
    ops.push_back(f.param);
  }
  for (int64_t e = 0; e < shape_.levels(); ++e) out += expert_axis(e) + " ";
  // A lone factor with all axes already in order (DenseMoE) still goes through einsum,
  // which returns a copy: the materialised tensor never aliases a parameter.
  return einsum(spec + " -> " + out + "i o", ops);
}

Tensor MuMoELayer::expert_weight(const std::vector<int64_t>& index) const {
  MU_CHECK(int64_t(index.size()) == shape_.levels(), type_name(), ".expert_weight: got ", index.size(),
           " indices for ", shape_.levels(), " levels");
  for (size_t e = 0; e < index.size(); ++e)
    MU_CHECK(index[e] >= 0 && index[e] < shape_.experts[e], type_name(), ".expert_weight: expert ", index[e],
             " out of range at level ", e, " (", shape_.experts[e], " experts)");
  // Slice every factor at the chosen experts, then contract what is left to (i, o).
  std::string spec;
  std::vector<Tensor> ops;
  for (const Factor& f : factors_) {
    Tensor t = f.param;
    std::vector<std::string> axes;
    int64_t removed = 0;
    for (size_t d = 0; d < f.axes.size(); ++d) {
      bool sliced = false;
      for (int64_t e = 0; e < shape_.levels(); ++e)
        if (f.axes[d] == expert_axis(e)) {
          t = t.select(int64_t(d) - removed, index[size_t(e)]);
          ++removed;
          sliced = true;
        }
      if (!sliced) axes.push_back(f.axes[d]);
    }
    spec += (spec.empty() ? "" : ", ") + (axes.empty() ? std::string() : term(axes));
    ops.push_back(t);
  }
  return einsum(spec + " -> i o", ops);
}

Tensor MuMoELayer::forward_without_expert(const Tensor& z, const std::vector<Tensor>& a, int64_t level,
                                          int64_t n) const {
  MU_CHECK(level >= 0 && level < shape_.levels(), type_name(), ".forward_without_expert: level ", level,
           " out of range (", shape_.levels(), " levels)");
  MU_CHECK(n >= 0 && n < shape_.experts[size_t(level)], type_name(), ".forward_without_expert: expert ", n,
           " out of range at level ", level, " (", shape_.experts[size_t(level)], " experts)");
  // Zeroing slice n of mode `level` of W removes exactly the terms with coefficient a_level[n].
  std::vector<Tensor> b = a;
  Tensor keep = ones({shape_.experts[size_t(level)]}, a[size_t(level)].dtype());
  keep.set({n}, 0.0);
  // Element writes need a CPU tensor; the mask then moves to the coefficients' device.
  b[size_t(level)] = a[size_t(level)] * keep.to(a[size_t(level)].device());
  return forward(z, b);
}

Tensor MuMoELayer::forward_without_combination(const Tensor& z, const std::vector<Tensor>& a,
                                               const std::vector<int64_t>& index) const {
  Tensor w = expert_weight(index);  // (I+1, O)
  auto [zf, af] = flatten_inputs(z, a, "forward_without_combination");
  // The removed expert's contribution: (Π_e a_e[n_e]) · W_nᵀ [z; 1], per row.
  Tensor coef = af[0].narrow(1, index[0], 1);
  for (size_t e = 1; e < af.size(); ++e) coef = coef * af[e].narrow(1, index[e], 1);
  Tensor contribution = zf.matmul(w) * coef;
  return forward(z, a) - restore_leading(contribution, z);
}

std::string MuMoELayer::extra_repr() const {
  std::string ex;
  for (int64_t n : shape_.experts) ex += (ex.empty() ? "" : "x") + std::to_string(n);
  return detail::str("in=", shape_.in, ", out=", shape_.out, ", experts=", ex, ", bias=", shape_.bias ? "true" : "false");
}

// ---------------------------------------------------------------- CP

CPMuMoE::CPMuMoE(MoEShape s, int64_t rank, Generator* gen) : MuMoELayer("CPMuMoE", std::move(s)), rank_(rank) {
  MU_CHECK(rank > 0, "CPMuMoE: rank must be positive, got ", rank);
  for (int64_t e = 0; e < shape_.levels(); ++e)
    add_factor("U" + std::to_string(e + 1), replicate_init({shape_.experts[size_t(e)], rank}, expert_sigma(e), gen),
               {expert_axis(e), "r"});
  add_factor("U_in", uniform_init({shape_.in_rows(), rank}, shape_.in, gen), {"i", "r"});
  add_factor("U_out", uniform_init({shape_.out, rank}, rank, gen), {"o", "r"});
}

// Factors in add_factor order: U_1..U_E, U_in, U_out.
Tensor CPMuMoE::own_forward(const Tensor& z2, const std::vector<Tensor>& af,
                            const std::vector<Tensor>& factor_values) const {
  const size_t E = af.size();
  const Tensor& u_in = factor_values[E];
  std::vector<Tensor> u(factor_values.begin(), factor_values.begin() + std::ptrdiff_t(E));
  Tensor h;
  if (fused_) {
    h = cp_hadamard(with_one(z2), u_in, af, u);  // (B, R), the products never stored
  } else {
    // [z, 1] U_in with the 1 implied: the product plus the bias row.
    h = shape_.bias ? matmul_with_one(z2, u_in) : z2.matmul(u_in);
    for (size_t e = 0; e < E; ++e) h = h * af[e].matmul(u[e]);
  }
  return h.matmul(factor_values[E + 1].t());  // (B, R) · (R, O)
}

int64_t CPMuMoE::count_parameters(const MoEShape& s, int64_t rank) {
  const char* what = "CPMuMoE::count_parameters";
  check_shape(s, what);
  MU_CHECK(rank > 0, what, ": rank must be positive, got ", rank);
  Count c{what};
  c.add({rank, s.in_rows()}).add({rank, s.out});
  for (int64_t e : s.experts) c.add({rank, e});
  return c.n;
}

// R (Σ N_e + I + O): the factor products; the Hadamard products add E·R more.
int64_t CPMuMoE::flops_per_token() const {
  Count c{"CPMuMoE::flops_per_token"};
  c.add({rank_, shape_.in_rows()}).add({rank_, shape_.out}).add({shape_.levels(), rank_});
  for (int64_t e : shape_.experts) c.add({rank_, e});
  return c.n;
}

// ---------------------------------------------------------------- TR / TT

static std::string rank_axis(size_t k) { return "r" + std::to_string(k + 1); }

TRMuMoE::TRMuMoE(MoEShape s, std::vector<int64_t> ranks, Generator* gen)
    : TRMuMoE("TRMuMoE", std::move(s), std::move(ranks), gen) {}

TRMuMoE::TRMuMoE(std::string type, MoEShape s, std::vector<int64_t> ranks, Generator* gen)
    : MuMoELayer(std::move(type), std::move(s)), ranks_(std::move(ranks)) {
  const int64_t E = shape_.levels();
  MU_CHECK(int64_t(ranks_.size()) == E + 2, type_name().c_str(), ": needs E + 2 = ", E + 2, " ranks (R_1..R_", E + 2,
           ") for ", E, " expert level", E == 1 ? "" : "s", ", got ", ranks_.size());
  for (int64_t r : ranks_) MU_CHECK(r > 0, type_name().c_str(), ": ranks must be positive, got ", shape_str(ranks_));
  const size_t K = ranks_.size();
  for (int64_t e = 0; e < E; ++e) {
    int64_t r0 = ranks_[size_t(e)], r1 = ranks_[size_t(e) + 1], n = shape_.experts[size_t(e)];
    // Each slice U_e[:, n, :] is diagonal with entries N(1, sigma^2): the same matrix for
    // every expert, plus noise on the first level.
    Tensor core = zeros({r0, n, r1});
    Tensor diag = replicate_init({n, std::min(r0, r1)}, expert_sigma(e), gen);
    for (int64_t k = 0; k < std::min(r0, r1); ++k) core.select(0, k).select(1, k).copy_(diag.select(1, k));
    add_factor("U" + std::to_string(e + 1), core, {rank_axis(size_t(e)), expert_axis(e), rank_axis(size_t(e) + 1)});
  }
  int64_t ri = ranks_[K - 2], ro = ranks_[K - 1];
  add_factor("U_in", uniform_init({ri, shape_.in_rows(), ro}, shape_.in, gen), {rank_axis(K - 2), "i", rank_axis(K - 1)});
  add_factor("U_out", uniform_init({ro, shape_.out, ranks_[0]}, ro * ranks_[0], gen), {rank_axis(K - 1), "o", rank_axis(0)});
}

int64_t TRMuMoE::count_parameters(const MoEShape& s, const std::vector<int64_t>& r) {
  const char* what = "TRMuMoE::count_parameters";
  check_shape(s, what);
  check_ranks(r, s.experts.size() + 2, what, "one per expert mode, then the input's and the output's");
  Count c{what};
  for (size_t e = 0; e < s.experts.size(); ++e) c.add({r[e], s.experts[e], r[e + 1]});
  size_t K = r.size();
  return c.add({r[K - 2], s.in_rows(), r[K - 1]}).add({r[K - 1], s.out, r[0]}).n;
}

// Σ_e R_e N_e R_{e+1} + R_{E+1} I R_{E+2} (mode-2 products), Σ R_1 R_e R_{e+1} (the chain
// of small matrix products), R_1 O R_{E+2} (the output core): the paper's count for E = 1.
int64_t TRMuMoE::flops_per_token() const {
  const auto& r = ranks_;
  size_t K = r.size();
  Count c{"TRMuMoE::flops_per_token"};
  for (size_t e = 0; e < shape_.experts.size(); ++e) c.add({r[e], shape_.experts[e], r[e + 1]});
  c.add({r[K - 2], shape_.in_rows(), r[K - 1]});
  for (size_t e = 1; e + 1 < K; ++e) c.add({r[0], r[e], r[e + 1]});
  return c.add({r[0], shape_.out, r[K - 1]}).n;
}

// Factors in add_factor order: U_1..U_E, U_in, U_out. Each core is permuted once into
// the matrix its product needs (a copy of the small core, not of the activations).
Tensor TRMuMoE::own_forward(const Tensor& z2, const std::vector<Tensor>& af,
                            const std::vector<Tensor>& factor_values) const {
  const size_t E = af.size(), K = ranks_.size();
  const int64_t B = z2.size(0), r1 = ranks_[0], ri = ranks_[K - 2], ro = ranks_[K - 1];
  // U_in (R_{E+1}, I(+1), R_{E+2}) as the matrix (I(+1), R_{E+1} R_{E+2}).
  Tensor w_in = factor_values[E].permute({1, 0, 2}).contiguous().reshape({shape_.in_rows(), ri * ro});
  Tensor h = shape_.bias ? matmul_with_one(z2, w_in) : z2.matmul(w_in);
  Tensor q;  // c_1 ... c_e so far: (B, R_1, R_{e+1})
  for (size_t e = 0; e < E; ++e) {
    const Tensor& u = factor_values[e];  // (R_e, N_e, R_{e+1})
    Tensor c = af[e].matmul(u.permute({1, 0, 2}).contiguous().reshape({u.size(1), u.size(0) * u.size(2)}));
    c = c.reshape({B, u.size(0), u.size(2)});
    q = e == 0 ? c : q.matmul(c);
  }
  if (fused_) {
    // U_out (R_{E+2}, O, R_1) as the matrix (R_{E+2} R_1, O), rows in ring_gemm's s-major order.
    Tensor w_ring = factor_values[E + 1].permute({0, 2, 1}).contiguous().reshape({ro * r1, shape_.out});
    return ring_gemm(q, h.reshape({B, ri, ro}), w_ring);
  }
  q = q.matmul(h.reshape({B, ri, ro}));  // (B, R_1, R_{E+2})
  // U_out (R_{E+2}, O, R_1) as the matrix (R_1 R_{E+2}, O), rows in q's order.
  Tensor w_out = factor_values[E + 1].permute({2, 0, 1}).contiguous().reshape({r1 * ro, shape_.out});
  return q.reshape({B, r1 * ro}).matmul(w_out);
}

static std::vector<int64_t> with_unit_first(std::vector<int64_t> r) {
  r.insert(r.begin(), 1);
  return r;
}

TTMuMoE::TTMuMoE(MoEShape s, std::vector<int64_t> ranks, Generator* gen)
    : TRMuMoE("TTMuMoE", std::move(s), with_unit_first(std::move(ranks)), gen) {}

// ---------------------------------------------------------------- Tucker

TuckerMuMoE::TuckerMuMoE(MoEShape s, std::vector<int64_t> ranks, Generator* gen) : MuMoELayer("TuckerMuMoE", std::move(s)), ranks_(std::move(ranks)) {
  const int64_t E = shape_.levels();
  MU_CHECK(int64_t(ranks_.size()) == E + 2, "TuckerMuMoE: needs E + 2 = ", E + 2,
           " ranks (one per expert mode, then R_I, R_O), got ", ranks_.size());
  for (int64_t r : ranks_) MU_CHECK(r > 0, "TuckerMuMoE: ranks must be positive, got ", shape_str(ranks_));
  int64_t ri = ranks_[size_t(E)], ro = ranks_[size_t(E) + 1];
  Shape core_shape = {ro, ri};
  std::vector<std::string> core_axes = {"ro", "ri"};
  for (int64_t e = 0; e < E; ++e) {
    core_shape.push_back(ranks_[size_t(e)]);
    core_axes.push_back("rn" + std::to_string(e + 1));
  }
  // The core mixes R_I inputs per output rank: initialised like a linear map from R_I.
  add_factor("core", uniform_init(core_shape, ri, gen), core_axes);
  for (int64_t e = 0; e < E; ++e)
    add_factor("U" + std::to_string(e + 1), replicate_init({shape_.experts[size_t(e)], ranks_[size_t(e)]}, expert_sigma(e), gen),
               {expert_axis(e), "rn" + std::to_string(e + 1)});
  add_factor("U_in", uniform_init({shape_.in_rows(), ri}, shape_.in, gen), {"i", "ri"});
  add_factor("U_out", uniform_init({shape_.out, ro}, ro, gen), {"o", "ro"});
}

int64_t TuckerMuMoE::count_parameters(const MoEShape& s, const std::vector<int64_t>& r) {
  const char* what = "TuckerMuMoE::count_parameters";
  check_shape(s, what);
  size_t E = s.experts.size();
  check_ranks(r, E + 2, what, "one per expert mode, then R_I, R_O");
  Count c{what}, core{what};
  core.add({r[E], r[E + 1]});
  for (size_t e = 0; e < E; ++e) core.n = checked_mul(core.n, r[e], what, ": the core's size overflows"), c.add({s.experts[e], r[e]});
  return c.add({core.n}).add({s.in_rows(), r[E]}).add({s.out, r[E + 1]}).n;
}

// Projections Σ N_e R_{N_e} + I R_I; the core contracted with the projected input,
// R_O R_I Π R_{N_e}, then with each projected coefficient vector in turn, R_O Π_{k>=e} R_{N_k}
// (R_O R_N for one level: the preliminary paper's R_I I + R_O R_I R_N + R_N N + R_O R_N + R_O O);
// the output O R_O.
int64_t TuckerMuMoE::flops_per_token() const {
  size_t E = shape_.experts.size();
  const char* what = "TuckerMuMoE::flops_per_token";
  Count c{what};
  int64_t core = checked_mul(ranks_[E], ranks_[E + 1], what);
  for (size_t e = 0; e < E; ++e) core = checked_mul(core, ranks_[e], what), c.add({shape_.experts[e], ranks_[e]});
  c.add({shape_.in_rows(), ranks_[E]}).add({core});
  int64_t left = ranks_[E + 1];  // R_O Π_{k>=e} R_{N_k}, built from the last level back
  std::vector<int64_t> chain(E);
  for (size_t e = E; e-- > 0;) chain[e] = left = checked_mul(left, ranks_[e], what);
  for (int64_t n : chain) c.add({n});
  return c.add({shape_.out, ranks_[E + 1]}).n;
}

// ---------------------------------------------------------------- Hadamard

HadamardMoE::HadamardMoE(MoEShape s, Generator* gen) : MuMoELayer("HadamardMoE", std::move(s)) {
  for (int64_t e = 0; e < shape_.levels(); ++e)
    add_factor("C" + std::to_string(e + 1), replicate_init({shape_.experts[size_t(e)], shape_.out}, expert_sigma(e), gen),
               {expert_axis(e), "o"});
  add_factor("D", uniform_init({shape_.in_rows(), shape_.out}, shape_.in, gen), {"i", "o"});
}

int64_t HadamardMoE::count_parameters(const MoEShape& s) {
  const char* what = "HadamardMoE::count_parameters";
  check_shape(s, what);
  Count c{what};
  c.add({s.in_rows(), s.out});
  for (int64_t e : s.experts) c.add({e, s.out});
  return c.n;
}

int64_t HadamardMoE::flops_per_token() const {
  Count c{"HadamardMoE::flops_per_token"};
  c.add({shape_.in_rows(), shape_.out}).add({shape_.levels(), shape_.out});
  for (int64_t e : shape_.experts) c.add({e, shape_.out});
  return c.n;
}

// ---------------------------------------------------------------- dense

static std::vector<std::string> dense_axes(const MoEShape& s) {
  std::vector<std::string> axes;
  for (size_t e = 0; e < s.experts.size(); ++e) axes.push_back("n" + std::to_string(e + 1));
  axes.push_back("i");
  axes.push_back("o");
  return axes;
}

static Shape dense_shape(const MoEShape& s) {
  Shape sh(s.experts.begin(), s.experts.end());
  sh.push_back(s.in_rows());
  sh.push_back(s.out);
  return sh;
}

DenseMoE::DenseMoE(MoEShape s, Generator* gen) : MuMoELayer("DenseMoE", std::move(s)) {
  // Every expert initialised independently, like its own linear layer.
  add_factor("W", uniform_init(dense_shape(shape_), shape_.in, gen), dense_axes(shape_));
}

DenseMoE::DenseMoE(MoEShape s, const Tensor& weight) : MuMoELayer("DenseMoE", std::move(s)) {
  MU_CHECK(weight.shape() == dense_shape(shape_), "DenseMoE: weight has shape ", shape_str(weight.shape()),
           "; expected ", shape_str(dense_shape(shape_)));
  add_factor("W", weight.detach().clone(), dense_axes(shape_));
}

// With no more inputs than experts, the coefficients go first, level by level: each step
// multiplies (B, N_e) by the tensor so far seen as (N_e, rest) per batch entry, W in its
// own layout, so W is never copied, and the intermediate (B, I+1, O) is no larger than W;
// then [z, 1] (B, 1, I+1) times it. The planner's order for few inputs takes z first and
// copies W into (I+1, N·O) order on every call: for one input of 768 -> 768 with 128
// experts, 104 ms and a 641 MB peak against 22 ms (reading W's 302 MB once) and 323 MB
// on 2 cores. Larger batches keep the planner's order, whose intermediate (B, N, O) is
// the smaller one.
Tensor DenseMoE::own_forward(const Tensor& z2, const std::vector<Tensor>& af,
                             const std::vector<Tensor>& factor_values) const {
  const int64_t B = z2.size(0), rows = shape_.in_rows(), O = shape_.out;
  if (B > shape_.total_experts()) return Tensor();
  int64_t rest = shape_.total_experts() / shape_.experts[0] * rows * O;
  Tensor t = af[0].matmul(factor_values[0].reshape({shape_.experts[0], rest}));  // (B, rest)
  for (size_t e = 1; e < af.size(); ++e) {
    const int64_t n = shape_.experts[e];
    rest /= n;
    t = af[e].unsqueeze(1).matmul(t.reshape({B, n, rest})).reshape({B, rest});  // (B, 1, N_e) · (B, N_e, rest)
  }
  return with_one(z2).unsqueeze(1).matmul(t.reshape({B, rows, O})).reshape({B, O});
}

int64_t DenseMoE::count_parameters(const MoEShape& s) {
  check_shape(s, "DenseMoE::count_parameters");
  return Count{"DenseMoE::count_parameters"}.add({s.total_experts(), s.in_rows(), s.out}).n;
}
int64_t DenseMoE::flops_per_token() const { return count_parameters(shape_); }

}  // namespace mu::nn
