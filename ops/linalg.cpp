// Matrix products. One differentiable primitive, `product` (bmm, and mm as its batch-free
// case), runs the matmul kernel of its device; its gradients are products again, taken
// with transposed views so that nothing is copied. matmul reduces every torch.matmul
// case to it with views (unsqueeze, expand, reshape), whose own gradients route the
// result back to the original shapes.
#include "autograd/autocast.h"
#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "ops/kernels/linalg.h"
#include "ops/ops.h"
#include "ops/pointwise.h"

namespace mu {

using autograd::record;
using autograd::save;
using autograd::SavedTensor;
using autograd::TensorList;

namespace {


// Same dtype (as multiplied) and device, and a dtype the GEMM has: float32, float64 or
// bfloat16 (float32 accumulation).
void check_operands(const Tensor& a, const Tensor& b, const char* op) {
  const DType da = autograd::autocast::low_dtype(a), db = autograd::autocast::low_dtype(b);
  MU_CHECK(da == db, op, ": dtype mismatch: ", dtype_name(a.dtype()), " vs ", dtype_name(b.dtype()), " (shapes ",
           shape_str(a.shape()), " and ", shape_str(b.shape()), "); convert one with .to(dtype)");
  MU_CHECK(a.device() == b.device(), op, ": device mismatch: ", a.device().str(), " vs ", b.device().str());
  MU_CHECK(da == kFloat32 || da == kFloat64 || da == kBFloat16, op, ": ", dtype_name(a.dtype()),
           " tensors are not supported, only float32, float64 and bfloat16 (shapes ", shape_str(a.shape()), " and ",
           shape_str(b.shape()), "); convert with .to(kFloat32)");
}

void check_inner(const Tensor& a, const Tensor& b, int64_t ka, int64_t kb, const char* op) {
  MU_CHECK(ka == kb, op, ": shapes ", shape_str(a.shape()), " and ", shape_str(b.shape()), " cannot be multiplied (",
           ka, " != ", kb, ")");
}

// x itself when its last two dims are row-major or transposed (one of their strides is 1,
// which the GEMM packs fastest and BLAS accepts), else a dense copy.
Tensor gemm_operand(const Tensor& x) {
  const int64_t r = x.size(-2), c = x.size(-1);
  const bool rows_dense = x.stride(-1) == 1 || c == 1;
  const bool cols_dense = x.stride(-2) == 1 || r == 1;
  return rows_dense || cols_dense ? x : x.contiguous();
}

// a · b for two rank-2 or two rank-3 tensors with matching batch and inner sizes, or a
// rank-2 a shared by every entry of a rank-3 b; no graph. The result is a new dense
// tensor.
Tensor product_kernel(const Tensor& a_in, const Tensor& b_in, const char* op) {
  NoGradGuard no_grad;  // a layout copy made here is not part of the user's graph
  const Tensor a = gemm_operand(a_in.dim() == 2 && b_in.dim() == 3
                                    ? a_in.unsqueeze(0).expand({b_in.size(0), a_in.size(0), a_in.size(1)})
                                    : a_in),
               b = gemm_operand(b_in);
  const bool batched = a.dim() == 3;
  const int64_t batch = batched ? a.size(0) : 1, M = a.size(-2), N = b.size(-1);
  Tensor out = empty(batched ? Shape{batch, M, N} : Shape{M, N}, TensorOptions(a.dtype()).device(a.device()));
  kernels::matmul(a.device(), out, a, b);
  return out;
}

// Σ_b a[b] · b[b] for rank-3 a and b: (M, N); no graph. The gradient of a matrix shared
// by a batch, summed as it is computed where the device has a kernel for it. Elsewhere
// (CUDA) one product over the batch's depths laid end to end, [a[0] ... a[B-1]] ·
// [b[0]; ...; b[B-1]]: a as (M, B K), b as (B K, N), copied where their layouts do not
// allow those views. One GEMM whose sums run in float32 and are rounded once, where the
// batch of products and then their sum rounded each bfloat16 product first (a Mixer's
// token-weight gradient under autocast was off by up to 0.25 on values near 50).
Tensor batch_sum_product_kernel(const Tensor& a_in, const Tensor& b_in, const char* op) {
  NoGradGuard no_grad;
  if (!kernels::matmul_batch_sum.has(a_in.device().type)) {
    const int64_t batch = a_in.size(0), M = a_in.size(1), K = a_in.size(2), N = b_in.size(2);
    return product_kernel(a_in.permute({1, 0, 2}).reshape({M, batch * K}), b_in.reshape({batch * K, N}), op);
  }
  const Tensor a = gemm_operand(a_in), b = gemm_operand(b_in);
  Tensor out = empty({a.size(1), b.size(2)}, TensorOptions(a.dtype()).device(a.device()));
  kernels::matmul_batch_sum(a.device(), out, a, b);
  return out;
}

// The differentiable product. With y = a · b: da = g · bᵀ and db = aᵀ · g, per batch entry.
// A rank-2 a with a rank-3 b is one matrix shared by the whole batch (y[b] = a · b[b]):
// its gradient is the sum over the batch, Σ_b g[b] · b[b]ᵀ, taken in one pass.
// Each operand is kept only if the other one's gradient needs it.
Tensor product(const Tensor& a0, const Tensor& b0, const char* op, const char* node_name) {
  // Under autocast float32 operands run in bfloat16; the casts are nodes of the graph,
  // so the gradients reach a0 and b0 in their own dtype.
  const Tensor a = autograd::autocast::to_low(a0), b = autograd::autocast::to_low(b0);
  Tensor y = product_kernel(a, b, op);
  const bool ga = a.requires_grad(), gb = b.requires_grad();
  SavedTensor as = gb ? save(a) : SavedTensor(), bs = ga ? save(b) : SavedTensor();
  // A b that is the transpose of a dense matrix (a Linear layer's weight.t()) gets its
  // gradient in that layout: (gᵀ a)ᵀ, a dense matrix seen transposed, so the gradient
  // reaching the weight is dense with no transposing copy on the way.
  const bool b_transposed = b.dim() == 2 && !b.is_contiguous() && b.t().is_contiguous();
  const bool shared_a = a.dim() == 2 && b.dim() == 3;
  return record(node_name, y, {a, b}, [as, bs, ga, gb, op, b_transposed, shared_a](const Tensor& g) -> TensorList {
    Tensor da;
    if (ga && shared_a)
      da = batch_sum_product_kernel(g, bs.get().transpose(-2, -1), op);
    else if (ga)
      da = product_kernel(g, bs.get().transpose(-2, -1), op);
    Tensor db;
    if (gb && b_transposed)
      db = product_kernel(g.transpose(-2, -1), as.get(), op).transpose(-2, -1);
    else if (gb)
      db = product_kernel(as.get().transpose(-2, -1), g, op);
    return {da, db};
  });
}

// Whether x · b + bias runs as one kernel (matmul_bias) on x's device: x as autocast
// casts it, the weight and the bias all float32, float64 or bfloat16 (the bias then added
// to the product's float32 sums, the total rounded once).
bool bias_product_fused(const Tensor& x, DType weight_dtype) {
  const DType dt = autograd::autocast::low_dtype(x);
  return kernels::matmul_bias.has(x.device().type) && weight_dtype == dt &&
         (dt == kFloat32 || dt == kFloat64 || dt == kBFloat16);
}

// x (..., K) · b (K, N) + bias (N), the bias added as the product is stored; no graph.
// x2 is x as (M, K) (cast to bfloat16 first under autocast), whose gradient routes back to
// x; y is (M, N) and out_shape the result's shape, (..., N).
struct BiasProduct {
  Tensor x2, y;
  Shape out_shape;
};
BiasProduct bias_product(const Tensor& x, const Tensor& b, const Tensor& bias) {
  BiasProduct r;
  r.out_shape.assign(x.shape().begin(), x.shape().end() - 1);
  const int64_t M = numel_of(r.out_shape), K = b.size(0), N = b.size(1);
  r.out_shape.push_back(N);
  r.x2 = autograd::autocast::to_low(x).reshape({M, K});
  NoGradGuard no_grad;
  r.y = empty({M, N}, TensorOptions(r.x2.dtype()).device(x.device()));
  kernels::matmul_bias(x.device(), r.y, gemm_operand(r.x2), gemm_operand(b), bias.contiguous());
  return r;
}

}  // namespace

Tensor mm(const Tensor& a, const Tensor& b) {
  MU_CHECK(a.dim() == 2 && b.dim() == 2, "mm: expects two 2-D tensors, got shapes ", shape_str(a.shape()), " and ",
           shape_str(b.shape()), " (matmul handles other ranks)");
  check_operands(a, b, "mm");
  check_inner(a, b, a.size(1), b.size(0), "mm");
  return product(a, b, "mm", "MmBackward");
}

Tensor bmm(const Tensor& a, const Tensor& b) {
  MU_CHECK(a.dim() == 3 && b.dim() == 3, "bmm: expects two 3-D tensors, got shapes ", shape_str(a.shape()), " and ",
           shape_str(b.shape()), " (matmul broadcasts batch dimensions)");
  check_operands(a, b, "bmm");
  MU_CHECK(a.size(0) == b.size(0), "bmm: batch sizes differ (", a.size(0), " != ", b.size(0), ") for shapes ",
           shape_str(a.shape()), " and ", shape_str(b.shape()));
  check_inner(a, b, a.size(2), b.size(1), "bmm");
  return product(a, b, "bmm", "BmmBackward");
}

Tensor matmul(const Tensor& a, const Tensor& b) {
  MU_CHECK(a.dim() >= 1 && b.dim() >= 1, "matmul: both arguments need at least 1 dimension, got shapes ",
           shape_str(a.shape()), " and ", shape_str(b.shape()), " (use mul for scalars)");
  check_operands(a, b, "matmul");
  const int64_t da = a.dim(), db = b.dim();
  // A 1-D left operand is a row (K), a 1-D right operand a column (K).
  const int64_t K = a.size(-1);
  check_inner(a, b, K, db == 1 ? b.size(0) : b.size(-2), "matmul");

  if (da <= 2 && db <= 2) {
    // Promote vectors to matrices, multiply, then drop the added dims:
    // (K)·(K) -> [], (M,K)·(K) -> [M], (K)·(K,N) -> [N], (M,K)·(K,N) -> [M,N].
    Tensor a2 = da == 1 ? a.unsqueeze(0) : a, b2 = db == 1 ? b.unsqueeze(1) : b;
    Tensor y = product(a2, b2, "matmul", "MmBackward");
    if (da == 2 && db == 2) return y;
    Shape out;
    if (da == 2) out.push_back(a.size(0));
    if (db == 2) out.push_back(b.size(1));
    return y.reshape(out);
  }

  if (da >= 3 && db <= 2) {
    // Batched · matrix: the batch dims of a fold into its rows, giving one large product
    // rather than a batch of small ones, and b is never expanded.
    Shape out(a.shape().begin(), a.shape().end() - 1);  // batch..., M
    Tensor b2 = db == 1 ? b.unsqueeze(1) : b;
    Tensor y = product(a.reshape({numel_of(out), K}), b2, "matmul", "MmBackward");
    if (db == 2) out.push_back(b.size(1));
    return y.reshape(out);
  }

  // General case: broadcast the batch dims, flatten them into one, bmm, restore them.
  Tensor a2 = da == 1 ? a.unsqueeze(0) : a, b2 = db == 1 ? b.unsqueeze(1) : b;
  const Shape ba(a2.shape().begin(), a2.shape().end() - 2), bb(b2.shape().begin(), b2.shape().end() - 2);
  const size_t nd = std::max(ba.size(), bb.size());
  Shape batch(nd);
  for (size_t i = 0; i < nd; ++i) {
    // Right-aligned, missing leading dims count as 1 (NumPy broadcasting).
    const int64_t x = i < nd - ba.size() ? 1 : ba[i - (nd - ba.size())];
    const int64_t y = i < nd - bb.size() ? 1 : bb[i - (nd - bb.size())];
    MU_CHECK(x == y || x == 1 || y == 1, "matmul: the batch dimensions of shapes ", shape_str(a.shape()), " and ",
             shape_str(b.shape()), " cannot be broadcast together (", x, " vs ", y, ")");
    batch[i] = x == 1 ? y : x;
  }
  const int64_t M = a2.size(-2), N = b2.size(-1), nb = numel_of(batch);
  Shape sa = batch, sb = batch;
  sa.insert(sa.end(), {M, K});
  sb.insert(sb.end(), {K, N});
  // An a with no batch of its own (a matrix, or leading dims of size 1) is one matrix
  // shared by the batch: product sums its gradient over the batch as it computes it.
  const Tensor a3 = numel_of(ba) == 1 ? a2.reshape({M, K}) : a2.expand(sa).reshape({nb, M, K});
  Tensor y = product(a3, b2.expand(sb).reshape({nb, K, N}), "matmul", "BmmBackward");
  Shape out = batch;
  if (da > 1) out.push_back(M);
  if (db > 1) out.push_back(N);
  return y.reshape(out);
}

void check_linear_operands(const char* op, const Tensor& x, const Tensor& w, const Tensor& b) {
  MU_CHECK(x.defined() && w.defined(), op, ": input and weight must be defined");
  MU_CHECK(w.dim() == 2, op, ": weight must be 2-D (out_features, in_features), got shape ", shape_str(w.shape()));
  MU_CHECK(x.dim() >= 1 && x.size(-1) == w.size(1), op, ": input of shape ", shape_str(x.shape()),
           " does not end in the weight's in_features ", w.size(1), " (weight shape ", shape_str(w.shape()), ")");
  MU_CHECK(!b.defined() || (b.dim() == 1 && b.size(0) == w.size(0)), op, ": bias must have shape (", w.size(0),
           "), got ", shape_str(b.shape()));
  using autograd::autocast::low_dtype;
  MU_CHECK(low_dtype(w) == low_dtype(x) && (!b.defined() || low_dtype(b) == low_dtype(x)), op,
           ": dtype mismatch: input ", dtype_name(x.dtype()), ", weight ", dtype_name(w.dtype()),
           b.defined() ? ", bias " : "", b.defined() ? dtype_name(b.dtype()) : "", "; convert with .to(dtype)");
  MU_CHECK(w.device() == x.device() && (!b.defined() || b.device() == x.device()), op, ": device mismatch: input on ",
           x.device().str(), ", weight on ", w.device().str(), b.defined() ? ", bias on " + b.device().str() : "");
}

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  check_linear_operands("linear", x, w, b);
  // Under autocast the weight is cast before it is transposed (a dense copy rather than
  // a transposing one), and the bias is cast too: matmul_bias adds it to the product's
  // float32 sums and rounds the total once to bfloat16, as torch's F.linear does on a GPU
  // (cuBLASLt's bias epilogue).
  const Tensor wl = autograd::autocast::to_low(w), bl = b.defined() ? autograd::autocast::to_low(b) : b;
  if (!bl.defined() || !bias_product_fused(x, wl.dtype()))
    return bl.defined() ? matmul(x, wl.t()) + bl : matmul(x, wl.t());
  auto [x2, y, out_shape] = bias_product(x, wl.t(), bl);
  // The graph's inputs are the operands as multiplied: under autocast the bfloat16 casts,
  // whose own nodes return the gradients to the float32 tensors.
  const bool gx = x2.requires_grad(), gw = wl.requires_grad(), gb = bl.requires_grad();
  if (gx || gw || gb) {
    SavedTensor xs = gw ? save(x2) : SavedTensor(), ws = gx ? save(wl) : SavedTensor();
    // dx = g w, dw = gᵀ x (dense, the weight's layout), db = the column sums of g.
    y = record("LinearBackward", y, {x2, wl, bl}, [xs, ws, gx, gw, gb](const Tensor& g) -> TensorList {
      return {gx ? product_kernel(g, ws.get(), "linear") : Tensor(),
              gw ? product_kernel(g.t(), xs.get(), "linear") : Tensor(), gb ? sum(g, {0}) : Tensor()};
    });
  }
  return y.reshape(out_shape);
}

