// einsum: parse the spec into integer labels, bring every operand to unique labels
// (diagonals taken, broadcast size-1 dims dropped, private letters summed out), then
// contract pairwise in the order the planner picks. Every step is a differentiable op,
// so the gradient follows the same plan backwards (see contract_all).
#include "ops/einsum.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

#include "autograd/autocast.h"
#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "ops/ops.h"
#include "tensor/checked.h"

namespace mu {

using autograd::TensorList;
using Labels = std::vector<int>;

namespace {

constexpr int kEllipsis = -1;

// ---------------------------------------------------------------- parsing

struct Term {
  Labels labels;               // kEllipsis marks where "..." stands
  std::vector<size_t> pos;     // character position of each label in the spec
};

struct ParsedSpec {
  std::vector<Term> inputs;
  Term output;
  bool has_output = false;
  std::vector<std::string> names;  // label id -> its name in the spec
};

bool is_space(char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; }

// Is this term written einops style (names separated by spaces inside the term)?
bool has_inner_space(const std::string& s, size_t b, size_t e) {
  while (b < e && is_space(s[b])) ++b;
  while (e > b && is_space(s[e - 1])) --e;
  for (size_t i = b; i < e; ++i)
    if (is_space(s[i])) return true;
  return false;
}

struct Parser {
  explicit Parser(const std::string& s) : spec(s) {}
  const std::string& spec;
  bool einops = false;
  std::map<std::string, int> ids;
  ParsedSpec out;

  int label_id(const std::string& name) {
    auto it = ids.find(name);
    if (it != ids.end()) return it->second;
    int id = int(out.names.size());
    ids[name] = id;
    out.names.push_back(name);
    return id;
  }

  // A character of the spec as an error shows it: itself when printable ASCII, else its
  // byte in hex (one byte of a UTF-8 letter alone would print as garbage).
  static std::string shown(char c) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7f) return std::string("'") + c + "'";
    char buf[16];
    std::snprintf(buf, sizeof buf, "byte 0x%02X", unsigned(u));
    return buf;
  }

  // Parses spec[b, e) as one term; `what` names it in errors ("operand 1", "the output").
  Term term(size_t b, size_t e, const std::string& what) {
    Term t;
    bool ellipsis = false;
    auto add_ellipsis = [&](size_t at) {
      MU_CHECK(!ellipsis, "einsum: more than one ellipsis '...' in ", what, " (second at position ", at, ") of \"",
               spec, "\"");
      ellipsis = true;
      t.labels.push_back(kEllipsis);
      t.pos.push_back(at);
    };
    size_t i = b;
    while (i < e) {
      char c = spec[i];
      if (is_space(c)) { ++i; continue; }
      if (c == '.') {
        MU_CHECK(spec.compare(i, 3, "...") == 0 && i + 3 <= e, "einsum: '.' at position ", i,
                 " is not part of an ellipsis '...' in \"", spec, "\"");
        add_ellipsis(i);
        i += 3;
        continue;
      }
      if (einops) {
        size_t j = i;
        while (j < e && !is_space(spec[j]) && spec[j] != '.') ++j;
        std::string name = spec.substr(i, j - i);
        MU_CHECK(std::isalpha(static_cast<unsigned char>(name[0])) || name[0] == '_', "einsum: axis name \"", name,
                 "\" at position ", i, " must start with a letter or '_' in \"", spec, "\"");
        for (size_t k = 0; k < name.size(); ++k)
          MU_CHECK(std::isalnum(static_cast<unsigned char>(name[k])) || name[k] == '_', "einsum: invalid character ",
                   shown(name[k]), " at position ", i + k, " in \"", spec, "\"");
        t.labels.push_back(label_id(name));
        t.pos.push_back(i);
        i = j;
      } else {
        MU_CHECK(std::isalpha(static_cast<unsigned char>(c)), "einsum: invalid character ", shown(c), " at position ",
                 i, " in \"", spec, "\" (axes are letters a-z, A-Z)");
        t.labels.push_back(label_id(std::string(1, c)));
        t.pos.push_back(i);
        ++i;
      }
    }
    return t;
  }

