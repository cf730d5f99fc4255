// Matrix products. matmul follows torch.matmul: 1-D operands are promoted and the
// added dim removed; batch dims broadcast.
#pragma once
#include <string>

#include "tensor/tensor.h"

namespace mu {

Tensor matmul(const Tensor& a, const Tensor& b);
Tensor mm(const Tensor& a, const Tensor& b);   // (M,K) @ (K,N)
Tensor bmm(const Tensor& a, const Tensor& b);  // (B,M,K) @ (B,K,N)

// torch.nn.functional.linear: x (..., in) · wᵀ + b for w (out, in) and b (out) or
// undefined. On the CPU, in float32 and float64, the bias is added as the product is
// stored (one pass over the output, not two) and one node computes all three gradients;
// elsewhere (a CUDA tensor, autocast's bfloat16) it is matmul(x, wᵀ) + b.
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b = Tensor());

// linear's operand checks, its messages opened by `op`: x (..., in), w (out, in), b (out)
// or undefined, one dtype (as autocast would multiply them) and one device. For the ops
// built around a linear layer (gelu_linear, linear_cross_entropy).
void check_linear_operands(const char* op, const Tensor& x, const Tensor& w, const Tensor& b);

// linear(gelu(h, approximate), w, b), keeping h and not gelu(h) for the backward, which
// computes gelu(h) again (one elementwise pass, no product): an MLP's second layer without
// its widest activation held, llm.c's GELU recompute. h (..., in); approximate "none" or
// "tanh" as gelu's. Under autocast the product runs in bfloat16 as linear's does.
Tensor gelu_linear(const Tensor& h, const Tensor& w, const Tensor& b = Tensor(),
                   const std::string& approximate = "none");

// [x, 1] · w for x (..., K) and w (K + 1, N): a product whose last row of w is a bias, as
// a factorised layer's input factor stores it, without appending the 1 to x. On the CPU
// (float32, float64) the bias row is added as the product is stored, and one node fills
// w's whole gradient in one buffer: xᵀ g in rows [0, K), the column sums of g in row K
// (composed of w's two views, it took two zero-filled copies of w and their sum);
// elsewhere it is matmul(x, w[:K]) + w[K].
Tensor matmul_with_one(const Tensor& x, const Tensor& w);

// a · b + bias[:, None] for a (M, K), b (K, N) or (B, K, N) and bias (M): a Linear layer
// (weight a, bias) applied along b's second-to-last dim, as an MLP-Mixer's token MLP
// applies one across the patches of every channel, without transposing b. On the CPU
// (float32, float64) the bias is added as the product is stored and one node computes
// the three gradients; elsewhere it is matmul(a, b) + bias.unsqueeze(1).
Tensor matmul_row_bias(const Tensor& a, const Tensor& b, const Tensor& bias);

}  // namespace mu
