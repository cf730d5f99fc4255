// The fused Hadamard-of-GEMMs kernels of ops/cuda/hadamard_gemm.cu (host side and
// kernels, as written: float32 and float64 on the SIMT kernel, bfloat16 on the tensor-core
// kernel through emu_wmma.h) run under the host emulation and compared with
// out = scale ∗ Π_k (a_k · b_k) summed in long double from the same inputs: output sizes
// that are no multiple of the 64 x 64 tile (several blocks both ways), depths that are
// no multiple of a stage (16 or 32) and depth 0, one factor, three, and nine (past the
// eight of one launch: a second launch takes the partial product as its scale, in
// place), with and without scale.
#include "hadamard_cuda.h"
#include <cmath>
#include <cstdio>
#include "emu_convert.h"
#include <random>
using namespace mu;
namespace ck = mu::cuda_kernels;

static int failures = 0;


// Worst |out - ref| / (|ref| + floor) over the output, where floor is the size of a
// typical entry: the products of sums of K terms that cancel leave entries near 0 whose
// relative error says nothing.
template <class T>
void run(int64_t M, int64_t R, std::vector<int64_t> ks, bool with_scale, double tol) {
  std::mt19937_64 rng(M * 131 + R * 7 + int64_t(ks.size()));
  std::normal_distribution<double> nd;
  std::vector<std::vector<T>> a(ks.size()), b(ks.size());
  for (size_t f = 0; f < ks.size(); ++f) {
    // Sums of K terms of size 1/sqrt(K): each factor's entries stay near 1.
    const double s = 1 / std::sqrt(double(std::max<int64_t>(ks[f], 1)));
    a[f].resize(size_t(M * ks[f]));
    b[f].resize(size_t(ks[f] * R));
    for (auto& x : a[f]) x = from_d<T>(nd(rng));
    for (auto& x : b[f]) x = from_d<T>(s * nd(rng));
  }
  std::vector<T> scale(size_t(M * R)), out(size_t(M * R), from_d<T>(777.0));
  for (auto& x : scale) x = from_d<T>(1 + 0.5 * nd(rng));
  std::vector<long double> ref(size_t(M * R));
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < R; ++j) {
      long double p = with_scale ? to_d(scale[size_t(i * R + j)]) : 1;
      for (size_t f = 0; f < ks.size(); ++f) {
        long double s = 0;
        for (int64_t k = 0; k < ks[f]; ++k) s += (long double)to_d(a[f][size_t(i * ks[f] + k)]) * to_d(b[f][size_t(k * R + j)]);
        p *= s;
      }
      ref[size_t(i * R + j)] = p;
    }
  std::vector<EmuTensor> av, bv;
  for (size_t f = 0; f < ks.size(); ++f) {
    av.push_back(emu_view(a[f], {M, ks[f]}));
    bv.push_back(emu_view(b[f], {ks[f], R}));
  }
  ck::hadamard_gemm(emu_view(out, {M, R}), av, bv, with_scale ? emu_view(scale, {M, R}) : EmuTensor{});
  double typical = 0;
  for (long double r : ref) typical += double(r * r);
  typical = std::sqrt(typical / double(ref.size()));
  double worst = 0;
  for (size_t e = 0; e < ref.size(); ++e) {
    const double o = to_d(out[e]);
    const double err = std::isfinite(o) ? std::abs(o - double(ref[e])) / (std::abs(double(ref[e])) + typical) : INFINITY;
    worst = std::max(worst, err);
  }
  const bool ok = worst <= tol;
  failures += !ok;
  printf("%s (%ld, %ld), %zu factor%s K", std::is_same_v<T, double> ? "f64" : std::is_same_v<T, float> ? "f32" : "bf16",
         M, R, ks.size(), ks.size() == 1 ? "" : "s");
  for (int64_t k : ks) printf(" %ld", k);
  printf("%s: worst error %.2e (bound %.0e) %s\n", with_scale ? ", scale" : "", worst, tol, ok ? "ok" : "FAIL");
}

int main() {
  const std::vector<int64_t> nine = {3, 17, 1, 40, 5, 16, 33, 2, 9};
  for (bool sc : {false, true}) {
    run<float>(70, 130, {17}, sc, 1e-5);
    run<float>(64, 64, {40, 1, 33}, sc, 1e-5);
    run<double>(130, 65, {16, 0}, sc, 1e-13);  // K = 0: an empty sum, the product 0
    run<double>(33, 70, nine, sc, 1e-13);
    run<float>(65, 3, nine, sc, 1e-5);
    // bfloat16: the result rounded to 2^-9 relative after float32 sums, twice with nine
    // factors (the first launch's partial product is stored in bfloat16).
    run<__nv_bfloat16>(70, 130, {40}, sc, 6e-3);
    run<__nv_bfloat16>(65, 64, {33, 7, 64}, sc, 6e-3);
    run<__nv_bfloat16>(20, 9, nine, sc, 6e-3);
  }
  printf("%s\n", failures ? "FAIL" : "PASS");
  return failures ? 1 : 0;
}