  ParsedSpec parse() {
    MU_CHECK(std::any_of(spec.begin(), spec.end(), [](char c) { return !is_space(c); }), "einsum: empty spec");
    size_t arrow = spec.find("->");
    MU_CHECK(arrow == std::string::npos || spec.find("->", arrow + 2) == std::string::npos,
             "einsum: more than one '->' in \"", spec, "\" (second at position ", spec.find("->", arrow + 2), ")");
    size_t lhs_end = arrow == std::string::npos ? spec.size() : arrow;
    for (size_t i = 0; i < lhs_end; ++i)
      MU_CHECK(spec[i] != '>' && spec[i] != '-', "einsum: stray '", spec[i], "' at position ", i, " in \"", spec, "\"");
    // Term boundaries on the left of the arrow.
    std::vector<std::pair<size_t, size_t>> bounds;
    size_t b = 0;
    for (size_t i = 0; i <= lhs_end; ++i)
      if (i == lhs_end || spec[i] == ',') {
        bounds.push_back({b, i});
        b = i + 1;
      }
    for (auto [tb, te] : bounds) einops = einops || has_inner_space(spec, tb, te);
    if (arrow != std::string::npos) einops = einops || has_inner_space(spec, arrow + 2, spec.size());
    for (size_t k = 0; k < bounds.size(); ++k) out.inputs.push_back(term(bounds[k].first, bounds[k].second, "operand " + std::to_string(k)));
    if (arrow != std::string::npos) {
      out.has_output = true;
      for (size_t i = arrow + 2; i < spec.size(); ++i)
        MU_CHECK(spec[i] != ',' && spec[i] != '-' && spec[i] != '>', "einsum: unexpected '", spec[i], "' at position ",
                 i, " in the output of \"", spec, "\"");
      out.output = term(arrow + 2, spec.size(), "the output");
    }
    return out;
  }
};

// ---------------------------------------------------------------- the problem

// What einsum computes once operand shapes are known: every operand reduced to unique
// labels, with the view and reduction steps that get it there.
struct Problem {
  std::vector<std::string> names;   // label id -> name (ellipsis dims get "...0", "...1")
  std::vector<int64_t> sizes;       // label id -> size
  std::vector<Labels> raw;          // per operand: one label per dim (repeats allowed)
  std::vector<Labels> prepared;     // per operand: unique labels after preparation
  Labels output;
  std::string spec;
};