Tensor matmul_with_one(const Tensor& x, const Tensor& w) {
  MU_CHECK(x.defined() && w.defined(), "matmul_with_one: input and weight must be defined");
  MU_CHECK(w.dim() == 2 && w.size(0) >= 1, "matmul_with_one: weight must be 2-D (K + 1, N), got shape ",
           shape_str(w.shape()));
  const int64_t K = w.size(0) - 1, N = w.size(1);
  MU_CHECK(x.dim() >= 1 && x.size(-1) == K, "matmul_with_one: input of shape ", shape_str(x.shape()), " does not end in ",
           K, ", the weight's rows less the bias row (weight shape ", shape_str(w.shape()), ")");
  check_operands(x, w, "matmul_with_one");
  const Tensor top = w.narrow(0, 0, K), last = w.select(0, K);
  if (!bias_product_fused(x, w.dtype())) return matmul(x, top) + last;
  auto [x2, y, out_shape] = bias_product(x, top, last);
  const bool gx = x2.requires_grad(), gw = w.requires_grad();
  if (gx || gw) {
    SavedTensor xs = gw ? save(x2) : SavedTensor(), ws = gx ? save(w) : SavedTensor();
    y = record("MatmulWithOneBackward", y, {x2, w}, [xs, ws, gx, gw, K, N](const Tensor& g) -> TensorList {
      Tensor dx = gx ? product_kernel(g, ws.get().narrow(0, 0, K).t(), "matmul_with_one") : Tensor();
      Tensor dw;
      if (gw) {
        NoGradGuard no_grad;
        dw = empty({K + 1, N}, TensorOptions(g.dtype()).device(g.device()));
        // Rows [0, K) of a dense (K + 1, N) matrix are a dense (K, N) matrix: the product
        // is stored in place.
        kernels::matmul(g.device(), dw.narrow(0, 0, K), gemm_operand(xs.get().t()), gemm_operand(g));
        dw.select(0, K).copy_(sum(g, {0}));
      }
      return {dx, dw};
    });
  }
  return y.reshape(out_shape);
}

