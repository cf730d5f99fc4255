// grouped_mm: the differentiable grouped matrix product (ops/grouped_mm.h) over the
// kernels of ops/kernels/grouped_mm.h.
//
// Gradients, with y_g = x_g · w[g] on each group's rows:  dx_g = dy_g · w[g]ᵀ, which is
// the grouped product again with w's transposed view (no copy), and dw[g] = x_gᵀ · dy_g,
// a second kernel that sums over each group's rows; a group without rows gets dw[g] = 0.
// Both run as one kernel call each, the loop over groups inside the kernel.
#include "ops/grouped_mm.h"

#include "autograd/autocast.h"
#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "ops/kernels/grouped_mm.h"
#include "ops/ops.h"

namespace mu {

using autograd::record;
using autograd::save;
using autograd::SavedTensor;
using autograd::TensorList;

namespace {


// Ranks, dtypes, devices and sizes; offsets against w's group count and x's rows.
void check_inputs(const Tensor& x, const Tensor& w, const std::vector<int64_t>& offsets) {
  MU_CHECK(x.defined() && w.defined(), "grouped_mm: x and w must be defined tensors");
  MU_CHECK(x.dim() == 2, "grouped_mm: x must be a matrix (M, K), got shape ", shape_str(x.shape()));
  MU_CHECK(w.dim() == 3, "grouped_mm: w must be a stack of matrices (G, K, N), got shape ", shape_str(w.shape()));
  const DType dx = autograd::autocast::low_dtype(x), dw = autograd::autocast::low_dtype(w);
  MU_CHECK(dx == dw, "grouped_mm: dtype mismatch: x is ", dtype_name(x.dtype()), " but w is ", dtype_name(w.dtype()),
           "; convert one with .to(dtype)");
  MU_CHECK(dx == kFloat32 || dx == kFloat64 || dx == kBFloat16, "grouped_mm: ", dtype_name(x.dtype()),
           " tensors are not supported, only float32, float64 and bfloat16");
  MU_CHECK(x.device() == w.device(), "grouped_mm: device mismatch: x is on ", x.device().str(), " but w is on ",
           w.device().str());
  MU_CHECK(x.size(1) == w.size(1), "grouped_mm: x of shape ", shape_str(x.shape()), " and w of shape ",
           shape_str(w.shape()), " cannot be multiplied: x has K = ", x.size(1), " columns but w's matrices have ",
           w.size(1), " rows");
  const int64_t G = w.size(0), M = x.size(0);
  MU_CHECK(int64_t(offsets.size()) == G + 1, "grouped_mm: offsets has ", offsets.size(),
           " entries but w of shape ", shape_str(w.shape()), " holds G = ", G, " groups, which need G + 1 = ", G + 1,
           " offsets");
  MU_CHECK(offsets[0] == 0, "grouped_mm: offsets[0] is ", offsets[0], "; the first group must start at row 0");
  for (size_t g = 1; g < offsets.size(); ++g)
    MU_CHECK(offsets[g] >= offsets[g - 1], "grouped_mm: offsets must be non-decreasing, but offsets[", g, "] = ",
             offsets[g], " < offsets[", g - 1, "] = ", offsets[g - 1]);
  MU_CHECK(offsets[size_t(G)] == M, "grouped_mm: offsets[", G, "] is ", offsets[size_t(G)],
           " but x of shape ", shape_str(x.shape()), " has M = ", M, " rows; the groups must cover every row");
}

// Whether a rows x cols matrix with strides (sr, sc) is one BLAS reads in place: a unit
// stride along its rows (row-major) or its columns (column-major), the other stride at
// least the matching extent (so no broadcast, stride-0 dims). The same rule as cuBLAS's
// view in ops/cuda/cublas_view.cuh; a size-1 dim makes its stride irrelevant.
bool blas_layout(int64_t rows, int64_t cols, int64_t sr, int64_t sc) {
  const int64_t min_sr = cols > 1 ? cols : 1, min_sc = rows > 1 ? rows : 1;
  const bool row_major = (sc == 1 || cols == 1) && (rows == 1 || sr >= min_sr);
  const bool col_major = (sr == 1 || rows == 1) && (cols == 1 || sc >= min_sc);
  return row_major || col_major;
}

// t itself when its matrices (last two dims) have a BLAS layout, else a dense copy.
Tensor gemm_operand(const Tensor& t) {
  return blas_layout(t.size(-2), t.size(-1), t.stride(-2), t.stride(-1)) ? t : t.contiguous();
}

// The forward kernel on BLAS-readable operands, outside any graph: a new dense (M, N).
Tensor forward_kernel(const Tensor& x_in, const Tensor& w_in, const std::vector<int64_t>& offsets) {
  NoGradGuard no_grad;  // a layout copy made here is no part of the user's graph
  const Tensor x = gemm_operand(x_in), w = gemm_operand(w_in);
  Tensor out = empty({x.size(0), w.size(2)}, TensorOptions(x.dtype()).device(x.device()));
  kernels::grouped_mm(out.device(), out, x, w, offsets);
  return out;
}

// dw (G, K, N), dw[g] = x_gᵀ · dy_g, outside any graph.
Tensor weight_grad_kernel(const Tensor& x_in, const Tensor& dy_in, int64_t G, const std::vector<int64_t>& offsets) {
  NoGradGuard no_grad;
  const Tensor x = gemm_operand(x_in), dy = gemm_operand(dy_in);
  Tensor dw = empty({G, x.size(1), dy.size(1)}, TensorOptions(x.dtype()).device(x.device()));
  kernels::grouped_mm_weight_grad(dw.device(), dw, x, dy, offsets);
  return dw;
}

}  // namespace

Tensor grouped_mm(const Tensor& x0, const Tensor& w0, const std::vector<int64_t>& offsets) {
  check_inputs(x0, w0, offsets);
  // Under autocast float32 operands run in bfloat16; the casts are graph nodes, so the
  // gradients reach x0 and w0 in their own dtype.
  const Tensor x = autograd::autocast::to_low(x0), w = autograd::autocast::to_low(w0);
  Tensor y = forward_kernel(x, w, offsets);
  const bool gx = x.requires_grad(), gw = w.requires_grad();
  // Each operand is kept only when the other one's gradient needs it.
  SavedTensor xs = gw ? save(x) : SavedTensor(), ws = gx ? save(w) : SavedTensor();
  const int64_t G = w.size(0);
  return record("GroupedMmBackward", y, {x, w}, [xs, ws, gx, gw, G, offsets](const Tensor& g) -> TensorList {
    Tensor dx = gx ? forward_kernel(g, ws.get().transpose(1, 2), offsets) : Tensor();
    Tensor dw = gw ? weight_grad_kernel(xs.get(), g, G, offsets) : Tensor();
    return {dx, dw};
  });
}

}  // namespace mu
