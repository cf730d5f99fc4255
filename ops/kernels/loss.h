// Kernels of cross_entropy with class-index targets (ops/loss.cpp): one fused pass per
// line of logits for the forward and one for the backward.
#pragma once
#include "ops/dispatch.h"
#include "tensor/tensor.h"

namespace mu::kernels {

// The dense logits seen as (outer, classes, inner): line l = o * inner + i holds the C
// logits of one position, `inner` elements apart (1 for (N, C) logits). Targets, per-line
// losses and log-sum-exps are dense tensors of outer * inner elements in the same order;
// the log-sum-exps are float64 whatever the logits' dtype (a float32 lse of ~10 would
// carry ~5e-7 of rounding into every probability of the backward).
// Dtypes: logits float32 or float64, with weight, loss and grad alike; or bfloat16 logits
// (autocast's) with float32 weight, loss and grad: read widened, computed in float32,
// dlogits (bfloat16) rounded once.
struct CrossEntropyLines {
  int64_t outer, classes, inner;
  int64_t ignore_index;
  double label_smoothing;  // s in [0, 1]
};

// For every line l with target t = target[l] (already checked to be in [0, C) or
// ignore_index): lse[l] = log sum_c exp(x[c]) and
//   loss[l] = (1 - s) w[t] (lse - x[t]) + (s / C) sum_c w[c] (lse - x[c]),
// w the weight (C) or all ones when `weight` is undefined; loss[l] = lse[l] = 0 on an
// ignored line. A NaN in a line makes its loss NaN.
MU_DECLARE_KERNEL(cross_entropy_forward, void(const Tensor& logits, const Tensor& target, const Tensor& weight,
                                              const Tensor& loss, const Tensor& lse, const CrossEntropyLines& lines));
// dlogits of line l = g_l (a_l softmax(x) - (s / C) w - (1 - s) w[t] onehot(t)), with
// a_l = (1 - s) w[t] + (s / C) sum_c w[c] and g_l = scale * grad[l] (grad holds one value
// per line) or scale * grad[0] (grad has one element: a reduced loss); softmax is
// exp(x - lse[l]) from the saved lse. Zero on ignored lines. dlogits may be logits itself:
// every kernel reads each logit once, before it writes that logit's gradient, and reads
// no other logit after it.
MU_DECLARE_KERNEL(cross_entropy_backward, void(const Tensor& grad, double scale, const Tensor& logits,
                                               const Tensor& target, const Tensor& weight, const Tensor& lse,
                                               const Tensor& dlogits, const CrossEntropyLines& lines));

}  // namespace mu::kernels
