// The tensor-algebra toolkit against independent brute-force loops in double: mode-n
// products on every mode of 3- and 4-way tensors, unfold/fold placement by the
// Kolda–Bader index formula, Khatri–Rao and Kronecker products, CP / TR / TT / Tucker
// reconstruction, singular values and numerical rank; then gradcheck of each
// differentiable function and the error messages.
#include <cmath>
#include <functional>

#include "helpers.h"
#include "ops/einsum.h"
#include "ops/tensor_algebra.h"

using namespace mu;
using namespace mu::tensor_algebra;
using autograd::TensorList;

namespace {

Tensor r(const Shape& s) { return randn(s, kFloat64); }

// Calls f on every multi-index of `shape`, last index fastest.
void for_each_index(const Shape& shape, const std::function<void(const Shape&)>& f) {
  for (int64_t s : shape)
    if (s == 0) return;
  Shape idx(shape.size(), 0);
  while (true) {
    f(idx);
    int64_t d = int64_t(shape.size()) - 1;
    // Odometer: bump the last index, carrying into earlier ones.
    while (d >= 0 && ++idx[size_t(d)] == shape[size_t(d)]) idx[size_t(d--)] = 0;
    if (d < 0) return;
  }
}

// Row-major position of idx in a dense tensor of `shape`.
int64_t offset(const Shape& shape, const Shape& idx) {
  int64_t o = 0;
  for (size_t d = 0; d < shape.size(); ++d) o = o * shape[d] + idx[d];
  return o;
}

// A dense host copy of a tensor, indexed by multi-index.
struct Host {
  Shape shape;
  std::vector<double> v;
  explicit Host(const Tensor& t) : shape(t.shape()), v(t.to_vector<double>()) {}
  double operator()(const Shape& idx) const { return v[size_t(offset(shape, idx))]; }
};

// Brute-force X ×ₙ M: y[…, j, …] = Σ_k M[j, k] x[…, k, …].
Tensor mode_product_loops(const Tensor& x, const Tensor& m, int64_t n) {
  Host X(x), M(m);
  Shape out = x.shape();
  out[size_t(n)] = m.size(0);
  std::vector<double> y(size_t(numel_of(out)), 0.0);
  for_each_index(out, [&](const Shape& i) {
    Shape xi = i;
    double s = 0;
    for (int64_t k = 0; k < x.size(n); ++k) {
      xi[size_t(n)] = k;
      s += M({i[size_t(n)], k}) * X(xi);
    }
    y[size_t(offset(out, i))] = s;
  });
  return from_vector(y, out, kFloat64);
}

// Brute-force X ×ₙ v: the mode is summed away.
Tensor mode_vec_loops(const Tensor& x, const Tensor& v, int64_t n) {
  Host X(x), V(v);
  Shape out;
  for (int64_t d = 0; d < x.dim(); ++d)
    if (d != n) out.push_back(x.size(d));
  std::vector<double> y(size_t(numel_of(out)), 0.0);
  for_each_index(out, [&](const Shape& i) {
    Shape xi = i;
    xi.insert(xi.begin() + n, 0);  // put mode n back into the index
    double s = 0;
    for (int64_t k = 0; k < x.size(n); ++k) {
      xi[size_t(n)] = k;
      s += V({k}) * X(xi);
    }
    y[size_t(offset(out, i))] = s;
  });
  return from_vector(y, out, kFloat64);
}

// Kolda–Bader column of element i in the mode-n unfolding: Σ_{k≠n} i_k J_k with
// J_k = Π_{m<k, m≠n} I_m.
int64_t kb_column(const Shape& shape, const Shape& i, int64_t n) {
  int64_t col = 0;
  for (int64_t k = 0; k < int64_t(shape.size()); ++k) {
    if (k == n) continue;
    int64_t Jk = 1;
    for (int64_t m = 0; m < k; ++m)
      if (m != n) Jk *= shape[size_t(m)];
    col += i[size_t(k)] * Jk;
  }
  return col;
}

// Product of two dense row-major matrices, a (p × q) and b (q × s), by triple loop.
std::vector<double> matmul_loops(const std::vector<double>& a, const std::vector<double>& b, int64_t p, int64_t q,
                                 int64_t s) {
  std::vector<double> c(size_t(p * s), 0.0);
  for (int64_t i = 0; i < p; ++i)
    for (int64_t j = 0; j < s; ++j)
      for (int64_t k = 0; k < q; ++k) c[size_t(i * s + j)] += a[size_t(i * q + k)] * b[size_t(k * s + j)];
  return c;
}

// Brute-force tensor ring: each element is the trace of the product of its slices.
Tensor tr_loops(const std::vector<Tensor>& cores) {
  std::vector<Host> U;
  Shape out;
  for (const Tensor& c : cores) {
    U.emplace_back(c);
    out.push_back(c.size(1));
  }
  std::vector<double> y(size_t(numel_of(out)), 0.0);
  for_each_index(out, [&](const Shape& i) {
    // prod starts as the R_0 x R_0 identity and is multiplied slice by slice.
    const int64_t r0 = cores[0].size(0);
    std::vector<double> prod(size_t(r0 * r0), 0.0);
    for (int64_t a = 0; a < r0; ++a) prod[size_t(a * r0 + a)] = 1;
    int64_t cur = r0;
    for (size_t k = 0; k < cores.size(); ++k) {
      const int64_t rk = cores[k].size(0), rn = cores[k].size(2);
      std::vector<double> slice(size_t(rk * rn));
      for (int64_t a = 0; a < rk; ++a)
        for (int64_t b = 0; b < rn; ++b) slice[size_t(a * rn + b)] = U[k]({a, i[k], b});
      prod = matmul_loops(prod, slice, r0, cur, rn);
      cur = rn;
    }
    double tr = 0;
    for (int64_t a = 0; a < r0; ++a) tr += prod[size_t(a * r0 + a)];
    y[size_t(offset(out, i))] = tr;
  });
  return from_vector(y, out, kFloat64);
}

// An n x n Householder reflector I - 2 v vᵀ / (vᵀ v), orthogonal by construction.
Tensor householder(int64_t n) {
  std::vector<double> v = r({n}).to_vector<double>();
  double vv = 0;
  for (double e : v) vv += e * e;
  std::vector<double> h(size_t(n * n));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) h[size_t(i * n + j)] = (i == j ? 1.0 : 0.0) - 2 * v[size_t(i)] * v[size_t(j)] / vv;
  return from_vector(h, {n, n}, kFloat64);
}