Problem build_problem(const std::string& spec, const std::vector<Shape>& shapes) {
  ParsedSpec ps = Parser(spec).parse();
  Problem p;
  p.spec = spec;
  MU_CHECK(ps.inputs.size() == shapes.size(), "einsum: \"", spec, "\" has ", ps.inputs.size(), " operand term",
           ps.inputs.size() == 1 ? "" : "s", " but ", shapes.size(), " operand", shapes.size() == 1 ? " was" : "s were",
           " given");
  const int n_named = int(ps.names.size());
  p.names = ps.names;

  // Ellipsis rank: the most dims any operand's "..." covers; ellipsis dims are right-aligned.
  int64_t ell = 0;
  std::vector<int64_t> ell_dims(shapes.size(), 0);
  for (size_t k = 0; k < shapes.size(); ++k) {
    const Term& t = ps.inputs[k];
    int64_t named = int64_t(std::count_if(t.labels.begin(), t.labels.end(), [](int l) { return l != kEllipsis; }));
    bool has_ell = named != int64_t(t.labels.size());
    int64_t nd = int64_t(shapes[k].size());
    if (has_ell) {
      MU_CHECK(nd >= named, "einsum: operand ", k, " has ", nd, " dims (shape ", shape_str(shapes[k]), ") but its term names ",
               named, " plus an ellipsis");
      ell_dims[k] = nd - named;
      ell = std::max(ell, ell_dims[k]);
    } else {
      MU_CHECK(nd == named, "einsum: operand ", k, " has ", nd, " dims (shape ", shape_str(shapes[k]), ") but its term names ",
               named, " (\"", spec, "\")");
    }
  }
  for (int64_t e = 0; e < ell; ++e) p.names.push_back("..." + std::to_string(e));
  auto ell_label = [&](int64_t e) { return n_named + int(e); };

  // One label per dim, and each label's size (1 broadcasts against any size).
  p.sizes.assign(p.names.size(), -1);
  // Where each letter's size was set, (operand, dim), for the error naming both places.
  std::vector<std::pair<size_t, size_t>> where_set(p.names.size());
  for (size_t k = 0; k < shapes.size(); ++k) {
    Labels dims;
    std::vector<size_t> pos;
    for (size_t i = 0; i < ps.inputs[k].labels.size(); ++i) {
      int l = ps.inputs[k].labels[i];
      if (l == kEllipsis) {
        for (int64_t e = ell - ell_dims[k]; e < ell; ++e) dims.push_back(ell_label(e)), pos.push_back(ps.inputs[k].pos[i]);
      } else {
        dims.push_back(l);
        pos.push_back(ps.inputs[k].pos[i]);
      }
    }
    // A letter repeated inside one operand is a diagonal: its sizes must agree exactly.
    for (size_t d = 0; d < dims.size(); ++d)
      for (size_t d2 = d + 1; d2 < dims.size(); ++d2)
        MU_CHECK(dims[d] != dims[d2] || shapes[k][d] == shapes[k][d2], "einsum: letter '", p.names[size_t(dims[d])],
                 "' is repeated in operand ", k, " with sizes ", shapes[k][d], " and ", shapes[k][d2],
                 "; a diagonal needs equal sizes");
    for (size_t d = 0; d < dims.size(); ++d) {
      int l = dims[d];
      int64_t s = shapes[k][d];
      int64_t& have = p.sizes[size_t(l)];
      if (have == -1 || (have == 1 && s != 1)) {  // first sighting, or a real size after broadcasts
        have = s;
        where_set[size_t(l)] = {k, d};
      } else if (s != have && s != 1) {  // size 1 broadcasts; any other disagreement is an error
        std::string all;
        for (const Shape& sh : shapes) all += (all.empty() ? "" : ", ") + shape_str(sh);
        const auto [k0, d0] = where_set[size_t(l)];
        MU_FAIL("einsum: ", l >= n_named ? "ellipsis dim" : "letter", " '", p.names[size_t(l)], "' (position ", pos[d],
                ") has size ", s, " in operand ", k, " dim ", d, " but size ", have, " in operand ", k0, " dim ", d0,
                " (\"", spec, "\", shapes ", all, ")");
      }
    }
    p.raw.push_back(dims);
  }

  // The output: as written, or (implicit) ellipsis dims then letters seen once, sorted.
  if (ps.has_output) {
    std::set<int> seen;
    for (size_t i = 0; i < ps.output.labels.size(); ++i) {
      int l = ps.output.labels[i];
      if (l == kEllipsis) {
        for (int64_t e = 0; e < ell; ++e) p.output.push_back(ell_label(e));
        continue;
      }
      bool in_input = false;
      for (const Labels& r : p.raw) in_input = in_input || std::count(r.begin(), r.end(), l) > 0;
      MU_CHECK(in_input, "einsum: output letter '", p.names[size_t(l)], "' (position ", ps.output.pos[i],
               ") does not appear in any operand of \"", spec, "\"");
      MU_CHECK(seen.insert(l).second, "einsum: output letter '", p.names[size_t(l)], "' (position ", ps.output.pos[i],
               ") appears more than once in \"", spec, "\"");
      p.output.push_back(l);
    }
  } else {
    for (int64_t e = 0; e < ell; ++e) p.output.push_back(ell_label(e));
    std::map<int, int> count;
    for (const Term& t : ps.inputs)
      for (int l : t.labels)
        if (l != kEllipsis) count[l] += 1;
    std::vector<int> once;
    for (auto [l, c] : count)
      if (c == 1) once.push_back(l);
    std::sort(once.begin(), once.end(), [&](int a, int b) { return p.names[size_t(a)] < p.names[size_t(b)]; });
    p.output.insert(p.output.end(), once.begin(), once.end());
  }

  // Prepared labels: unique, broadcast (size-1 against a larger size) dims dropped,
  // letters held by this operand alone and absent from the output summed out.
  for (size_t k = 0; k < p.raw.size(); ++k) {
    Labels u;
    for (size_t d = 0; d < p.raw[k].size(); ++d) {
      int l = p.raw[k][d];
      if (std::count(u.begin(), u.end(), l)) continue;
      if (shapes[k][d] == 1 && p.sizes[size_t(l)] != 1) continue;
      u.push_back(l);
    }
    p.prepared.push_back(u);
  }
  for (size_t k = 0; k < p.prepared.size(); ++k) {
    Labels keep;
    for (int l : p.prepared[k]) {
      bool elsewhere = std::count(p.output.begin(), p.output.end(), l) > 0;
      for (size_t j = 0; j < p.prepared.size() && !elsewhere; ++j)
        elsewhere = j != k && std::count(p.prepared[j].begin(), p.prepared[j].end(), l) > 0;
      if (elsewhere) keep.push_back(l);
    }
    p.prepared[k] = keep;
  }
  return p;
}

// ---------------------------------------------------------------- planning

// The element count of a tensor with these labels; used for the labels of one operand
// or of a pairwise result that is about to be allocated, which empty() checks as well.
int64_t labels_size(const Labels& ls, const std::vector<int64_t>& sizes) {
  int64_t n = 1;
  for (int l : ls) n = checked_mul(n, sizes[size_t(l)], "einsum: a contraction has too many elements");
  return n;
}

// The same count in double, for the planner's costs: the union of every operand's
// labels may hold more combinations than int64 can count (the naive cost of
// "ab,cd->" is |a||b||c||d|), and a cost only needs to compare.
double labels_count(const Labels& ls, const std::vector<int64_t>& sizes) {
  double n = 1;
  for (int l : ls) n *= double(sizes[size_t(l)]);
  return n;
}

