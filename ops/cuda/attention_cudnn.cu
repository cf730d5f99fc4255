// The cuDNN path of the attention forward (ops/cuda/attention.cu calls it first and falls
// back to its own tiled kernel when this returns false). Compiled only with MUMOE_CUDNN
// defined and libcudnn linked; without it the file is empty.
//
// It describes softmax(scale · Q Kᵀ, causal mask) V as a cuDNN 9 backend operation graph
// (cudnn_graph.h, no frontend library): matmul -> scale -> [causal select] -> max ->
// subtract -> exp -> sum -> (stats = max + log sum) -> divide -> matmul, the pattern cuDNN
// fuses into one flash-attention engine. The graph is built once per shape and device and
// its execution plan cached; a shape no engine supports is remembered as unsupported.
// Only bfloat16 without dropout goes here: cuDNN's dropout draws its own mask, not the
// counter-based one every backend of this framework shares (attention_dropout_bits). The
// stats (float, one per query row) are the forward's lse, written straight into the
// float32 lse tensor the op allocated. The backward stays the tiled kernel's.
#ifdef MUMOE_CUDNN
#include <cudnn.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

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

  std::vector<cudnnBackendDescriptor_t> ops;  // the graph's operations, in order
};

// Unique ids of the tensors passed at execution.
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kScale, kNegInf, kFirstVirtual = 100 };

// A finalized execution plan and everything it refers to.
struct Plan {
  GraphBuilder graph;
  Desc plan;
  int64_t workspace = 0;
};

struct Shape5 {
  int64_t B, H, Tq, Tk, D;
};

// The graph of the forward for this shape, or nullptr when cuDNN has no engine for it.
std::unique_ptr<Plan> build(cudnnHandle_t handle, const Shape5& s, bool causal) {
  auto p = std::make_unique<Plan>();
  GraphBuilder& g = p->graph;
  const int64_t B = s.B, H = s.H, Tq = s.Tq, Tk = s.Tk, D = s.D;
  int64_t next = kFirstVirtual;
  const cudnnDataType_t bf = CUDNN_DATA_BFLOAT16, f32 = CUDNN_DATA_FLOAT;
  // Dense (B, H, T, D) operands; Kᵀ is k read with its last two dims swapped.
  auto q = g.tensor(kQ, bf, {B, H, Tq, D}, {H * Tq * D, Tq * D, D, 1});
  auto kt = g.tensor(kK, bf, {B, H, D, Tk}, {H * Tk * D, Tk * D, 1, D});
  auto v = g.tensor(kV, bf, {B, H, Tk, D}, {H * Tk * D, Tk * D, D, 1});
  auto o = g.tensor(kO, bf, {B, H, Tq, D}, {H * Tq * D, Tq * D, D, 1});
  auto stats = g.tensor(kStats, f32, {B, H, Tq, 1}, {H * Tq, Tq, 1, 1});
  auto scale = g.tensor(kScale, f32, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true);
  // Score-shaped and row-shaped intermediates, float, inside the fused kernel.
  const int64_t sd[4] = {B, H, Tq, Tk}, ss[4] = {H * Tq * Tk, Tq * Tk, Tk, 1};
  const int64_t rd[4] = {B, H, Tq, 1}, rs[4] = {H * Tq, Tq, 1, 1};
  auto scores = [&](cudnnDataType_t t = CUDNN_DATA_FLOAT) { return g.tensor(next++, t, sd, ss, true); };
  auto rows = [&] { return g.tensor(next++, f32, rd, rs, true); };

  auto s0 = scores();
  g.matmul(q, kt, s0);
  auto s1 = scores();
  g.pointwise(CUDNN_POINTWISE_MUL, s0, scale, s1);
  if (causal) {
    // Keep entry (i, j) where row index >= column index, else -inf.
    auto row = scores(CUDNN_DATA_INT32), col = scores(CUDNN_DATA_INT32), keep = scores(CUDNN_DATA_BOOLEAN);
    g.pointwise(CUDNN_POINTWISE_GEN_INDEX, s1, nullptr, row, nullptr, 2);
    g.pointwise(CUDNN_POINTWISE_GEN_INDEX, s1, nullptr, col, nullptr, 3);
    g.pointwise(CUDNN_POINTWISE_CMP_GE, row, col, keep);
    auto neg_inf = g.tensor(kNegInf, f32, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true);
    auto masked = scores();
    g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, s1, neg_inf, masked, keep);
    s1 = masked;
  }
  auto mx = rows();
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, s1, mx);
  auto shifted = scores(), e = scores();
  g.pointwise(CUDNN_POINTWISE_SUB, s1, mx, shifted);
  g.pointwise(CUDNN_POINTWISE_EXP, shifted, nullptr, e);
  auto sum = rows(), log_sum = rows();
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, sum);
  g.pointwise(CUDNN_POINTWISE_LOG, sum, nullptr, log_sum);
  g.pointwise(CUDNN_POINTWISE_ADD, mx, log_sum, stats);
  // bfloat16, as v: cuDNN's fused engine takes a matmul only with both operands of one type
  // ("A and B need to have the same datatype", its log said of a float32 P).
  auto probs = scores(CUDNN_DATA_BFLOAT16);
  g.pointwise(CUDNN_POINTWISE_DIV, e, sum, probs);
  g.matmul(probs, v, o);
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

  // The heuristic's engine configurations, best first: the first that finalizes wins.
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

