// The attention kernels of ops/cuda/attention.cu run under the host emulation of emu.h
// and compared with a brute-force float64 attention (forward and backward, causal,
// dropout with the mask of attention_dropout_bits, Tq != Tk, D = 1 to 128), for float64,
// float32 (the scalar and the vector variant) and bfloat16. Built and run by run.sh, which extracts the kernels into
// kernels.h. Prints the error of each output relative to its largest reference value.
#include "kernels.h"
#include <cstdio>
#include "attention_reference.h"
#include <random>
#include <algorithm>
using namespace mu;
using namespace mu::cuda_kernels;


template <class T, class W, bool V4 = false>
double run(int64_t B, int64_t H, int64_t Tq, int64_t Tk, int D, bool causal, double p, double scale, uint64_t seed) {
  const int64_t BH = B * H;
  const AttentionCase<T> c = attention_case<T>(BH, Tq, Tk, D, causal, p, scale, seed);
  const std::vector<T>&qt = c.q, &kt = c.k, &vt = c.v, &dOt = c.dO;
  const uint64_t key = kernels::attention_dropout_key(seed), thr = kernels::attention_dropout_threshold(p);
  const double keep = p < 1 ? 1 / (1 - p) : 0;
  // The kernels, launched as ops/cuda/attention.cu's host side does (forward_launch,
  // backward_launch): the vector variant (V4: float32, D = 64) with 16-byte rows and its
  // own tiles, the scalar one with odd row strides.
  Geo<W> g;
  g.BH = BH; g.Tq = Tq; g.Tk = Tk; g.D = D; g.ld = V4 ? D + 4 : D | 1; g.scale = W(scale); g.causal = causal; g.dropout = p > 0;
  g.key = key; g.threshold = thr; g.keep = W(keep);
  std::vector<lse_t<T>> l_k(BH * Tq);  // float32 for bfloat16 inputs
  std::vector<T> o_k(BH * Tq * D), dq_k(BH * Tq * D), dk_k(BH * Tk * D), dv_k(BH * Tk * D);
  constexpr int BQ = V4 ? 64 : std::is_same_v<W, double> ? 32 : 64, BK = V4 ? 64 : 32, LDP = V4 ? BK + 4 : BK + 1;
  const unsigned fblocks = unsigned(BH * ((Tq + BQ - 1) / BQ));
  const size_t fsmem = (size_t(BQ + 2 * BK) * g.ld + size_t(BQ) * LDP) * sizeof(W);
  auto dispatch = [&](auto body) {
    if constexpr (V4) body(std::integral_constant<int, 8>{});
    else if (D <= 64) body(std::integral_constant<int, 8>{});
    else body(std::integral_constant<int, 16>{});
  };
  dispatch([&](auto dc) {
    constexpr int DC = decltype(dc)::value;
    emu_launch(fblocks, 128, fsmem, [&] { forward_kernel<T, W, BQ, BK, DC, V4>(qt.data(), kt.data(), vt.data(), o_k.data(), l_k.data(), g); });
  });
  std::vector<W> di(BH * Tq), lw(BH * Tq);
  emu_launch(unsigned((BH * Tq + 7) / 8), 256, 0, [&] { attention_row_terms_kernel<T, W, lse_t<T>>(dOt.data(), o_k.data(), l_k.data(), di.data(), lw.data(), BH * Tq, D); });
  constexpr int KB = V4 ? 64 : 32, KQ = 32, QQ = V4 ? 64 : 32, QK = 32, PAD = V4 ? 4 : 1;
  const size_t smem_kv = (size_t(KB + KB + KQ + KQ) * g.ld + 2 * size_t(KB) * (KQ + PAD) + 2 * KQ) * sizeof(W);
  const size_t smem_q = (size_t(QQ + QQ + QK + QK) * g.ld + size_t(QQ) * (QK + PAD)) * sizeof(W);
  dispatch([&](auto dc) {
    constexpr int DC = decltype(dc)::value;
    emu_launch(unsigned(BH * ((Tk + KB - 1) / KB)), 128, smem_kv, [&] { dkdv_kernel<T, W, KB, KQ, DC, V4>(qt.data(), kt.data(), vt.data(), dOt.data(), lw.data(), di.data(), dk_k.data(), dv_k.data(), g); });
    emu_launch(unsigned(BH * ((Tq + QQ - 1) / QQ)), 128, smem_q, [&] { dq_kernel<T, W, QQ, QK, DC, V4>(qt.data(), kt.data(), vt.data(), dOt.data(), lw.data(), di.data(), dq_k.data(), g); });
  });
  double e[5] = {attention_error(o_k, c.out), attention_error(l_k, c.lse), attention_error(dq_k, c.dq),
                 attention_error(dk_k, c.dk), attention_error(dv_k, c.dv)};
  printf("%s%s B%ld H%ld Tq%ld Tk%ld D%d causal%d p%.2f: out %.2e lse %.2e dq %.2e dk %.2e dv %.2e\n",
         std::is_same_v<T, double> ? "f64" : std::is_same_v<T, float> ? "f32" : "bf16", V4 ? " vector" : "", B, H, Tq, Tk, D, causal, p, e[0], e[1], e[2], e[3], e[4]);
  double worst = 0;
  for (double x : e) worst = std::isnan(x) ? INFINITY : std::max(worst, x);  // a NaN output fails
  return worst;
}

int main() {
  double worst64 = 0, worst32 = 0;
  struct C { int64_t B, H, Tq, Tk; int D; bool causal; double p; };
  C cs[] = {{1, 2, 70, 70, 64, true, 0}, {2, 1, 33, 33, 5, true, 0.3}, {1, 1, 45, 70, 12, false, 0.25},
            {1, 1, 65, 65, 128, true, 0.1}, {1, 2, 1, 1, 4, false, 0}, {1, 1, 100, 3, 100, false, 0.5}, {1, 1, 130, 130, 1, true, 0}};
  for (auto& c : cs) {
    worst64 = std::max(worst64, run<double, double>(c.B, c.H, c.Tq, c.Tk, c.D, c.causal, c.p, 1 / std::sqrt(double(c.D)), 7));
    worst32 = std::max(worst32, run<float, float>(c.B, c.H, c.Tq, c.Tk, c.D, c.causal, c.p, 1 / std::sqrt(double(c.D)), 7));
  }
  // The vector variant (float32, D = 64): partial 64-row tiles, Tq != Tk both ways, dropout.
  C vs[] = {{1, 2, 70, 70, 64, true, 0}, {1, 1, 45, 130, 64, false, 0.25}, {2, 1, 129, 129, 64, true, 0.1},
            {1, 1, 100, 3, 64, false, 0}, {1, 1, 1, 1, 64, true, 0}};
  for (auto& c : vs)
    worst32 = std::max(worst32, run<float, float, true>(c.B, c.H, c.Tq, c.Tk, c.D, c.causal, c.p, 0.125, 7));
  double worst16 = std::max(run<__nv_bfloat16, float>(1, 2, 70, 70, 64, true, 0.2, 0.125, 7),
                            run<__nv_bfloat16, float>(1, 1, 45, 70, 100, false, 0, 0.1, 7));
  printf("worst f64 %.2e f32 %.2e bf16 %.2e\n", worst64, worst32, worst16);
  // The bounds of tests/test_attention.cpp (bf16: its gradient bound; lse and out are rounded to 8 bits).
  const bool ok = worst64 <= 1e-12 && worst32 <= 5e-6 && worst16 <= 3e-2;
  printf("%s\n", ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}