Labels label_union(const Labels& a, const Labels& b) {
  Labels u = a;
  for (int l : b)
    if (!std::count(u.begin(), u.end(), l)) u.push_back(l);
  return u;
}

// Labels of the pairwise result of a and b: those that `others` or `out` still need.
Labels pair_result(const Labels& a, const Labels& b, const std::vector<Labels>& others, const Labels& out) {
  Labels r;
  for (int l : label_union(a, b)) {
    bool needed = std::count(out.begin(), out.end(), l) > 0;
    for (const Labels& o : others) needed = needed || std::count(o.begin(), o.end(), l) > 0;
    if (needed) r.push_back(l);
  }
  return r;
}

struct Plan {
  std::vector<std::pair<int, int>> steps;
  double flops = 0;
  double largest = 0;
};

// Up to kOptimalOperands operands the cheapest contraction tree, found by dynamic
// programming over subsets of the operands (each subset's cheapest tree is the cheapest
// split into two subsets' trees plus their pairwise product): about 3^n / 2 splits, 265,000
// at 12 operands (a few milliseconds, once per plan: plans are cached below). The greedy
// order it replaced for 6 to 12 operands cost 2.7x the multiply-adds of a hierarchical
// TRμMoE layer's forward pass and 3.9-4.4x a hierarchical Tucker layer's.
constexpr size_t kOptimalOperands = 12;

// The optimal tree as steps of the list convention (EinsumPath::steps). Ties go to the
// smaller largest intermediate, then to the first split found; the letters of all
// operands must number at most 64. Returns false (and leaves `plan` alone) otherwise.
bool plan_optimal(const std::vector<Labels>& ops, const Labels& out, const std::vector<int64_t>& sizes, Plan& plan) {
  const size_t n = ops.size();
  std::vector<int> letters;  // bit b of a label set <-> letters[b]
  for (const Labels& ls : ops)
    for (int l : ls)
      if (!std::count(letters.begin(), letters.end(), l)) letters.push_back(l);
  for (int l : out)
    if (!std::count(letters.begin(), letters.end(), l)) letters.push_back(l);
  if (n < 2 || n > kOptimalOperands || letters.size() > 64) return false;
  auto bits = [&](const Labels& ls) {
    uint64_t b = 0;
    for (int l : ls) b |= uint64_t(1) << (std::find(letters.begin(), letters.end(), l) - letters.begin());
    return b;
  };
  double letter_size[64];
  for (size_t k = 0; k < letters.size(); ++k) letter_size[k] = double(sizes[size_t(letters[k])]);
  auto count = [&](uint64_t b) {
    double c = 1;
    for (; b != 0; b &= b - 1) c *= letter_size[__builtin_ctzll(b)];
    return c;
  };
  const uint32_t full = (uint32_t(1) << n) - 1;
  const uint64_t out_bits = bits(out);
  std::vector<uint64_t> op_bits(n);
  for (size_t k = 0; k < n; ++k) op_bits[k] = bits(ops[k]);
  // labels[S]: the letters of S's contraction that the operands outside S or the output need.
  std::vector<uint64_t> held(size_t(full) + 1, 0), labels(size_t(full) + 1, 0);
  for (uint32_t s = 1; s <= full; ++s) {
    const int low = __builtin_ctz(s);
    held[s] = held[s & (s - 1)] | op_bits[size_t(low)];
  }
  for (uint32_t s = 1; s <= full; ++s) labels[s] = held[s] & (held[full & ~s] | out_bits);
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> cost(size_t(full) + 1, inf), largest(size_t(full) + 1, 0);
  std::vector<uint32_t> split(size_t(full) + 1, 0);
  for (size_t k = 0; k < n; ++k) cost[uint32_t(1) << k] = 0;
  for (uint32_t s = 1; s <= full; ++s) {
    if ((s & (s - 1)) == 0) continue;  // a single operand
    const uint32_t low = s & (~s + 1);
    const double size = s == full ? 0 : count(labels[s]);  // the output is no intermediate
    // Splits a | b with a holding s's lowest operand: each unordered split once.
    for (uint32_t a = (s - 1) & s; a != 0; a = (a - 1) & s) {
      if (!(a & low)) continue;
      const uint32_t b = s ^ a;
      const double c = cost[a] + cost[b] + count(labels[a] | labels[b]);
      const double big = std::max({largest[a], largest[b], size});
      if (c < cost[s] || (c == cost[s] && big < largest[s])) cost[s] = c, largest[s] = big, split[s] = a;
    }
  }
  // The tree into list steps: children first; each step names its two entries'
  // positions in the current list, whose result goes to the end.
  std::vector<uint32_t> list;
  for (size_t k = 0; k < n; ++k) list.push_back(uint32_t(1) << k);
  Plan result;
  std::function<void(uint32_t)> emit = [&](uint32_t s) {
    if ((s & (s - 1)) == 0) return;
    const uint32_t a = split[s], b = s ^ a;
    emit(a);
    emit(b);
    int i = int(std::find(list.begin(), list.end(), a) - list.begin());
    int j = int(std::find(list.begin(), list.end(), b) - list.begin());
    if (i > j) std::swap(i, j);
    result.steps.push_back({i, j});
    list.erase(list.begin() + j);
    list.erase(list.begin() + i);
    list.push_back(s);
  };
  emit(full);
  result.flops = cost[full];
  result.largest = largest[full];
  plan = result;
  return true;
}