// U diag(s) Vᵀ with U (m x m) and V (n x n) orthogonal (products of two reflectors, so
// neither is symmetric) and s placed on the first min(m, n) diagonal entries.
Tensor with_singular_values(int64_t m, int64_t n, const std::vector<double>& s) {
  std::vector<double> d(size_t(m * n), 0.0);
  for (size_t k = 0; k < s.size(); ++k) d[k * size_t(n) + k] = s[k];
  Tensor U = mm(householder(m), householder(m)), V = mm(householder(n), householder(n));
  return mm(mm(U, from_vector(d, {m, n}, kFloat64)), V.t());
}

const double kTol = 1e-12;

}  // namespace

// ---------------------------------------------------------------- mode-n products

TEST_CASE("mode_n_product on every mode of 3- and 4-way tensors matches loops") {
  manual_seed(1);
  for (const Shape& shape : {Shape{3, 4, 5}, Shape{2, 3, 4, 5}}) {
    Tensor x = r(shape);
    for (int64_t n = 0; n < x.dim(); ++n) {
      INFO("shape " << shape_str(shape) << " mode " << n);
      Tensor m = r({6, x.size(n)});
      Tensor y = mode_n_product(x, m, n);
      Shape expect = shape;
      expect[size_t(n)] = 6;
      CHECK(y.shape() == expect);
      CHECK(max_abs_diff(y, mode_product_loops(x, m, n)) < kTol);
      // A negative mode counts from the end.
      CHECK(max_abs_diff(mode_n_product(x, m, n - x.dim()), y) == 0);

      Tensor v = r({x.size(n)});
      Tensor yv = mode_n_product_vec(x, v, n);
      CHECK(yv.dim() == x.dim() - 1);
      CHECK(max_abs_diff(yv, mode_vec_loops(x, v, n)) < kTol);
    }
  }
  // A 1-way tensor: the product is M · x, the vector form a dot product.
  Tensor x = r({5}), m = r({3, 5}), v = r({5});
  CHECK(max_abs_diff(mode_n_product(x, m, 0), mode_product_loops(x, m, 0)) < kTol);
  CHECK(max_abs_diff(mode_n_product_vec(x, v, 0), mode_vec_loops(x, v, 0)) < kTol);
  // Non-contiguous inputs give the same values.
  Tensor xt = r({5, 4, 3}).permute({2, 1, 0});
  Tensor mt = r({4, 6}).t();
  CHECK(max_abs_diff(mode_n_product(xt, mt, 1), mode_product_loops(xt.contiguous(), mt.contiguous(), 1)) < kTol);
}

