// The cuDNN path of attention (ops/cuda/attention_cudnn.cu: its graph building, plan
// choice and caching, and the host side of both directions, as written) over emu_cudnn.h,
// which checks each descriptor as cuDNN's backend API requires and interprets the
// operation graphs on host memory. Against the float64 reference of attention_reference.h:
//  - forward (out, lse) and backward (dq, dk, dv) for several shapes, causal or not,
//    Tq != Tk, head dims 8 to 128; the backward in form 0 (the first it tries);
//  - form 1, when no engine takes form 0; a first engine configuration that fails to
//    finalize its plan (the next one is used); the dQ accumulator added into, as older
//    releases do (it must start at zero);
//  - no engine at all: both directions decline and leave the outputs alone, and the shape
//    is remembered (no graph built again); a shape seen before reuses its plan;
//  - a plan whose first execution cuDNN refuses: declined, its plan forgotten, the shape
//    declined from then on without building or executing anything;
//  - the calls the path must decline: q off a 16-byte boundary, dropout, a head dim not a
//    multiple of 8 or above 128, float32, MUMOE_ATTENTION naming another path, a decoding step (unless forced);
//  - nothing against the API's rules (emu_cudnn::violations), every variant pack and
//    every plan that did not finalize destroyed.
#include "cudnn_cuda.h"
#include <cstdio>
#include "attention_reference.h"
using namespace mu;
namespace ck = mu::cuda_kernels;
using bf16 = __nv_bfloat16;

static int failures = 0;
static void report(const std::string& what, bool ok) {
  if (!ok) printf("  FAIL: %s\n", what.c_str());
  failures += !ok;
}

// Whether graph g has a non-virtual tensor with unique id uid.
static bool has_real(const emu_cudnn::Desc& g, int64_t uid) {
  for (void* o : g.get<void*>(CUDNN_ATTR_OPERATIONGRAPH_OPS)) {
    const auto* op = static_cast<emu_cudnn::Desc*>(o);
    std::vector<emu_cudnn::Desc*> ts = emu_cudnn::op_inputs(*op);
    ts.push_back(emu_cudnn::op_output(*op));
    for (auto* t : ts)
      if (!emu_cudnn::info(t).is_virtual && emu_cudnn::info(t).uid == uid) return true;
  }
  return false;
}

struct Run {
  bool fwd_took = false, bwd_took = false, untouched = true;
  double worst_fwd = 0, worst_bwd = 0;
};

// Forward then backward through the cuDNN path, each output starting as NaN.
static Run run(int64_t B, int64_t H, int64_t Tq, int64_t Tk, int D, bool causal, uint64_t seed, bool quiet = false) {
  const int64_t BH = B * H;
  const double scale = 1 / std::sqrt(double(D));
  AttentionCase<bf16> c = attention_case<bf16>(BH, Tq, Tk, D, causal, 0, scale, seed);
  const bf16 nan = from_d<bf16>(NAN);
  std::vector<bf16> out(size_t(BH * Tq * D), nan), dq(out.size(), nan), dk(size_t(BH * Tk * D), nan), dv(dk.size(), nan);
  std::vector<float> lse(size_t(BH * Tq), NAN);
  kernels::AttentionParams prm;
  prm.scale = scale, prm.causal = causal;
  const EmuTensor q = emu_view(c.q, {B, H, Tq, D}), k = emu_view(c.k, {B, H, Tk, D}), v = emu_view(c.v, {B, H, Tk, D}),
                  o = emu_view(out, {B, H, Tq, D}), l = emu_view(lse, {B, H, Tq});
  Run r;
  r.fwd_took = ck::attention_forward_cudnn(q, k, v, o, l, prm);
  r.bwd_took = ck::attention_backward_cudnn(q, k, v, o, l, emu_view(c.dO, {B, H, Tq, D}), emu_view(dq, {B, H, Tq, D}),
                                            emu_view(dk, {B, H, Tk, D}), emu_view(dv, {B, H, Tk, D}), prm);
  for (size_t i = 0; i < out.size(); ++i) r.untouched &= std::isnan(float(out[i])) && std::isnan(float(dq[i]));
  for (size_t i = 0; i < dk.size(); ++i) r.untouched &= std::isnan(float(dk[i])) && std::isnan(float(dv[i]));
  for (float x : lse) r.untouched &= std::isnan(x);
  const double e[5] = {attention_error(out, c.out), attention_error(lse, c.lse), attention_error(dq, c.dq),
                       attention_error(dk, c.dk), attention_error(dv, c.dv)};
  auto worst = [](double a, double b) { return std::isnan(b) ? INFINITY : std::max(a, b); };
  r.worst_fwd = worst(worst(0, e[0]), e[1]);
  r.worst_bwd = worst(worst(worst(0, e[2]), e[3]), e[4]);
  if (!quiet)
    printf("bf16 B%ld H%ld Tq%ld Tk%ld D%d causal%d: out %.2e lse %.2e dq %.2e dk %.2e dv %.2e (backward form %d)\n", B,
           H, Tq, Tk, D, causal, e[0], e[1], e[2], e[3], e[4], emu_cudnn::last_uids.count(ck::kRowDot) ? 0 : 1);
  return r;
}

