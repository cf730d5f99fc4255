// The cuDNN path of attention, forward and backward (ops/cuda/attention.cu calls each first
// and falls back to the framework's own kernels when it returns false). Compiled only with
// MUMOE_CUDNN defined and libcudnn linked; without it the file is empty.
//
// Each direction is a cuDNN 9 backend operation graph (cudnn_graph.h, no frontend library)
// in the pattern cuDNN fuses into one flash-attention engine:
//   forward:  matmul -> scale -> [causal select] -> max -> subtract -> exp -> sum ->
//             (stats = max + log sum) -> divide -> matmul
//   backward: rowsum(dO * O) = Δ;  P = exp(scale · Q Kᵀ [masked] - stats);
//             dV = Pᵀ dO;  dS = P * (dO Vᵀ - Δ) * scale;  dK = dSᵀ Q;  dQ = dS K
// A graph is built once per shape, direction and device and its execution plan cached; a
// shape no engine supports is remembered as unsupported. Only bfloat16 without dropout goes
// here: cuDNN's dropout draws its own mask, not the counter-based one every backend of this
// framework shares (attention_dropout_bits). The stats (float, one per query row) are the
// forward's lse, written straight into the float32 lse tensor the op allocated, and read
// back by the backward.
#ifdef MUMOE_CUDNN
#include <cudnn.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "ops/cuda/attention_common.cuh"
#include "ops/cuda/dtypes.cuh"
#include "ops/cuda/runtime.cuh"
#include "ops/kernels/attention.h"

namespace mu::cuda_kernels {
namespace {

// One backend descriptor, destroyed with its owner.
class Desc {
 public:
  Desc() = default;
  explicit Desc(cudnnBackendDescriptorType_t type) {
    if (cudnnBackendCreateDescriptor(type, &d_) != CUDNN_STATUS_SUCCESS) d_ = nullptr;
  }
  ~Desc() {
    if (d_ != nullptr) cudnnBackendDestroyDescriptor(d_);
  }
  Desc(Desc&& o) noexcept : d_(o.d_) { o.d_ = nullptr; }
  Desc& operator=(Desc&& o) noexcept {
    std::swap(d_, o.d_);
    return *this;
  }
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;
  cudnnBackendDescriptor_t get() const { return d_; }
  explicit operator bool() const { return d_ != nullptr; }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

// Building a graph: every call is checked, and the first failure makes the whole build
// report false (the caller then uses the tiled kernel).
class GraphBuilder {
 public:
  bool ok = true;
  std::vector<Desc> keep;  // every descriptor the graph refers to, alive as long as the plan

  cudnnBackendDescriptor_t make(cudnnBackendDescriptorType_t type) {
    keep.emplace_back(type);
    if (!keep.back()) ok = false;
    return keep.back().get();
  }
  void set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
           int64_t count, const void* value) {
    if (ok && cudnnBackendSetAttribute(d, name, type, count, value) != CUDNN_STATUS_SUCCESS) ok = false;
  }
  void finalize(cudnnBackendDescriptor_t d) {
    if (ok && cudnnBackendFinalize(d) != CUDNN_STATUS_SUCCESS) ok = false;
  }