TEST_CASE("multi_mode_product applies matrices and vectors on the original modes") {
  manual_seed(2);
  Tensor x = r({3, 4, 5, 2});
  Tensor v0 = r({3}), m2 = r({6, 5}), v3 = r({2}), m1 = r({7, 4});
  // Given out of order: the vector on mode 0 removes a mode before modes 1 and 2 are reached.
  Tensor y = multi_mode_product(x, {m2, v0, v3, m1}, {2, 0, 3, 1});
  CHECK(y.shape() == Shape{7, 6});
  // Brute force: y[a, b] = Σ_{i,j,k,l} v0[i] m1[a, j] m2[b, k] v3[l] x[i, j, k, l].
  Host X(x), V0(v0), M1(m1), M2(m2), V3(v3);
  std::vector<double> expect(7 * 6, 0.0);
  for (int64_t a = 0; a < 7; ++a)
    for (int64_t b = 0; b < 6; ++b)
      for_each_index(x.shape(), [&](const Shape& i) {
        expect[size_t(a * 6 + b)] += V0({i[0]}) * M1({a, i[1]}) * M2({b, i[2]}) * V3({i[3]}) * X(i);
      });
  CHECK(max_abs_diff(y, from_vector(expect, {7, 6}, kFloat64)) < kTol);
  // Default modes 0, 1, …: the same as chaining mode_n_product by hand.
  Tensor a = r({2, 3}), b = r({3, 4});
  Tensor chain = mode_n_product(mode_n_product(x, a, 0), b, 1);
  CHECK(max_abs_diff(multi_mode_product(x, {a, b}), chain) < kTol);
}

// ---------------------------------------------------------------- unfold / fold

TEST_CASE("unfold places elements by the Kolda-Bader formula and fold inverts it") {
  manual_seed(3);
  for (const Shape& shape : {Shape{3, 4, 5}, Shape{2, 3, 4, 5}}) {
    Tensor x = r(shape);
    Host X(x);
    for (int64_t n = 0; n < x.dim(); ++n) {
      INFO("shape " << shape_str(shape) << " mode " << n);
      Tensor u = unfold(x, n);
      CHECK(u.shape() == Shape{shape[size_t(n)], x.numel() / shape[size_t(n)]});
      Host U(u);
      int64_t wrong = 0;
      for_each_index(shape, [&](const Shape& i) {
        wrong += U({i[size_t(n)], kb_column(shape, i, n)}) != X(i) ? 1 : 0;
      });
      CHECK(wrong == 0);
      // Round trips, both ways, are exact (only data movement).
      CHECK(max_abs_diff(fold(u, n, shape), x) == 0);
      Tensor m = r(u.shape());
      CHECK(max_abs_diff(unfold(fold(m, n, shape), n), m) == 0);
    }
  }
  // The 3-way case written out: X_(1) column j + k·J holds X[:, j, k] (first remaining fastest).
  Tensor x = r({2, 3, 4});
  Tensor u = unfold(x, 0);
  CHECK(u.at({1, 2 + 1 * 3}) == x.at({1, 2, 1}));
  CHECK(unfold(x, 1).at({2, 1 + 3 * 2}) == x.at({1, 2, 3}));
  CHECK(unfold(x, 2).at({3, 1 + 2 * 2}) == x.at({1, 2, 3}));
}

TEST_CASE("unfold of a mode-n product is the matrix times the unfolding") {
  manual_seed(4);
  for (const Shape& shape : {Shape{3, 4, 5}, Shape{2, 3, 4, 5}}) {
    Tensor x = r(shape);
    for (int64_t n = 0; n < x.dim(); ++n) {
      INFO("shape " << shape_str(shape) << " mode " << n);
      Tensor m = r({4, x.size(n)});
      CHECK(max_abs_diff(unfold(mode_n_product(x, m, n), n), mm(m, unfold(x, n))) < kTol);
    }
  }
}

// ---------------------------------------------------------------- Khatri–Rao, Kronecker