Plan plan_greedy(const std::vector<Labels>& ops, const Labels& out, const std::vector<int64_t>& sizes);

// Plans already made, by operand letters and sizes: a layer's einsum plans the same
// contraction on every call, and planning 11 operands costs about a millisecond. Bounded:
// emptied when it reaches kPlanCacheSize entries.
constexpr size_t kPlanCacheSize = 4096;
struct CachedPlan {
  Plan plan;
  bool optimal;
};
std::mutex g_plan_mutex;
std::map<std::vector<int64_t>, CachedPlan> g_plans;

// The optimal tree for up to kOptimalOperands operands (plan_optimal); greedily the
// cheapest next pair for more.
Plan plan_contraction(const std::vector<Labels>& ops, const Labels& out, const std::vector<int64_t>& sizes, bool* exhaustive) {
  // The key: each operand's letters with their sizes, then the output's.
  std::vector<int64_t> key;
  for (const Labels& ls : ops) {
    key.push_back(int64_t(ls.size()));
    for (int l : ls) key.push_back(l), key.push_back(sizes[size_t(l)]);
  }
  key.push_back(-1);
  for (int l : out) key.push_back(l), key.push_back(sizes[size_t(l)]);
  {
    std::lock_guard<std::mutex> lock(g_plan_mutex);
    auto it = g_plans.find(key);
    if (it != g_plans.end()) {
      if (exhaustive) *exhaustive = it->second.optimal;
      return it->second.plan;
    }
  }
  CachedPlan made;
  made.optimal = ops.size() <= 1 || plan_optimal(ops, out, sizes, made.plan);
  if (!made.optimal) made.plan = plan_greedy(ops, out, sizes);
  if (exhaustive) *exhaustive = made.optimal;
  std::lock_guard<std::mutex> lock(g_plan_mutex);
  if (g_plans.size() >= kPlanCacheSize) g_plans.clear();
  g_plans.emplace(std::move(key), made);
  return made.plan;
}

// Greedily the cheapest next pair, for more operands than plan_optimal takes, as
// opt_einsum's greedy order: among pairs that share a letter (any pair if none do), the one
// whose result shrinks memory most (result size minus both inputs), then the one with the
// fewest multiply-adds. Pairs sharing nothing would form outer products, which is how a
// μMoE layer's weight tensor gets materialised.
Plan plan_greedy(const std::vector<Labels>& ops, const Labels& out, const std::vector<int64_t>& sizes) {
  Plan plan;
  std::vector<Labels> cur = ops;
  auto others_of = [&](int i, int j) {
    std::vector<Labels> others;
    for (int k = 0; k < int(cur.size()); ++k)
      if (k != i && k != j) others.push_back(cur[size_t(k)]);
    return others;
  };
  auto shares = [&](int i, int j) {
    for (int l : cur[size_t(i)])
      if (std::count(cur[size_t(j)].begin(), cur[size_t(j)].end(), l)) return true;
    return false;
  };
  while (cur.size() > 1) {
    bool any_shared = false;
    for (int i = 0; i < int(cur.size()); ++i)
      for (int j = i + 1; j < int(cur.size()); ++j) any_shared = any_shared || shares(i, j);
    double best_delta = std::numeric_limits<double>::infinity(), best_cost = best_delta;
    int pi = 0, pj = 1;
    for (int i = 0; i < int(cur.size()); ++i)
      for (int j = i + 1; j < int(cur.size()); ++j) {
        if (any_shared && !shares(i, j)) continue;
        const double cost = labels_count(label_union(cur[size_t(i)], cur[size_t(j)]), sizes);
        const double delta = labels_count(pair_result(cur[size_t(i)], cur[size_t(j)], others_of(i, j), out), sizes) -
                             labels_count(cur[size_t(i)], sizes) - labels_count(cur[size_t(j)], sizes);
        if (delta < best_delta || (delta == best_delta && cost < best_cost)) best_delta = delta, best_cost = cost, pi = i, pj = j;
      }
    std::vector<Labels> others = others_of(pi, pj);
    const Labels r = pair_result(cur[size_t(pi)], cur[size_t(pj)], others, out);
    plan.steps.push_back({pi, pj});
    plan.flops += labels_count(label_union(cur[size_t(pi)], cur[size_t(pj)]), sizes);
    // The last step's result is the output, not an intermediate.
    if (!others.empty()) plan.largest = std::max(plan.largest, labels_count(r, sizes));
    others.push_back(r);
    cur = std::move(others);
  }
  return plan;
}