  // A 4-D tensor: real (data passed at execution), virtual (lives inside the fused
  // kernel), or by value (a host scalar passed at execution).
  cudnnBackendDescriptor_t tensor(int64_t uid, cudnnDataType_t dtype, const int64_t (&dims)[4],
                                  const int64_t (&strides)[4], bool is_virtual = false, bool by_value = false) {
    cudnnBackendDescriptor_t t = make(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    const int64_t alignment = 16;
    set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dtype);
    set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims);
    set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides);
    set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment);
    set(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual);
    if (by_value) set(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value);
    finalize(t);
    return t;
  }

  // y = mode(x[, b][, t]) elementwise in float; GEN_INDEX takes the axis it numbers.
  cudnnBackendDescriptor_t pointwise(cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x,
                                     cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t y,
                                     cudnnBackendDescriptor_t t = nullptr, int64_t axis = -1) {
    cudnnBackendDescriptor_t pw = make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    const cudnnDataType_t prec = CUDNN_DATA_FLOAT;
    set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    set(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
    if (axis >= 0) set(pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
    finalize(pw);
    cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw);
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    if (b != nullptr) set(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
    if (t != nullptr) set(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t);
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    finalize(op);
    ops.push_back(op);
    return op;
  }

  // y = reduce(x) over the dims where y has size 1, in float.
  void reduction(cudnnReduceTensorOp_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t r = make(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    const cudnnDataType_t prec = CUDNN_DATA_FLOAT;
    set(r, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode);
    set(r, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &prec);
    finalize(r);
    cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    set(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &r);
    set(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    set(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    finalize(op);
    ops.push_back(op);
  }

  // c = a · b over the last two dims, batched over the first two, fp32 accumulation.
  void matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c) {
    cudnnBackendDescriptor_t mm = make(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    const cudnnDataType_t prec = CUDNN_DATA_FLOAT;
    set(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &prec);
    finalize(mm);
    cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    set(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a);
    set(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
    set(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c);
    set(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &mm);
    finalize(op);
    ops.push_back(op);
  }

  // y = x laid out anew: y's own dims, strides and dtype (a transpose is a reshape whose
  // strides swap two dims; a bfloat16 y of a float x also rounds).
  void reshape(cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    set(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    set(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    finalize(op);
    ops.push_back(op);
  }

  std::vector<cudnnBackendDescriptor_t> ops;  // the graph's operations, in order
};

// Unique ids of the tensors passed at execution (by-value scalars included).
enum Uid : int64_t {
  kQ = 1, kK, kV, kO, kStats, kScale, kNegInf,  // forward; the backward reads the same five
  kGradO, kGradQ, kGradK, kGradV, kRowDot, kGradQAccum, kOne,
  kFirstVirtual = 100
};

// A finalized execution plan and everything it refers to. The backward also needs two
// float32 scratch tensors of its own (Δ and the dQ accumulator), placed after cuDNN's
// workspace in one allocation.
struct Plan {
  GraphBuilder graph;
  Desc plan;
  int64_t workspace = 0;
  int form = 0;            // which graph form an engine took (the backward tries two)
  const char* what = "";   // that form in words, for MUMOE_CUDNN_LOG
  bool has_run = false;    // an execution succeeded: a later failure is an error, not a refusal
};

struct Shape5 {
  int64_t B, H, Tq, Tk, D;
};

// Dense (B, H, T, D) strides, and those of the same tensor read with its last two dims
// swapped (Kᵀ, Vᵀ: dims (B, H, D, T)).
struct Layout {
  int64_t dense[4], swapped[4];
  Layout(int64_t H, int64_t T, int64_t D)
      : dense{H * T * D, T * D, D, 1}, swapped{H * T * D, T * D, 1, D} {}
};

// Finalizes graph g's operations into an execution plan: the heuristic's engine
// configurations, best first; the first that finalizes wins. nullptr when none does.
std::unique_ptr<Plan> make_plan(std::unique_ptr<Plan> p, cudnnHandle_t handle) {
  GraphBuilder& g = p->graph;
  if (!g.ok) return nullptr;
  cudnnBackendDescriptor_t graph = g.make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  g.set(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
  g.set(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, int64_t(g.ops.size()), g.ops.data());
  g.finalize(graph);
  cudnnBackendDescriptor_t heur = g.make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
  g.set(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph);
  g.set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
  g.finalize(heur);
  if (!g.ok) return nullptr;  // no engine takes this graph

  int64_t count = 0;
  if (cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count,
                               nullptr) != CUDNN_STATUS_SUCCESS || count <= 0)
    return nullptr;
  std::vector<cudnnBackendDescriptor_t> cfgs(static_cast<size_t>(count));
  for (auto& c : cfgs) c = g.make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
  if (!g.ok) return nullptr;
  int64_t got = 0;
  if (cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got,
                               cfgs.data()) != CUDNN_STATUS_SUCCESS)
    return nullptr;
  for (int64_t i = 0; i < got; ++i) {
    Desc plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
    if (!plan) return nullptr;
    if (cudnnBackendSetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle) !=
            CUDNN_STATUS_SUCCESS ||
        cudnnBackendSetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                 &cfgs[size_t(i)]) != CUDNN_STATUS_SUCCESS ||
        cudnnBackendFinalize(plan.get()) != CUDNN_STATUS_SUCCESS)
      continue;  // this engine does not support the graph after all
    int64_t ws = 0, n = 0;
    if (cudnnBackendGetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n, &ws) !=
        CUDNN_STATUS_SUCCESS)
      continue;
    p->plan = std::move(plan);
    p->workspace = ws;
    return p;
  }
  return nullptr;
}

// What both directions' graphs start from: the shape's sizes and layouts, Q and Kᵀ (k read
// with its last two dims swapped), the stats, the scale, and makers of the virtual
// score-shaped (B, H, Tq, Tk) and row-shaped (B, H, Tq, 1) intermediates.
struct GraphStart {
  GraphBuilder& g;
  int64_t B, H, Tq, Tk, D;
  Layout lq, lk;
  int64_t next = kFirstVirtual;  // the next virtual tensor's unique id
  cudnnBackendDescriptor_t q, kt, stats, scale;

  GraphStart(GraphBuilder& g_, const Shape5& s)
      : g(g_), B(s.B), H(s.H), Tq(s.Tq), Tk(s.Tk), D(s.D), lq(s.H, s.Tq, s.D), lk(s.H, s.Tk, s.D) {
    q = g.tensor(kQ, CUDNN_DATA_BFLOAT16, {B, H, Tq, D}, lq.dense);
    kt = g.tensor(kK, CUDNN_DATA_BFLOAT16, {B, H, D, Tk}, lk.swapped);
    stats = g.tensor(kStats, CUDNN_DATA_FLOAT, {B, H, Tq, 1}, {H * Tq, Tq, 1, 1});
    scale = g.tensor(kScale, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true);
  }
  cudnnBackendDescriptor_t scores(cudnnDataType_t t = CUDNN_DATA_FLOAT) {
    const int64_t sd[4] = {B, H, Tq, Tk}, ss[4] = {H * Tq * Tk, Tq * Tk, Tk, 1};
    return g.tensor(next++, t, sd, ss, true);
  }
  cudnnBackendDescriptor_t rows() {
    const int64_t rd[4] = {B, H, Tq, 1}, rs[4] = {H * Tq, Tq, 1, 1};
    return g.tensor(next++, CUDNN_DATA_FLOAT, rd, rs, true);
  }
  // x where the row index >= the column index, else -inf (the by-value kNegInf).
  cudnnBackendDescriptor_t causal_mask(cudnnBackendDescriptor_t x) {
    auto row = scores(CUDNN_DATA_INT32), col = scores(CUDNN_DATA_INT32), keep = scores(CUDNN_DATA_BOOLEAN);
    g.pointwise(CUDNN_POINTWISE_GEN_INDEX, x, nullptr, row, nullptr, 2);
    g.pointwise(CUDNN_POINTWISE_GEN_INDEX, x, nullptr, col, nullptr, 3);
    g.pointwise(CUDNN_POINTWISE_CMP_GE, row, col, keep);
    auto neg_inf = g.tensor(kNegInf, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true);
    auto masked = scores();
    g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, x, neg_inf, masked, keep);
    return masked;
  }
};

// The forward's graph for this shape, or nullptr when cuDNN has no engine for it.
std::unique_ptr<Plan> build_forward(cudnnHandle_t handle, const Shape5& s, bool causal) {
  auto p = std::make_unique<Plan>();
  p->what = "forward";
  GraphBuilder& g = p->graph;
  GraphStart st(g, s);
  auto v = g.tensor(kV, CUDNN_DATA_BFLOAT16, {st.B, st.H, st.Tk, st.D}, st.lk.dense);
  auto o = g.tensor(kO, CUDNN_DATA_BFLOAT16, {st.B, st.H, st.Tq, st.D}, st.lq.dense);

  auto s0 = st.scores();
  g.matmul(st.q, st.kt, s0);
  auto s1 = st.scores();
  g.pointwise(CUDNN_POINTWISE_MUL, s0, st.scale, s1);
  if (causal) s1 = st.causal_mask(s1);
  auto mx = st.rows();
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, s1, mx);
  auto shifted = st.scores(), e = st.scores();
  g.pointwise(CUDNN_POINTWISE_SUB, s1, mx, shifted);
  g.pointwise(CUDNN_POINTWISE_EXP, shifted, nullptr, e);
  auto sum = st.rows(), log_sum = st.rows();
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, sum);
  g.pointwise(CUDNN_POINTWISE_LOG, sum, nullptr, log_sum);
  g.pointwise(CUDNN_POINTWISE_ADD, mx, log_sum, st.stats);
  // bfloat16, as v: cuDNN's fused engine takes a matmul only with both operands of one type
  // ("A and B need to have the same datatype", its log said of a float32 P).
  auto probs = st.scores(CUDNN_DATA_BFLOAT16);
  g.pointwise(CUDNN_POINTWISE_DIV, e, sum, probs);
  g.matmul(probs, v, o);
  return make_plan(std::move(p), handle);
}

