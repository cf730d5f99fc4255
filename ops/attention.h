// Fused scaled dot-product attention.
#pragma once
#include <cstdint>
#include <optional>

#include "tensor/tensor.h"

namespace mu {

// softmax(q kᵀ · scale + mask) v over the last two dims of q (B, H, Tq, D) and k, v
// (B, H, Tk, D), as torch.nn.functional.scaled_dot_product_attention:
//  - scale defaults to 1 / sqrt(D);
//  - causal: query i sees keys j <= i only (needs Tq == Tk);
//  - dropout_p > 0 and training: each attention probability is zeroed with probability
//    dropout_p and the rest scaled by 1 / (1 - dropout_p); dropout_p == 1 gives zeros.
//    The mask is a hash of (dropout_seed, b, h, i, j); without a dropout_seed one is drawn
//    from the global generator (manual_seed), so a given seed (or manual_seed before the
//    call) reproduces the mask exactly.
// float32 or float64, one device. Never forms the (Tq, Tk) matrix: memory beyond the
// output is O(B H Tq) (the row log-sum-exp kept for backward), and backward recomputes
// the probabilities.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal = false,
                                    double dropout_p = 0.0, bool training = true,
                                    std::optional<double> scale = std::nullopt,
                                    std::optional<uint64_t> dropout_seed = std::nullopt);

}  // namespace mu
