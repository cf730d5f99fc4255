// einsum against a brute-force evaluator (one nested loop over every index value, with
// its own parser), the planner's counts against hand-worked ones, gradcheck of the
// papers' contractions, and bad specs.
#include <limits>
#include <map>
#include <random>
#include <set>


#include "helpers.h"

using namespace mu;
using autograd::TensorList;

namespace {

// ---------------------------------------------------------------- brute force
// Character specs only. "..." is rewritten into fresh capital letters, right-aligned
// per operand; a size-1 dim broadcasts against the letter's size.
Tensor brute_einsum(std::string spec, const std::vector<Tensor>& ops) {
  spec.erase(std::remove(spec.begin(), spec.end(), ' '), spec.end());
  size_t arrow = spec.find("->");
  std::string lhs = spec.substr(0, arrow), rhs = arrow == std::string::npos ? "" : spec.substr(arrow + 2);
  std::vector<std::string> terms;
  size_t b = 0;
  for (size_t i = 0; i <= lhs.size(); ++i)
    if (i == lhs.size() || lhs[i] == ',') terms.push_back(lhs.substr(b, i - b)), b = i + 1;
  REQUIRE(terms.size() == ops.size());
  // Ellipsis rank, and the capital letters standing for its dims.
  size_t ell = 0;
  for (size_t k = 0; k < terms.size(); ++k) {
    size_t p = terms[k].find("...");
    if (p != std::string::npos) ell = std::max(ell, size_t(ops[k].dim()) - (terms[k].size() - 3));
  }
  std::string caps;
  for (size_t e = 0; e < ell; ++e) caps += char('Z' - e);
  std::reverse(caps.begin(), caps.end());
  for (size_t k = 0; k < terms.size(); ++k) {
    size_t p = terms[k].find("...");
    if (p == std::string::npos) continue;
    size_t n = size_t(ops[k].dim()) - (terms[k].size() - 3);
    terms[k] = terms[k].substr(0, p) + caps.substr(ell - n) + terms[k].substr(p + 3);
  }
  std::string out;
  if (arrow != std::string::npos) {
    size_t p = rhs.find("...");
    out = p == std::string::npos ? rhs : rhs.substr(0, p) + caps + rhs.substr(p + 3);
  } else {
    std::map<char, int> count;
    for (auto& t : terms)
      for (char c : t) count[c]++;
    out = caps;
    for (auto [c, n] : count)
      if (n == 1 && !(c >= 'A' && c <= 'Z' && caps.find(c) != std::string::npos)) out += c;
  }
  std::map<char, int64_t> size;
  for (size_t k = 0; k < terms.size(); ++k)
    for (size_t d = 0; d < terms[k].size(); ++d) {
      int64_t s = ops[k].shape()[d];
      if (!size.count(terms[k][d]) || size[terms[k][d]] == 1) size[terms[k][d]] = s;
    }
  std::string letters;
  for (auto [c, s] : size) letters += c;
  Shape oshape;
  for (char c : out) oshape.push_back(size[c]);
  Tensor result = zeros(oshape, kFloat64);
  std::vector<std::vector<double>> vals;
  for (const Tensor& t : ops) vals.push_back(t.to_vector<double>());
  std::vector<Shape> strides;
  for (const Tensor& t : ops) strides.push_back(contiguous_strides(t.shape()));
  std::vector<double> acc(size_t(numel_of(oshape)), 0.0);
  std::map<char, int64_t> idx;
  for (char c : letters) idx[c] = 0;
  // Odometer over every letter's range.
  while (true) {
    double prod = 1;
    for (size_t k = 0; k < ops.size(); ++k) {
      int64_t off = 0;
      for (size_t d = 0; d < terms[k].size(); ++d) off += (ops[k].shape()[d] == 1 ? 0 : idx[terms[k][d]]) * strides[k][d];
      prod *= vals[k][size_t(off)];
    }
    int64_t o = 0;
    for (char c : out) o = o * size[c] + idx[c];
    acc[size_t(o)] += prod;
    size_t pos = 0;
    for (; pos < letters.size(); ++pos) {
      char c = letters[pos];
      if (++idx[c] < size[c]) break;
      idx[c] = 0;
    }
    if (pos == letters.size()) break;
  }
  return from_vector(acc, oshape);
}

// ---------------------------------------------------------------- random specs
struct RandomCase {
  std::string spec;
  std::vector<Tensor> ops;
};

RandomCase random_case(std::mt19937& rng) {
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  std::string pool = "abcdefg";
  std::map<char, int64_t> size;
  for (char c : pool) size[c] = pick(1, 4);
  int n_ops = pick(1, 4);
  bool use_ell = pick(0, 3) == 0;
  int ell_rank = use_ell ? pick(0, 2) : 0;
  Shape ell_shape;
  for (int e = 0; e < ell_rank; ++e) ell_shape.push_back(pick(1, 3));
  RandomCase rc;
  std::vector<std::string> terms;
  std::set<char> used;
  for (int k = 0; k < n_ops; ++k) {
    std::string t;
    int n = pick(0, 4);
    for (int i = 0; i < n; ++i) {
      char c = pool[size_t(pick(0, int(pool.size()) - 1))];
      t += c;  // repeats allowed: diagonals
      used.insert(c);
    }
    Shape shape;
    std::string term = t;
    if (use_ell) {
      size_t at = size_t(pick(0, int(t.size())));
      term = t.substr(0, at) + "..." + t.substr(at);
      int r = pick(0, ell_rank);  // this operand's share of the ellipsis dims (right-aligned)
      for (size_t i = 0; i < at; ++i) shape.push_back(size[t[i]]);
      for (int e = ell_rank - r; e < ell_rank; ++e) shape.push_back(pick(0, 2) == 0 ? 1 : ell_shape[size_t(e)]);
      for (size_t i = at; i < t.size(); ++i) shape.push_back(size[t[i]]);
    } else {
      for (char c : t) shape.push_back(size[c]);
    }
    // Sometimes a size-1 dim that broadcasts against the letter's size elsewhere.
    for (size_t d = 0; d < shape.size(); ++d)
      if (pick(0, 9) == 0 && !use_ell && std::count(t.begin(), t.end(), t[d]) == 1) shape[d] = 1;
    terms.push_back(term);
    rc.ops.push_back(randn(shape, kFloat64));
  }
  for (int k = 0; k < n_ops; ++k) rc.spec += (k ? "," : "") + terms[size_t(k)];
  bool blank = rc.spec.find_first_not_of(',') == std::string::npos;
  if (blank || pick(0, 2) > 0) {  // explicit output (always for a spec with no letters: "" is an error): a random subset of the used letters, shuffled
    std::string out;
    for (char c : used)
      if (pick(0, 1)) out += c;
    std::shuffle(out.begin(), out.end(), rng);
    if (use_ell) {
      size_t at = size_t(pick(0, int(out.size())));
      out = out.substr(0, at) + "..." + out.substr(at);
    }
    rc.spec += "->" + out;
  }
  return rc;
}

}  // namespace