// Per device: the cuDNN handle and the plans built so far (nullptr: unsupported shape).
struct DeviceState {
  std::mutex mu;
  cudnnHandle_t handle = nullptr;
  bool handle_failed = false;
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, bool>, std::unique_ptr<Plan>> plans;
};

DeviceState& state(int device) {
  static std::mutex mu;
  static std::map<int, std::unique_ptr<DeviceState>> states;  // never freed: handles live as long as the process
  std::lock_guard<std::mutex> lock(mu);
  auto& s = states[device];
  if (!s) s = std::make_unique<DeviceState>();
  return *s;
}

}  // namespace

// Runs the forward through cuDNN when it can (bfloat16, no dropout, D a multiple of 8 up
// to 128, non-empty), returning true; false leaves everything to the tiled kernel.
bool attention_forward_cudnn(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                             const kernels::AttentionParams& params) {
  const Shape5 s{q.size(0), q.size(1), q.size(2), k.size(2), q.size(3)};
  if (q.dtype() != DType::BFloat16 || params.dropout_p > 0) return false;
  if (s.B * s.H == 0 || s.Tq == 0 || s.Tk == 0 || s.D == 0 || s.D % 8 != 0 || s.D > 128) return false;
  const int dev = q.device().index;
  cudaStream_t stream = cuda::stream(dev);  // also makes dev current for cudnnCreate
  DeviceState& st = state(dev);
  std::lock_guard<std::mutex> lock(st.mu);  // one handle: one caller at a time
  if (st.handle_failed) return false;
  if (st.handle == nullptr && cudnnCreate(&st.handle) != CUDNN_STATUS_SUCCESS) {
    st.handle = nullptr;
    st.handle_failed = true;  // no usable cuDNN (e.g. a library/driver mismatch): tiled kernel from now on
    return false;
  }
  const cudnnStatus_t ss = cudnnSetStream(st.handle, stream);
  MU_CHECK(ss == CUDNN_STATUS_SUCCESS, "attention_forward (cuDNN): cudnnSetStream failed: ", cudnnGetErrorString(ss));
  auto key = std::make_tuple(s.B, s.H, s.Tq, s.Tk, s.D, params.causal);
  auto it = st.plans.find(key);
  if (it == st.plans.end()) it = st.plans.emplace(key, build(st.handle, s, params.causal)).first;
  const Plan* plan = it->second.get();
  if (plan == nullptr) return false;

  // The stats (float, dense (B, H, Tq, 1)) are the lse tensor itself (float32 for
  // bfloat16 inputs, ops/kernels/attention.h).
  float* stats = static_cast<float*>(lse.raw_data());
  cuda::Workspace ws(size_t(plan->workspace), dev);
  void* cudnn_ws = ws.as<void>();
  float scale = float(params.scale), neg_inf = -INFINITY;
  // By-value tensors are passed as host pointers to their value.
  int64_t uids[] = {kQ, kK, kV, kO, kStats, kScale, kNegInf};
  void* ptrs[] = {q.raw_data(), k.raw_data(), v.raw_data(), out.raw_data(), stats, &scale, &neg_inf};
  const int64_t n = params.causal ? 7 : 6;  // -inf is in the graph only when causal
  Desc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  MU_CHECK(bool(pack), "attention_forward (cuDNN): cannot create a variant pack");
  auto chk = [&](cudnnStatus_t r, const char* what) {
    MU_CHECK(r == CUDNN_STATUS_SUCCESS, "attention_forward (cuDNN): ", what, " failed: ", cudnnGetErrorString(r),
             " (q ", shape_str(q.shape()), ", k ", shape_str(k.shape()), ")");
  };
  chk(cudnnBackendSetAttribute(pack.get(), CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids),
      "setting the unique ids");
  chk(cudnnBackendSetAttribute(pack.get(), CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs),
      "setting the data pointers");
  chk(cudnnBackendSetAttribute(pack.get(), CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &cudnn_ws),
      "setting the workspace");
  chk(cudnnBackendFinalize(pack.get()), "finalizing the variant pack");
  chk(cudnnBackendExecute(st.handle, plan->plan.get(), pack.get()), "cudnnBackendExecute");
  return true;
}

}  // namespace mu::cuda_kernels
#endif  // MUMOE_CUDNN