// The backward's graph for this shape in one of two forms cuDNN releases have fused (the
// engine matches the pattern, so which form a given library takes is found by trying):
//   form 0: the causal mask after subtracting the stats, Δ a real float tensor;
//   form 1: the mask right after scaling (as in the forward), Δ virtual.
// Both accumulate dQ in a real float32 tensor (kGradQAccum) rounded into dQ at the end.
std::unique_ptr<Plan> build_backward(cudnnHandle_t handle, const Shape5& s, bool causal, int form) {
  auto p = std::make_unique<Plan>();
  p->form = form;
  p->what = form == 0 ? "backward, form 0 (mask after the stats, real row dots)" : "backward, form 1 (mask after the scale)";
  GraphBuilder& g = p->graph;
  GraphStart st(g, s);
  const int64_t B = s.B, H = s.H, Tq = s.Tq, Tk = s.Tk, D = s.D;
  const cudnnDataType_t bf = CUDNN_DATA_BFLOAT16, f32 = CUDNN_DATA_FLOAT;
  const Layout &lq = st.lq, &lk = st.lk;
  auto q = st.q, kt = st.kt, stats = st.stats, scale = st.scale;
  auto vt = g.tensor(kV, bf, {B, H, D, Tk}, lk.swapped);
  auto o = g.tensor(kO, bf, {B, H, Tq, D}, lq.dense);
  auto dout = g.tensor(kGradO, bf, {B, H, Tq, D}, lq.dense);
  auto dq = g.tensor(kGradQ, bf, {B, H, Tq, D}, lq.dense);
  auto dk = g.tensor(kGradK, bf, {B, H, Tk, D}, lk.dense);
  auto dv = g.tensor(kGradV, bf, {B, H, Tk, D}, lk.dense);
  auto dq_acc = g.tensor(kGradQAccum, f32, {B, H, Tq, D}, lq.dense);
  auto one = g.tensor(kOne, f32, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true);
  const int64_t td[4] = {B, H, Tk, Tq}, ts[4] = {H * Tq * Tk, Tq * Tk, 1, Tk};  // a score tensor transposed
  const int64_t rd[4] = {B, H, Tq, 1}, rs[4] = {H * Tq, Tq, 1, 1};
  auto scores = [&] { return st.scores(); };
  auto rows = [&] { return st.rows(); };

  // Δ_i = Σ_d dO_id O_id (times one: the slot where a dropout scale would go).
  auto prod = g.tensor(st.next++, f32, {B, H, Tq, D}, lq.dense, true);
  g.pointwise(CUDNN_POINTWISE_MUL, dout, o, prod);
  auto dot = rows();
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, prod, dot);
  auto delta = form == 0 ? g.tensor(kRowDot, f32, rd, rs) : rows();
  g.pointwise(CUDNN_POINTWISE_MUL, dot, one, delta);

  // P = exp(scale · Q Kᵀ - stats), masked.
  auto s0 = scores(), s1 = scores();
  g.matmul(q, kt, s0);
  g.pointwise(CUDNN_POINTWISE_MUL, s0, scale, s1);
  if (causal && form == 1) s1 = st.causal_mask(s1);
  auto s2 = scores();
  g.pointwise(CUDNN_POINTWISE_SUB, s1, stats, s2);
  if (causal && form == 0) s2 = st.causal_mask(s2);
  auto probs = scores();
  g.pointwise(CUDNN_POINTWISE_EXP, s2, nullptr, probs);

  // dV = Pᵀ dO, Pᵀ a bfloat16 transposed view (the matmul's operands share one type).
  auto probs_t = g.tensor(st.next++, bf, td, ts, true);
  g.reshape(probs, probs_t);
  g.matmul(probs_t, dout, dv);

  // dS = P * (dO Vᵀ - Δ) * scale.
  auto dp = scores(), dp_centered = scores(), ds0 = scores(), ds = scores();
  g.matmul(dout, vt, dp);
  g.pointwise(CUDNN_POINTWISE_SUB, dp, delta, dp_centered);
  g.pointwise(CUDNN_POINTWISE_MUL, dp_centered, probs, ds0);
  g.pointwise(CUDNN_POINTWISE_MUL, ds0, scale, ds);

  // dK = dSᵀ Q; dQ = dS K (K read back in its own layout), accumulated in float32.
  auto ds_t = g.tensor(st.next++, bf, td, ts, true);
  g.reshape(ds, ds_t);
  g.matmul(ds_t, q, dk);
  auto k_own = g.tensor(st.next++, f32, {B, H, Tk, D}, lk.dense, true);
  g.reshape(kt, k_own);
  g.matmul(ds, k_own, dq_acc);
  g.pointwise(CUDNN_POINTWISE_IDENTITY, dq_acc, nullptr, dq);
  return make_plan(std::move(p), handle);
}

