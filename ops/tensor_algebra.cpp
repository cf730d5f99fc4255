// Multilinear algebra built from views, broadcasting products and matmul (see the header
// for the index conventions). Nothing here has its own kernel or backward: each result is
// a composition of differentiable ops, so autograd differentiates it as written. The one
// exception is the Jacobi SVD at the end, which only counts and is never differentiated.
#include "ops/tensor_algebra.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "ops/ops.h"

namespace mu::tensor_algebra {

namespace {

// The permutation that moves dim `mode` of an `ndim`-way tensor to the end, keeping the
// order of the others.
Shape mode_to_last(int64_t ndim, int64_t mode) {
  Shape p;
  for (int64_t d = 0; d < ndim; ++d)
    if (d != mode) p.push_back(d);
  p.push_back(mode);
  return p;
}

// Inverse of mode_to_last: moves the last dim of an `ndim`-way tensor back to `mode`,
// i.e. (0, …, mode-1, last, mode, …, ndim-2).
Shape last_to_mode(int64_t ndim, int64_t mode) {
  Shape p;
  for (int64_t d = 0; d < mode; ++d) p.push_back(d);
  p.push_back(ndim - 1);
  for (int64_t d = mode; d < ndim - 1; ++d) p.push_back(d);
  return p;
}

// The permutation of unfold: mode n first, then the other modes from the LAST to the
// first, so that in the row-major reshape that follows the first remaining mode is the
// fastest-varying column index (Kolda–Bader).
Shape unfold_order(int64_t ndim, int64_t mode) {
  Shape p = {mode};
  for (int64_t d = ndim - 1; d >= 0; --d)
    if (d != mode) p.push_back(d);
  return p;
}

void check_matrix(const Tensor& m, const char* op, const char* what) {
  MU_CHECK(m.dim() == 2, op, ": ", what, " must be a 2-D matrix, got shape ", shape_str(m.shape()));
}

}  // namespace

// ---------------------------------------------------------------- unfolding

Tensor unfold(const Tensor& x, int64_t mode) {
  MU_CHECK(x.dim() >= 1, "unfold: needs a tensor with at least one mode, got a scalar");
  const int64_t n = wrap_sized_dim(mode, x.dim(), "unfold");
  // Π_{k≠n} I_k counted explicitly: reshape's -1 is ambiguous when some size is 0.
  int64_t rest = 1;
  for (int64_t d = 0; d < x.dim(); ++d)
    if (d != n) rest *= x.size(d);
  return x.permute(unfold_order(x.dim(), n)).reshape({x.size(n), rest});
}

Tensor fold(const Tensor& m, int64_t mode, const Shape& shape) {
  check_matrix(m, "fold", "the unfolded tensor");
  MU_CHECK(!shape.empty(), "fold: the target shape must have at least one mode");
  const int64_t ndim = int64_t(shape.size());
  const int64_t n = wrap_sized_dim(mode, ndim, "fold");
  int64_t rest = 1;
  for (int64_t d = 0; d < ndim; ++d)
    if (d != n) rest *= shape[size_t(d)];
  MU_CHECK(m.size(0) == shape[size_t(n)] && m.size(1) == rest, "fold: a mode-", n, " unfolding of shape ",
           shape_str(shape), " is ", shape[size_t(n)], " x ", rest, ", got ", shape_str(m.shape()));
  // Undo unfold step by step: split the columns into the remaining modes in unfold's
  // order (last mode first), then permute every mode back to its place.
  const Shape order = unfold_order(ndim, n);
  Shape split, inverse(size_t(ndim), 0);
  for (int64_t j = 0; j < ndim; ++j) {
    split.push_back(shape[size_t(order[size_t(j)])]);
    inverse[size_t(order[size_t(j)])] = j;
  }
  return m.reshape(split).permute(inverse);
}

// ---------------------------------------------------------------- mode-n products

Tensor mode_n_product(const Tensor& x, const Tensor& m, int64_t mode) {
  MU_CHECK(x.dim() >= 1, "mode_n_product: needs a tensor with at least one mode, got a scalar");
  check_matrix(m, "mode_n_product", "the matrix");
  const int64_t n = wrap_sized_dim(mode, x.dim(), "mode_n_product");
  MU_CHECK(m.size(1) == x.size(n), "mode_n_product: the matrix ", shape_str(m.shape()), " must have ", x.size(n),
           " columns to multiply mode ", n, " of a tensor of shape ", shape_str(x.shape()));
  // With mode n last, every mode-n fibre is a row: right-multiplying by Mᵀ maps each
  // fibre f to M f, which is the definition; then mode n goes back to its place.
  Tensor y = matmul(x.permute(mode_to_last(x.dim(), n)), m.t());
  return y.permute(last_to_mode(x.dim(), n));
}

Tensor mode_n_product_vec(const Tensor& x, const Tensor& v, int64_t mode) {
  MU_CHECK(x.dim() >= 1, "mode_n_product_vec: needs a tensor with at least one mode, got a scalar");
  MU_CHECK(v.dim() == 1, "mode_n_product_vec: the vector must be 1-D, got shape ", shape_str(v.shape()));
  const int64_t n = wrap_sized_dim(mode, x.dim(), "mode_n_product_vec");
  MU_CHECK(v.size(0) == x.size(n), "mode_n_product_vec: a vector of length ", v.size(0), " cannot contract mode ", n,
           " (size ", x.size(n), ") of a tensor of shape ", shape_str(x.shape()));
  // matmul of (…, I_n) by a vector contracts the last dim and drops it; the other modes
  // keep their relative order, so no permutation back is needed.
  return matmul(x.permute(mode_to_last(x.dim(), n)), v);
}

Tensor multi_mode_product(const Tensor& x, const std::vector<Tensor>& factors, const std::vector<int64_t>& modes_in) {
  std::vector<int64_t> modes = modes_in;
  if (modes.empty())
    for (size_t k = 0; k < factors.size(); ++k) modes.push_back(int64_t(k));
  MU_CHECK(modes.size() == factors.size(), "multi_mode_product: ", factors.size(), " factors but ", modes.size(),
           " modes");
  std::vector<std::pair<int64_t, size_t>> order;  // (mode of x, which factor)
  std::vector<bool> used(size_t(std::max<int64_t>(x.dim(), 0)), false);
  for (size_t k = 0; k < modes.size(); ++k) {
    const int64_t n = wrap_sized_dim(modes[k], x.dim(), "multi_mode_product");
    MU_CHECK(!used[size_t(n)], "multi_mode_product: mode ", n, " appears twice");
    used[size_t(n)] = true;
    order.push_back({n, k});
  }
  // Products on distinct modes commute. Applying them in increasing mode order means a
  // vector, which removes its mode, only shifts the modes still to come: each later
  // mode drops by the number of vectors applied so far.
  std::sort(order.begin(), order.end());
  Tensor y = x;
  int64_t removed = 0;
  for (const auto& [n, k] : order) {
    const Tensor& f = factors[k];
    MU_CHECK(f.dim() == 1 || f.dim() == 2, "multi_mode_product: factor ", k, " must be a matrix or a vector, got shape ",
             shape_str(f.shape()));
    if (f.dim() == 2) {
      y = mode_n_product(y, f, n - removed);
    } else {
      y = mode_n_product_vec(y, f, n - removed);
      ++removed;
    }
  }
  return y;
}

// ---------------------------------------------------------------- products of matrices

Tensor khatri_rao(const std::vector<Tensor>& matrices) {
  MU_CHECK(!matrices.empty(), "khatri_rao: needs at least one matrix");
  for (size_t k = 0; k < matrices.size(); ++k) {
    MU_CHECK(matrices[k].dim() == 2, "khatri_rao: matrix ", k, " must be 2-D, got shape ",
             shape_str(matrices[k].shape()));
    MU_CHECK(matrices[k].size(1) == matrices[0].size(1), "khatri_rao: every matrix needs the same number of columns; ",
             "matrix 0 has ", matrices[0].size(1), ", matrix ", k, " has ", matrices[k].size(1));
  }
  Tensor acc = matrices[0];
  for (size_t k = 1; k < matrices.size(); ++k) {
    const Tensor& b = matrices[k];
    const int64_t rows = acc.size(0) * b.size(0), r = acc.size(1);
    // (P, 1, R) * (1, J, R) gives (P, J, R) with entry [p, j, r] = acc[p, r] · b[j, r];
    // flattening (p, j) row-major gives row p·J + j, the earlier factor slowest.
    acc = (acc.unsqueeze(1) * b.unsqueeze(0)).reshape({rows, r});
  }
  return acc;
}

Tensor kron(const Tensor& a, const Tensor& b) {
  const int64_t nd = std::max(a.dim(), b.dim());
  Shape sa(size_t(nd - a.dim()), 1), sb(size_t(nd - b.dim()), 1);  // leading 1s to equal rank
  sa.insert(sa.end(), a.shape().begin(), a.shape().end());
  sb.insert(sb.end(), b.shape().begin(), b.shape().end());
  // Interleave: a as (a_0, 1, a_1, 1, …) and b as (1, b_0, 1, b_1, …); their broadcast
  // product holds a[i, k, …] · b[j, l, …] at [i, j, k, l, …], and merging each (i, j)
  // pair row-major gives index i·b_d + j in every dim.
  Shape ia, ib, out;
  for (size_t d = 0; d < size_t(nd); ++d) {
    ia.insert(ia.end(), {sa[d], 1});
    ib.insert(ib.end(), {1, sb[d]});
    out.push_back(sa[d] * sb[d]);
  }
  return (a.reshape(ia) * b.reshape(ib)).reshape(out);
}

// ---------------------------------------------------------------- reconstruction

Tensor cp_to_tensor(const std::vector<Tensor>& factors, const Tensor& weights) {
  MU_CHECK(!factors.empty(), "cp_to_tensor: needs at least one factor");
  MU_CHECK(factors[0].dim() == 2, "cp_to_tensor: factor 0 must be a 2-D (I_0 x R) matrix, got shape ",
           shape_str(factors[0].shape()));
  const int64_t rank = factors[0].size(1);
  for (size_t k = 0; k < factors.size(); ++k)
    MU_CHECK(factors[k].dim() == 2 && factors[k].size(1) == rank, "cp_to_tensor: factor ", k,
             " must be an (I_", k, " x R) matrix with the R = ", rank, " columns of factor 0, got shape ",
             shape_str(factors[k].shape()));
  Tensor first = factors[0];
  if (weights.defined()) {
    MU_CHECK(weights.dim() == 1 && weights.size(0) == rank, "cp_to_tensor: weights must have shape [", rank,
             "] (one per rank-one term), got ", shape_str(weights.shape()));
    // Scaling the columns of one factor scales each rank-one term once.
    first = first * weights.unsqueeze(0);
  }
  if (factors.size() == 1) return first.sum({1});
  Shape shape;
  for (const Tensor& f : factors) shape.push_back(f.size(0));
  // Row-major flattening of modes 1… is khatri_rao's row order (first index slowest), so
  // U_0 · khatri_rao(U_1, …)ᵀ is X with its modes 1… flattened in C order.
  const std::vector<Tensor> rest(factors.begin() + 1, factors.end());
  return mm(first, khatri_rao(rest).t()).reshape(shape);
}

Tensor tr_to_tensor(const std::vector<Tensor>& cores) {
  MU_CHECK(!cores.empty(), "tr_to_tensor: needs at least one core");
  const size_t N = cores.size();
  for (size_t k = 0; k < N; ++k)
    MU_CHECK(cores[k].dim() == 3, "tr_to_tensor: core ", k, " must be 3-D (R_k, I_k, R_k+1), got shape ",
             shape_str(cores[k].shape()));
  for (size_t k = 0; k < N; ++k) {  // every core is 3-D (above) before its neighbour's ranks are read
    const size_t next = (k + 1) % N;  // the last core connects back to the first
    MU_CHECK(cores[k].size(2) == cores[next].size(0), "tr_to_tensor: rank mismatch between core ", k, " ",
             shape_str(cores[k].shape()), " and core ", next, " ", shape_str(cores[next].shape()), " (",
             cores[k].size(2), " != ", cores[next].size(0), ")");
  }
  // acc (R_0, P, R_k) holds, for every multi-index p of the modes merged so far, the
  // matrix product of their slices. Appending core k is one matmul over R_k: slices
  // multiply as (R_0·P, R_k) · (R_k, I_k·R_k+1), and the row-major (p, i_k) order puts
  // the new mode fastest, which is the C order of the final shape.
  const int64_t r0 = cores[0].size(0);
  Tensor acc = cores[0];
  Shape shape = {cores[0].size(1)};
  for (size_t k = 1; k < N; ++k) {
    const Tensor& u = cores[k];
    const int64_t p = acc.size(1), rk = u.size(0), ik = u.size(1), rn = u.size(2);
    acc = mm(acc.reshape({r0 * p, rk}), u.reshape({rk, ik * rn})).reshape({r0, p * ik, rn});
    shape.push_back(ik);
  }
  // Trace over the ring: keep the entries [a, p, a] by masking with the identity and
  // summing both rank dims.
  Tensor id = eye(r0, r0, TensorOptions(acc.dtype()).device(acc.device()));
  return (acc * id.unsqueeze(1)).sum({0, 2}).reshape(shape);
}

Tensor tt_to_tensor(const std::vector<Tensor>& cores) {
  MU_CHECK(!cores.empty(), "tt_to_tensor: needs at least one core");
  for (size_t k = 0; k < cores.size(); ++k)
    MU_CHECK(cores[k].dim() == 3, "tt_to_tensor: core ", k, " must be 3-D (R_k, I_k, R_k+1), got shape ",
             shape_str(cores[k].shape()));
  MU_CHECK(cores.front().size(0) == 1 && cores.back().size(2) == 1,
           "tt_to_tensor: a tensor train's boundary ranks must be 1; the first core is ", shape_str(cores.front().shape()),
           " and the last ", shape_str(cores.back().shape()), " (use tr_to_tensor for a ring)");
  // With R_0 = R_N = 1 the trace of a 1 x 1 product is its only entry.
  return tr_to_tensor(cores);
}

Tensor tucker_to_tensor(const Tensor& core, const std::vector<Tensor>& factors) {
  MU_CHECK(int64_t(factors.size()) == core.dim(), "tucker_to_tensor: a core of shape ", shape_str(core.shape()),
           " needs ", core.dim(), " factors, got ", factors.size());
  for (size_t k = 0; k < factors.size(); ++k)
    MU_CHECK(factors[k].dim() == 2 && factors[k].size(1) == core.size(int64_t(k)), "tucker_to_tensor: factor ", k,
             " must be (I_", k, " x ", core.size(int64_t(k)), ") to match the core ", shape_str(core.shape()), ", got ",
             shape_str(factors[k].shape()));
  return multi_mode_product(core, factors);
}

// ---------------------------------------------------------------- numerical rank

Tensor singular_values(const Tensor& m_in) {
  check_matrix(m_in, "singular_values", "the input");
  MU_CHECK(m_in.is_floating_point(), "singular_values: needs a floating-point matrix, got ", dtype_name(m_in.dtype()));
  // Work on the orientation with no more columns than rows: one-sided Jacobi returns one
  // value per column, and a wide matrix would add max - min spurious zero columns.
  const Tensor m = m_in.size(0) >= m_in.size(1) ? m_in.detach() : m_in.detach().t();
  const int64_t rows = m.size(0), cols = m.size(1);
  const std::vector<double> flat = m.to_vector<double>();
  for (double v : flat)
    MU_CHECK(std::isfinite(v), "singular_values: the matrix ", shape_str(m_in.shape()), " has non-finite entries");
  // Column-major copy: every rotation updates two whole columns.
  std::vector<double> a(size_t(rows * cols));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) a[size_t(j * rows + i)] = flat[size_t(i * cols + j)];
  auto col = [&](int64_t j) { return a.data() + j * rows; };