// ---------------------------------------------------------------- execution

// Position of each label of `want` within `have`.
Shape positions(const Labels& have, const Labels& want) {
  Shape perm;
  for (int l : want) perm.push_back(int64_t(std::find(have.begin(), have.end(), l) - have.begin()));
  return perm;
}

// Contracts a (labels la) with b (labels lb), keeping `keep`; returns the result and its labels.
std::pair<Tensor, Labels> contract_pair(const Tensor& a, const Labels& la, const Tensor& b, const Labels& lb,
                                        const Labels& keep, const std::vector<int64_t>& sizes) {
  auto kept = [&](int l) { return std::count(keep.begin(), keep.end(), l) > 0; };
  auto in = [](const Labels& ls, int l) { return std::count(ls.begin(), ls.end(), l) > 0; };
  Labels batch, contracted, a_only, b_only, a_drop, b_drop;
  for (int l : la) {
    if (in(lb, l)) (kept(l) ? batch : contracted).push_back(l);
    else (kept(l) ? a_only : a_drop).push_back(l);
  }
  for (int l : lb)
    if (!in(la, l)) (kept(l) ? b_only : b_drop).push_back(l);
  // Letters only one side holds and nobody needs: sum them out first.
  Tensor x = a, y = b;
  Labels lx = la, ly = lb;
  auto drop = [&](Tensor& t, Labels& lt, const Labels& gone) {
    if (gone.empty()) return;
    t = t.sum(positions(lt, gone));
    Labels rest;
    for (int l : lt)
      if (!in(gone, l)) rest.push_back(l);
    lt = rest;
  };
  drop(x, lx, a_drop);
  drop(y, ly, b_drop);

  Labels out_labels = batch;
  out_labels.insert(out_labels.end(), a_only.begin(), a_only.end());
  out_labels.insert(out_labels.end(), b_only.begin(), b_only.end());
  Shape out_shape;
  for (int l : out_labels) out_shape.push_back(sizes[size_t(l)]);
  int64_t nb = labels_size(batch, sizes), m = labels_size(a_only, sizes), n = labels_size(b_only, sizes),
          k = labels_size(contracted, sizes);

  auto order = [](Labels p1, const Labels& p2, const Labels& p3) {
    p1.insert(p1.end(), p2.begin(), p2.end());
    p1.insert(p1.end(), p3.begin(), p3.end());
    return p1;
  };
  // Integer operands have no GEMM kernel (as matmul, which refuses them): their
  // contractions are broadcast products summed, exact as torch's CPU einsum is, within a
  // bound on the products held at once.
  const bool integral = !is_floating(x.dtype());
  if (integral && !contracted.empty() && !(m == 1 && n == 1)) {
    constexpr int64_t kMaxProducts = int64_t(1) << 28;
    const double products = double(nb) * double(m) * double(n) * double(k);
    MU_CHECK(products <= double(kMaxProducts), "einsum: ", dtype_name(x.dtype()),
             " operands are contracted as broadcast products, here ", int64_t(products), " of them (", nb,
             " batch entries of ", m, " x ", k, " by ", k, " x ", n, "), more than ", kMaxProducts,
             " at once; convert the operands to float64, exact for integers below 2^53");
  }
  if (contracted.empty() || (m == 1 && n == 1) || integral) {
    // No GEMM form (a Hadamard or outer product), one dot product per batch entry, or
    // integers: broadcast multiply, then sum the contracted letters.
    Labels xa = order(batch, a_only, contracted), yb = order(batch, b_only, contracted);
    Tensor xp = x.permute(positions(lx, xa)), yp = y.permute(positions(ly, yb));
    Shape xs, ys;
    for (int l : batch) xs.push_back(sizes[size_t(l)]), ys.push_back(sizes[size_t(l)]);
    for (int l : a_only) xs.push_back(sizes[size_t(l)]), ys.push_back(1);
    for (int l : b_only) xs.push_back(1), ys.push_back(sizes[size_t(l)]);
    if (contracted.empty()) return {(xp.reshape(xs) * yp.reshape(ys)).reshape(out_shape), out_labels};
    xs.push_back(k);
    ys.push_back(k);
    Tensor r = (xp.reshape(xs) * yp.reshape(ys)).sum({int64_t(xs.size()) - 1});
    return {r.reshape(out_shape), out_labels};
  }
  // GEMM form: (nb, m, k) @ (nb, k, n).
  Tensor xm = x.permute(positions(lx, order(batch, a_only, contracted))).reshape({nb, m, k});
  Tensor ym = y.permute(positions(ly, order(batch, contracted, b_only))).reshape({nb, k, n});
  Tensor r = nb == 1 ? mm(xm.select(0, 0), ym.select(0, 0)) : bmm(xm, ym);
  return {r.reshape(out_shape), out_labels};
}