// Per device: the cuDNN handle and the plans built so far (nullptr: unsupported shape).
struct DeviceState {
  std::mutex mu;
  cudnnHandle_t handle = nullptr;
  bool handle_failed = false;
  // (B, H, Tq, Tk, D, causal, backward) -> plan
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, bool, bool>, std::unique_ptr<Plan>> plans;
};

DeviceState& state(int device) {
  static std::mutex mu;
  static std::map<int, std::unique_ptr<DeviceState>> states;  // never freed: handles live as long as the process
  std::lock_guard<std::mutex> lock(mu);
  auto& s = states[device];
  if (!s) s = std::make_unique<DeviceState>();
  return *s;
}

// Decoding steps (attention_decoding_step) are left to the framework's kernels unless
// MUMOE_ATTENTION=cudnn: plans are built and kept per (B, H, Tq, Tk, D), so every step of a
// sampling loop would build a plan of its own (graph, heuristics, finalization: far more
// than the step's kernel) and keep it for the life of the process.

// What both directions take: bfloat16 without dropout, D a multiple of 8 up to 128,
// non-empty, not a decoding step, and MUMOE_ATTENTION not naming one of the framework's
// own kernels (=cudnn takes decoding steps too).
bool cudnn_takes(const Tensor& q, const Shape5& s, const kernels::AttentionParams& params) {
  if (q.dtype() != DType::BFloat16 || params.dropout_p > 0) return false;
  if (s.B * s.H == 0 || s.Tq == 0 || s.Tk == 0 || s.D == 0 || s.D % 8 != 0 || s.D > 128) return false;
  if (attention_path_forced("cudnn")) return true;
  return attention_path_unset() && !attention_decoding_step(s.Tq, s.Tk);
}