TEST_CASE("khatri_rao and kron match loops") {
  manual_seed(5);
  Tensor A = r({3, 4}), B = r({5, 4}), C = r({2, 4});
  Host HA(A), HB(B), HC(C);
  Tensor ab = khatri_rao({A, B});
  REQUIRE(ab.shape() == Shape{15, 4});
  Host AB(ab);
  double err = 0;
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 5; ++j)
      for (int64_t c = 0; c < 4; ++c) err = std::max(err, std::abs(AB({i * 5 + j, c}) - HA({i, c}) * HB({j, c})));
  CHECK(err < kTol);
  Tensor abc = khatri_rao({A, B, C});
  REQUIRE(abc.shape() == Shape{30, 4});
  Host ABC(abc);
  err = 0;
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 5; ++j)
      for (int64_t k = 0; k < 2; ++k)
        for (int64_t c = 0; c < 4; ++c)
          err = std::max(err, std::abs(ABC({(i * 5 + j) * 2 + k, c}) - HA({i, c}) * HB({j, c}) * HC({k, c})));
  CHECK(err < kTol);
  // One matrix: itself.
  CHECK(max_abs_diff(khatri_rao({A}), A) == 0);

  Tensor P = r({2, 3}), Q = r({4, 5});
  Tensor pq = kron(P, Q);
  REQUIRE(pq.shape() == Shape{8, 15});
  Host HP(P), HQ(Q), PQ(pq);
  err = 0;
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 4; ++j)
      for (int64_t k = 0; k < 3; ++k)
        for (int64_t l = 0; l < 5; ++l) err = std::max(err, std::abs(PQ({i * 4 + j, k * 5 + l}) - HP({i, k}) * HQ({j, l})));
  CHECK(err < kTol);
  // Vectors, and a vector with a matrix (promoted to a 1-row matrix, as torch.kron).
  Tensor u = r({3}), w = r({2});
  Host U(u), W(w);
  Tensor uw = kron(u, w);
  REQUIRE(uw.shape() == Shape{6});
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 2; ++j) CHECK(std::abs(uw.at({i * 2 + j}) - U({i}) * W({j})) < kTol);
  Tensor uq = kron(u, Q);
  REQUIRE(uq.shape() == Shape{4, 15});
  for (int64_t j = 0; j < 4; ++j)
    for (int64_t k = 0; k < 3; ++k)
      for (int64_t l = 0; l < 5; ++l) CHECK(std::abs(uq.at({j, k * 5 + l}) - U({k}) * HQ({j, l})) < kTol);
}

// ---------------------------------------------------------------- reconstruction

TEST_CASE("cp_to_tensor matches the sum of outer products") {
  manual_seed(6);
  for (const Shape& shape : {Shape{3, 4, 5}, Shape{2, 3, 4, 5}}) {
    const int64_t R = 3;
    std::vector<Tensor> f;
    std::vector<Host> F;
    for (int64_t s : shape) {
      f.push_back(r({s, R}));
      F.emplace_back(f.back());
    }
    Tensor w = r({R});
    Host HW(w);
    for (bool weighted : {false, true}) {
      INFO("shape " << shape_str(shape) << (weighted ? " weighted" : ""));
      std::vector<double> expect(size_t(numel_of(shape)), 0.0);
      for_each_index(shape, [&](const Shape& i) {
        double s = 0;
        for (int64_t c = 0; c < R; ++c) {
          double term = weighted ? HW({c}) : 1.0;
          for (size_t k = 0; k < shape.size(); ++k) term *= F[k]({i[k], c});
          s += term;
        }
        expect[size_t(offset(shape, i))] = s;
      });
      Tensor x = weighted ? cp_to_tensor(f, w) : cp_to_tensor(f);
      CHECK(x.shape() == shape);
      CHECK(max_abs_diff(x, from_vector(expect, shape, kFloat64)) < kTol);
    }
  }
  // One factor: the row sums (weighted).
  Tensor a = r({4, 3}), w = r({3});
  CHECK(max_abs_diff(cp_to_tensor({a}, w), matmul(a, w)) < kTol);
}

