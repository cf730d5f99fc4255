#include "nn/expert_analysis.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <new>
#include <stdexcept>

#include "autograd/grad_mode.h"
#include "ops/ops.h"
#include "tensor/checked.h"

namespace mu::nn {

// ---------------------------------------------------------------- counterfactuals

// The arguments that name experts are checked against the block's options before the
// block reads x: a wrong index is reported as such, not as a failure deep in a forward.
static void check_expert(const MuMoE& block, int64_t level, int64_t n, const char* op) {
  const std::vector<int64_t>& experts = block.options().experts();
  const int64_t levels = int64_t(experts.size());
  MU_CHECK(level >= 0 && level < levels, op, ": level ", level, " out of range (the block has ", levels, " level",
           levels == 1 ? "" : "s", ")");
  MU_CHECK(n >= 0 && n < experts[size_t(level)], op, ": expert ", n, " out of range at level ", level, " (",
           experts[size_t(level)], " experts)");
}

static void check_combination(const MuMoE& block, const std::vector<int64_t>& index, const char* op) {
  const std::vector<int64_t>& experts = block.options().experts();
  MU_CHECK(index.size() == experts.size(), op, ": the combination ", shape_str(index), " names ", index.size(),
           " experts but the block has ", experts.size(), " levels (experts ", shape_str(experts), ")");
  for (size_t e = 0; e < index.size(); ++e)
    MU_CHECK(index[e] >= 0 && index[e] < experts[e], op, ": the combination ", shape_str(index), " is out of range at level ",
             e, " (experts ", shape_str(experts), ")");
}

Tensor forward_without_expert(MuMoE& block, const Tensor& x, int64_t level, int64_t n) {
  check_expert(block, level, n, "forward_without_expert");
  // The gating is left as it is: only the expert's computation is taken away.
  std::vector<Tensor> a = block.coefficients(x);
  Tensor y = block.layer(0)->forward_without_expert(block.layer_input(x), a, level, n);
  if (block.num_layers() > 1) y = block.layer(1)->forward_without_expert(block.hidden_activation(y), a, level, n);
  return y;
}

Tensor forward_without_combination(MuMoE& block, const Tensor& x, const std::vector<int64_t>& index) {
  check_combination(block, index, "forward_without_combination");
  std::vector<Tensor> a = block.coefficients(x);
  Tensor y = block.layer(0)->forward_without_combination(block.layer_input(x), a, index);
  if (block.num_layers() > 1)
    y = block.layer(1)->forward_without_combination(block.hidden_activation(y), a, index);
  return y;
}

// ---------------------------------------------------------------- re-writing

// Checks that every a_e has the leading dims of a_0; returns those dims.
static Shape leading_dims(const std::vector<Tensor>& a, const char* op) {
  MU_CHECK(!a.empty(), op, ": needs the coefficients of at least one level");
  for (const Tensor& t : a) MU_CHECK(t.defined() && t.dim() >= 1, op, ": coefficients must have an expert dim");
  Shape lead(a[0].shape().begin(), a[0].shape().end() - 1);
  for (size_t e = 1; e < a.size(); ++e) {
    Shape l(a[e].shape().begin(), a[e].shape().end() - 1);
    MU_CHECK(l == lead, op, ": coefficients of level ", e, " have leading dims ", shape_str(l), ", level 0 has ",
             shape_str(lead));
  }
  return lead;
}

// "b n1, b n2, ..." and the coefficients flattened to (M, N_e), for the einsums below.
static std::string flat_terms(const std::vector<Tensor>& a, int64_t M, std::vector<Tensor>& ops) {
  std::string spec;
  for (size_t e = 0; e < a.size(); ++e) {
    spec += (spec.empty() ? "" : ", ") + std::string("b n") + std::to_string(e + 1);
    ops.push_back(a[e].reshape({M, a[e].size(-1)}));
  }
  return spec;
}

static std::string expert_axes(size_t levels) {
  std::string s;
  for (size_t e = 0; e < levels; ++e) s += (s.empty() ? "n" : " n") + std::to_string(e + 1);
  return s;
}

Tensor mean_coefficients(const std::vector<Tensor>& a, const Tensor& mask) {
  Shape lead = leading_dims(a, "mean_coefficients");
  const int64_t M = numel_of(lead);
  Tensor w;
  if (mask.defined()) {
    MU_CHECK(mask.shape() == lead, "mean_coefficients: mask has shape ", shape_str(mask.shape()),
             "; expected the coefficients' leading dims ", shape_str(lead));
    // Nonzero entries are members, whatever the mask's dtype.
    w = ne(mask, zeros_like(mask)).to(a[0].dtype()).reshape({M});
  } else {
    w = ones({M}, TensorOptions(a[0].dtype()).device(a[0].device()));
  }
  const double count = w.sum().item();
  MU_CHECK(count > 0, "mean_coefficients: the mask selects no position");
  std::vector<Tensor> ops = {w};
  std::string spec = "b, " + flat_terms(a, M, ops);
  // Σ_b w_b a_1[b] ⊗ ... ⊗ a_E[b], never forming a per-position outer product.
  return einsum(spec + " -> " + expert_axes(a.size()), ops) * (1.0 / count);
}

Tensor rewrite_term(const std::vector<Tensor>& a, const Tensor& mean, double lambda) {
  MU_CHECK(std::isfinite(lambda), "rewrite_term: lambda must be a finite number, got ", lambda);
  Shape lead = leading_dims(a, "rewrite_term");
  Shape want;
  for (const Tensor& t : a) want.push_back(t.size(-1));
  MU_CHECK(mean.defined() && mean.shape() == want, "rewrite_term: mean coefficients have shape ",
           mean.defined() ? shape_str(mean.shape()) : std::string("(undefined)"), "; expected ", shape_str(want),
           " (N_1, ..., N_E)");
  const int64_t M = numel_of(lead);
  std::vector<Tensor> ops;
  std::string spec = flat_terms(a, M, ops);
  ops.push_back(mean);
  Tensor t = einsum(spec + ", " + expert_axes(a.size()) + " -> b", ops) * lambda;
  return t.reshape(lead);
}

Tensor forward_with_rewrite(MuMoE& block, const Tensor& x, const Tensor& mean, const std::vector<int64_t>& heads,
                            std::optional<double> lambda) {
  const char* op = "forward_with_rewrite";
  const int64_t out = block.options().out();
  const std::vector<int64_t>& experts = block.options().experts();
  // Every argument is checked before the block reads x.
  for (int64_t o : heads) MU_CHECK(o >= 0 && o < out, op, ": output head ", o, " out of range (", out, " outputs)");
  MU_CHECK(mean.defined() && mean.shape() == experts, op, ": mean coefficients have shape ",
           mean.defined() ? shape_str(mean.shape()) : std::string("(undefined)"), "; the block's experts are ",
           shape_str(experts));
  if (lambda) MU_CHECK(std::isfinite(*lambda), op, ": lambda must be a finite number, got ", *lambda);
  // N_1 ⋯ N_E, the paper's λ, in double: it is only a scale.
  double total = 1;
  for (int64_t n : experts) total *= double(n);
  std::vector<Tensor> a = block.coefficients(x);
  Tensor y = block.forward_with(x, a);
  Tensor term = rewrite_term(a, mean, lambda ? *lambda : total);
  // A 0/1 vector over the outputs: the term lands on the chosen heads only.
  Tensor select = zeros({out}, y.dtype());
  for (int64_t o : heads) select.set({o}, 1.0);
  // Built on the CPU (element writes need one), then moved next to the output.
  return y + term.unsqueeze(-1) * select.to(y.device());
}

// ---------------------------------------------------------------- statistics

// Strict order of activations: higher coefficient first, then lower index, then lower position.
static bool better(const ExpertActivation& x, const ExpertActivation& y) {
  if (x.coefficient != y.coefficient) return x.coefficient > y.coefficient;
  if (x.index != y.index) return x.index < y.index;
  return x.position < y.position;
}

CoefficientCollector::CoefficientCollector(std::vector<int64_t> experts, int64_t top_k, int64_t num_classes)
    : experts_(std::move(experts)), k_(top_k), num_classes_(num_classes) {
  MU_CHECK(!experts_.empty(), "CoefficientCollector: needs the experts of at least one level");
  for (int64_t n : experts_) MU_CHECK(n > 0, "CoefficientCollector: expert counts must be positive, got ", shape_str(experts_));
  MU_CHECK(top_k >= 0, "CoefficientCollector: top_k must be non-negative, got ", top_k);
  MU_CHECK(num_classes >= 0, "CoefficientCollector: num_classes must be non-negative, got ", num_classes);
  // The tables are host vectors sized by the arguments: a size no memory can hold is a
  // mu::Error naming them, not a std::bad_alloc or length_error escaping. Their bytes are
  // counted (checked) and bounded as a tensor's are before anything is allocated.
  const char* what = "CoefficientCollector: bytes of the tables";
  int64_t bytes = checked_mul(2 * int64_t(sizeof(int64_t)), num_classes_, what);
  for (int64_t n : experts_) {
    bytes = checked_add(bytes, checked_mul(n, int64_t(sizeof(decltype(heaps_)::value_type::value_type)), what), what);
    bytes = checked_add(bytes, checked_mul(checked_mul(num_classes_, n, what), int64_t(sizeof(double)), what), what);
  }
  MU_CHECK(bytes <= kMaxAllocationBytes, "CoefficientCollector: tables for experts ", shape_str(experts_), " and ",
           num_classes_, " classes need ", bytes, " bytes, more than any machine can address");
  try {
    for (int64_t n : experts_) {
      heaps_.emplace_back(size_t(n));
      sums_.emplace_back(size_t(num_classes_ * n), 0.0);
    }
    class_inputs_.assign(size_t(num_classes_), 0);
    class_positions_.assign(size_t(num_classes_), 0);
  } catch (const std::bad_alloc&) {
    MU_FAIL("CoefficientCollector: tables for experts ", shape_str(experts_), " and ", num_classes_,
            " classes do not fit in host memory");
  } catch (const std::length_error&) {
    MU_FAIL("CoefficientCollector: tables for experts ", shape_str(experts_), " and ", num_classes_,
            " classes do not fit in host memory");
  }
}

void CoefficientCollector::add(const std::vector<Tensor>& a, const Tensor& indices, const Tensor& labels) {
  MU_CHECK(int64_t(a.size()) == levels(), "CoefficientCollector::add: got coefficients of ", a.size(),
           " levels, expected ", levels());
  MU_CHECK(indices.defined() && indices.dim() == 1 && !indices.is_floating_point(),
           "CoefficientCollector::add: indices must be a 1-D integer tensor (B), got ",
           indices.defined() ? indices.describe() : std::string("an undefined tensor"));
  const int64_t B = indices.size(0);
  const std::vector<int64_t> idx = indices.to_vector<int64_t>();
  std::vector<int64_t> lab;
  if (num_classes_ > 0) {
    MU_CHECK(labels.defined() && labels.dim() == 1 && labels.size(0) == B && !labels.is_floating_point(),
             "CoefficientCollector::add: labels must be a 1-D integer tensor of ", B, " entries, got ",
             labels.defined() ? labels.describe() : std::string("an undefined tensor"));
    lab = labels.to_vector<int64_t>();
    for (int64_t c : lab)
      MU_CHECK(c >= 0 && c < num_classes_, "CoefficientCollector::add: label ", c, " out of range [0, ",
               num_classes_, ")");
  }
  // Positions per input: every leading dim after the batch one is a token axis.
  int64_t P = -1;
  for (int64_t e = 0; e < levels(); ++e) {
    const Tensor& t = a[size_t(e)];
    const int64_t N = experts_[size_t(e)];
    MU_CHECK(t.defined() && t.dim() >= 2 && t.size(0) == B && t.size(-1) == N,
             "CoefficientCollector::add: coefficients of level ", e, " must be (", B, ", ..., ", N, "), got ",
             t.defined() ? t.describe() : std::string("an undefined tensor"));
    const int64_t p = t.numel() / (B * N);
    MU_CHECK(P < 0 || p == P, "CoefficientCollector::add: levels disagree on the positions per input");
    P = p;
  }
  for (int64_t e = 0; e < levels(); ++e) {
    const int64_t N = experts_[size_t(e)];
    const std::vector<double> v = a[size_t(e)].to_vector<double>();
    auto& heaps = heaps_[size_t(e)];
    for (int64_t b = 0; b < B; ++b)
      for (int64_t p = 0; p < P; ++p)
        for (int64_t n = 0; n < N; ++n) {
          const double c = v[size_t((b * P + p) * N + n)];
          if (num_classes_ > 0) sums_[size_t(e)][size_t(lab[size_t(b)] * N + n)] += c;
          // Experts that did not take part (coefficient 0, as entmax often gives) are not "activated".
          if (!(c > 0) || k_ == 0) continue;
          ExpertActivation cand{idx[size_t(b)], p, c};
          auto& h = heaps[size_t(n)];
          if (int64_t(h.size()) < k_) {
            h.push_back(cand);
            std::push_heap(h.begin(), h.end(), better);  // ordered by `better`, the front is the worst kept
          } else if (better(cand, h.front())) {
            std::pop_heap(h.begin(), h.end(), better);
            h.back() = cand;
            std::push_heap(h.begin(), h.end(), better);
          }
        }
  }
  for (int64_t b = 0; b < B && num_classes_ > 0; ++b) {
    class_inputs_[size_t(lab[size_t(b)])] += 1;
    class_positions_[size_t(lab[size_t(b)])] += P;
  }
  inputs_ += B;
}

void CoefficientCollector::add(MuMoE& block, const Tensor& x, const Tensor& indices, const Tensor& labels) {
  NoGradGuard no_grad;
  add(block.coefficients(x), indices, labels);
}

std::vector<ExpertActivation> CoefficientCollector::top_k(int64_t level, int64_t n) const {
  MU_CHECK(level >= 0 && level < levels(), "CoefficientCollector::top_k: level ", level, " out of range (",
           levels(), " levels)");
  MU_CHECK(n >= 0 && n < experts_[size_t(level)], "CoefficientCollector::top_k: expert ", n,
           " out of range at level ", level, " (", experts_[size_t(level)], " experts)");
  std::vector<ExpertActivation> out = heaps_[size_t(level)][size_t(n)];
  std::sort(out.begin(), out.end(), better);
  return out;
}

Tensor CoefficientCollector::class_means(int64_t level) const {
  MU_CHECK(num_classes_ > 0, "CoefficientCollector::class_means: built without classes (num_classes = 0)");
  MU_CHECK(level >= 0 && level < levels(), "CoefficientCollector::class_means: level ", level, " out of range (",
           levels(), " levels)");
  const int64_t N = experts_[size_t(level)];
  std::vector<double> m(size_t(num_classes_ * N));
  for (int64_t c = 0; c < num_classes_; ++c)
    for (int64_t n = 0; n < N; ++n) {
      const int64_t cnt = class_positions_[size_t(c)];
      // NaN marks "no data", which a mean of 0 would hide.
      m[size_t(c * N + n)] = cnt > 0 ? sums_[size_t(level)][size_t(c * N + n)] / double(cnt)
                                     : std::numeric_limits<double>::quiet_NaN();
    }
  return from_vector(m, {num_classes_, N});
}

}  // namespace mu::nn