// The device's handle on the current stream with st.mu held, or nullptr when cuDNN cannot
// be used there (remembered: the framework's kernels from then on).
cudnnHandle_t handle_on_stream(DeviceState& st, int dev, const char* op) {
  cudaStream_t stream = cuda::stream(dev);  // also makes dev current for cudnnCreate
  if (st.handle_failed) return nullptr;
  if (st.handle == nullptr && cudnnCreate(&st.handle) != CUDNN_STATUS_SUCCESS) {
    st.handle = nullptr;
    st.handle_failed = true;  // no usable cuDNN (e.g. a library/driver mismatch)
    return nullptr;
  }
  const cudnnStatus_t ss = cudnnSetStream(st.handle, stream);
  MU_CHECK(ss == CUDNN_STATUS_SUCCESS, op, " (cuDNN): cudnnSetStream failed: ", cudnnGetErrorString(ss));
  return st.handle;
}

// MUMOE_CUDNN_LOG=1 prints which graph form each new shape got (or that none did).
void log_plan(const char* op, const Shape5& s, const Plan* plan) {
  const char* log = std::getenv("MUMOE_CUDNN_LOG");
  if (log == nullptr || std::strcmp(log, "1") != 0) return;
  std::fprintf(stderr, "[mumoe] %s (cuDNN) B %lld H %lld Tq %lld Tk %lld D %lld: %s\n", op, (long long)s.B,
               (long long)s.H, (long long)s.Tq, (long long)s.Tk, (long long)s.D,
               plan != nullptr ? plan->what : "no engine, the framework's kernel");
}