  // Hestenes' one-sided Jacobi: rotate pairs of columns until all are mutually orthogonal;
  // A·V = U·Σ then has the singular values as column norms. Convergence is quadratic, so a
  // few sweeps suffice; the cap only guards against cycling on round-off.
  const double eps = std::numeric_limits<double>::epsilon();
  for (int sweep = 0; sweep < 100; ++sweep) {
    bool rotated = false;
    for (int64_t p = 0; p < cols - 1; ++p) {
      for (int64_t q = p + 1; q < cols; ++q) {
        double alpha = 0, beta = 0, gamma = 0;  // |a_p|², |a_q|², a_p · a_q
        const double *cp = col(p), *cq = col(q);
        for (int64_t i = 0; i < rows; ++i) {
          alpha += cp[i] * cp[i];
          beta += cq[i] * cq[i];
          gamma += cp[i] * cq[i];
        }
        // Orthogonal to working precision (relative to the columns' norms): skip. This
        // also skips pairs with a zero column, whose gamma is exactly 0.
        if (std::abs(gamma) <= eps * std::sqrt(alpha * beta)) continue;
        rotated = true;
        // The rotation angle θ that zeroes the off-diagonal of the 2x2 Gram matrix
        // [[α, γ], [γ, β]]: t = tan θ is the smaller root of t² + 2ζt - 1 = 0.
        const double zeta = (beta - alpha) / (2 * gamma);
        const double t = (zeta >= 0 ? 1.0 : -1.0) / (std::abs(zeta) + std::hypot(1.0, zeta));
        const double c = 1 / std::sqrt(1 + t * t), s = c * t;
        double *wp = col(p), *wq = col(q);
        for (int64_t i = 0; i < rows; ++i) {
          const double x = wp[i], y = wq[i];
          wp[i] = c * x - s * y;
          wq[i] = s * x + c * y;
        }
      }
    }
    if (!rotated) break;
  }
  std::vector<double> sigma(static_cast<size_t>(cols), 0.0);
  for (int64_t j = 0; j < cols; ++j) {
    double ss = 0;
    for (int64_t i = 0; i < rows; ++i) ss += col(j)[i] * col(j)[i];
    sigma[size_t(j)] = std::sqrt(ss);
  }
  std::sort(sigma.begin(), sigma.end(), std::greater<double>());
  return from_vector(sigma, {cols}, kFloat64);
}

int64_t matrix_rank(const Tensor& m, std::optional<double> tol) {
  const std::vector<double> sigma = singular_values(m).to_vector<double>();
  if (sigma.empty()) return 0;  // an empty matrix has rank 0
  MU_CHECK(!tol || *tol >= 0, "matrix_rank: tolerance must be non-negative, got ", *tol);
  // numpy/torch default: the size of round-off in an SVD of a matrix of this size.
  const double limit = tol ? *tol
                           : sigma[0] * double(std::max(m.size(0), m.size(1))) * std::numeric_limits<double>::epsilon();
  int64_t rank = 0;
  for (double s : sigma) rank += s > limit ? 1 : 0;
  return rank;
}

}  // namespace mu::tensor_algebra