TEST_CASE("tr_to_tensor and tt_to_tensor match traces of slice products") {
  manual_seed(7);
  // Ring ranks differ per edge, and the last edge closes back to R_0 = 2.
  std::vector<Tensor> ring = {r({2, 3, 3}), r({3, 4, 4}), r({4, 5, 2})};
  Tensor x = tr_to_tensor(ring);
  CHECK(x.shape() == Shape{3, 4, 5});
  CHECK(max_abs_diff(x, tr_loops(ring)) < kTol);
  std::vector<Tensor> ring4 = {r({3, 2, 2}), r({2, 3, 4}), r({4, 2, 1}), r({1, 3, 3})};
  CHECK(max_abs_diff(tr_to_tensor(ring4), tr_loops(ring4)) < kTol);
  // One core: the trace of each slice U[:, i, :].
  std::vector<Tensor> one = {r({3, 4, 3})};
  CHECK(max_abs_diff(tr_to_tensor(one), tr_loops(one)) < kTol);

  std::vector<Tensor> train = {r({1, 3, 2}), r({2, 4, 3}), r({3, 2, 2}), r({2, 5, 1})};
  Tensor t = tt_to_tensor(train);
  CHECK(t.shape() == Shape{3, 4, 2, 5});
  CHECK(max_abs_diff(t, tr_loops(train)) < kTol);
}

TEST_CASE("tucker_to_tensor matches the nested sum") {
  manual_seed(8);
  Tensor core = r({2, 3, 4});
  std::vector<Tensor> f = {r({5, 2}), r({6, 3}), r({3, 4})};
  Host G(core), U0(f[0]), U1(f[1]), U2(f[2]);
  Shape shape = {5, 6, 3};
  std::vector<double> expect(size_t(numel_of(shape)), 0.0);
  for_each_index(shape, [&](const Shape& i) {
    double s = 0;
    for_each_index(core.shape(), [&](const Shape& c) {
      s += G(c) * U0({i[0], c[0]}) * U1({i[1], c[1]}) * U2({i[2], c[2]});
    });
    expect[size_t(offset(shape, i))] = s;
  });
  Tensor x = tucker_to_tensor(core, f);
  CHECK(x.shape() == shape);
  CHECK(max_abs_diff(x, from_vector(expect, shape, kFloat64)) < kTol);
}

TEST_CASE("reconstructions and products agree with their einsum statements") {
  manual_seed(13);
  Tensor A = r({3, 4}), B = r({5, 4}), C = r({2, 4}), w = r({4});
  CHECK(max_abs_diff(cp_to_tensor({A, B, C}, w), einsum("ir,jr,kr,r->ijk", {A, B, C, w})) < kTol);
  CHECK(max_abs_diff(khatri_rao({A, B}), einsum("ir,jr->ijr", {A, B}).reshape({15, 4})) < kTol);
  Tensor G = r({2, 3, 4}), U0 = r({5, 2}), U1 = r({6, 3}), U2 = r({3, 4});
  CHECK(max_abs_diff(tucker_to_tensor(G, {U0, U1, U2}), einsum("abc,ia,jb,kc->ijk", {G, U0, U1, U2})) < kTol);
  Tensor T0 = r({2, 3, 3}), T1 = r({3, 4, 4}), T2 = r({4, 5, 2});
  CHECK(max_abs_diff(tr_to_tensor({T0, T1, T2}), einsum("aib,bjc,cka->ijk", {T0, T1, T2})) < kTol);
  Tensor X = r({3, 4, 5}), M = r({6, 4}), v = r({5});
  CHECK(max_abs_diff(mode_n_product(X, M, 1), einsum("ijk,aj->iak", {X, M})) < kTol);
  CHECK(max_abs_diff(mode_n_product_vec(X, v, 2), einsum("ijk,k->ij", {X, v})) < kTol);
}

// ---------------------------------------------------------------- singular values, rank

TEST_CASE("singular_values recovers a known spectrum") {
  manual_seed(9);
  const std::vector<double> s = {5.0, 3.0, 2.0, 0.5, 1e-3};
  // Tall, and its transpose (wide): the same values, in descending order.
  Tensor m = with_singular_values(7, 5, s);
  Tensor sv = singular_values(m);
  REQUIRE(sv.shape() == Shape{5});
  CHECK(sv.dtype() == kFloat64);
  for (size_t k = 0; k < s.size(); ++k) CHECK(std::abs(sv.at({int64_t(k)}) - s[k]) < 1e-12);
  Tensor svt = singular_values(m.t());
  CHECK(max_abs_diff(svt, sv) < 1e-12);
  // A diagonal matrix with unsorted, signed entries: the sorted absolute values.
  Tensor d = tensor({{0.0, 0.0, -2.0}, {0.0, 7.0, 0.0}, {0.5, 0.0, 0.0}}, kFloat64);
  Tensor sd = singular_values(d);
  CHECK(sd.at({0}) == doctest::Approx(7.0).epsilon(1e-14));
  CHECK(sd.at({1}) == doctest::Approx(2.0).epsilon(1e-14));
  CHECK(sd.at({2}) == doctest::Approx(0.5).epsilon(1e-14));
  // float32 input is computed in double all the same.
  Tensor sf = singular_values(m.to(kFloat32));
  CHECK(sf.dtype() == kFloat64);
  CHECK(std::abs(sf.at({0}) - 5.0) < 1e-5);
}