// Runs plan with the tensors named by uids (device pointers, or host pointers for the
// by-value scalars) and workspace ws, returning true. A plan's first execution may still
// be refused (an engine that finalized for the graph but rejects it when run): that
// returns false, and the caller forgets the plan and leaves the call to the framework's
// kernels. A failure after a successful run is an error.
bool execute(cudnnHandle_t handle, Plan& plan, const int64_t* uids, void* const* ptrs, int64_t n, void* ws,
             const char* op, const Tensor& q, const Tensor& k) {
  Desc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  MU_CHECK(bool(pack), op, " (cuDNN): cannot create a variant pack");
  auto chk = [&](cudnnStatus_t r, const char* what) {
    MU_CHECK(r == CUDNN_STATUS_SUCCESS, op, " (cuDNN): ", what, " failed: ", cudnnGetErrorString(r), " (q ",
             shape_str(q.shape()), ", k ", shape_str(k.shape()), ")");
  };
  chk(cudnnBackendSetAttribute(pack.get(), CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids),
      "setting the unique ids");
  chk(cudnnBackendSetAttribute(pack.get(), CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs),
      "setting the data pointers");
  chk(cudnnBackendSetAttribute(pack.get(), CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws),
      "setting the workspace");
  chk(cudnnBackendFinalize(pack.get()), "finalizing the variant pack");
  const cudnnStatus_t r = cudnnBackendExecute(handle, plan.plan.get(), pack.get());
  if (r != CUDNN_STATUS_SUCCESS && !plan.has_run) {
    // A launch cuDNN could not make leaves its error as the runtime's last one, which the
    // framework's next kernel launch would otherwise report as its own.
    (void)cudaGetLastError();
    if (const char* log = std::getenv("MUMOE_CUDNN_LOG"); log != nullptr && std::strcmp(log, "1") == 0)
      std::fprintf(stderr, "[mumoe] %s (cuDNN) refused at its first execution (%s): the framework's kernel\n", op,
                   cudnnGetErrorString(r));
    return false;
  }
  chk(r, "cudnnBackendExecute");
  plan.has_run = true;
  return true;
}

// Bytes rounded up to a 256-byte boundary (each tensor carved out of one workspace starts on one).
size_t round_up(int64_t bytes) { return (size_t(bytes) + 255) / 256 * 256; }

}  // namespace

// Runs the forward through cuDNN when it can (cudnn_takes), returning true; false leaves
// everything to the framework's kernels.
bool attention_forward_cudnn(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                             const kernels::AttentionParams& params) {
  const Shape5 s{q.size(0), q.size(1), q.size(2), k.size(2), q.size(3)};
  if (!cudnn_takes(q, s, params)) return false;
  // The graph declares every tensor 16-byte aligned (GraphBuilder::tensor): a view that starts
  // elsewhere goes to the framework's kernels.
  if (!attention_aligned16({&q, &k, &v, &out, &lse})) return false;
  const int dev = q.device().index;
  DeviceState& st = state(dev);
  std::lock_guard<std::mutex> lock(st.mu);  // one handle: one caller at a time
  cudnnHandle_t handle = handle_on_stream(st, dev, "attention_forward");
  if (handle == nullptr) return false;
  auto key = std::make_tuple(s.B, s.H, s.Tq, s.Tk, s.D, params.causal, false);
  auto it = st.plans.find(key);
  if (it == st.plans.end()) {
    it = st.plans.emplace(key, build_forward(handle, s, params.causal)).first;
    log_plan("attention_forward", s, it->second.get());
  }
  Plan* plan = it->second.get();
  if (plan == nullptr) return false;

  // The stats (float, dense (B, H, Tq, 1)) are the lse tensor itself (float32 for
  // bfloat16 inputs, ops/kernels/attention.h).
  cuda::Workspace ws(size_t(plan->workspace), dev);
  float scale = float(params.scale), neg_inf = -INFINITY;
  int64_t uids[] = {kQ, kK, kV, kO, kStats, kScale, kNegInf};
  void* ptrs[] = {q.raw_data(), k.raw_data(), v.raw_data(), out.raw_data(), lse.raw_data(), &scale, &neg_inf};
  const int64_t n = params.causal ? 7 : 6;  // -inf is in the graph only when causal
  if (!execute(handle, *plan, uids, ptrs, n, ws.as<void>(), "attention_forward", q, k)) {
    it->second.reset();  // refused: the shape's later calls go to the framework's kernels at once
    return false;
  }
  return true;
}