// Out and lse within 1e-2 (P is rounded to bfloat16 before P V), the gradients within 1e-2.
static bool good(const Run& r) { return r.fwd_took && r.bwd_took && r.worst_fwd <= 1e-2 && r.worst_bwd <= 1e-2; }

// Whether the path declines both directions of a call (q of dtype dt, starting q_offset
// elements into its buffer) and leaves the outputs alone.
template <class T>
static bool declines(int D, double dropout, int64_t q_offset = 0) {
  const int64_t T_ = 8;
  AttentionCase<T> c = attention_case<T>(2, T_, T_, D, false, 0, 0.1, 3);
  std::vector<T> qbuf(size_t(q_offset) + c.q.size());
  std::copy(c.q.begin(), c.q.end(), qbuf.begin() + q_offset);
  std::vector<T> out(c.q.size(), from_d<T>(NAN)), dq = out, dk = out, dv = out;
  std::vector<float> lse(c.lse.size(), NAN);
  kernels::AttentionParams prm;
  prm.dropout_p = dropout;
  const Shape s{1, 2, T_, D};
  const EmuTensor q = emu_view(qbuf, s, {}, q_offset);
  const bool f = ck::attention_forward_cudnn(q, emu_view(c.k, s), emu_view(c.v, s), emu_view(out, s),
                                             emu_view(lse, {1, 2, T_}), prm);
  const bool b = ck::attention_backward_cudnn(q, emu_view(c.k, s), emu_view(c.v, s), emu_view(out, s),
                                              emu_view(lse, {1, 2, T_}), emu_view(c.dO, s), emu_view(dq, s),
                                              emu_view(dk, s), emu_view(dv, s), prm);
  bool untouched = true;
  for (size_t i = 0; i < out.size(); ++i)
    untouched &= std::isnan(to_d(out[i])) && std::isnan(to_d(dq[i])) && std::isnan(to_d(dk[i])) && std::isnan(to_d(dv[i]));
  return !f && !b && untouched;
}

static int live_of(cudnnBackendDescriptorType_t t) {
  int n = 0;
  for (auto* d : emu_cudnn::live) n += d->type == t;
  return n;
}

