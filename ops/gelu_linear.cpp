// gelu_linear: y = gelu(h) wᵀ + b with gelu(h) kept by no one. The forward computes a =
// gelu(h), the product and drops a; the backward computes a again from the saved h, then
//   dw = gᵀ a,  db = 1ᵀ g,  dh = gelu'(h) ⊙ (g w),
// the same products the unfused pair takes (linear's two, gelu's one elementwise pass),
// plus one gelu forward. What it saves is the (tokens, in) activation an MLP's second layer
// would keep for its weight's gradient: in GPT-2 the 4d-wide one, the widest of a block.
#include "autograd/autocast.h"
#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "ops/functors.h"
#include "ops/ops.h"
#include "ops/pointwise.h"

namespace mu {

using autograd::record;
using autograd::save;
using autograd::TensorList;
using detail::map;

namespace {

// a = gelu(h), no graph.
Tensor gelu_of(const Tensor& h, bool tanh_form) {
  return tanh_form ? map(fn::GeluTanh{}, {h}) : map(fn::Gelu{}, {h});
}

}  // namespace

Tensor gelu_linear(const Tensor& h, const Tensor& w, const Tensor& b, const std::string& approximate) {
  MU_CHECK(approximate == "none" || approximate == "tanh",
           "gelu_linear: approximate must be \"none\" or \"tanh\", got \"", approximate, "\"");
  MU_CHECK(!h.defined() || h.is_floating_point(), "gelu_linear: input must be floating point, got ",
           dtype_name(h.dtype()));
  check_linear_operands("gelu_linear", h, w, b);
  const bool tanh_form = approximate == "tanh";
  Tensor y, wl;
  {
    NoGradGuard no_grad;
    // Under autocast linear casts w (and b) to bfloat16; that cast is kept for the
    // backward, as linear's own node keeps it.
    y = linear(gelu_of(h.detach(), tanh_form), w.detach(), b.defined() ? b.detach() : b);
    wl = autograd::autocast::to_low(w.detach());
  }
  const bool gh = h.requires_grad(), gw = w.requires_grad(), gb = b.defined() && b.requires_grad();
  if (!autograd::is_grad_enabled() || !(gh || gw || gb)) return y;
  // The product's dtype (bfloat16 under autocast) and the gradients' (the parameters' own).
  const DType product = wl.dtype(), w_dtype = w.dtype(), b_dtype = b.defined() ? b.dtype() : w.dtype();
  return record("GeluLinearBackward", y, {h, w, b},
                [hs = save(h.detach()), ws = save(gh ? wl : Tensor()), tanh_form, gh, gw, gb, product, w_dtype,
                 b_dtype](const Tensor& g) -> TensorList {
    NoGradGuard no_grad;
    const Tensor hv = hs.get();
    const int64_t in = hv.size(-1), out = g.size(-1);
    const Tensor g2 = g.reshape({-1, out});
    TensorList r(3);
    // The weight's gradient reads a = gelu(h), in the product's dtype as the forward had it:
    // computed again here, freed on return.
    if (gw) r[1] = matmul(g2.t(), gelu_of(hv, tanh_form).to(product).reshape({-1, in})).to(w_dtype);
    if (gb) r[2] = sum(g2, {0}).to(b_dtype);
    if (gh) {
      const Tensor da = matmul(g2, ws.get()).reshape(hv.shape());
      r[0] = tanh_form ? map(fn::GeluTanhGrad{}, {da, hv}) : map(fn::GeluGrad{}, {da, hv});
    }
    return r;
  });
}

}  // namespace mu
