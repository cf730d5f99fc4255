// linear_cross_entropy: a language model's head and loss, cross_entropy(linear(x, W, b), t),
// taken a chunk of rows at a time so that the (rows, vocabulary) logits are never all held.
//
// For each chunk of rows: logits = x_c Wᵀ (+ b), one buffer reused by every chunk; the
// fused cross-entropy kernels (ops/kernels/loss.h) give the chunk's losses and, in the same
// pass over the buffer, d(loss)/d(logits); two GEMMs turn that into the chunk's rows of dx
// and its share of dW, added to what the earlier chunks left (kernels::matmul_accumulate).
//
// A reduced loss (Mean, Sum) has one upstream value g, so its gradients are g times what
// the forward already computed at g = 1: they are taken in the forward pass, and the
// backward only scales them. That costs three GEMMs, as the unfused head does, and no
// more. An unreduced loss (None) has one upstream value per row, known only in the
// backward: its backward computes the logits again (a fourth GEMM) from the saved
// log-sum-exps.
#include <algorithm>

#include "autograd/autocast.h"
#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "ops/kernels/linalg.h"
#include "ops/kernels/loss.h"
#include "ops/loss.h"
#include "ops/loss_common.h"
#include "ops/ops.h"

namespace mu {

using autograd::record;
using autograd::save;
using autograd::SavedTensor;
using autograd::TensorList;
using namespace loss_detail;

namespace {

// Rows per chunk by default: as many as the weight has columns (K), at least 512. A
// chunk's logits (rows x V) then take at least the weight's memory (V x K), which the step
// holds anyway, with its gradient. Fewer rows would save little more and cost time: every
// chunk packs W again for its two products with it, and adds its share to all of dW (V x K),
// a product that sums over the chunk's rows only. bench_lm_head at gpt2-mini's head (1024
// rows, K 256, V 50257, 2 threads): 442 ms unfused; chunks of 512, 256, 128, 32 rows: 425,
// 480, 515, 715 ms.
int64_t default_chunk_rows(int64_t K) { return std::max<int64_t>(K, 512); }

// The operands as the chunks read them: x (N, K) and w (V, K) dense in the product dtype
// (bfloat16 under autocast), b (V) or undefined, the targets (N) and class weights.
struct Operands {
  Tensor x, w, b, target, class_weight;
  int64_t ignore_index = -100;
  double label_smoothing = 0;
  int64_t rows = 1;  // per chunk
};

// The gradients being summed: dx (N, K), dw (V, K), db (V), each undefined when not wanted,
// in float32 for bfloat16 operands (the chunks' sums are not rounded to 16 bits each).
struct Grads {
  Tensor dx, dw, db;
};

DType accumulation_dtype(DType d) { return d == kBFloat16 ? kFloat32 : d; }

// out += a · b, no graph: the device's matmul_accumulate, or the product added.
void accumulate_product(const Tensor& out, const Tensor& a, const Tensor& b) {
  if (kernels::matmul_accumulate.has(out.device().type)) {
    kernels::matmul_accumulate(out.device(), out, a, b);
    return;
  }
  Tensor(out).add_(matmul(a, b).to(out.dtype()));
}

// Runs every chunk of rows. With per and lse defined (the forward), the kernel's forward
// fills the chunk's losses and log-sum-exps; with grad defined, d(loss)/d(logits) at the
// upstream values grad (one, or one per row) times scale is taken from lse and summed into
// the wanted gradients.
void run_chunks(const Operands& o, const Tensor& per, const Tensor& lse, const Tensor& grad, double scale,
                const Grads& out) {
  NoGradGuard no_grad;
  const int64_t N = o.x.size(0), V = o.w.size(0);
  if (N == 0) return;
  const Device dev = o.x.device();
  const int64_t rows = std::min(o.rows, N);
  Tensor logits_buffer = empty({rows, V}, TensorOptions(o.x.dtype()).device(dev));
  const bool per_row_grad = grad.defined() && grad.numel() != 1;
  for (int64_t r0 = 0; r0 < N; r0 += rows) {
    const int64_t n = std::min(rows, N - r0);
    Tensor logits = logits_buffer.narrow(0, 0, n), x = o.x.narrow(0, r0, n), t = o.target.narrow(0, r0, n);
    Tensor lse_c = lse.narrow(0, r0, n);
    // The logits as linear computes them: the bias added to the product's sums where the
    // device has the kernel (a bfloat16 logit then rounded once, as linear's).
    if (o.b.defined() && kernels::matmul_bias.has(dev.type)) {
      kernels::matmul_bias(dev, logits, x, o.w.t(), o.b);
    } else {
      kernels::matmul(dev, logits, x, o.w.t());
      if (o.b.defined()) logits.add_(o.b);
    }
    const kernels::CrossEntropyLines lines{n, V, 1, o.ignore_index, o.label_smoothing};
    if (per.defined()) kernels::cross_entropy_forward(dev, logits, t, o.class_weight, per.narrow(0, r0, n), lse_c, lines);
    if (!grad.defined()) continue;
    // The gradient goes over the logits (the kernels allow it: ops/kernels/loss.h).
    Tensor dlogits = logits;
    kernels::cross_entropy_backward(dev, per_row_grad ? grad.narrow(0, r0, n) : grad, scale, logits, t,
                                    o.class_weight, lse_c, dlogits, lines);
    if (out.dx.defined()) accumulate_product(out.dx.narrow(0, r0, n), dlogits, o.w);  // dx_c = dl W
    if (out.dw.defined()) accumulate_product(out.dw, dlogits.t(), x);                 // dW += dlᵀ x_c
    if (out.db.defined()) Tensor(out.db).add_(sum(dlogits, {0}).to(out.db.dtype()));  // db += 1ᵀ dl
  }
}

// Zero-filled accumulators for the wanted gradients.
Grads zero_grads(const Operands& o, bool gx, bool gw, bool gb) {
  const TensorOptions acc = TensorOptions(accumulation_dtype(o.x.dtype())).device(o.x.device());
  const int64_t N = o.x.size(0), K = o.x.size(1), V = o.w.size(0);
  return {gx ? zeros({N, K}, acc) : Tensor(), gw ? zeros({V, K}, acc) : Tensor(), gb ? zeros({V}, acc) : Tensor()};
}

// The dtypes and input shape the gradients are handed back in: the inputs' own.
struct GradTypes {
  Shape input_shape;
  DType input = kFloat32, weight = kFloat32, bias = kFloat32;
  GradTypes(const Tensor& x, const Tensor& w, const Tensor& b)
      : input_shape(x.shape()), input(x.dtype()), weight(w.dtype()), bias(b.defined() ? b.dtype() : w.dtype()) {}
};

// The accumulated gradients in the dtypes and shapes of the inputs they belong to.
TensorList finish(const Grads& g, const GradTypes& types) {
  NoGradGuard no_grad;
  return {g.dx.defined() ? g.dx.to(types.input).reshape(types.input_shape) : Tensor(),
          g.dw.defined() ? g.dw.to(types.weight) : Tensor(), g.db.defined() ? g.db.to(types.bias) : Tensor()};
}

void check_operands(const char* op, const Tensor& input, const Tensor& weight, const Tensor& bias,
                    const Tensor& target, int64_t chunk_rows) {
  MU_CHECK(target.defined(), op, ": target must be defined");
  check_linear_operands(op, input, weight, bias);
  const DType dt = autograd::autocast::low_dtype(input);
  MU_CHECK(dt == kFloat32 || dt == kFloat64 || dt == kBFloat16, op, ": input must be float32, float64 or bfloat16, got ",
           dtype_name(input.dtype()));
  MU_CHECK(target.dtype() == kInt64, op, ": target must hold int64 class indices, got ", dtype_name(target.dtype()));
  MU_CHECK(target.device() == input.device(), op, ": target on ", target.device().str(), ", input on ",
           input.device().str());
  const Shape rows_shape(input.shape().begin(), input.shape().end() - 1);
  MU_CHECK(target.shape() == rows_shape, op, ": target of shape ", shape_str(target.shape()),
           " does not match input of shape ", shape_str(input.shape()), " (expected ", shape_str(rows_shape), ")");
  MU_CHECK(chunk_rows >= 0, op, ": chunk_rows must be positive (or 0 for the default), got ", chunk_rows);
}

}  // namespace

Tensor linear_cross_entropy(const Tensor& input, const Tensor& weight, const Tensor& bias, const Tensor& target,
                            const CrossEntropyOptions& options, int64_t chunk_rows) {
  const char* op = "linear_cross_entropy";
  check_reduction(op, options.reduction());
  const double s = options.label_smoothing();
  MU_CHECK(s >= 0 && s <= 1, op, ": label_smoothing must be between 0.0 and 1.0, got ", s);
  check_operands(op, input, weight, bias, target, chunk_rows);
  refuse_weight_grad(op, options.weight());
  const int64_t K = weight.size(1), V = weight.size(0), N = K == 0 ? target.numel() : input.numel() / K;

  Operands o;
  {
    // The product operands, outside the graph: under autocast bfloat16 copies (each made
    // once, not once per chunk), dense for the GEMMs.
    NoGradGuard no_grad;
    o.x = autograd::autocast::to_low(input.detach()).reshape({N, K}).contiguous();
    o.w = autograd::autocast::to_low(weight.detach()).contiguous();
    if (bias.defined()) o.b = autograd::autocast::to_low(bias.detach()).contiguous();
  }
  const DType loss_dtype = compute_dtype(o.x.dtype());  // float32 for bfloat16 products
  ClassTargets ct;
  ct.classes = V;
  ct.outer = N;
  ct.loss_shape = target.shape();
  // Class weights in the input's dtype, as cross_entropy's are in the logits'; the kernels
  // read them in the losses' (float32 beside bfloat16 logits).
  check_weight(op, input.dtype(), input.device(), options.weight(), V);
  read_class_targets(op, target, options.weight(), options.ignore_index(), ct);
  o.target = target.reshape({N}).contiguous();
  if (options.weight().defined()) o.class_weight = options.weight().detach().to(loss_dtype).contiguous();
  o.ignore_index = options.ignore_index();
  o.label_smoothing = s;
  o.rows = chunk_rows > 0 ? chunk_rows : default_chunk_rows(K);

  const TensorOptions lopts = TensorOptions(loss_dtype).device(input.device());
  Tensor per = empty({N}, lopts), lse = empty({N}, lopts.dtype(kFloat64));
  const bool gx = input.requires_grad(), gw = weight.requires_grad(), gb = bias.defined() && bias.requires_grad();
  const bool recorded = autograd::is_grad_enabled() && (gx || gw || gb);
  const Reduction reduction = options.reduction();
  // d(out)/d(loss of row r): 1 for None and Sum, 1 / the sum of class weights for Mean.
  const double scale = reduction == Reduction::Mean ? 1.0 / ct.weight_sum : 1.0;

  if (!recorded || reduction == Reduction::None) {
    run_chunks(o, per, lse, Tensor(), 1.0, Grads());
    Tensor out = reduce(per.reshape(ct.loss_shape), reduction, ct.weight_sum);
    if (!recorded) return out;
    // None: the backward takes the chunks again with one upstream value per row.
    return record("LinearCrossEntropyBackward", out, {input, weight, bias},
                  [xs = save(o.x), ws = save(o.w), bs = save(o.b), ts = save(o.target), cws = save(o.class_weight),
                   ls = save(lse), o, gx, gw, gb, types = GradTypes(input, weight, bias)](const Tensor& g) -> TensorList {
      Operands again = o;
      again.x = xs.get(), again.w = ws.get(), again.b = bs.get(), again.target = ts.get();
      again.class_weight = cws.get();
      const Grads grads = zero_grads(again, gx, gw, gb);
      run_chunks(again, Tensor(), ls.get(), g.reshape({-1}).contiguous(), 1.0, grads);
      return finish(grads, types);
    });
  }

  // Mean, Sum: the gradients at an upstream value of 1, taken with the losses.
  const Grads grads = zero_grads(o, gx, gw, gb);
  run_chunks(o, per, lse, full({1}, 1.0, lopts), scale, grads);
  const TensorList at_one = finish(grads, GradTypes(input, weight, bias));
  Tensor out = reduce(per.reshape(ct.loss_shape), reduction, ct.weight_sum);
  // The gradients wait in the node. Returned as they are, they become x.grad and w.grad
  // without a copy: the engine frees a node after its last run, before the leaves take
  // its gradients, and keeps a gradient nothing else refers to (autograd/engine.cpp).
  return record("LinearCrossEntropyBackward", out, {input, weight, bias},
                [dxs = save(at_one[0]), dws = save(at_one[1]), dbs = save(at_one[2])](const Tensor& g) -> TensorList {
    TensorList r{dxs.get(), dws.get(), dbs.get()};
    // An upstream 1 (loss.backward()) leaves them as they are (read on the CPU only, where
    // it costs no device round trip). Any other value scales them: in place on the last
    // run, when nothing will read them again, else into new tensors.
    if (g.device().is_cpu() && g.item() == 1.0) return r;
    const bool last = autograd::last_use();
    for (Tensor& d : r) {
      if (!d.defined()) continue;
      if (last) d.mul_(g);
      else d = (d * g).to(d.dtype());
    }
    return r;
  });
}

}  // namespace mu