TEST_CASE("einsum equals the brute-force evaluator on 300 random specs") {
  std::mt19937 rng(1234);
  manual_seed(99);
  for (int i = 0; i < 300; ++i) {
    RandomCase rc = random_case(rng);
    std::string shapes;
    for (auto& t : rc.ops) shapes += shape_str(t.shape()) + " ";
    INFO("spec \"" << rc.spec << "\" shapes " << shapes);
    Tensor ref = brute_einsum(rc.spec, rc.ops);
    Tensor got = einsum(rc.spec, rc.ops);
    REQUIRE(got.shape() == ref.shape());
    CHECK(max_abs_diff(got, ref) <= 1e-10 * (1 + ref.abs().sum().item()));
  }
}

// Integer operands (no GEMM kernel takes them) are contracted as broadcast products,
// exactly: the 300 random specs again on small integers, against the brute-force sums in
// double (exact at these magnitudes), the result in the operands' dtype as torch's.
TEST_CASE("einsum of int64 and int32 operands equals the brute-force sums exactly, in their dtype") {
  std::mt19937 rng(1234);
  manual_seed(99);
  for (int i = 0; i < 300; ++i) {
    RandomCase rc = random_case(rng);
    for (DType dt : {kInt64, kInt32}) {
      std::vector<Tensor> ints, as_double;
      for (const Tensor& t : rc.ops) {
        ints.push_back((t * 20.0).to(dt));  // integers (truncated) in about [-80, 80]
        as_double.push_back(ints.back().to(kFloat64));
      }
      INFO("spec \"" << rc.spec << "\" " << dtype_name(dt));
      const Tensor ref = brute_einsum(rc.spec, as_double);
      const Tensor got = einsum(rc.spec, ints);
      REQUIRE(got.shape() == ref.shape());
      CHECK(got.dtype() == dt);
      CHECK(got.to(kFloat64).to_vector<double>() == ref.to_vector<double>());
    }
  }
  // The products held at once are bounded, and the bound is named.
  CHECK_THROWS_MU(einsum("ij,jk->ik", {zeros({1024, 1024}, kInt64), zeros({1024, 1024}, kInt64)}),
                  "einsum: int64 operands are contracted as broadcast products, here 1073741824 of them");
  CHECK_THROWS_MU(einsum("ij,jk->ik", {zeros({2, 3}, kBool), zeros({3, 2}, kBool)}),
                  "einsum: bool operands are not supported (\"ij,jk->ik\")");
}

