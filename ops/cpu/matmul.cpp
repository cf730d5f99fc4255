// The CPU matrix-product kernel (declared in ops/kernels/linalg.h): the GEMM of
// ops/cpu/gemm.h on the operands' strides, without copies.
#include <omp.h>

#include "ops/cpu/gemm.h"
#include "ops/cpu/parallel.h"
#include "ops/cpu/widen.h"
#include "ops/kernels/linalg.h"
#include "ops/kernels/map.h"

namespace mu::cpu {

// out = a · b, plus 1 col_biasᵀ or row_bias 1ᵀ where defined, for rank-2 or rank-3
// operands: the one body of the three product kernels below.
static void product(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& col_bias, const Tensor& row_bias,
                    const char* name) {
  const bool batched = a.dim() == 3;
  const int64_t batch = batched ? a.size(0) : 1, M = a.size(-2), K = a.size(-1), N = b.size(-1);
  MU_DISPATCH_FLOAT(a.dtype(), name, [&] {
    // A 2-D operand is a batch of one: its batch stride is never used.
    MatrixRef<const scalar_t> A{a.data_ptr<scalar_t>(), batched ? a.stride(0) : 0, a.stride(-2), a.stride(-1)};
    MatrixRef<const scalar_t> B{b.data_ptr<scalar_t>(), batched ? b.stride(0) : 0, b.stride(-2), b.stride(-1)};
    MatrixRef<scalar_t> C{out.data_ptr<scalar_t>(), batched ? out.stride(0) : 0, out.stride(-2), out.stride(-1)};
    gemm<scalar_t>(batch, M, N, K, A, B, C, false, col_bias.defined() ? col_bias.data_ptr<scalar_t>() : nullptr,
                   row_bias.defined() ? row_bias.data_ptr<scalar_t>() : nullptr);
  });
}

// The bfloat16 product on the VDPBF16PS GEMM, batch entry by batch entry, into a dense out
// of element type TC (bfloat16 rounded as it is stored, or float32). Entries too small for
// the GEMM to split (an MLP-Mixer's token weights by each image: 64 x 49 by 49 x 128, 0.8
// MFLOP) are shared out among the threads whole, each on one thread; larger ones run one
// after another, each split by the GEMM. Either way an entry's sums run in one order.
// `col_bias` (N float32 values) and `row_bias` (M), where not null, are added to every
// entry's sums before they are stored.
template <class TC>
static void gemm_bf16_entries(TC* cd, const Tensor& a, const Tensor& b, const float* col_bias = nullptr,
                              const float* row_bias = nullptr) {
  const int64_t M = a.size(-2), K = a.size(-1), N = b.size(-1);
  const int64_t batch = a.dim() == 3 ? a.size(0) : 1;
  const bfloat16_t *ad = a.data_ptr<bfloat16_t>(), *bd = b.data_ptr<bfloat16_t>();
  const bool tiny = K >= 1 && gemm_tiny_product(M, N, K);
  auto entry = [&](int64_t e) {
    const int64_t ao = a.dim() == 3 ? e * a.stride(0) : 0, bo = b.dim() == 3 ? e * b.stride(0) : 0;
    if (tiny)
      gemm_bf16_tiny(M, N, K, ad + ao, a.stride(-2), a.stride(-1), bd + bo, b.stride(-2), b.stride(-1),
                     cd + e * M * N, N, col_bias, row_bias);
    else
      gemm_bf16(M, N, K, ad + ao, a.stride(-2), a.stride(-1), bd + bo, b.stride(-2), b.stride(-1), cd + e * M * N,
                N, col_bias, row_bias);
  };
  const bool whole = 2.0 * double(M) * double(N) * double(K) < kParallelFlops &&
                     2.0 * double(batch) * double(M) * double(N) * double(K) >= kParallelFlops;
  parallel_for(batch, whole && !omp_in_parallel() ? omp_get_max_threads() : 1, entry);
}

// out (float32 or bfloat16, rank 2 or 3) = a · b, plus `col_bias` (N float32 values) or
// `row_bias` (M) where not null, for bfloat16 operands on the float32 GEMM, each operand
// widened as the GEMM packs it (gemm_bf16_widening): a bfloat16 out rounded tile by tile
// as it is stored where the product allows, else through a float32 twin rounded once.
static void widening_product(const Tensor& out, const Tensor& a, const Tensor& b, const float* col_bias = nullptr,
                             const float* row_bias = nullptr) {
  const bool batched = a.dim() == 3;
  const int64_t batch = batched ? a.size(0) : 1, M = a.size(-2), K = a.size(-1), N = b.size(-1);
  MatrixRef<const bfloat16_t> A{a.data_ptr<bfloat16_t>(), batched ? a.stride(0) : 0, a.stride(-2), a.stride(-1)};
  MatrixRef<const bfloat16_t> B{b.data_ptr<bfloat16_t>(), batched ? b.stride(0) : 0, b.stride(-2), b.stride(-1)};
  auto into = [&](const Tensor& c, auto* data) {
    gemm_bf16_widening(batch, M, N, K, A, B, {data, batched ? c.stride(0) : 0, c.stride(-2), c.stride(-1)}, col_bias,
                       row_bias);
  };
  if (out.dtype() == kFloat32) return into(out, out.data_ptr<float>());
  if (out.dtype() == kBFloat16 && gemm_bf16_widening_rounds(M, N, K, A.col_stride, B.row_stride, B.col_stride))
    return into(out, out.data_ptr<bfloat16_t>());
  const Tensor wide = wide_like(out);
  into(wide, wide.data_ptr<float>());
  narrow_into(out, wide);
}

// The forms of a bfloat16 product: tiny (a tensor ring's per-token chains:
// gemm_bf16_tiny, on every CPU); a few rows by a transposed weight (a Linear layer in a
// decoding step); many rows (gemm_bf16, where the CPU has AVX512_BF16); else the float32
// GEMM widening the operands (widening_product).
struct Bf16Form {
  bool tiny, few_rows, many_rows;
};
static Bf16Form bf16_form(const Tensor& a, const Tensor& b) {
  const int64_t M = a.size(-2), K = a.size(-1), N = b.size(-1);
  Bf16Form f{};
  f.tiny = K >= 1 && gemm_tiny_product(M, N, K);
  f.few_rows = !f.tiny && a.dim() == 2 && b.stride(0) == 1 && bf16_weight_product_fits(M, N, K);
  f.many_rows = !f.few_rows && (f.tiny || gemm_bf16_available());
  return f;
}

static void matmul(const Tensor& out, const Tensor& a, const Tensor& b) {
  if (a.dtype() == kBFloat16) {  // autocast's products: in float32, rounded once (ops/cpu/widen.h)
    const int64_t M = a.size(-2), K = a.size(-1), N = b.size(-1);
    const auto [tiny, few_rows, many_rows] = bf16_form(a, b);
    if (many_rows && out.is_contiguous()) {
      // Many rows: the bfloat16 operands multiplied as they are (gemm_bf16), straight into
      // out (a bfloat16 out rounded as each tile is stored: GPT-2 mini's head wrote 205 MB
      // of float32 logits and read them back to round them, 10 of its 90 ms).
      if (out.dtype() == kBFloat16) return gemm_bf16_entries(out.data_ptr<bfloat16_t>(), a, b);
      if (out.dtype() == kFloat32) return gemm_bf16_entries(out.data_ptr<float>(), a, b);
    }
    if (!few_rows && !many_rows) return widening_product(out, a, b);
    Tensor wide = wide_like(out);
    if (few_rows) {
      // The weight is read in place, not widened whole for a handful of rows: as dot
      // products on VDPBF16PS where the CPU has it, else widened in registers for FMAs.
      if (gemm_bf16_available()) {
        const Tensor ar = a.stride(1) == 1 ? a : a.contiguous();
        gemm_bf16_few_rows(M, N, K, ar.data_ptr<bfloat16_t>(), ar.stride(0), b.data_ptr<bfloat16_t>(), b.stride(1),
                           wide.data_ptr<float>(), wide.stride(0), wide.stride(1));
      } else {
        const Tensor wa = widened(a);
        gemm_bf16_weight(M, N, K, wa.data_ptr<float>(), wa.stride(0), wa.stride(1), b.data_ptr<bfloat16_t>(),
                         b.stride(1), wide.data_ptr<float>(), wide.stride(0), wide.stride(1));
      }
    } else {  // many rows, into a dense float32 twin of an out that is not dense
      gemm_bf16_entries(wide.data_ptr<float>(), a, b);
    }
    narrow_into(out, wide);
    return;
  }
  product(out, a, b, Tensor(), Tensor(), "matmul");
}

// A bfloat16 product plus `bias` broadcast to out's shape, computed in float32 and rounded
// once as out is written: the bias added in the GEMM's registers (col_bias or row_bias,
// widened once) where the product takes the many-row, tiny or widening form, else (a few
// rows) the product into a float32 twin and the bias added by the elementwise add.
static void bf16_product_plus(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& col_bias,
                              const Tensor& row_bias) {
  const Tensor& bias = col_bias.defined() ? col_bias : row_bias;
  const Bf16Form form = bf16_form(a, b);
  const bool widening = !form.few_rows && !form.many_rows;
  if ((form.many_rows && out.dtype() == kBFloat16 && out.is_contiguous()) || widening) {
    const Tensor wide_bias = widened(bias);
    const float* wb = wide_bias.data_ptr<float>();
    const float *cb = col_bias.defined() ? wb : nullptr, *rb = row_bias.defined() ? wb : nullptr;
    if (widening) return widening_product(out, a, b, cb, rb);
    return gemm_bf16_entries(out.data_ptr<bfloat16_t>(), a, b, cb, rb);
  }
  const Tensor wide = wide_like(out);
  matmul(wide, a, b);
  const Tensor spread = col_bias.defined() ? bias.expand(out.shape()) : bias.unsqueeze(-1).expand(out.shape());
  const std::array<Tensor, 3> in{wide, spread, Tensor()};
  kernels::map<fn::Add>()(out.device(), out, in, fn::Add{});
}

static void matmul_row_bias(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& bias) {
  // bfloat16 (the MLP-Mixer's token mixing under autocast): rounded once, as matmul_bias.
  if (a.dtype() == kBFloat16) return bf16_product_plus(out, a, b, Tensor(), bias);
  product(out, a, b, Tensor(), bias, "matmul_row_bias");
}

static void matmul_batch_sum(const Tensor& out, const Tensor& a, const Tensor& b) {
  if (a.dtype() == kBFloat16) {
    Tensor wide = wide_like(out);
    const int64_t batch = a.size(0), M = a.size(1), K = a.size(2), N = b.size(2);
    if ((a.stride(2) == 1 || K <= 1) && (b.stride(1) == 1 || K <= 1)) {
      // Both operands contiguous along the depth (the Mixer's token weights' gradients):
      // summed as they lie (on VDPBF16PS where the CPU has AVX512_BF16).
      gemm_batch_sum_bf16(batch, M, N, K, {a.data_ptr<bfloat16_t>(), a.stride(0), a.stride(1), a.stride(2)},
                          {b.data_ptr<bfloat16_t>(), b.stride(0), b.stride(1), b.stride(2)},
                          {wide.data_ptr<float>(), 0, wide.stride(0), wide.stride(1)});
      return narrow_into(out, wide);
    }
    matmul_batch_sum(wide, widened(a), widened(b));
    narrow_into(out, wide);
    return;
  }
  const int64_t batch = a.size(0), M = a.size(1), K = a.size(2), N = b.size(2);
  MU_DISPATCH_FLOAT(a.dtype(), "matmul_batch_sum", [&] {
    MatrixRef<const scalar_t> A{a.data_ptr<scalar_t>(), a.stride(0), a.stride(1), a.stride(2)};
    MatrixRef<const scalar_t> B{b.data_ptr<scalar_t>(), b.stride(0), b.stride(1), b.stride(2)};
    MatrixRef<scalar_t> C{out.data_ptr<scalar_t>(), 0, out.stride(0), out.stride(1)};
    gemm_batch_sum<scalar_t>(batch, M, N, K, A, B, C);
  });
}

static void matmul_bias(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& bias) {
  // bfloat16: the bias added to the product's float32 sums and the total rounded once as
  // it is written: what CUDA's bias epilogue computes, where the product rounded and then
  // the sum would round twice.
  if (a.dtype() == kBFloat16) return bf16_product_plus(out, a, b, bias, Tensor());
  product(out, a, b, bias, Tensor(), "matmul_bias");
}

static void matmul_accumulate(const Tensor& out, const Tensor& a, const Tensor& b) {
  MU_CHECK(a.dim() == 2 && b.dim() == 2 && out.dim() == 2, "matmul_accumulate: rank-2 operands expected, got ",
           shape_str(a.shape()), " x ", shape_str(b.shape()), " into ", shape_str(out.shape()));
  if (a.dtype() == kBFloat16) {
    // bfloat16 operands are widened (exactly); a float32 out takes the float32 sum as it
    // is, a bfloat16 out is widened, summed into and rounded once.
    MU_CHECK(out.dtype() == kFloat32 || out.dtype() == kBFloat16, "matmul_accumulate: bfloat16 operands into ",
             dtype_name(out.dtype()), " (float32 or bfloat16 expected)");
    if (out.dtype() == kFloat32) return matmul_accumulate(out, widened(a), widened(b));
    Tensor wide = widened(out);
    matmul_accumulate(wide, widened(a), widened(b));
    narrow_into(out, wide);
    return;
  }
  MU_CHECK(out.dtype() == a.dtype() && b.dtype() == a.dtype(), "matmul_accumulate: dtypes ", dtype_name(a.dtype()),
           " x ", dtype_name(b.dtype()), " into ", dtype_name(out.dtype()));
  const int64_t M = a.size(0), K = a.size(1), N = b.size(1);
  MU_DISPATCH_FLOAT(a.dtype(), "matmul_accumulate", [&] {
    MatrixRef<const scalar_t> A{a.data_ptr<scalar_t>(), 0, a.stride(0), a.stride(1)};
    MatrixRef<const scalar_t> B{b.data_ptr<scalar_t>(), 0, b.stride(0), b.stride(1)};
    MatrixRef<scalar_t> C{out.data_ptr<scalar_t>(), 0, out.stride(0), out.stride(1)};
    gemm<scalar_t>(1, M, N, K, A, B, C, /*accumulate=*/true);
  });
}

MU_REGISTER_KERNEL(kernels::matmul, DeviceType::CPU, matmul);
MU_REGISTER_KERNEL(kernels::matmul_accumulate, DeviceType::CPU, matmul_accumulate);
MU_REGISTER_KERNEL(kernels::matmul_batch_sum, DeviceType::CPU, matmul_batch_sum);
MU_REGISTER_KERNEL(kernels::matmul_bias, DeviceType::CPU, matmul_bias);
MU_REGISTER_KERNEL(kernels::matmul_row_bias, DeviceType::CPU, matmul_row_bias);

}  // namespace mu::cpu
