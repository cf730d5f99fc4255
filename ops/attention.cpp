// scaled_dot_product_attention: checks, allocation and the autograd record; the work is
// in the attention_forward / attention_backward kernels (ops/kernels/attention.h).
#include "ops/attention.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "autograd/autocast.h"
#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "ops/kernels/attention.h"
#include "tensor/random.h"

namespace mu {

using autograd::record;
using autograd::save;
using autograd::TensorList;

namespace {

constexpr const char* kOp = "scaled_dot_product_attention";

// q, k, v: 4-D, one floating dtype, one device, matching B, H and D, k and v one length.
void check_inputs(const Tensor& q, const Tensor& k, const Tensor& v, bool causal) {
  const std::pair<const Tensor*, const char*> named[] = {{&q, "q"}, {&k, "k"}, {&v, "v"}};
  for (auto [t, name] : named) {
    MU_CHECK(t->defined(), kOp, ": ", name, " is an undefined tensor");
    MU_CHECK(t->dim() == 4, kOp, ": ", name, " must be 4-D (B, H, T, D), got shape ", shape_str(t->shape()));
  }
  MU_CHECK(q.is_floating_point(), kOp, ": needs float32 or float64 tensors, got ", dtype_name(q.dtype()));
  MU_CHECK(q.dtype() == k.dtype() && q.dtype() == v.dtype(), kOp, ": dtype mismatch: q ", dtype_name(q.dtype()),
           ", k ", dtype_name(k.dtype()), ", v ", dtype_name(v.dtype()));
  MU_CHECK(q.device() == k.device() && q.device() == v.device(), kOp, ": device mismatch: q on ", q.device().str(),
           ", k on ", k.device().str(), ", v on ", v.device().str());
  const Shape &qs = q.shape(), &ks = k.shape(), &vs = v.shape();
  const char* dims[] = {"batch (dim 0)", "heads (dim 1)", "", "head size D (dim 3)"};
  for (size_t d : {size_t(0), size_t(1), size_t(3)})
    MU_CHECK(qs[d] == ks[d] && qs[d] == vs[d], kOp, ": ", dims[d], " differs: q ", shape_str(qs), ", k ",
             shape_str(ks), ", v ", shape_str(vs));
  MU_CHECK(ks[2] == vs[2], kOp, ": k and v must have the same length (dim 2): k ", shape_str(ks), ", v ",
           shape_str(vs));
  MU_CHECK(!causal || qs[2] == ks[2], kOp, ": causal masking needs as many queries as keys, got Tq = ", qs[2],
           " and Tk = ", ks[2], " (q ", shape_str(qs), ", k ", shape_str(ks), ")");
}

}  // namespace

Tensor scaled_dot_product_attention(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, bool causal,
                                    double dropout_p, bool training, std::optional<double> scale,
                                    std::optional<uint64_t> dropout_seed) {
  // Under autocast the three run in bfloat16; the casts are nodes of the graph.
  const Tensor q = autograd::autocast::to_low(q_in), k = autograd::autocast::to_low(k_in),
               v = autograd::autocast::to_low(v_in);
  check_inputs(q, k, v, causal);
  MU_CHECK(dropout_p >= 0 && dropout_p <= 1, kOp, ": dropout_p has to be between 0 and 1, got ", dropout_p);
  const int64_t D = q.shape()[3];
  kernels::AttentionParams p;
  p.scale = scale ? *scale : 1.0 / std::sqrt(double(std::max<int64_t>(D, 1)));
  MU_CHECK(std::isfinite(p.scale), kOp, ": scale must be finite, got ", p.scale);
  p.causal = causal;
  p.dropout_p = training ? dropout_p : 0.0;
  // One seed per call, drawn only when a mask is needed: with dropout off the global
  // stream is left as it is.
  if (p.dropout_p > 0) p.seed = dropout_seed ? *dropout_seed : default_generator().next_u64();

  // Where no graph is recorded, the forward kernels take k and v as they are when their
  // rows are dense (ops/kernels/attention.h): a key-value cache's first Tk rows per head
  // are then not copied out first (on CUDA for a decoding step; its other paths copy what
  // they need). The backward reads dense copies.
  const bool views = !(autograd::is_grad_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad()));
  auto as_read = [views](const Tensor& t) {
    return views && kernels::attention_rows_view(t) ? t.detach() : t.detach().contiguous();
  };
  Tensor qc = q.detach().contiguous(), kc = as_read(k), vc = as_read(v);
  const Shape& qs = q.shape();
  Tensor out = empty(qs, TensorOptions(q.dtype()).device(q.device()));
  // The log-sum-exps in float32 for bfloat16 inputs: the backward's probabilities are
  // exp(s - lse), and a bfloat16 lse (8 bits) would put ~0.4 % into every one.
  const DType lse_dtype = q.dtype() == kBFloat16 ? kFloat32 : q.dtype();
  Tensor lse = empty({qs[0], qs[1], qs[2]}, TensorOptions(lse_dtype).device(q.device()));
  kernels::attention_forward(q.device(), qc, kc, vc, out, lse, p);

  return record("ScaledDotProductAttentionBackward", out, {q, k, v},
                [qs_ = save(qc), ks_ = save(kc), vs_ = save(vc), os_ = save(out), ls_ = save(lse),
                 p](const Tensor& g) -> TensorList {
    Tensor qv = qs_.get(), kv = ks_.get(), vv = vs_.get();
    Tensor dq = empty_like(qv), dk = empty_like(kv), dv = empty_like(vv);
    kernels::attention_backward(qv.device(), qv, kv, vv, os_.get(), ls_.get(), g.contiguous(), dq, dk, dv, p);
    return {dq, dk, dv};
  });
}

}  // namespace mu