TEST_CASE("einsum: named cases of every feature") {
  manual_seed(5);
  Tensor a = randn({3, 4}, kFloat64), b = randn({4, 5}, kFloat64), sq = randn({4, 4}, kFloat64);
  Tensor v = randn({4}, kFloat64), bt = randn({2, 3, 4}, kFloat64);
  auto same = [](const std::string& spec, const std::vector<Tensor>& ops) {
    INFO(spec);
    Tensor got = einsum(spec, ops), ref = brute_einsum(spec, ops);
    REQUIRE(got.shape() == ref.shape());
    CHECK(max_abs_diff(got, ref) < 1e-12);
  };
  same("ij,jk->ik", {a, b});
  same("ij,jk", {a, b});        // implicit output: i, k
  same("ji,jk", {a.t(), b});    // transposed (non-contiguous) operand
  same("ii->i", {sq});          // diagonal
  same("ii", {sq});             // trace
  same("ij->", {a});            // full sum
  same("ij->ji", {a});          // transpose
  same("i,i->", {v, v});        // dot
  same("i,j->ij", {v, v});      // outer
  same("bij,jk->bik", {bt, b});
  same("...j,jk->...k", {bt, b});
  same("b...,b...->b", {bt, bt});
  same("...ij,...jk", {bt, randn({2, 4, 3}, kFloat64)});
  same("ij,ij,ij->ij", {a, a, a});  // Hadamard of three
  same("i,i,i,i->", {v, v, v, v});
  same("ab,bc,cd,de,ef->af", {randn({2, 3}, kFloat64), randn({3, 4}, kFloat64), randn({4, 2}, kFloat64),
                              randn({2, 3}, kFloat64), randn({3, 2}, kFloat64)});
  // size-1 broadcasting of a letter
  same("ij,ij->ij", {randn({3, 1}, kFloat64), randn({3, 5}, kFloat64)});
  // spaces are ignored in character mode
  CHECK(max_abs_diff(einsum(" ij , jk -> ik ", {a, b}), einsum("ij,jk->ik", {a, b})) == 0);
}

TEST_CASE("einsum: einops-style multi-character axis names") {
  manual_seed(6);
  Tensor z = randn({2, 3, 5}, kFloat64), u = randn({5, 4}, kFloat64);
  Tensor got = einsum("b t n1, n1 r -> b t r", {z, u});
  CHECK(max_abs_diff(got, brute_einsum("btn,nr->btr", {z, u})) < 1e-12);
  Tensor w = randn({4, 6}, kFloat64);
  CHECK(max_abs_diff(einsum("batch tok rank, rank out -> batch tok out", {einsum("b t n1, n1 r -> b t r", {z, u}), w}),
                     brute_einsum("btn,nr,ro->bto", {z, u, w})) < 1e-12);
  // single-letter names with spaces read the same in both modes
  CHECK(max_abs_diff(einsum("i j, j k -> i k", {u, w}), einsum("ij,jk->ik", {u, w})) == 0);
}

TEST_CASE("einsum matches matmul and the GEMM path on float32 too") {
  manual_seed(7);
  Tensor x = randn({64, 48}), y = randn({48, 33});
  CHECK(max_abs_diff(einsum("ik,kj->ij", {x, y}), x.matmul(y)) < 1e-4);
  Tensor bx = randn({5, 16, 8}), by = randn({5, 8, 9});
  CHECK(max_abs_diff(einsum("bik,bkj->bij", {bx, by}), bmm(bx, by)) < 1e-5);
}

