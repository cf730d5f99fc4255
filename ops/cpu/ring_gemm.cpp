// CPU kernel of the fused ring-contraction GEMM (declared in ops/kernels/ring_gemm.h).
// Rows go in blocks (kBlockBytes of A each): the block's rows of A
// (a[s P + p] = Σ_r c[m, p, r] h[m, r, s], summed in acc_t and rounded once to the compute
// type) are formed in a buffer, then multiplied by w with the CPU's GEMM (ops/cpu/gemm.h),
// so that the product runs at the GEMM's rate; A is whole in memory only when it fits one
// block. float32 and float64 compute in their own type (the GEMM's float32 sums, as
// matmul's); bfloat16 is widened to float32 (A's entries rounded to bfloat16 first, as
// the CUDA kernel stores them for its tensor cores; w widened once) and the output
// rounded to bfloat16 once.
#include <algorithm>
#include <type_traits>
#include <vector>

#include "ops/cpu/gemm.h"
#include "ops/cpu/loops.h"
#include "ops/cpu/widen.h"
#include "ops/kernels/ring_gemm.h"

namespace mu::cpu {

namespace {

// A block's rows of A take up to this many bytes (at least 256 rows): each block's GEMM
// packs w again, so blocks are as large as memory allows (the whole of a 2048-token
// layer's A at S P = 596, 4.9 MB; a quarter of a GPT-2 batch's).
constexpr int64_t kBlockBytes = int64_t(8) << 20;

// T: the type of c and h; W: the compute type (float for bfloat16), that of w and out,
// which the caller has widened for bfloat16.
template <class T, class W = compute_t<T>>
void ring_gemm_blocks(W* out, const T* c, const T* h, const W* w, int64_t M, int64_t P, int64_t R, int64_t S,
                      int64_t N) {
  constexpr bool kBf16 = std::is_same_v<T, bfloat16_t>;
  using A = acc_t<W>;  // A's entries are summed in double for float32
  const int64_t K = S * P;
  const int64_t block = std::min(M, std::max<int64_t>(256, kBlockBytes / std::max<int64_t>(1, K * int64_t(sizeof(W)))));
  // Scratch from the framework's allocator, which keeps freed blocks: fresh pages from the
  // system cost a page fault each (a fifth of a bfloat16 GPT-2 layer's time when this
  // was new[]); uninitialised, every entry is written before it is read.
  const Tensor a_buf = empty({block * K}, TensorOptions(std::is_same_v<W, double> ? kFloat64 : kFloat32));
  W* const a = a_buf.data_ptr<W>();
  for (int64_t m0 = 0; m0 < M; m0 += block) {
    const int64_t rows = std::min(block, M - m0);
    // Per thread: one row's product c[m] · h[m] (P x S), summed along h's rows (unit
    // stride, vectorisable), then stored transposed into A's s-major row.
    parallel_for_with(
        rows, rows * K * R > 32768 ? omp_get_max_threads() : 1, [&] { return std::vector<A>(size_t(P * S)); },
        [&](std::vector<A>& q, int64_t i) {
          const T* cm = c + (m0 + i) * P * R;
          const T* hm = h + (m0 + i) * R * S;
          std::fill(q.begin(), q.end(), A(0));
          for (int64_t p = 0; p < P; ++p)
            for (int64_t r = 0; r < R; ++r) {
              const A cv = A(widen_value(cm[p * R + r]));
              const T* hr = hm + r * S;
              A* qp = q.data() + p * S;
              for (int64_t s = 0; s < S; ++s) qp[s] += cv * A(widen_value(hr[s]));
            }
          W* ar = a + i * K;
          for (int64_t s = 0; s < S; ++s)
            for (int64_t p = 0; p < P; ++p) {
              const A v = q[size_t(p * S + s)];
              // bfloat16: the entry as the tensor cores read it.
              ar[s * P + p] = kBf16 ? W(float(bfloat16_t(float(v)))) : W(v);
            }
        });
    gemm<W>(1, rows, N, K, MatrixRef<const W>{a, 0, K, 1}, MatrixRef<const W>{w, 0, N, 1},
            MatrixRef<W>{out + m0 * N, 0, N, 1});
  }
}

void ring_gemm(const Tensor& out, const Tensor& c, const Tensor& h, const Tensor& w) {
  const int64_t M = out.size(0), N = out.size(1), P = c.size(1), R = c.size(2), S = h.size(2);
  if (M == 0 || N == 0) return;
  auto run = [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bfloat16_t>) {
      // w widened once (exactly), the product in float32, the output rounded once.
      const Tensor w32 = widened(w);
      Tensor o32 = wide_like(out);
      ring_gemm_blocks<T>(o32.data_ptr<float>(), c.data_ptr<T>(), h.data_ptr<T>(), w32.data_ptr<float>(), M, P, R, S,
                          N);
      narrow_into(out, o32);
    } else {
      ring_gemm_blocks<T>(out.data_ptr<T>(), c.data_ptr<T>(), h.data_ptr<T>(), w.data_ptr<T>(), M, P, R, S, N);
    }
  };
  dispatch_float_bf16(out.dtype(), "ring_gemm", run);
}

}  // namespace

MU_REGISTER_KERNEL(kernels::ring_gemm, DeviceType::CPU, ring_gemm);

}  // namespace mu::cpu
