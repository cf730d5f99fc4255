// Kernels of fused scaled dot-product attention (ops/attention.cpp).
//
// Shapes, all dense (contiguous) and of one floating dtype: q (B, H, Tq, D), k and v
// (B, H, Tk, D), out (B, H, Tq, D), lse (B, H, Tq); for bfloat16 q, k, v (autocast), lse
// is float32 and the arithmetic float32. The forward also takes k and v as views whose
// rows are dense and whose heads lie one stride apart (attention_rows_view): the first Tk
// rows of a longer per-head buffer, as a key-value cache holds them (the CPU reads them in
// place; CUDA for a decoding step, and dense copies for the rest). Row i of out is
//   softmax_j(scale * q_i · k_j, keys j > i masked when causal) applied to v,
// with each probability, when dropout is on, zeroed or scaled by 1 / (1 - p) by a mask
// that is a pure function of (seed, b, h, i, j): backward regenerates it, nothing stores it.
#pragma once
#include <cstdint>

#include "ops/dispatch.h"
#include "ops/functors.h"  // MU_HOST_DEVICE: the mask is drawn on the host and the device alike
#include "tensor/tensor.h"

namespace mu::kernels {

// What both kernels need besides the tensors.
struct AttentionParams {
  double scale = 1;       // scores are scale * (q_i · k_j)
  bool causal = false;    // query i sees keys j <= i only (the op requires Tq == Tk)
  double dropout_p = 0;   // probability of dropping one attention probability; 0: no dropout
  uint64_t seed = 0;      // the dropout mask's key (attention_dropout_bits)
};

// The stride s from one head of x (B, H, T, D) to the next such that head (b, h) starts at
// element (b H + h) s of x's data, when x's rows are dense (stride D, then 1); -1 when
// they are not, or when the heads are not evenly spaced. (A template only so that the
// host emulation's tensor stand-in can be asked too.)
template <class TensorT = Tensor>
int64_t attention_head_stride(const TensorT& x) {
  const int64_t B = x.size(0), H = x.size(1), T = x.size(2), D = x.size(3);
  if (D > 1 && x.stride(3) != 1) return -1;
  if (T > 1 && x.stride(2) != D) return -1;
  if (B * H <= 1) return T * D;
  if (H == 1) return x.stride(0);
  if (B == 1 || x.stride(0) == H * x.stride(1)) return x.stride(1);
  return -1;
}
// Whether the forward kernels take x as it is (a dense tensor, or a view with dense rows
// and evenly spaced heads, of which every head's T rows do not overlap the next head's).
template <class TensorT = Tensor>
bool attention_rows_view(const TensorT& x) {
  const int64_t s = attention_head_stride(x);
  return s >= x.size(2) * x.size(3);
}

// out and lse = the log of each row's softmax denominator, in scaled-score units
// (lse_i = log sum_j exp(scale * q_i · k_j) over the keys row i sees; -inf for Tk == 0).
MU_DECLARE_KERNEL(attention_forward, void(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                          const Tensor& lse, const AttentionParams& params));
// dq, dk, dv (shaped as q, k, v; overwritten) from the forward's inputs, its out and lse,
// and the gradient of out (grad_out, shaped as out). The probabilities are recomputed
// from q, k and lse.
MU_DECLARE_KERNEL(attention_backward, void(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                           const Tensor& lse, const Tensor& grad_out, const Tensor& dq,
                                           const Tensor& dk, const Tensor& dv, const AttentionParams& params));

// ---------------------------------------------------------------- the dropout mask
// Every backend draws the same mask: element (b, h, i, j) has the counter
// n = ((b * H + h) * Tq + i) * Tk + j and 32 bits attention_dropout_bits(key, n), with
// key = attention_dropout_key(seed); it is kept when those bits are >= the threshold
// round(p * 2^32) (never kept for p = 1). A counter-based hash: any element's bits cost
// the same and come out alike in any order, on any thread.

// The splitmix64 finaliser: a bijection of 64-bit words that mixes every input bit into
// every output bit.
MU_HOST_DEVICE inline uint64_t attention_mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
MU_HOST_DEVICE inline uint64_t attention_dropout_key(uint64_t seed) { return attention_mix64(seed); }
// Distinct counters stay distinct (an odd multiplier and the mix are bijections); the
// key moves the whole sequence, so two seeds give unrelated masks.
MU_HOST_DEVICE inline uint32_t attention_dropout_bits(uint64_t key, uint64_t n) {
  return uint32_t(attention_mix64(key + n * 0x9e3779b97f4a7c15ULL) >> 32);
}
// Elements whose bits are below this are dropped: round(p * 2^32), which is 2^32 (all
// dropped) for p = 1.
MU_HOST_DEVICE inline uint64_t attention_dropout_threshold(double p) { return uint64_t(p * 4294967296.0 + 0.5); }

}  // namespace mu::kernels