TEST_CASE("einsum_path: order, FLOPs and largest intermediate") {
  // (10x20)(20x30)(30x5): left-to-right costs 10*20*30 + 10*30*5 = 7500, right first
  // costs 20*30*5 + 10*20*5 = 4000: the planner takes the right pair first.
  EinsumPath p = einsum_path("ij,jk,kl->il", {{10, 20}, {20, 30}, {30, 5}});
  CHECK(p.exhaustive);
  REQUIRE(p.steps.size() == 2);
  CHECK(p.steps[0] == std::pair<int, int>{1, 2});
  CHECK(p.flops == 4000);
  CHECK(p.largest_intermediate == 20 * 5);
  CHECK(p.naive_flops == 10.0 * 20 * 30 * 5 * 2);
  // The CP layer: (bn,nr) then (bi,ir), Hadamard, then (or): 2*(b*n*r... ) hand count
  int64_t B = 8, N = 16, I = 32, R = 12, O = 10;
  EinsumPath cp = einsum_path("bn,nr,bi,ir,or->bo", {{B, N}, {N, R}, {B, I}, {I, R}, {O, R}});
  CHECK(cp.flops == double(B * N * R + B * I * R + B * R + B * R * O));
  CHECK(cp.largest_intermediate == double(B * R));
  // A private letter summed first counts one add per element.
  EinsumPath priv = einsum_path("ij,jk->k", {{7, 3}, {3, 4}});
  CHECK(priv.flops == 7 * 3 + 3 * 4);
}

namespace {

// The cheapest multiply-add count of a chain of matrices p[0] x p[1], p[1] x p[2], ...:
// the textbook O(n^3) dynamic programme over chain intervals.
double matrix_chain_cost(const std::vector<int64_t>& p) {
  const size_t n = p.size() - 1;
  std::vector<std::vector<double>> m(n, std::vector<double>(n, 0));
  for (size_t len = 2; len <= n; ++len)
    for (size_t i = 0; i + len - 1 < n; ++i) {
      const size_t j = i + len - 1;
      m[i][j] = std::numeric_limits<double>::infinity();
      for (size_t k = i; k < j; ++k)
        m[i][j] = std::min(m[i][j], m[i][k] + m[k + 1][j] + double(p[i]) * double(p[k + 1]) * double(p[j + 1]));
    }
  return m[0][n - 1];
}

// "ab,bc,...->a?" over a chain of matrices with sizes p.
std::pair<std::string, std::vector<Shape>> chain_spec(const std::vector<int64_t>& p) {
  std::string spec;
  std::vector<Shape> shapes;
  for (size_t k = 0; k + 1 < p.size(); ++k) {
    spec += (k ? "," : "") + std::string(1, char('a' + k)) + char('a' + k + 1);
    shapes.push_back({p[k], p[k + 1]});
  }
  spec += std::string("->") + 'a' + char('a' + p.size() - 1);
  return {spec, shapes};
}

}  // namespace

TEST_CASE("einsum_path: up to 12 operands the cheapest order, as the matrix-chain programme finds it") {
  // Irregular sizes, so that the cheapest order is neither left- nor right-first.
  for (const std::vector<int64_t>& p : {std::vector<int64_t>{30, 35, 15, 5, 10, 20, 25},
                                        {40, 20, 30, 10, 30, 5, 60, 8, 12},
                                        {5, 60, 3, 70, 2, 80, 9, 40, 6, 50, 4, 30, 7}}) {
    auto [spec, shapes] = chain_spec(p);
    INFO(spec);
    EinsumPath path = einsum_path(spec, shapes);
    CHECK(path.exhaustive);
    CHECK(path.steps.size() == shapes.size() - 1);
    CHECK(path.flops == matrix_chain_cost(p));
  }
  // The einsum runs that plan: the chain's product equals the matrices multiplied in turn.
  manual_seed(2);
  std::vector<int64_t> p{6, 9, 4, 7, 3, 8, 5};
  auto [spec, shapes] = chain_spec(p);
  std::vector<Tensor> ms;
  for (const Shape& s : shapes) ms.push_back(randn(s, kFloat64));
  Tensor want = ms[0];
  for (size_t k = 1; k < ms.size(); ++k) want = want.matmul(ms[k]);
  CHECK(max_abs_diff(einsum(spec, ms), want) < 1e-10);
  // Past 12 operands: greedy, a valid plan, never cheaper than the optimum.
  std::vector<int64_t> q{5, 60, 3, 70, 2, 80, 9, 40, 6, 50, 4, 30, 7, 20, 11};
  auto [long_spec, long_shapes] = chain_spec(q);
  EinsumPath many = einsum_path(long_spec, long_shapes);
  CHECK(!many.exhaustive);
  CHECK(many.steps.size() == long_shapes.size() - 1);
  CHECK(many.flops >= matrix_chain_cost(q));
  CHECK(many.str().find("greedy") != std::string::npos);
}