TEST_CASE("matrix_rank of low-rank products, identity, zero and deficient matrices") {
  manual_seed(10);
  struct Case { int64_t m, n, r; };
  for (Case c : {Case{10, 8, 3}, Case{8, 10, 3}, Case{16, 64, 16}, Case{64, 16, 5}, Case{12, 12, 11}, Case{6, 9, 1},
                 Case{9, 7, 7}}) {
    INFO("(" << c.m << " x " << c.r << ") · (" << c.r << " x " << c.n << ")");
    Tensor a = mm(r({c.m, c.r}), r({c.r, c.n}));
    CHECK(matrix_rank(a) == c.r);
    CHECK(matrix_rank(a.t()) == c.r);
  }
  CHECK(matrix_rank(eye(7, 7, kFloat64)) == 7);
  CHECK(matrix_rank(eye(3, 5, kFloat64)) == 3);
  CHECK(matrix_rank(zeros({4, 6}, kFloat64)) == 0);
  CHECK(matrix_rank(zeros({0, 3}, kFloat64)) == 0);
  // A duplicated column and a zero row.
  Tensor b = r({6, 4});
  Tensor dup = cat({b, b.narrow(1, 1, 1)}, 1);  // 6 x 5, column 4 == column 1
  CHECK(matrix_rank(dup) == 4);
  Tensor zrow = cat({b.t(), zeros({1, 6}, kFloat64)}, 0);  // 5 x 6 with a zero last row
  CHECK(matrix_rank(zrow) == 4);
  // A singular value far below the default tolerance does not count; an explicit
  // tolerance moves the cut.
  Tensor m = with_singular_values(6, 5, {4.0, 2.0, 1.0, 1e-3, 1e-20});
  CHECK(matrix_rank(m) == 4);
  CHECK(matrix_rank(m, 1e-2) == 3);
  CHECK(matrix_rank(m, 3.0) == 1);
}

// ---------------------------------------------------------------- gradients

TEST_CASE("gradcheck: mode-n products, unfold/fold, khatri_rao, kron") {
  manual_seed(11);
  const Shape shape = {2, 3, 4};
  for (int64_t n = 0; n < 3; ++n) {
    INFO("mode " << n);
    const int64_t In = shape[size_t(n)];
    CHECK_GRAD([n](const TensorList& in) { return mode_n_product(in[0], in[1], n); },
               (TensorList{r(shape), r({3, In})}));
    CHECK_GRAD([n](const TensorList& in) { return mode_n_product_vec(in[0], in[1], n); },
               (TensorList{r(shape), r({In})}));
    CHECK_GRAD([n](const TensorList& in) { return unfold(in[0], n); }, (TensorList{r(shape)}));
  }
  CHECK_GRAD([](const TensorList& in) { return fold(in[0], 1, {2, 3, 4}); }, (TensorList{r({3, 8})}));
  CHECK_GRAD([](const TensorList& in) { return multi_mode_product(in[0], {in[1], in[2]}, {2, 0}); },
             (TensorList{r({2, 3, 4}), r({5, 4}), r({2})}));
  CHECK_GRAD([](const TensorList& in) { return khatri_rao({in[0], in[1]}); }, (TensorList{r({3, 2}), r({4, 2})}));
  CHECK_GRAD([](const TensorList& in) { return khatri_rao({in[0], in[1], in[2]}); },
             (TensorList{r({2, 3}), r({3, 3}), r({2, 3})}));
  CHECK_GRAD([](const TensorList& in) { return kron(in[0], in[1]); }, (TensorList{r({2, 3}), r({3, 2})}));
}

