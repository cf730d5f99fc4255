// Loss functions, with torch.nn.functional's semantics (PyTorch 1.13):
//
//   Tensor loss = cross_entropy(logits, target);                       // mean over (N)
//   Tensor l2 = cross_entropy(logits, target, CrossEntropyOptions()
//                                                 .weight(class_weights)
//                                                 .label_smoothing(0.1)
//                                                 .ignore_index(pad_id));
//
// cross_entropy with class-index targets is one fused kernel per row (forward and
// backward); the others are composed from differentiable ops.
#pragma once
#include "tensor/tensor.h"

namespace mu {

// How per-element losses are combined: kept as they are, averaged, or summed.
enum class Reduction { None, Mean, Sum };

struct CrossEntropyOptions {
  // Per-class weights, shape (C). For class-index targets it is a constant (as in
  // PyTorch, whose gradient for it is not implemented): a weight that requires grad is
  // refused while grad mode is on.
  CrossEntropyOptions& weight(Tensor w) { weight_ = std::move(w); return *this; }
  // Targets equal to it contribute nothing and leave the mean's denominator (class-index
  // targets only; probability targets refuse any value but a negative one).
  CrossEntropyOptions& ignore_index(int64_t i) { ignore_index_ = i; return *this; }
  CrossEntropyOptions& reduction(Reduction r) { reduction_ = r; return *this; }
  // In [0, 1]: the target distribution becomes (1 - s) * target + s / C.
  CrossEntropyOptions& label_smoothing(double s) { label_smoothing_ = s; return *this; }

  const Tensor& weight() const { return weight_; }
  int64_t ignore_index() const { return ignore_index_; }
  Reduction reduction() const { return reduction_; }
  double label_smoothing() const { return label_smoothing_; }

 private:
  Tensor weight_;
  int64_t ignore_index_ = -100;
  Reduction reduction_ = Reduction::Mean;
  double label_smoothing_ = 0.0;
};

// torch.nn.functional.cross_entropy. logits: (C), (N, C) or (N, C, d1, d2, ...), classes
// along dim 1 (dim 0 for (C)). target is either
//  - int64 class indices of shape (), (N) or (N, d1, d2, ...): the loss of one position
//    is (1 - s) w[t] (lse - x[t]) + (s / C) sum_c w[c] (lse - x[c]) (s the label
//    smoothing, w the weight or 1, lse the log-sum-exp of the position's logits), 0 where
//    t == ignore_index; Mean divides the sum by the sum of w[t] over the positions not
//    ignored (NaN when every position is ignored, as in PyTorch);
//  - or class probabilities, floating point, of the logits' shape: the loss of one
//    position is -sum_c w[c] q[c] log_softmax(x)[c] with q = (1 - s) p + s / C; Mean
//    divides by the number of positions (N * d1 * ...). Differentiable in the target too.
// Reduction::None returns one loss per position: shape (), (N) or (N, d1, ...).
Tensor cross_entropy(const Tensor& logits, const Tensor& target, const CrossEntropyOptions& options);
// The same with only a reduction and an ignore_index.
Tensor cross_entropy(const Tensor& logits, const Tensor& target, Reduction reduction = Reduction::Mean,
                     int64_t ignore_index = -100);

// A language model's head and loss, cross_entropy(linear(input, weight, bias).reshape(
// {-1, classes}), target.reshape({-1}), options), without ever holding the (N, classes)
// logits: they are computed chunk_rows rows at a time (0: the default, K rows and at least
// 512, whose logits take at least the weight's memory), each chunk's losses and gradients
// taken before the next.
//   input (..., K), weight (classes, K), bias (classes) or undefined; target (...) int64
//   class indices: the classes are along the last dim, as linear gives them.
//   options as cross_entropy's: class weights (in the input's dtype), ignore_index, label
//   smoothing, reduction; None returns the target's shape.
// Under autocast the products run in bfloat16 as linear's would, the losses in float32,
// and dweight is summed in float32 across the chunks.
//
// With Mean or Sum the gradients are computed in the forward pass (three GEMMs in all, as
// unfused) and held until the backward: dinput (..., K) and dweight (classes, K) in place
// of the (N, classes) logits and their gradient. With None the backward computes the
// logits again (one GEMM more). GPT-2's loss at 50257 classes and 8 x 1024 positions has
// 1.6 GB of float32 logits (GPT2Config::chunked_loss).
Tensor linear_cross_entropy(const Tensor& input, const Tensor& weight, const Tensor& bias, const Tensor& target,
                            const CrossEntropyOptions& options = CrossEntropyOptions(), int64_t chunk_rows = 0);

// torch.nn.functional.nll_loss: log_probs (C), (N, C) or (N, C, d1, ...), int64 target
// (), (N) or (N, d1, ...); loss -w[t] log_probs[t], 0 where t == ignore_index; Mean
// divides by the sum of w[t] over the targets not ignored. weight (C) may be undefined.
Tensor nll_loss(const Tensor& log_probs, const Tensor& target, const Tensor& weight = Tensor(),
                Reduction reduction = Reduction::Mean, int64_t ignore_index = -100);

// torch.nn.functional.mse_loss: (a - b)^2. a and b must have the same shape (PyTorch
// broadcasts with a warning; here a mismatch is an error, since it is almost always a
// bug such as (N, 1) against (N)).
Tensor mse_loss(const Tensor& a, const Tensor& b, Reduction reduction = Reduction::Mean);

// torch.nn.functional.binary_cross_entropy_with_logits, in PyTorch's numerically stable
// form: (1 - t) x + (1 + (pw - 1) t) (log(1 + exp(-|x|)) + max(-x, 0)), times weight.
// target has the logits' shape; weight and pos_weight (undefined = none) broadcast to it
// (pos_weight is usually (C), one weight per class of the last dim). Differentiable in
// every floating-point argument.
Tensor binary_cross_entropy_with_logits(const Tensor& logits, const Tensor& target, const Tensor& weight = Tensor(),
                                        const Tensor& pos_weight = Tensor(), Reduction reduction = Reduction::Mean);

}  // namespace mu