TEST_CASE("gradcheck: 20+ specs, including the papers' contractions") {
  manual_seed(8);
  auto g = [](const std::string& spec, const std::vector<Shape>& shapes) {
    TensorList in;
    for (const Shape& s : shapes) in.push_back(randn(s, kFloat64));
    INFO(spec);
    CHECK_GRAD([spec](const TensorList& t) { return einsum(spec, t); }, in);
  };
  const int64_t B = 3, I = 4, O = 3, N = 3, M = 2, P = 2, R = 3;
  g("ij,jk->ik", {{3, 4}, {4, 2}});
  g("bij,bjk->bik", {{2, 3, 4}, {2, 4, 2}});
  g("ii->i", {{3, 3}});
  g("ii", {{3, 3}});
  g("iij->j", {{2, 2, 3}});
  g("ij->", {{3, 4}});
  g("i,j->ij", {{3}, {4}});
  g("...ij,...jk->...ik", {{2, 3, 4}, {4, 2}});
  g("ij,ij->ij", {{3, 1}, {3, 4}});  // broadcast size-1 letter
  g("btr,btr,or->bto", {{2, 3, 4}, {2, 3, 4}, {5, 4}});
  g("b t n1, n1 r -> b t r", {{2, 3, 4}, {4, 2}});
  // CP muMoE, one level: y = U_O((U_N^T a) * (U_I^T z))
  g("bn,nr,bi,ir,or->bo", {{B, N}, {N, R}, {B, I}, {I, R}, {O, R}});
  // CP, two and three levels of experts
  g("bn,nr,bm,mr,bi,ir,or->bo", {{B, N}, {N, R}, {B, M}, {M, R}, {B, I}, {I, R}, {O, R}});
  g("bn,nr,bm,mr,bp,pr,bi,ir,or->bo", {{B, N}, {N, R}, {B, M}, {M, R}, {B, P}, {P, R}, {B, I}, {I, R}, {O, R}});
  // TR, one level: cores U1 (R1,N,R2), U_I (R2,I,R3), U_O (R3,O,R1)
  g("bn,anc,bi,cid,doa->bo", {{B, N}, {2, N, 3}, {B, I}, {3, I, 2}, {2, O, 2}});
  // TR, two levels: U1 (R1,N,R2), U2 (R2,M,R3), U_I (R3,I,R4), U_O (R4,O,R1)
  g("bn,anc,bm,cme,bi,eid,doa->bo", {{B, N}, {2, N, 2}, {B, M}, {2, M, 3}, {B, I}, {3, I, 2}, {2, O, 2}});
  // TR, three levels: U1 (R1,N,R2), U2 (R2,M,R3), U3 (R3,P,R4), U_I (R4,I,R5), U_O (R5,O,R1)
  g("bn,anc,bm,cme,bp,epf,bi,fid,doa->bo",
    {{B, N}, {2, N, 2}, {B, M}, {2, M, 2}, {B, P}, {2, P, 2}, {B, I}, {2, I, 2}, {2, O, 2}});
  // TT (R1 = 1): same ring with a size-1 closing rank
  g("bn,anc,bi,cid,doa->bo", {{B, N}, {1, N, 3}, {B, I}, {3, I, 2}, {2, O, 1}});
  // Tucker: core Z (R_O, R_I, R_N), factors G_I (I,R_I), G_N (N,R_N), G_O (O,R_O)
  g("bi,ij,bn,nk,ol,ljk->bo", {{B, I}, {I, 2}, {B, N}, {N, 3}, {O, 2}, {2, 2, 3}});
  // Tucker with two expert modes
  g("bi,ij,bn,nk,bm,mq,ol,ljkq->bo", {{B, I}, {I, 2}, {B, N}, {N, 2}, {B, M}, {M, 2}, {O, 2}, {2, 2, 2, 2}});
  // dense (materialised) MoE: W (N, I, O)
  g("bn,bi,nio->bo", {{B, N}, {B, I}, {N, I, O}});
  // dense hierarchical with two levels
  g("bn,bm,bi,nmio->bo", {{B, N}, {B, M}, {B, I}, {N, M, I, O}});
  // Hadamard / MxD: y = (C^T a) * (D^T z)
  g("bn,no,bi,io->bo", {{B, N}, {N, O}, {B, I}, {I, O}});
  // with token dims, as the layers use them
  g("btn,nr,bti,ir,or->bto", {{2, 2, N}, {N, R}, {2, 2, I}, {I, R}, {O, R}});
}

