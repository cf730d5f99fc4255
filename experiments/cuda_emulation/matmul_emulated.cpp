// The host side and packing kernel of ops/cuda/matmul.cu (as written) run under the host
// emulation with emu_cublas.h standing in for cuBLAS, and compared with products read
// directly through the operands' strides: float32, float64 and bfloat16; 2-D and batched;
// operands row-major, column-major, with padded rows or columns, broadcast along rows or
// columns (stride 0: no cuBLAS view, packed first), broadcast over the batch (batch
// stride 0), and K = 0 (zeros without cuBLAS). The output starts as NaN garbage; or, for
// the accumulating form (beta = 1: matmul_row_bias's, onto the broadcast bias), as values
// the product is added to, through the padded output buffer too.
#include "matmul_cuda.h"
#include <cmath>
#include <cstdio>
#include <random>
#include "emu_convert.h"
using namespace mu;
namespace ck = mu::cuda_kernels;

// The device's handle: the stand-ins ignore it.
namespace mu::cuda {
cublasHandle_t cublas(int) { return nullptr; }
}  // namespace mu::cuda

static int failures = 0;

// A (batch, rows, cols) operand over its own buffer, in one of six layouts.
struct Operand {
  int64_t rows, cols, sb, sr, sc;
  std::vector<double> values;  // the buffer, as doubles
};
Operand make(int64_t batch, int64_t rows, int64_t cols, int layout, bool batch_broadcast, std::mt19937& g) {
  Operand o{rows, cols, 0, 0, 0, {}};
  switch (layout) {
    case 0: o.sr = cols, o.sc = 1; break;                   // row-major
    case 1: o.sr = 1, o.sc = rows; break;                   // column-major
    case 2: o.sr = cols + 2, o.sc = 1; break;               // padded rows
    case 3: o.sr = 1, o.sc = rows + 3; break;               // padded columns
    case 4: o.sr = 0, o.sc = 1; break;                      // one row broadcast down the rows
    default: o.sr = 1, o.sc = 0; break;                     // one column broadcast across
  }
  const int64_t span = rows == 0 || cols == 0 ? 1 : 1 + (rows - 1) * o.sr + (cols - 1) * o.sc;
  o.sb = batch_broadcast ? 0 : span + 1;
  o.values.resize(size_t((batch_broadcast ? 1 : batch) * (span + 1)));
  std::normal_distribution<double> nd;
  for (auto& v : o.values) v = nd(g);
  return o;
}

template <class T>
bool trial(int64_t batch, bool batched, int64_t M, int64_t K, int64_t N, bool accumulate, std::mt19937& g) {
  const Operand a = make(batch, M, K, int(g() % 6), batched && g() % 3 == 0, g);
  const Operand b = make(batch, K, N, int(g() % 6), batched && g() % 3 == 0, g);
  std::vector<T> av(a.values.size()), bv(b.values.size());
  for (size_t i = 0; i < av.size(); ++i) av[i] = from_d<T>(a.values[i]);
  for (size_t i = 0; i < bv.size(); ++i) bv[i] = from_d<T>(b.values[i]);
  std::vector<T> out(size_t(batch * M * N), from_d<T>(NAN));
  std::normal_distribution<double> nd;
  if (accumulate)
    for (auto& v : out) v = from_d<T>(nd(g));
  const std::vector<T> before = out;
  auto view = [&](std::vector<T>& v, const Operand& o) {
    return batched ? emu_view(v, {batch, o.rows, o.cols}, {o.sb, o.sr, o.sc}) : emu_view(v, {o.rows, o.cols}, {o.sr, o.sc});
  };
  const EmuTensor ot = batched ? emu_view(out, {batch, M, N}) : emu_view(out, {M, N});
  if (accumulate)
    ck::matmul_typed<T>(ot, view(av, a), view(bv, b), true);
  else
    ck::matmul(ot, view(av, a), view(bv, b));
  double worst = 0;
  for (int64_t bi = 0; bi < batch; ++bi)
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        const double c0 = accumulate ? to_d(before[size_t((bi * M + i) * N + j)]) : 0.0;
        double s = c0, mag = std::abs(c0);
        for (int64_t p = 0; p < K; ++p) {
          const double x = to_d(av[size_t(bi * a.sb + i * a.sr + p * a.sc)]) * to_d(bv[size_t(bi * b.sb + p * b.sr + j * b.sc)]);
          s += x, mag += std::abs(x);
        }
        const double o = to_d(out[size_t((bi * M + i) * N + j)]);
        worst = std::max(worst, std::isfinite(o) ? std::abs(o - s) / (mag + 1e-30) : INFINITY);
      }
  // Relative to the sum of |terms|: float32 sums, bfloat16's one rounding of the result.
  const double tol = std::is_same_v<T, double> ? 1e-14 : std::is_same_v<T, float> ? 1e-6 : 5e-3;
  return worst <= tol;
}

template <class T>
void sweep(const char* name) {
  std::mt19937 g(11);
  int bad = 0, n = 0;
  for (int t = 0; t < 400; ++t, ++n) {
    const bool batched = t % 2 == 1;
    const int64_t batch = batched ? 1 + int64_t(g() % 3) : 1;
    const int64_t M = 1 + g() % 6, K = t % 50 == 7 ? 0 : int64_t(1 + g() % 6), N = 1 + g() % 6;
    bad += !trial<T>(batch, batched, M, K, N, t % 4 >= 2, g);
  }
  printf("matmul %s: %d products (2-D and batched, six layouts each side, batch broadcast, K = 0, half of them "
         "accumulating): %s\n", name, n, bad ? "FAIL" : "ok");
  failures += bad != 0;
}

int main() {
  // As the product's size decides (these small ones: never padded), then with every
  // misaligned operand and output of a float32 or bfloat16 product copied through a
  // padded buffer (MUMOE_MATMUL_PAD=always), as the large ones are.
  unsetenv("MUMOE_MATMUL_PAD");
  emu_each_float_type([](auto tag, const char* name) { sweep<decltype(tag)>(name); }, failures);
  setenv("MUMOE_MATMUL_PAD", "always", 1);
  printf("MUMOE_MATMUL_PAD=always:\n");
  const int rc = emu_each_float_type([](auto tag, const char* name) { sweep<decltype(tag)>(name); }, failures);
  unsetenv("MUMOE_MATMUL_PAD");
  return rc;
}
