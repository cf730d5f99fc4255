// The CUDA attention op whole: ops/cuda/attention.cu's entry points (its host side: tile
// sizes, shared memory and the opt-in past 48 KB, the vector variant's choice, empty
// calls, the head-dim limit, and the order in which it offers a call to cuDNN, the flash
// kernels, the cuBLAS path and its tiled kernels), with each of those paths emulated in
// its own translation unit (run.sh), against the float64 reference of
// attention_reference.h. Each call's outputs start as NaN. Which path ran is read from the
// stand-ins (cuDNN executions, cuBLAS GEMMs) and the flash path's launch names, and checked
// against the rules the code documents: bfloat16 without dropout goes to cuDNN; the
// other bfloat16 calls and the float32 ones at D = 64 (16-byte aligned; the forward from
// 64 queries on) to the flash kernels; the cuBLAS path from 128 x 128 scores on, except
// the float32 forward; MUMOE_ATTENTION=
// tiled|gemm|flash forces its path where it applies; everything else runs the tiled kernels,
// which also run forced over more shapes (head dims 1 to 128, Tq != Tk, dropout), their
// backward twice: dQ fused into the dK/dV blocks, and MUMOE_ATTENTION_DQ=separate.
#include "attention_op_cuda.h"
#include <cstdio>
#include "attention_reference.h"
using namespace mu;
namespace ck = mu::cuda_kernels;
using bf16 = __nv_bfloat16;

namespace mu::cuda {
cublasHandle_t cublas(int) { return nullptr; }  // the stand-in ignores the handle
}  // namespace mu::cuda

static int failures = 0;
static void report(const std::string& what, bool ok) {
  if (!ok) printf("  FAIL: %s\n", what.c_str());
  failures += !ok;
}

// What each direction's call went to, from the stand-ins' counters around it.
// The flash path is told by its launches' names.
struct Seen {
  long cudnn = emu_cudnn::executions, gemm = emu_cublas_calls;
  Seen() { emu_last_launch.clear(); }
  std::string path() const {
    if (emu_cudnn::executions != cudnn) return "cudnn";
    if (emu_last_launch.find("(flash") != std::string::npos) return "flash";
    if (emu_cublas_calls != gemm) return "gemm";
    return "tiled";
  }
};

template <class T>
static const char* tname() {
  return std::is_same_v<T, double> ? "f64" : std::is_same_v<T, float> ? "f32" : "bf16";
}