int main() {
  struct C { int64_t B, H, Tq, Tk; int D; bool causal; };
  const C cs[] = {{1, 2, 70, 70, 64, true}, {2, 1, 33, 50, 32, false}, {1, 1, 40, 40, 128, true},
                  {1, 1, 45, 20, 8, false}, {1, 1, 1, 1, 16, true}};
  int plans = 0;  // the plans cached so far (one per shape and direction)
  for (const C& c : cs) {
    const Run r = run(c.B, c.H, c.Tq, c.Tk, c.D, c.causal, 5);
    report("forward and backward through the cuDNN path, form 0, within 1e-2", good(r) && emu_cudnn::last_uids.count(ck::kRowDot));
    plans += 2;
  }

  // The same shape again: no graph built, the cached plans executed.
  const int graphs = emu_cudnn::graphs_finalized, execs = emu_cudnn::executions;
  report("a shape seen before reuses its plans",
         good(run(1, 2, 70, 70, 64, true, 6, true)) && emu_cudnn::graphs_finalized == graphs &&
             emu_cudnn::executions == execs + 2);

  // No engine takes form 0: the backward builds form 1 (Δ virtual, the mask after the scale).
  emu_cudnn::accept = [](const emu_cudnn::Desc& g) { return !has_real(g, ck::kRowDot); };
  const Run f1 = run(1, 1, 50, 50, 64, true, 7);
  report("form 1 when no engine takes form 0", good(f1) && !emu_cudnn::last_uids.count(ck::kRowDot));
  plans += 2;
  emu_cudnn::accept = [](const emu_cudnn::Desc&) { return true; };

  // The best engine configuration fails to finalize: the next one is used.
  emu_cudnn::first_engine_fails = true;
  report("the next engine configuration when the first fails", good(run(1, 1, 30, 30, 32, true, 8)));
  plans += 2;
  emu_cudnn::first_engine_fails = false;

  // Older releases add into the dQ accumulator: it must start at zero (fresh memory NaN here).
  emu_cudnn::matmul_adds_into_real_float = true;
  cuda::emu_garbage_byte = 0xff;
  report("the dQ accumulator starts at zero", good(run(1, 1, 24, 24, 16, false, 9)));
  plans += 2;
  cuda::emu_garbage_byte = 0xA7;
  emu_cudnn::matmul_adds_into_real_float = false;

  // No engine at all: both directions decline, outputs untouched, and the shape is remembered.
  emu_cudnn::accept = [](const emu_cudnn::Desc&) { return false; };
  const Run none = run(1, 1, 12, 12, 24, false, 10, true);
  const int graphs_after = emu_cudnn::graphs_finalized;
  const Run again = run(1, 1, 12, 12, 24, false, 10, true);
  report("no engine: both directions decline and leave the outputs alone",
         !none.fwd_took && !none.bwd_took && none.untouched && !again.fwd_took && again.untouched);
  report("no engine: the shape is remembered", emu_cudnn::graphs_finalized == graphs_after);
  emu_cudnn::accept = [](const emu_cudnn::Desc&) { return true; };

  // A plan that finalizes but whose first execution cuDNN refuses: both directions decline,
  // outputs untouched, and the plans are forgotten (destroyed; the shape's later calls
  // decline without building or executing anything).
  emu_cudnn::execute_refuses = true;
  const Run refused = run(1, 1, 20, 20, 32, false, 13, true);
  emu_cudnn::execute_refuses = false;
  const int graphs_refused = emu_cudnn::graphs_finalized, execs_refused = emu_cudnn::executions;
  const Run after = run(1, 1, 20, 20, 32, false, 13, true);
  report("a first execution refused: both directions decline and leave the outputs alone",
         !refused.fwd_took && !refused.bwd_took && refused.untouched);
  report("a first execution refused: the shape declines from then on, nothing built or run",
         !after.fwd_took && !after.bwd_took && after.untouched && emu_cudnn::graphs_finalized == graphs_refused &&
             emu_cudnn::executions == execs_refused);

  report("q not on a 16-byte boundary declined", declines<bf16>(64, 0, /*q_offset=*/1));
  report("dropout declined", declines<bf16>(64, 0.1));
  report("D = 36 declined", declines<bf16>(36, 0));
  report("D = 136 declined", declines<bf16>(136, 0));
  report("float32 declined", declines<float>(64, 0));
  setenv("MUMOE_ATTENTION", "tiled", 1);
  report("MUMOE_ATTENTION=tiled declined", declines<bf16>(64, 0));
  setenv("MUMOE_ATTENTION", "cudnn", 1);
  report("MUMOE_ATTENTION=cudnn taken", good(run(1, 1, 16, 16, 64, false, 11, true)));
  plans += 2;
  // A decoding step (one query, or 8, against a longer cache) is declined, with no graph
  // built for it; 9 queries, or as many as keys, are not decoding steps; =cudnn takes one.
  const int graphs_before_decode = emu_cudnn::graphs_finalized;
  unsetenv("MUMOE_ATTENTION");
  const Run step = run(1, 2, 1, 70, 64, false, 12, true), eight = run(1, 2, 8, 70, 64, false, 12, true);
  report("a decoding step declined, no graph built",
         !step.fwd_took && !step.bwd_took && step.untouched && !eight.fwd_took && !eight.bwd_took &&
             emu_cudnn::graphs_finalized == graphs_before_decode);
  report("9 queries against 70 keys taken", good(run(1, 2, 9, 70, 64, false, 12, true)));
  plans += 2;
  setenv("MUMOE_ATTENTION", "cudnn", 1);
  report("MUMOE_ATTENTION=cudnn takes a decoding step", good(run(1, 2, 1, 70, 64, false, 12, true)));
  plans += 2;
  unsetenv("MUMOE_ATTENTION");

  for (const std::string& v : emu_cudnn::violations) report("against cuDNN's rules: " + v, false);
  report("every variant pack destroyed", live_of(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR) == 0);
  report("one live plan per cached shape and direction (" + std::to_string(live_of(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR)) +
             " for " + std::to_string(plans) + ")",
         live_of(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR) == plans);
  printf("%s\n", failures ? "FAIL" : "PASS");
  return failures ? 1 : 0;
}
