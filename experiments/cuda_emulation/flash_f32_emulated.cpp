// The float32 tensor-core attention backward of ops/cuda/attention_flash_f32.cu (its
// kernel, the dQ sum of attention_common.cuh and its host side, as written) under the
// host emulation, the tf32 WMMA fragments stood in for by emu_wmma.h (whose mma_sync
// reads a tf32 operand's top 19 bits, as the tensor cores do: a product that skipped the
// split into two tf32 halves shows as an error of ~1e-3), against the float64 reference of
// attention_reference.h: dq, dk and dv for partial 64-row tiles (dQ's scratch rows
// rounded up), several key tiles per query tile and the reverse, causal masks with Tq =
// Tk, Tq > Tk and Tq < Tk, dropout, one query and one key, heads from two batch entries.
// The forward's out and lse are the reference's, rounded to float32. The gradients start
// as NaN, so an entry never written shows. Then the calls the path must decline, leaving
// every output untouched: bfloat16, D != 64, an operand off 16-byte alignment,
// MUMOE_ATTENTION naming the tiled or cuBLAS path, no heads, no keys.
#include "flash_f32_cuda.h"
#include <cstdio>
#include "attention_reference.h"
using namespace mu;
namespace ck = mu::cuda_kernels;

static int failures = 0;
static void report(const char* what, bool ok) {
  if (!ok) printf("  FAIL: %s\n", what);
  failures += !ok;
}

// One call through the path against the reference; returns the worst relative error.
static double run(int64_t B, int64_t H, int64_t Tq, int64_t Tk, bool causal, double p, uint64_t seed) {
  constexpr int D = 64;
  const int64_t BH = B * H;
  const double scale = 1 / std::sqrt(double(D));
  AttentionCase<float> c = attention_case<float>(BH, Tq, Tk, D, causal, p, scale, seed);
  std::vector<float> out(c.out.size()), lse(c.lse.size());
  for (size_t i = 0; i < out.size(); ++i) out[i] = float(c.out[i]);
  for (size_t i = 0; i < lse.size(); ++i) lse[i] = float(c.lse[i]);
  std::vector<float> dq(out.size(), NAN), dk(size_t(BH * Tk * D), NAN), dv(dk.size(), NAN);
  kernels::AttentionParams prm;
  prm.scale = scale, prm.causal = causal, prm.dropout_p = p, prm.seed = seed;
  const bool took = ck::attention_backward_flash_f32(
      emu_view(c.q, {B, H, Tq, D}), emu_view(c.k, {B, H, Tk, D}), emu_view(c.v, {B, H, Tk, D}),
      emu_view(out, {B, H, Tq, D}), emu_view(lse, {B, H, Tq}), emu_view(c.dO, {B, H, Tq, D}),
      emu_view(dq, {B, H, Tq, D}), emu_view(dk, {B, H, Tk, D}), emu_view(dv, {B, H, Tk, D}), prm);
  report("the float32 flash path takes a float32 D = 64 call", took);
  const double e[3] = {attention_error(dq, c.dq), attention_error(dk, c.dk), attention_error(dv, c.dv)};
  printf("f32 B%ld H%ld Tq%ld Tk%ld causal%d p%.2f: dq %.2e dk %.2e dv %.2e\n", B, H, Tq, Tk, causal, p, e[0], e[1],
         e[2]);
  double worst = 0;
  for (double x : e) worst = std::isnan(x) ? INFINITY : std::max(worst, x);
  return worst;
}

// Whether the path declines a call (returns false) and leaves the gradients as they were.
template <class E>
static bool declines(int D, int64_t BH, int64_t Tk, int64_t misalign) {
  const int64_t Tq = 8;
  AttentionCase<E> c = attention_case<E>(std::max<int64_t>(BH, 1), Tq, std::max<int64_t>(Tk, 1), D, false, 0, 0.1, 3);
  std::vector<E> out(c.q.size() + 8), dq(c.q.size() + 8, from_d<E>(NAN)), dk = dq, dv = dq;
  std::vector<float> lse(c.lse.size());
  const Shape s{1, BH, Tq, D}, sk{1, BH, Tk, D};
  const bool took = ck::attention_backward_flash_f32(
      emu_view(c.q, s), emu_view(c.k, sk), emu_view(c.v, sk), emu_view(out, s), emu_view(lse, {1, BH, Tq}),
      emu_view(c.dO, s), emu_view(dq, s, {}, misalign), emu_view(dk, sk, {}, misalign), emu_view(dv, sk, {}, misalign),
      kernels::AttentionParams{});
  bool untouched = true;
  for (size_t i = 0; i < dq.size(); ++i)
    untouched &= std::isnan(to_d(dq[i])) && std::isnan(to_d(dk[i])) && std::isnan(to_d(dv[i]));
  return !took && untouched;
}

int main() {
  struct C { int64_t B, H, Tq, Tk; bool causal; double p; };
  const C cs[] = {{1, 2, 70, 70, true, 0},    {2, 1, 130, 130, true, 0.2}, {1, 1, 45, 150, false, 0.1},
                  {1, 1, 150, 40, true, 0},   {1, 1, 40, 150, true, 0.3},  {1, 1, 64, 64, false, 0},
                  {1, 1, 1, 1, false, 0},     {1, 1, 200, 70, false, 0}};
  double worst = 0;
  for (const C& c : cs) worst = std::max(worst, run(c.B, c.H, c.Tq, c.Tk, c.causal, c.p, 11));
  // The tiled float32 kernels stay within 5e-6 of the reference (attention_op_emulated.cpp);
  // so must the split products. One tf32 product per pair gives ~1e-3.
  report("dq, dk, dv within 5e-6 of the float64 reference", worst <= 5e-6);

  report("bfloat16 declined", declines<__nv_bfloat16>(64, 2, 8, 0));
  report("D = 32 declined", declines<float>(32, 2, 8, 0));
  report("an operand off 16-byte alignment declined", declines<float>(64, 2, 8, 1));
  report("no heads declined", declines<float>(64, 0, 8, 0));
  report("no keys declined", declines<float>(64, 2, 0, 0));
  setenv("MUMOE_ATTENTION", "gemm", 1);
  report("MUMOE_ATTENTION=gemm declined", declines<float>(64, 2, 8, 0));
  setenv("MUMOE_ATTENTION", "tiled", 1);
  report("MUMOE_ATTENTION=tiled declined", declines<float>(64, 2, 8, 0));
  setenv("MUMOE_ATTENTION", "flash", 1);
  report("MUMOE_ATTENTION=flash taken", run(1, 1, 20, 20, true, 0, 5) <= 5e-6);
  unsetenv("MUMOE_ATTENTION");

  printf("worst %.2e\n%s\n", worst, failures ? "FAIL" : "PASS");
  return failures ? 1 : 0;
}