TEST_CASE("gradcheck: reconstructions with respect to their factors") {
  manual_seed(12);
  CHECK_GRAD([](const TensorList& in) { return cp_to_tensor({in[0], in[1], in[2]}); },
             (TensorList{r({2, 3}), r({3, 3}), r({4, 3})}));
  CHECK_GRAD([](const TensorList& in) { return cp_to_tensor({in[0], in[1], in[2]}, in[3]); },
             (TensorList{r({2, 3}), r({3, 3}), r({4, 3}), r({3})}));
  CHECK_GRAD([](const TensorList& in) { return tr_to_tensor({in[0], in[1], in[2]}); },
             (TensorList{r({2, 3, 3}), r({3, 2, 2}), r({2, 4, 2})}));
  CHECK_GRAD([](const TensorList& in) { return tt_to_tensor({in[0], in[1], in[2]}); },
             (TensorList{r({1, 3, 2}), r({2, 2, 3}), r({3, 4, 1})}));
  CHECK_GRAD([](const TensorList& in) { return tucker_to_tensor(in[0], {in[1], in[2], in[3]}); },
             (TensorList{r({2, 3, 2}), r({3, 2}), r({4, 3}), r({2, 2})}));
}

// ---------------------------------------------------------------- errors

TEST_CASE("tensor-algebra errors name the problem") {
  Tensor x = zeros({2, 3, 4}, kFloat64);
  CHECK_THROWS_MU(mode_n_product(x, zeros({5, 4}, kFloat64), 1), "must have 3 columns to multiply mode 1");
  CHECK_THROWS_MU(mode_n_product(x, zeros({5, 3}, kFloat64), 3), "mode_n_product");
  CHECK_THROWS_MU(mode_n_product(x, zeros({3}, kFloat64), 1), "must be a 2-D matrix");
  CHECK_THROWS_MU(mode_n_product_vec(x, zeros({4}, kFloat64), 0), "cannot contract mode 0");
  CHECK_THROWS_MU(multi_mode_product(x, {zeros({2}, kFloat64), zeros({2}, kFloat64)}, {0, 0}), "mode 0 appears twice");
  CHECK_THROWS_MU(multi_mode_product(x, {zeros({2}, kFloat64)}, {0, 1}), "1 factors but 2 modes");
  CHECK_THROWS_MU(fold(zeros({3, 7}, kFloat64), 1, {2, 3, 4}), "is 3 x 8, got [3, 7]");
  CHECK_THROWS_MU(khatri_rao({zeros({2, 3}, kFloat64), zeros({2, 4}, kFloat64)}), "same number of columns");
  CHECK_THROWS_MU(khatri_rao({}), "at least one matrix");
  CHECK_THROWS_MU(cp_to_tensor({zeros({2, 3}, kFloat64), zeros({4, 2}, kFloat64)}), "factor 1");
  CHECK_THROWS_MU(cp_to_tensor({zeros({2, 3}, kFloat64)}, zeros({2}, kFloat64)), "weights must have shape [3]");
  CHECK_THROWS_MU(tr_to_tensor({zeros({2, 3, 3}, kFloat64), zeros({3, 4, 5}, kFloat64)}), "rank mismatch between core 1");
  // A core that is not 3-D is named before any rank is compared with it.
  CHECK_THROWS_MU(tr_to_tensor({zeros({2, 3, 3}, kFloat64), zeros({}, kFloat64)}),
                  "tr_to_tensor: core 1 must be 3-D (R_k, I_k, R_k+1), got shape []");
  CHECK_THROWS_MU(tt_to_tensor({zeros({2, 3, 3}, kFloat64), zeros({3, 4, 2}, kFloat64)}), "boundary ranks must be 1");
  CHECK_THROWS_MU(tucker_to_tensor(x, {zeros({5, 2}, kFloat64)}), "needs 3 factors, got 1");
  CHECK_THROWS_MU(tucker_to_tensor(zeros({2, 3}, kFloat64), {zeros({5, 2}, kFloat64), zeros({5, 2}, kFloat64)}),
                  "factor 1 must be (I_1 x 3)");
  CHECK_THROWS_MU(singular_values(x), "must be a 2-D matrix");
  CHECK_THROWS_MU(singular_values(full({2, 2}, std::nan(""), kFloat64)), "non-finite");
  CHECK_THROWS_MU(matrix_rank(eye(2, 2, kFloat64), -1.0), "non-negative");
}