// Contracts prepared operands (unique labels, nothing private to one operand) into
// the output labels `out`, pair by pair in the planned order. Every step is built of
// differentiable views, bmm, mul and sum, so the backward pass walks the same plan in
// reverse: the gradient of each pair's operand is a contraction of the pair's output
// gradient with the other operand of the pair (g·Bᵀ and Aᵀ·g for a GEMM step), and the
// intermediates of the forward pass are reused rather than recomputed.
Tensor contract_all(TensorList ts, std::vector<Labels> ls, const Labels& out, const std::vector<int64_t>& sizes) {
  Plan plan = plan_contraction(ls, out, sizes, nullptr);
  for (auto [i, j] : plan.steps) {
    std::vector<Labels> others;
    TensorList rest;
    for (int k = 0; k < int(ls.size()); ++k)
      if (k != i && k != j) others.push_back(ls[size_t(k)]), rest.push_back(ts[size_t(k)]);
    Labels keep = out;
    for (const Labels& o : others) keep = label_union(keep, o);
    // Orientation: the operand holding the output's leading letters goes first, so that
    // the GEMM writes rows in the output's order and no transpose copy follows.
    int first = i, second = j;
    auto lead = [&](const Labels& own, const Labels& partner) {
      for (size_t q = 0; q < out.size(); ++q)
        if (std::count(own.begin(), own.end(), out[q]) && !std::count(partner.begin(), partner.end(), out[q])) return q;
      return out.size();
    };
    if (lead(ls[size_t(j)], ls[size_t(i)]) < lead(ls[size_t(i)], ls[size_t(j)])) std::swap(first, second);
    auto [r, lr] = contract_pair(ts[size_t(first)], ls[size_t(first)], ts[size_t(second)], ls[size_t(second)], keep, sizes);
    rest.push_back(r);
    others.push_back(lr);
    ts = rest;
    ls = others;
  }
  Tensor r = ts[0];
  Labels lr = ls[0];
  // A single operand may still hold letters absent from the output (e.g. "ij->" after
  // preparation kept none, or a trace): sum them, then order as the output asks.
  Labels gone;
  for (int l : lr)
    if (!std::count(out.begin(), out.end(), l)) gone.push_back(l);
  if (!gone.empty()) {
    r = r.sum(positions(lr, gone));
    Labels rest;
    for (int l : lr)
      if (!std::count(gone.begin(), gone.end(), l)) rest.push_back(l);
    lr = rest;
  }
  return r.permute(positions(lr, out)).contiguous();
}

// Geometry of the diagonal view over dims labelled `dims` with strides `in_strides`:
// dims sharing a label merge into one whose stride is the sum of theirs (stepping the
// letter steps every dim it names).
void diagonal_geometry(const Labels& dims, const Shape& in_shape, const Shape& in_strides, Labels* unique, Shape* shape,
                       Shape* strides) {
  unique->clear(), shape->clear(), strides->clear();
  for (size_t d = 0; d < dims.size(); ++d) {
    auto it = std::find(unique->begin(), unique->end(), dims[d]);
    if (it == unique->end()) {
      unique->push_back(dims[d]);
      shape->push_back(in_shape[d]);
      strides->push_back(in_strides[d]);
    } else {
      (*strides)[size_t(it - unique->begin())] += in_strides[d];
    }
  }
}

// x viewed with repeated labels merged (its diagonals); `unique` gets the view's labels.
Tensor take_diagonals(const Tensor& x, const Labels& dims, Labels* unique) {
  Shape shape, strides;
  diagonal_geometry(dims, x.shape(), x.strides(), unique, &shape, &strides);
  if (unique->size() == dims.size()) return x;
  Tensor v = make_view(x.storage(), shape, strides, x.storage_offset(), x.dtype());
  return autograd::record("EinsumDiagonalBackward", v, {x}, [dims, from = x.shape()](const Tensor& g) -> TensorList {
    // The gradient lives on the diagonal of a zero tensor of the input's shape.
    Tensor z = zeros(from, TensorOptions(g.dtype()).device(g.device()));
    Labels u;
    Shape shape, strides;
    diagonal_geometry(dims, from, contiguous_strides(from), &u, &shape, &strides);
    make_view(z.storage(), shape, strides, 0, z.dtype()).copy_(g);
    return {z};
  });
}

}  // namespace