Tensor matmul_row_bias(const Tensor& a, const Tensor& b, const Tensor& bias) {
  MU_CHECK(a.defined() && b.defined() && bias.defined(), "matmul_row_bias: a, b and bias must be defined");
  MU_CHECK(a.dim() == 2, "matmul_row_bias: a must be 2-D (M, K), got shape ", shape_str(a.shape()));
  MU_CHECK(b.dim() == 2 || b.dim() == 3, "matmul_row_bias: b must be (K, N) or (B, K, N), got shape ",
           shape_str(b.shape()));
  check_operands(a, b, "matmul_row_bias");
  check_inner(a, b, a.size(1), b.size(-2), "matmul_row_bias");
  const int64_t M = a.size(0), K = a.size(1), N = b.size(-1);
  MU_CHECK(bias.dim() == 1 && bias.size(0) == M, "matmul_row_bias: bias must have shape (", M,
           "), one value per row of a, got ", shape_str(bias.shape()));
  using autograd::autocast::low_dtype;
  MU_CHECK(low_dtype(bias) == low_dtype(a) && bias.device() == a.device(), "matmul_row_bias: bias is ",
           dtype_name(bias.dtype()), " on ", bias.device().str(), " but a is ", dtype_name(a.dtype()), " on ",
           a.device().str());
  // Under autocast the three are cast to bfloat16 first, as linear's are: the bias is
  // added to the product's float32 sums and the total rounded once (on every device).
  const DType dt = low_dtype(b);
  const bool fused = kernels::matmul_row_bias.has(b.device().type) &&
                     (dt == kFloat32 || dt == kFloat64 || dt == kBFloat16) && low_dtype(a) == dt && low_dtype(bias) == dt;
  if (!fused) return matmul(a, b) + bias.unsqueeze(1);
  using autograd::autocast::to_low;
  const Tensor al = to_low(a), bl = to_low(b), biasl = to_low(bias);
  const bool batched = bl.dim() == 3;
  Tensor y;
  {
    NoGradGuard no_grad;
    const Tensor av = gemm_operand(batched ? al.unsqueeze(0).expand({bl.size(0), M, K}) : al), bv = gemm_operand(bl);
    y = empty(batched ? Shape{bl.size(0), M, N} : Shape{M, N}, TensorOptions(dt).device(b.device()));
    kernels::matmul_row_bias(b.device(), y, av, bv, biasl.contiguous());
  }
  const bool ga = al.requires_grad(), gb = bl.requires_grad(), gbias = biasl.requires_grad();
  if (!ga && !gb && !gbias) return y;
  SavedTensor as = gb ? save(al) : SavedTensor(), bs = ga ? save(bl) : SavedTensor();
  // da = Σ_n g[n] b[n]ᵀ (summed as it is computed), db = aᵀ g, dbias = g summed over all
  // but its rows. The graph's inputs are the operands as multiplied: under autocast the
  // bfloat16 casts, whose own nodes return the gradients to the float32 tensors.
  return record("MatmulRowBiasBackward", y, {al, bl, biasl},
                [as, bs, ga, gb, gbias, batched](const Tensor& g) -> TensorList {
                  Tensor da, db, dbias;
                  if (ga)
                    da = batched ? batch_sum_product_kernel(g, bs.get().transpose(-2, -1), "matmul_row_bias")
                                 : product_kernel(g, bs.get().t(), "matmul_row_bias");
                  if (gb) db = product_kernel(as.get().t(), g, "matmul_row_bias");
                  if (gbias) dbias = batched ? sum(g, {0, 2}) : sum(g, {1});
                  return {da, db, dbias};
                });
}

Tensor Tensor::matmul(const Tensor& other) const { return mu::matmul(*this, other); }

}  // namespace mu
