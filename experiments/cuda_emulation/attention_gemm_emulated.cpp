// The cuBLAS attention path of ops/cuda/attention_gemm.cu (host side and row kernels, as
// written) under the host emulation, cuBLAS stood in for by emu_cublas.h, against the
// float64 reference of attention_reference.h: forward (S = Q Kᵀ, softmax rows with the
// causal and dropout masks, O = P V) and backward (P again from S and lse, dV, dP, the
// score gradients, dQ, dK), float32 and bfloat16, causal or not, dropout, Tq != Tk, and
// rows longer than a block (Tk = 300 on 256 threads). Causal calls from 129 queries on
// skip the score blocks above the diagonal: 2 to 5 blocks of 128 and 6 of 192, with
// Tq = Tk, Tq > Tk (the last rows see every key) and Tq < Tk (keys no query sees, whose
// dK and dV are zero). Outputs start as NaN garbage, workspace memory as garbage.
#include "attention_gemm_cuda.h"
#include <algorithm>
#include <cstdio>
#include "attention_reference.h"
using namespace mu;
namespace ck = mu::cuda_kernels;

namespace mu::cuda {
cublasHandle_t cublas(int) { return nullptr; }  // the stand-ins ignore the handle
}  // namespace mu::cuda

template <class T>
double run(int64_t B, int64_t H, int64_t Tq, int64_t Tk, int D, bool causal, double p, uint64_t seed) {
  const int64_t BH = B * H;
  const double scale = 1 / std::sqrt(double(D));
  AttentionCase<T> c = attention_case<T>(BH, Tq, Tk, D, causal, p, scale, seed);
  const T nan = from_d<T>(NAN);
  std::vector<T> out(size_t(BH * Tq * D), nan), dq(out.size(), nan), dk(size_t(BH * Tk * D), nan), dv(dk.size(), nan);
  std::vector<float> lse(size_t(BH * Tq), NAN);  // float32 for both dtypes
  const EmuTensor q = emu_view(c.q, {B, H, Tq, D}), k = emu_view(c.k, {B, H, Tk, D}), v = emu_view(c.v, {B, H, Tk, D}),
                  g = emu_view(c.dO, {B, H, Tq, D}), o = emu_view(out, {B, H, Tq, D}), l = emu_view(lse, {B, H, Tq});
  kernels::AttentionParams prm;
  prm.scale = scale, prm.causal = causal, prm.dropout_p = p, prm.seed = seed;
  ck::attention_forward_gemm(q, k, v, o, l, prm);
  ck::attention_backward_gemm(q, k, v, o, l, g, emu_view(dq, {B, H, Tq, D}), emu_view(dk, {B, H, Tk, D}),
                              emu_view(dv, {B, H, Tk, D}), prm);
  const double e[5] = {attention_error(out, c.out), attention_error(lse, c.lse), attention_error(dq, c.dq),
                       attention_error(dk, c.dk), attention_error(dv, c.dv)};
  printf("%s B%ld H%ld Tq%ld Tk%ld D%d causal%d p%.2f: out %.2e lse %.2e dq %.2e dk %.2e dv %.2e\n",
         std::is_same_v<T, float> ? "f32" : "bf16", B, H, Tq, Tk, D, causal, p, e[0], e[1], e[2], e[3], e[4]);
  double worst = 0;
  for (double x : e) worst = std::isnan(x) ? INFINITY : std::max(worst, x);
  return worst;
}

int main() {
  struct C { int64_t B, H, Tq, Tk; int D; bool causal; double p; };
  const C cs[] = {{1, 2, 70, 70, 64, true, 0}, {2, 1, 33, 33, 16, true, 0.3}, {1, 1, 45, 70, 12, false, 0.25},
                  {1, 1, 130, 130, 128, true, 0.1}, {1, 1, 100, 3, 8, false, 0.5}, {1, 1, 20, 300, 8, false, 0.1},
                  {1, 2, 300, 300, 16, true, 0.2}, {1, 1, 400, 150, 8, true, 0}, {1, 1, 140, 450, 8, true, 0.1},
                  {1, 1, 600, 600, 8, true, 0}, {1, 1, 1100, 1100, 4, true, 0}};
  double worst32 = 0, worst16 = 0;
  for (const C& c : cs) worst32 = std::max(worst32, run<float>(c.B, c.H, c.Tq, c.Tk, c.D, c.causal, c.p, 7));
  worst16 = std::max({run<__nv_bfloat16>(1, 2, 70, 70, 64, true, 0.2, 7),
                      run<__nv_bfloat16>(1, 1, 45, 300, 100, false, 0, 7),
                      run<__nv_bfloat16>(1, 1, 300, 260, 32, true, 0.1, 7)});
  printf("worst f32 %.2e bf16 %.2e\n", worst32, worst16);
  // The bounds of the tiled path's harness (bf16: tests/test_attention.cpp's gradient bound).
  const bool ok = worst32 <= 5e-6 && worst16 <= 3e-2;
  printf("%s\n", ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}