// ---------------------------------------------------------------- public API

Tensor einsum(const std::string& spec, const std::vector<Tensor>& operands_in) {
  // Under autocast every float32 operand runs in bfloat16 (the casts are graph nodes).
  std::vector<Tensor> operands;
  for (const Tensor& t : operands_in) operands.push_back(autograd::autocast::to_low(t));
  std::vector<Shape> shapes;
  for (size_t k = 0; k < operands.size(); ++k) {
    MU_CHECK(operands[k].defined(), "einsum: operand ", k, " is an undefined tensor");
    shapes.push_back(operands[k].shape());
  }
  Problem p = build_problem(spec, shapes);
  MU_CHECK(operands.empty() || operands[0].dtype() != kBool, "einsum: bool operands are not supported (\"", spec,
           "\"); convert them with .to(kInt64) or .to(kFloat32)");
  for (size_t k = 1; k < operands.size(); ++k) {
    MU_CHECK(operands[k].dtype() == operands[0].dtype(), "einsum: operand ", k, " has dtype ",
             dtype_name(operands[k].dtype()), " but operand 0 has ", dtype_name(operands[0].dtype()));
    MU_CHECK(operands[k].device() == operands[0].device(), "einsum: operand ", k, " is on ", operands[k].device().str(),
             " but operand 0 is on ", operands[0].device().str());
  }

  // Prepare each operand (differentiable views and sums), down to p.prepared[k].
  TensorList prepared;
  for (size_t k = 0; k < operands.size(); ++k) {
    Labels unique;
    Tensor t = take_diagonals(operands[k], p.raw[k], &unique);
    // Drop broadcast size-1 dims and sum the letters no one else needs.
    Shape sum_dims;
    Labels after;
    for (size_t d = 0; d < unique.size(); ++d) {
      int l = unique[d];
      bool keep = std::count(p.prepared[k].begin(), p.prepared[k].end(), l) > 0;
      if (keep) after.push_back(l);
      else sum_dims.push_back(int64_t(d));
    }
    if (!sum_dims.empty()) t = t.sum(sum_dims);
    prepared.push_back(t);
    p.prepared[k] = after;  // same set, in the operand's own dim order
  }

  Tensor r = contract_all(prepared, p.prepared, p.output, p.sizes);
  // Integer sums come out as int64 (sum's promotion); einsum keeps its operands' dtype,
  // as torch's does.
  if (!is_floating(operands[0].dtype()) && r.dtype() != operands[0].dtype()) r = r.to(operands[0].dtype());
  return r;
}

EinsumPath einsum_path(const std::string& spec, const std::vector<Shape>& shapes) {
  Problem p = build_problem(spec, shapes);
  EinsumPath path;
  // Preparation: summing letters private to an operand reads each element of its
  // diagonal view once.
  for (size_t k = 0; k < shapes.size(); ++k) {
    Labels unique;
    // Counted in double: einsum_path takes shapes, not tensors, so an operand's element
    // count may exceed int64.
    double summed = 1, n = 1;
    for (size_t d = 0; d < p.raw[k].size(); ++d) {
      int l = p.raw[k][d];
      if (std::count(unique.begin(), unique.end(), l)) continue;  // a diagonal: counted once
      unique.push_back(l);
      n *= double(shapes[k][d]);
      if (!std::count(p.prepared[k].begin(), p.prepared[k].end(), l)) summed *= double(shapes[k][d]);
    }
    if (summed > 1) path.flops += n;
  }
  Plan plan = plan_contraction(p.prepared, p.output, p.sizes, &path.exhaustive);
  path.steps = plan.steps;
  path.flops += plan.flops;
  path.largest_intermediate = plan.largest;
  Labels all;
  for (const Labels& r : p.raw) all = label_union(all, r);
  path.naive_flops = labels_count(all, p.sizes) * double(std::max<size_t>(1, shapes.size() - 1));
  return path;
}

std::string EinsumPath::str() const {
  std::ostringstream os;
  os << "einsum path (" << (exhaustive ? "exhaustive" : "greedy") << "):";
  for (auto [i, j] : steps) os << " (" << i << "," << j << ")";
  os << "; " << flops << " multiply-adds (naive " << naive_flops << "); largest intermediate " << largest_intermediate
     << " elements";
  return os.str();
}

}  // namespace mu