// Forward then backward through the op's CUDA entry points with MUMOE_ATTENTION = force
// (nullptr: unset); the paths taken must be want_fwd and want_bwd; `offset` elements of
// misalignment for every operand.
// dq_mode: MUMOE_ATTENTION_DQ (nullptr: unset, the tiled backward's fused dQ where it fits).
template <class T>
static void run_once(int64_t B, int64_t H, int64_t Tq, int64_t Tk, int D, bool causal, double p, const char* force,
                     const char* want_fwd, const char* want_bwd, int64_t offset, const char* dq_mode) {
  if (force) setenv("MUMOE_ATTENTION", force, 1);
  else unsetenv("MUMOE_ATTENTION");
  if (dq_mode) setenv("MUMOE_ATTENTION_DQ", dq_mode, 1);
  else unsetenv("MUMOE_ATTENTION_DQ");
  const int64_t BH = B * H;
  const double scale = 1 / std::sqrt(double(D));
  AttentionCase<T> c = attention_case<T>(BH, Tq, Tk, D, causal, p, scale, 21);
  const T nan = from_d<T>(NAN);
  auto padded = [&](std::vector<T> v) {  // the data moved `offset` elements in
    v.insert(v.begin(), size_t(offset), T{});
    return v;
  };
  std::vector<T> q = padded(c.q), k = padded(c.k), v = padded(c.v), g = padded(c.dO);
  std::vector<T> out(size_t(BH * Tq * D + offset), nan), dq(out.size(), nan), dk(size_t(BH * Tk * D + offset), nan),
      dv(dk.size(), nan);
  using L = std::conditional_t<std::is_same_v<T, double>, double, float>;  // lse: float32 beside bfloat16
  std::vector<L> lse(size_t(BH * Tq), L(NAN));
  const Shape sq{B, H, Tq, D}, sk{B, H, Tk, D};
  kernels::AttentionParams prm;
  prm.scale = scale, prm.causal = causal, prm.dropout_p = p, prm.seed = 21;
  const Seen f;
  ck::attention_forward(emu_view(q, sq, {}, offset), emu_view(k, sk, {}, offset), emu_view(v, sk, {}, offset),
                        emu_view(out, sq, {}, offset), emu_view(lse, {B, H, Tq}), prm);
  const std::string fwd = f.path();
  const Seen b;
  ck::attention_backward(emu_view(q, sq, {}, offset), emu_view(k, sk, {}, offset), emu_view(v, sk, {}, offset),
                         emu_view(out, sq, {}, offset), emu_view(lse, {B, H, Tq}), emu_view(g, sq, {}, offset),
                         emu_view(dq, sq, {}, offset), emu_view(dk, sk, {}, offset), emu_view(dv, sk, {}, offset), prm);
  const std::string bwd = b.path();
  out.erase(out.begin(), out.begin() + offset), dq.erase(dq.begin(), dq.begin() + offset);
  dk.erase(dk.begin(), dk.begin() + offset), dv.erase(dv.begin(), dv.begin() + offset);
  const double e[5] = {attention_error(out, c.out), attention_error(lse, c.lse), attention_error(dq, c.dq),
                       attention_error(dk, c.dk), attention_error(dv, c.dv)};
  double worst = 0;
  for (double x : e) worst = std::isnan(x) ? INFINITY : std::max(worst, x);
  const double tol = std::is_same_v<T, double> ? 1e-12 : std::is_same_v<T, float> ? 5e-6 : 1e-2;
  char what[256];
  snprintf(what, sizeof what, "%s B%ld H%ld Tq%ld Tk%ld D%d causal%d p%.2f%s%s%s%s: %s/%s, worst %.2e", tname<T>(), B,
           H, Tq, Tk, D, causal, p, force ? " MUMOE_ATTENTION=" : "", force ? force : "", offset ? " misaligned" : "",
           dq_mode ? " MUMOE_ATTENTION_DQ=separate" : "", fwd.c_str(), bwd.c_str(), worst);
  printf("%s\n", what);
  report(std::string(what) + ": within " + std::to_string(tol), worst <= tol);
  report(std::string(what) + ": paths " + want_fwd + "/" + want_bwd, fwd == want_fwd && bwd == want_bwd);
  unsetenv("MUMOE_ATTENTION");
  unsetenv("MUMOE_ATTENTION_DQ");
}

// Each call once, and where the tiled backward runs it, again with its separate dQ blocks.
template <class T>
static void run(int64_t B, int64_t H, int64_t Tq, int64_t Tk, int D, bool causal, double p, const char* force,
                const char* want_fwd, const char* want_bwd, int64_t offset = 0) {
  run_once<T>(B, H, Tq, Tk, D, causal, p, force, want_fwd, want_bwd, offset, nullptr);
  if (std::string(want_bwd) == "tiled")
    run_once<T>(B, H, Tq, Tk, D, causal, p, force, want_fwd, want_bwd, offset, "separate");
}