TEST_CASE("bad specs raise mu::Error naming the problem") {
  Tensor a = ones({2, 3}), b = ones({3, 4});
  CHECK_THROWS_MU(einsum("", {}), "empty spec");
  CHECK_THROWS_MU(einsum("   ", {a}), "empty spec");
  CHECK_THROWS_MU(einsum("ij,jk->iz", {a, b}), "output letter 'z' (position 8)");
  CHECK_THROWS_MU(einsum("ij,jk->ik", {a, ones({4, 4})}), "letter 'j'");
  CHECK_THROWS_MU(einsum("ij,jk->ik", {a, ones({4, 4})}), "size 4");
  // Both places of a size conflict: where the letter got its size, and where it disagrees.
  CHECK_THROWS_MU(einsum("ij,jk->ik", {a, ones({4, 4})}),
                  "letter 'j' (position 3) has size 4 in operand 1 dim 0 but size 3 in operand 0 dim 1");
  CHECK_THROWS_MU(einsum("ij,jk->ik", {a}), "2 operand terms but 1 operand was given");
  CHECK_THROWS_MU(einsum("ij->ik", {a, b}), "1 operand term but 2 operands were given");
  CHECK_THROWS_MU(einsum("i..j,jk->ik", {a, b}), "not part of an ellipsis");
  CHECK_THROWS_MU(einsum("...i...,ij->j", {a, b}), "more than one ellipsis");
  CHECK_THROWS_MU(einsum("ijk,jk->ik", {a, b}), "operand 0 has 2 dims");
  CHECK_THROWS_MU(einsum("ij,jk->ii", {a, b}), "appears more than once");
  CHECK_THROWS_MU(einsum("i#,jk->ik", {a, b}), "invalid character '#' at position 1");
  // A byte of a UTF-8 letter is shown in hex, not printed alone as half a character.
  CHECK_THROWS_MU(einsum("i\xc3\xa9,jk->ik", {a, b}), "invalid character byte 0xC3 at position 1");
  CHECK_THROWS_MU(einsum("ij->i->j", {a}), "more than one '->'");
  CHECK_THROWS_MU(einsum("ij,jk->ik", {a, ones({3, 4}, kFloat64)}), "dtype");
  CHECK_THROWS_MU(einsum("ii->i", {a}), "repeated in operand 0 with sizes 2 and 3");
  CHECK_THROWS_MU(einsum("b t 1n, n r -> b t r", {ones({2, 3, 4}), ones({4, 5})}), "must start with a letter");
}

TEST_CASE("1,000 random strings and shapes: errors are mu::Error, nothing crashes or hangs") {
  std::mt19937 rng(77);
  const std::string alphabet = "abcij.,->  ...#1A";
  int errors = 0, ok = 0;
  for (int i = 0; i < 1000; ++i) {
    std::string spec;
    int len = std::uniform_int_distribution<int>(0, 14)(rng);
    for (int c = 0; c < len; ++c) spec += alphabet[size_t(std::uniform_int_distribution<int>(0, int(alphabet.size()) - 1)(rng))];
    int n_ops = std::uniform_int_distribution<int>(0, 3)(rng);
    std::vector<Tensor> ops;
    for (int k = 0; k < n_ops; ++k) {
      Shape s;
      int nd = std::uniform_int_distribution<int>(0, 4)(rng);
      for (int d = 0; d < nd; ++d) s.push_back(std::uniform_int_distribution<int>(1, 3)(rng));
      ops.push_back(ones(s));
    }
    try {
      Tensor r = einsum(spec, ops);
      CHECK(r.defined());
      ++ok;
    } catch (const mu::Error&) {
      ++errors;
    }
  }
  // Both kinds occur, so the generator exercises the parser's error paths and its success path.
  CHECK(errors > 0);
  CHECK(ok > 0);
}