// Runs the backward through cuDNN when it can, returning true; false leaves everything to
// the framework's kernels. lse is the forward's (either path's: both are the log-sum-exp
// of the scaled, masked scores), float32.
bool attention_backward_cudnn(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                              const Tensor& grad_out, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                              const kernels::AttentionParams& params) {
  const Shape5 s{q.size(0), q.size(1), q.size(2), k.size(2), q.size(3)};
  if (!cudnn_takes(q, s, params) || lse.dtype() != DType::Float32) return false;
  if (!attention_aligned16({&q, &k, &v, &out, &lse, &grad_out, &dq, &dk, &dv})) return false;  // as the forward
  const int dev = q.device().index;
  DeviceState& st = state(dev);
  std::lock_guard<std::mutex> lock(st.mu);
  cudnnHandle_t handle = handle_on_stream(st, dev, "attention_backward");
  if (handle == nullptr) return false;
  auto key = std::make_tuple(s.B, s.H, s.Tq, s.Tk, s.D, params.causal, true);
  auto it = st.plans.find(key);
  if (it == st.plans.end()) {
    std::unique_ptr<Plan> built;
    for (int form = 0; form < 2 && built == nullptr; ++form) built = build_backward(handle, s, params.causal, form);
    it = st.plans.emplace(key, std::move(built)).first;
    log_plan("attention_backward", s, it->second.get());
  }
  Plan* plan = it->second.get();
  if (plan == nullptr) return false;

  // One allocation: cuDNN's workspace, then Δ (B·H·Tq floats), then the dQ accumulator
  // (as q, float32), which starts at zero (older releases add into it).
  const size_t ws_bytes = round_up(plan->workspace), delta_bytes = round_up(s.B * s.H * s.Tq * 4);
  const size_t acc_bytes = size_t(q.numel()) * 4;
  cuda::Workspace ws(ws_bytes + delta_bytes + acc_bytes, dev);
  char* base = ws.as<char>();
  void* delta = base + ws_bytes;
  void* dq_acc = base + ws_bytes + delta_bytes;
  MU_CUDA_CHECK(cudaMemsetAsync(dq_acc, 0, acc_bytes, cuda::stream(dev)));
  float scale = float(params.scale), neg_inf = -INFINITY, one = 1.0f;
  int64_t uids[] = {kQ, kK, kV, kO, kGradO, kStats, kGradQ, kGradK, kGradV, kGradQAccum, kScale, kOne, kRowDot, kNegInf};
  void* ptrs[] = {q.raw_data(),  k.raw_data(),  v.raw_data(),  out.raw_data(), grad_out.raw_data(),
                  lse.raw_data(), dq.raw_data(), dk.raw_data(), dv.raw_data(),  dq_acc,
                  &scale,         &one,          delta,         &neg_inf};
  // Δ is a real tensor only in form 0, -inf in the graph only when causal: the pack names
  // exactly the graph's non-virtual tensors.
  std::vector<int64_t> use_uids;
  std::vector<void*> use_ptrs;
  const bool real_delta = plan->form == 0;
  for (size_t i = 0; i < std::size(uids); ++i) {
    if (uids[i] == kRowDot && !real_delta) continue;
    if (uids[i] == kNegInf && !params.causal) continue;
    use_uids.push_back(uids[i]);
    use_ptrs.push_back(ptrs[i]);
  }
  if (!execute(handle, *plan, use_uids.data(), use_ptrs.data(), int64_t(use_uids.size()), base, "attention_backward",
               q, k)) {
    it->second.reset();  // refused: the shape's later calls go to the framework's kernels at once
    return false;
  }
  return true;
}

}  // namespace mu::cuda_kernels
#endif  // MUMOE_CUDNN