int main() {
  // bfloat16
  run<bf16>(1, 2, 70, 70, 64, true, 0, nullptr, "cudnn", "cudnn");
  run<bf16>(1, 2, 70, 70, 64, true, 0.2, nullptr, "flash", "flash");
  run<bf16>(1, 1, 130, 130, 32, true, 0.1, nullptr, "gemm", "gemm");
  run<bf16>(1, 1, 40, 40, 64, false, 0, "tiled", "tiled", "tiled");
  run<bf16>(1, 1, 40, 50, 48, false, 0.1, "gemm", "gemm", "gemm");
  run<bf16>(1, 1, 70, 70, 64, true, 0, "flash", "flash", "flash");
  run<bf16>(1, 1, 40, 70, 64, false, 0.1, nullptr, "tiled", "flash");  // under 64 queries: the tiled forward
  // float32: the tensor-core kernels (D = 64, aligned; the forward from 64 queries on,
  // below that the tiled kernels' vector variant), forced back to the tiled kernels; the
  // scalar variant, the cuBLAS backward
  run<float>(1, 1, 130, 130, 64, true, 0.1, nullptr, "flash", "flash");
  run<float>(1, 1, 40, 40, 64, true, 0, nullptr, "tiled", "flash");
  run<float>(1, 1, 130, 130, 64, true, 0.1, "tiled", "tiled", "tiled");
  run<float>(1, 2, 70, 70, 64, false, 0, "flash", "flash", "flash");
  run<float>(1, 1, 130, 130, 32, false, 0, nullptr, "tiled", "gemm");
  run<float>(1, 1, 50, 50, 40, true, 0, nullptr, "tiled", "tiled");
  run<float>(1, 1, 50, 50, 64, true, 0.2, nullptr, "tiled", "tiled", 1);  // off 16 bytes: the scalar variant
  run<float>(1, 2, 40, 40, 64, false, 0, "gemm", "gemm", "gemm");
  // float64: the tiled kernels only, D = 128 (the larger accumulator)
  run<double>(1, 1, 33, 45, 128, false, 0.1, nullptr, "tiled", "tiled");
  // Empty: no queries (dK, dV zero), no keys (out zero, lse -inf, dQ zero).
  run<float>(1, 2, 0, 5, 8, false, 0, nullptr, "tiled", "tiled");
  run<float>(1, 2, 5, 0, 8, false, 0, nullptr, "tiled", "tiled");

  // The tiled kernels over more shapes, forced where another path would take the call:
  // partial tiles, Tq != Tk both ways, D from 1 to 128, dropout; float64, float32 (the
  // scalar variant, and the vector one at D = 64), bfloat16.
  struct C { int64_t B, H, Tq, Tk; int D; bool causal; double p; };
  const C cs[] = {{2, 1, 33, 33, 5, true, 0.3},    {1, 1, 45, 70, 12, false, 0.25}, {1, 1, 65, 65, 128, true, 0.1},
                  {1, 2, 1, 1, 4, false, 0},       {1, 1, 100, 3, 100, false, 0.5}, {1, 1, 130, 130, 1, true, 0},
                  {1, 1, 45, 130, 64, false, 0.25}, {2, 1, 129, 129, 64, true, 0.1}, {1, 1, 100, 3, 64, false, 0},
                  {1, 1, 1, 1, 64, true, 0}};
  for (const C& c : cs) {
    run<double>(c.B, c.H, c.Tq, c.Tk, c.D, c.causal, c.p, nullptr, "tiled", "tiled");
    run<float>(c.B, c.H, c.Tq, c.Tk, c.D, c.causal, c.p, "tiled", "tiled", "tiled");
  }
  run<bf16>(1, 1, 45, 70, 100, false, 0, "tiled", "tiled", "tiled");

  // A head dim past the tiled kernels' accumulators: a mu::Error naming it.
  {
    std::vector<float> x(size_t(2 * 136), 1.f), o(x.size()), l(2);
    const Shape s{1, 1, 2, 136};
    std::string msg;
    try {
      ck::attention_forward(emu_view(x, s), emu_view(x, s), emu_view(x, s), emu_view(o, s), emu_view(l, {1, 1, 2}),
                            kernels::AttentionParams{});
    } catch (const Error& e) {
      msg = e.what();
    }
    report("D = 136 refused by name ('" + msg + "')",
           msg.find("attention_forward on CUDA: head dim D = 136 is not supported (at most 128)") != std::string::npos);
  }
  for (const std::string& v : emu_cudnn::violations) report("against cuDNN's rules: " + v, false);
  printf("%s\n", failures ? "FAIL" : "PASS");
  return failures ? 1 : 0;
}
