// A stand-in for cuDNN's backend API under the host emulation, for ops/cuda/attention_cudnn.cu
// compiled as host C++ against the real cudnn.h (run.sh's part `cudnn`): the functions that
// file calls, defined with the header's signatures. Descriptors keep their attributes;
// finalizing one checks what its type requires (a tensor's dtype, dims, strides of the same
// count, unique id, alignment; an operation's descriptors, finalized, of agreeing shapes;
// an operation graph in which every virtual tensor is written by one operation before any
// reads it). cudnnBackendExecute then interprets the graph on host memory, operation by
// operation in the graph's order, through the variant pack's pointers:
//   matmul      c = a · b over the last two dims, batched over the first two (a batch dim
//               of size 1 broadcasts), float accumulation;
//   pointwise   ADD SUB MUL DIV EXP LOG IDENTITY CMP_GE, GEN_INDEX (the index along an
//               axis), BINARY_SELECT (y = t ? x : b), in float, operands broadcast where a
//               dim has size 1;
//   reduction   MAX, ADD over the dims where y has size 1;
//   reshape     y reads the memory x occupies, through y's own dims and strides (a
//               transpose is a reshape whose strides swap two dims);
// every result rounded to its tensor's dtype (bfloat16, float, int32, bool). Virtual
// tensors live in host buffers laid out by their strides. The execution checks that the
// pack names exactly the graph's non-virtual tensors, that each pointer has the declared
// alignment, and it scribbles NaN over the plan's workspace first (as an engine's scratch
// would), so a tensor placed inside it shows. Misuse is recorded in emu_cudnn::violations.
//
// Knobs for the harness: which graphs an engine takes (accept), a first engine
// configuration whose plan fails to finalize (so the next must be tried), cudnnCreate
// failing, executions refused (a plan that finalized but will not run), matmuls into real
// float tensors that add into them (as older releases did with the dQ accumulator), and
// the workspace size plans report.
#pragma once
#include <cudnn.h>
#include "emu_queue.h"

#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <cuda_bf16.h>

namespace emu_cudnn {

struct Attr {
  cudnnBackendAttributeType_t type;
  int64_t count;
  std::vector<char> bytes;
};

struct Desc {
  cudnnBackendDescriptorType_t type;
  std::map<int, Attr> attrs;  // by cudnnBackendAttributeName_t
  bool finalized = false;
  Desc* graph = nullptr;  // an engine configuration's or plan's operation graph
  bool fails = false;     // an engine configuration whose plan will not finalize

  bool has(cudnnBackendAttributeName_t n) const { return attrs.count(int(n)) != 0; }
  template <class T>
  std::vector<T> get(cudnnBackendAttributeName_t n) const {
    const Attr& a = attrs.at(int(n));
    std::vector<T> v(size_t(a.count));
    std::memcpy(v.data(), a.bytes.data(), a.bytes.size());
    return v;
  }
  template <class T>
  T one(cudnnBackendAttributeName_t n) const {
    const Attr& a = attrs.at(int(n));
    T v{};
    if (a.count < 1 || a.bytes.size() < sizeof(T)) return v;
    std::memcpy(&v, a.bytes.data(), sizeof(T));
    return v;
  }
  Desc* ref(cudnnBackendAttributeName_t n) const { return has(n) ? static_cast<Desc*>(one<void*>(n)) : nullptr; }
};

inline std::vector<std::string> violations;
inline void violation(const std::string& what) { violations.push_back(what); }
inline std::set<Desc*> live;  // descriptors created and not destroyed
inline std::function<bool(const Desc& graph)> accept = [](const Desc&) { return true; };
inline bool first_engine_fails = false;
inline bool create_fails = false;
inline bool execute_refuses = false;  // every execution returns NOT_SUPPORTED (a plan that finalized yet fails)
inline bool matmul_adds_into_real_float = false;
inline int64_t workspace_bytes = 1000;  // not a multiple of 256: the caller rounds
inline int graphs_finalized = 0, executions = 0, creates = 0;
inline std::set<int64_t> last_uids;  // the non-virtual tensors of the last graph executed

inline size_t attr_elem_bytes(cudnnBackendAttributeType_t t) {
  switch (t) {
    case CUDNN_TYPE_HANDLE: return sizeof(cudnnHandle_t);
    case CUDNN_TYPE_DATA_TYPE: return sizeof(cudnnDataType_t);
    case CUDNN_TYPE_BOOLEAN: return sizeof(bool);
    case CUDNN_TYPE_INT64: return sizeof(int64_t);
    case CUDNN_TYPE_FLOAT: return sizeof(float);
    case CUDNN_TYPE_DOUBLE: return sizeof(double);
    case CUDNN_TYPE_VOID_PTR: return sizeof(void*);
    case CUDNN_TYPE_HEUR_MODE: return sizeof(cudnnBackendHeurMode_t);
    case CUDNN_TYPE_POINTWISE_MODE: return sizeof(cudnnPointwiseMode_t);
    case CUDNN_TYPE_BACKEND_DESCRIPTOR: return sizeof(cudnnBackendDescriptor_t);
    case CUDNN_TYPE_REDUCTION_OPERATOR_TYPE: return sizeof(cudnnReduceTensorOp_t);
    default: return 0;  // not emulated
  }
}

// ---------------------------------------------------------------- tensors

struct TensorInfo {
  Desc* d;
  cudnnDataType_t dtype;
  std::vector<int64_t> dims, strides;
  int64_t uid, alignment;
  bool is_virtual, by_value;
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t x : dims) n *= x;
    return n;
  }
  int64_t span() const {  // elements from the first to one past the last, by the strides
    int64_t s = 1;
    for (size_t i = 0; i < dims.size(); ++i) s += (dims[i] - 1) * strides[i];
    return numel() == 0 ? 0 : s;
  }
};

inline TensorInfo info(Desc* t) {
  TensorInfo i;
  i.d = t;
  i.dtype = t->one<cudnnDataType_t>(CUDNN_ATTR_TENSOR_DATA_TYPE);
  i.dims = t->get<int64_t>(CUDNN_ATTR_TENSOR_DIMENSIONS);
  i.strides = t->get<int64_t>(CUDNN_ATTR_TENSOR_STRIDES);
  i.uid = t->one<int64_t>(CUDNN_ATTR_TENSOR_UNIQUE_ID);
  i.alignment = t->one<int64_t>(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT);
  i.is_virtual = t->has(CUDNN_ATTR_TENSOR_IS_VIRTUAL) && t->one<bool>(CUDNN_ATTR_TENSOR_IS_VIRTUAL);
  i.by_value = t->has(CUDNN_ATTR_TENSOR_IS_BY_VALUE) && t->one<bool>(CUDNN_ATTR_TENSOR_IS_BY_VALUE);
  return i;
}

inline size_t dtype_bytes(cudnnDataType_t t) {
  switch (t) {
    case CUDNN_DATA_FLOAT: case CUDNN_DATA_INT32: return 4;
    case CUDNN_DATA_BFLOAT16: return 2;
    case CUDNN_DATA_BOOLEAN: return 1;
    default: return 0;
  }
}

// A value as a tensor of dtype t holds it.
inline double round_to(cudnnDataType_t t, double v) {
  switch (t) {
    case CUDNN_DATA_FLOAT: return double(float(v));
    case CUDNN_DATA_BFLOAT16: return double(__bfloat162float(__float2bfloat16_rn(float(v))));
    case CUDNN_DATA_INT32: return double(int32_t(v));
    case CUDNN_DATA_BOOLEAN: return v != 0 ? 1.0 : 0.0;
    default: return v;
  }
}

// The storage of one tensor during an execution: memory at a pointer (real, by value) or
// a host buffer (virtual), element `off` at its offset from the start.
struct Store {
  TensorInfo t;
  char* p = nullptr;              // real
  std::vector<double> buf;        // virtual
  std::vector<bool> written;      // virtual: which offsets hold a value
  double load(int64_t off) const {
    if (t.is_virtual) return buf[size_t(off)];
    switch (t.dtype) {
      case CUDNN_DATA_FLOAT: { float v; std::memcpy(&v, p + off * 4, 4); return v; }
      case CUDNN_DATA_INT32: { int32_t v; std::memcpy(&v, p + off * 4, 4); return v; }
      case CUDNN_DATA_BFLOAT16: { __nv_bfloat16 v; std::memcpy(&v, p + off * 2, 2); return __bfloat162float(v); }
      default: { bool v; std::memcpy(&v, p + off, 1); return v; }
    }
  }
  void store(int64_t off, double v) {
    v = round_to(t.dtype, v);
    if (t.is_virtual) {
      buf[size_t(off)] = v;
      written[size_t(off)] = true;
      return;
    }
    switch (t.dtype) {
      case CUDNN_DATA_FLOAT: { float x = float(v); std::memcpy(p + off * 4, &x, 4); break; }
      case CUDNN_DATA_INT32: { int32_t x = int32_t(v); std::memcpy(p + off * 4, &x, 4); break; }
      case CUDNN_DATA_BFLOAT16: { __nv_bfloat16 x = __float2bfloat16_rn(float(v)); std::memcpy(p + off * 2, &x, 2); break; }
      default: { bool x = v != 0; std::memcpy(p + off, &x, 1); break; }
    }
  }
};

// Calls f(index, offset) for every element of t (index: its 4 coordinates).
template <class F>
void each(const TensorInfo& t, F f) {
  std::vector<int64_t> idx(t.dims.size(), 0);
  const int64_t n = t.numel();
  for (int64_t e = 0; e < n; ++e) {
    int64_t off = 0;
    for (size_t i = 0; i < idx.size(); ++i) off += idx[i] * t.strides[i];
    f(idx, off);
    for (int64_t i = int64_t(idx.size()) - 1; i >= 0; --i) {
      if (++idx[size_t(i)] < t.dims[size_t(i)]) break;
      idx[size_t(i)] = 0;
    }
  }
}

// The offset in t of the element at `idx` of a larger shape, t's dims of size 1 broadcast.
inline int64_t bcast_offset(const TensorInfo& t, const std::vector<int64_t>& idx) {
  int64_t off = 0;
  for (size_t i = 0; i < idx.size(); ++i) off += (t.dims[i] == 1 ? 0 : idx[i]) * t.strides[i];
  return off;
}

// Whether `small` broadcasts to `big` (each dim equal or 1).
inline bool broadcasts(const TensorInfo& small, const TensorInfo& big) {
  if (small.dims.size() != big.dims.size()) return false;
  for (size_t i = 0; i < big.dims.size(); ++i)
    if (small.dims[i] != big.dims[i] && small.dims[i] != 1) return false;
  return true;
}

// ---------------------------------------------------------------- finalize checks

inline bool is_binary(cudnnPointwiseMode_t m) {
  return m == CUDNN_POINTWISE_ADD || m == CUDNN_POINTWISE_SUB || m == CUDNN_POINTWISE_MUL ||
         m == CUDNN_POINTWISE_DIV || m == CUDNN_POINTWISE_CMP_GE || m == CUDNN_POINTWISE_BINARY_SELECT;
}

// The tensors an operation reads and the one it writes.
inline std::vector<Desc*> op_inputs(const Desc& op) {
  std::vector<Desc*> in;
  auto add = [&](cudnnBackendAttributeName_t n) {
    if (Desc* d = op.ref(n)) in.push_back(d);
  };
  switch (op.type) {
    case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR:
      add(CUDNN_ATTR_OPERATION_POINTWISE_XDESC), add(CUDNN_ATTR_OPERATION_POINTWISE_BDESC),
          add(CUDNN_ATTR_OPERATION_POINTWISE_TDESC);
      break;
    case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR: add(CUDNN_ATTR_OPERATION_REDUCTION_XDESC); break;
    case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR:
      add(CUDNN_ATTR_OPERATION_MATMUL_ADESC), add(CUDNN_ATTR_OPERATION_MATMUL_BDESC);
      break;
    case CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR: add(CUDNN_ATTR_OPERATION_RESHAPE_XDESC); break;
    default: break;
  }
  return in;
}
inline Desc* op_output(const Desc& op) {
  switch (op.type) {
    case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR: return op.ref(CUDNN_ATTR_OPERATION_POINTWISE_YDESC);
    case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR: return op.ref(CUDNN_ATTR_OPERATION_REDUCTION_YDESC);
    case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR: return op.ref(CUDNN_ATTR_OPERATION_MATMUL_CDESC);
    case CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR: return op.ref(CUDNN_ATTR_OPERATION_RESHAPE_YDESC);
    default: return nullptr;
  }
}

// Why descriptor d cannot be finalized ("" when it can).
inline std::string finalize_problem(Desc& d) {
  auto need = [&](std::initializer_list<cudnnBackendAttributeName_t> names) -> std::string {
    for (auto n : names)
      if (!d.has(n)) return "attribute " + std::to_string(int(n)) + " not set";
    return "";
  };
  auto finalized = [&](std::initializer_list<cudnnBackendAttributeName_t> names) -> std::string {
    for (auto n : names)
      if (d.has(n) && (d.ref(n) == nullptr || !d.ref(n)->finalized))
        return "descriptor attribute " + std::to_string(int(n)) + " not finalized";
    return "";
  };
  std::string why;
  switch (d.type) {
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR: {
      if (!(why = need({CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_ATTR_TENSOR_STRIDES,
                        CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT})).empty())
        return why;
      const TensorInfo t = info(&d);
      if (t.dims.size() != t.strides.size()) return "dims and strides of different counts";
      if (dtype_bytes(t.dtype) == 0) return "a dtype the emulation does not know";
      for (int64_t x : t.dims)
        if (x <= 0) return "a dim < 1";
      return "";
    }
    case CUDNN_BACKEND_POINTWISE_DESCRIPTOR: {
      if (!(why = need({CUDNN_ATTR_POINTWISE_MODE, CUDNN_ATTR_POINTWISE_MATH_PREC})).empty()) return why;
      const auto m = d.one<cudnnPointwiseMode_t>(CUDNN_ATTR_POINTWISE_MODE);
      if (m == CUDNN_POINTWISE_GEN_INDEX && !d.has(CUDNN_ATTR_POINTWISE_AXIS)) return "GEN_INDEX without an axis";
      return "";
    }
    case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR: {
      if (!(why = need({CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_ATTR_OPERATION_POINTWISE_XDESC,
                        CUDNN_ATTR_OPERATION_POINTWISE_YDESC})).empty())
        return why;
      if (!(why = finalized({CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_ATTR_OPERATION_POINTWISE_XDESC,
                             CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_ATTR_OPERATION_POINTWISE_TDESC,
                             CUDNN_ATTR_OPERATION_POINTWISE_YDESC})).empty())
        return why;
      const auto m = d.ref(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR)->one<cudnnPointwiseMode_t>(CUDNN_ATTR_POINTWISE_MODE);
      if (is_binary(m) != d.has(CUDNN_ATTR_OPERATION_POINTWISE_BDESC)) return "a b operand where the mode takes none, or none where it takes one";
      if ((m == CUDNN_POINTWISE_BINARY_SELECT) != d.has(CUDNN_ATTR_OPERATION_POINTWISE_TDESC)) return "a t operand only for BINARY_SELECT";
      const TensorInfo y = info(d.ref(CUDNN_ATTR_OPERATION_POINTWISE_YDESC));
      for (Desc* in : op_inputs(d))
        if (!broadcasts(info(in), y)) return "an operand that does not broadcast to y";
      return "";
    }
    case CUDNN_BACKEND_REDUCTION_DESCRIPTOR:
      return need({CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_ATTR_REDUCTION_COMP_TYPE});
    case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR: {
      if (!(why = need({CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_ATTR_OPERATION_REDUCTION_XDESC,
                        CUDNN_ATTR_OPERATION_REDUCTION_YDESC})).empty())
        return why;
      if (!(why = finalized({CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_ATTR_OPERATION_REDUCTION_XDESC,
                             CUDNN_ATTR_OPERATION_REDUCTION_YDESC})).empty())
        return why;
      if (!broadcasts(info(d.ref(CUDNN_ATTR_OPERATION_REDUCTION_YDESC)), info(d.ref(CUDNN_ATTR_OPERATION_REDUCTION_XDESC))))
        return "y is not x with some dims reduced to 1";
      return "";
    }
    case CUDNN_BACKEND_MATMUL_DESCRIPTOR: return need({CUDNN_ATTR_MATMUL_COMP_TYPE});
    case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR: {
      if (!(why = need({CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_ATTR_OPERATION_MATMUL_BDESC,
                        CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_ATTR_OPERATION_MATMUL_DESC})).empty())
        return why;
      if (!(why = finalized({CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_ATTR_OPERATION_MATMUL_BDESC,
                             CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_ATTR_OPERATION_MATMUL_DESC})).empty())
        return why;
      const TensorInfo a = info(d.ref(CUDNN_ATTR_OPERATION_MATMUL_ADESC)), b = info(d.ref(CUDNN_ATTR_OPERATION_MATMUL_BDESC)),
                       c = info(d.ref(CUDNN_ATTR_OPERATION_MATMUL_CDESC));
      if (a.dims.size() != 4 || b.dims.size() != 4 || c.dims.size() != 4) return "a matmul operand not 4-D";
      if (a.dims[3] != b.dims[2] || c.dims[2] != a.dims[2] || c.dims[3] != b.dims[3])
        return "matmul shapes (" + std::to_string(a.dims[2]) + " x " + std::to_string(a.dims[3]) + ") (" +
               std::to_string(b.dims[2]) + " x " + std::to_string(b.dims[3]) + ") -> (" + std::to_string(c.dims[2]) +
               " x " + std::to_string(c.dims[3]) + ")";
      for (int i = 0; i < 2; ++i)
        if ((a.dims[i] != c.dims[i] && a.dims[i] != 1) || (b.dims[i] != c.dims[i] && b.dims[i] != 1))
          return "matmul batch dims that do not broadcast";
      if (a.dtype != b.dtype) return "matmul operands of two dtypes";
      return "";
    }
    case CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR: {
      if (!(why = need({CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_ATTR_OPERATION_RESHAPE_YDESC})).empty()) return why;
      if (!(why = finalized({CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_ATTR_OPERATION_RESHAPE_YDESC})).empty()) return why;
      const TensorInfo x = info(d.ref(CUDNN_ATTR_OPERATION_RESHAPE_XDESC)), y = info(d.ref(CUDNN_ATTR_OPERATION_RESHAPE_YDESC));
      if (x.numel() != y.numel() || x.span() != y.span()) return "a reshape to a different number of elements or span";
      return "";
    }
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR: {
      if (!(why = need({CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_ATTR_OPERATIONGRAPH_OPS})).empty()) return why;
      // Every virtual tensor written once, by an operation before any that reads it; one
      // descriptor per unique id.
      std::set<Desc*> written;
      std::map<int64_t, Desc*> by_uid;
      for (void* p : d.get<void*>(CUDNN_ATTR_OPERATIONGRAPH_OPS)) {
        Desc* op = static_cast<Desc*>(p);
        if (!op->finalized) return "an operation not finalized";
        std::vector<Desc*> ts = op_inputs(*op);
        Desc* out = op_output(*op);
        for (Desc* t : ts)
          if (info(t).is_virtual && !written.count(t))
            return "virtual tensor " + std::to_string(info(t).uid) + " read before an operation writes it";
        if (info(out).is_virtual && !written.insert(out).second)
          return "virtual tensor " + std::to_string(info(out).uid) + " written twice";
        ts.push_back(out);
        for (Desc* t : ts) {
          auto [it, fresh] = by_uid.emplace(info(t).uid, t);
          if (!fresh && it->second != t) return "two tensors with unique id " + std::to_string(info(t).uid);
        }
      }
      return "";
    }
    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR:
      return need({CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_ATTR_ENGINEHEUR_MODE});
    case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR:
      if (!(why = need({CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
                        CUDNN_ATTR_VARIANT_PACK_WORKSPACE})).empty())
        return why;
      if (d.attrs.at(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS).count != d.attrs.at(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS).count)
        return "as many unique ids as data pointers";
      return "";
    default: return "";
  }
}

// ---------------------------------------------------------------- execution

inline void run_op(const Desc& op, std::map<Desc*, Store>& st) {
  Store& y = st.at(op_output(op));
  const TensorInfo& yt = y.t;
  switch (op.type) {
    case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR: {
      const Desc* pw = op.ref(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR);
      const auto m = pw->one<cudnnPointwiseMode_t>(CUDNN_ATTR_POINTWISE_MODE);
      const Store& x = st.at(op.ref(CUDNN_ATTR_OPERATION_POINTWISE_XDESC));
      const Store* b = op.has(CUDNN_ATTR_OPERATION_POINTWISE_BDESC) ? &st.at(op.ref(CUDNN_ATTR_OPERATION_POINTWISE_BDESC)) : nullptr;
      const Store* t = op.has(CUDNN_ATTR_OPERATION_POINTWISE_TDESC) ? &st.at(op.ref(CUDNN_ATTR_OPERATION_POINTWISE_TDESC)) : nullptr;
      const int64_t axis = pw->has(CUDNN_ATTR_POINTWISE_AXIS) ? pw->one<int64_t>(CUDNN_ATTR_POINTWISE_AXIS) : -1;
      each(yt, [&](const std::vector<int64_t>& idx, int64_t off) {
        const float xv = float(x.load(bcast_offset(x.t, idx)));
        const float bv = b ? float(b->load(bcast_offset(b->t, idx))) : 0.f;
        float r = 0;
        switch (m) {
          case CUDNN_POINTWISE_ADD: r = xv + bv; break;
          case CUDNN_POINTWISE_SUB: r = xv - bv; break;
          case CUDNN_POINTWISE_MUL: r = xv * bv; break;
          case CUDNN_POINTWISE_DIV: r = xv / bv; break;
          case CUDNN_POINTWISE_EXP: r = std::exp(xv); break;
          case CUDNN_POINTWISE_LOG: r = std::log(xv); break;
          case CUDNN_POINTWISE_IDENTITY: r = xv; break;
          case CUDNN_POINTWISE_CMP_GE: r = xv >= bv; break;
          case CUDNN_POINTWISE_GEN_INDEX: r = float(idx.at(size_t(axis))); break;
          case CUDNN_POINTWISE_BINARY_SELECT: r = t->load(bcast_offset(t->t, idx)) != 0 ? xv : bv; break;
          default: violation("pointwise mode " + std::to_string(int(m)) + " is not emulated"); break;
        }
        y.store(off, r);
      });
      break;
    }
    case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR: {
      const auto m = op.ref(CUDNN_ATTR_OPERATION_REDUCTION_DESC)->one<cudnnReduceTensorOp_t>(CUDNN_ATTR_REDUCTION_OPERATOR);
      const Store& x = st.at(op.ref(CUDNN_ATTR_OPERATION_REDUCTION_XDESC));
      if (m != CUDNN_REDUCE_TENSOR_MAX && m != CUDNN_REDUCE_TENSOR_ADD) violation("a reduction the emulation does not know");
      std::map<int64_t, float> acc;  // by y's offset
      each(x.t, [&](const std::vector<int64_t>& idx, int64_t off) {
        const int64_t yo = bcast_offset(yt, idx);
        const float v = float(x.load(off));
        auto [it, fresh] = acc.emplace(yo, v);
        if (!fresh) it->second = m == CUDNN_REDUCE_TENSOR_MAX ? std::max(it->second, v) : it->second + v;
      });
      for (auto [off, v] : acc) y.store(off, v);
      break;
    }
    case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR: {
      const Store& a = st.at(op.ref(CUDNN_ATTR_OPERATION_MATMUL_ADESC));
      const Store& b = st.at(op.ref(CUDNN_ATTR_OPERATION_MATMUL_BDESC));
      const int64_t K = a.t.dims[3];
      const bool adds = matmul_adds_into_real_float && !yt.is_virtual && yt.dtype == CUDNN_DATA_FLOAT;
      each(yt, [&](const std::vector<int64_t>& idx, int64_t off) {
        float s = adds ? float(y.load(off)) : 0.f;
        std::vector<int64_t> ai = {idx[0], idx[1], idx[2], 0}, bi = {idx[0], idx[1], 0, idx[3]};
        for (int64_t k = 0; k < K; ++k) {
          ai[3] = k, bi[2] = k;
          s += float(a.load(bcast_offset(a.t, ai))) * float(b.load(bcast_offset(b.t, bi)));
        }
        y.store(off, s);
      });
      break;
    }
    case CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR: {
      const Store& x = st.at(op.ref(CUDNN_ATTR_OPERATION_RESHAPE_XDESC));
      each(yt, [&](const std::vector<int64_t>&, int64_t off) {
        if (x.t.is_virtual && !x.written[size_t(off)]) violation("a reshape reads memory its source does not cover");
        y.store(off, x.load(off));
      });
      break;
    }
    default: violation("an operation the emulation does not know"); break;
  }
}

inline cudnnStatus_t execute(Desc* plan, Desc* pack) {
  ++executions;
  Desc* graph = plan->graph;
  const std::vector<int64_t> uids = pack->get<int64_t>(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS);
  const std::vector<void*> ptrs = pack->get<void*>(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS);
  void* ws = pack->one<void*>(CUDNN_ATTR_VARIANT_PACK_WORKSPACE);
  std::map<int64_t, void*> by_uid;
  for (size_t i = 0; i < uids.size(); ++i)
    if (!by_uid.emplace(uids[i], ptrs[i]).second) violation("unique id " + std::to_string(uids[i]) + " twice in a variant pack");
  // The engine's scratch: the workspace holds garbage by the time any tensor is read.
  if (workspace_bytes > 0) {
    if (ws == nullptr) return violation("no workspace for a plan that needs one"), CUDNN_STATUS_BAD_PARAM;
    std::memset(ws, 0xff, size_t(workspace_bytes));
  }
  const std::vector<void*> ops = graph->get<void*>(CUDNN_ATTR_OPERATIONGRAPH_OPS);
  std::map<Desc*, Store> st;
  std::set<int64_t> real;
  for (void* o : ops) {
    Desc* op = static_cast<Desc*>(o);
    std::vector<Desc*> ts = op_inputs(*op);
    ts.push_back(op_output(*op));
    for (Desc* t : ts) {
      if (st.count(t)) continue;
      Store s;
      s.t = info(t);
      if (s.t.is_virtual) {
        s.buf.assign(size_t(s.t.span()), NAN);
        s.written.assign(size_t(s.t.span()), false);
      } else {
        real.insert(s.t.uid);
        auto it = by_uid.find(s.t.uid);
        if (it == by_uid.end() || it->second == nullptr) {
          violation("tensor " + std::to_string(s.t.uid) + " of the graph has no pointer in the variant pack");
          return CUDNN_STATUS_BAD_PARAM;
        }
        s.p = static_cast<char*>(it->second);
        if (!s.t.by_value && reinterpret_cast<uintptr_t>(s.p) % uint64_t(s.t.alignment) != 0)
          violation("tensor " + std::to_string(s.t.uid) + "'s pointer is not aligned to " + std::to_string(s.t.alignment));
        // Scratch and tensors apart: the workspace must not overlap a tensor.
        const char* w = static_cast<const char*>(ws);
        const int64_t bytes = s.t.span() * int64_t(dtype_bytes(s.t.dtype));
        if (!s.t.by_value && ws != nullptr && s.p < w + workspace_bytes && w < s.p + bytes)
          violation("tensor " + std::to_string(s.t.uid) + " overlaps the workspace");
      }
      st.emplace(t, std::move(s));
    }
  }
  for (const auto& [uid, p] : by_uid)
    if (!real.count(uid)) violation("unique id " + std::to_string(uid) + " in the variant pack is not a tensor of the graph");
  last_uids = real;
  for (void* o : ops) run_op(*static_cast<Desc*>(o), st);
  return CUDNN_STATUS_SUCCESS;
}

}  // namespace emu_cudnn

// The handle the real header declares (typedef struct cudnnContext* cudnnHandle_t).
struct cudnnContext {
  bool stream_set = false;
};

// ---------------------------------------------------------------- the cuDNN functions
// Inline (the header declared them plain): any number of translation units may include this.

inline const char* cudnnGetErrorString(cudnnStatus_t s) {
  switch (s) {
    case CUDNN_STATUS_SUCCESS: return "emulated: success";
    case CUDNN_STATUS_BAD_PARAM: return "emulated: bad parameter";
    case CUDNN_STATUS_NOT_SUPPORTED: return "emulated: not supported";
    default: return "emulated: other status";
  }
}

inline cudnnStatus_t cudnnCreate(cudnnHandle_t* h) {
  ++emu_cudnn::creates;
  if (emu_cudnn::create_fails) return CUDNN_STATUS_NOT_INITIALIZED;
  *h = new cudnnContext;
  return CUDNN_STATUS_SUCCESS;
}

inline cudnnStatus_t cudnnSetStream(cudnnHandle_t h, cudaStream_t) {
  h->stream_set = true;
  return CUDNN_STATUS_SUCCESS;
}

inline cudnnStatus_t cudnnBackendCreateDescriptor(cudnnBackendDescriptorType_t type, cudnnBackendDescriptor_t* d) {
  auto* x = new emu_cudnn::Desc{type, {}};
  emu_cudnn::live.insert(x);
  *d = x;
  return CUDNN_STATUS_SUCCESS;
}

inline cudnnStatus_t cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t d) {
  auto* x = static_cast<emu_cudnn::Desc*>(d);
  if (!emu_cudnn::live.erase(x)) return emu_cudnn::violation("a descriptor destroyed twice"), CUDNN_STATUS_BAD_PARAM;
  delete x;
  return CUDNN_STATUS_SUCCESS;
}

inline cudnnStatus_t cudnnBackendSetAttribute(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                                       cudnnBackendAttributeType_t type, int64_t count, const void* value) {
  auto* x = static_cast<emu_cudnn::Desc*>(d);
  if (!emu_cudnn::live.count(x)) return emu_cudnn::violation("an attribute set on no descriptor"), CUDNN_STATUS_BAD_PARAM;
  if (x->finalized) return emu_cudnn::violation("an attribute set on a finalized descriptor"), CUDNN_STATUS_BAD_PARAM;
  const size_t es = emu_cudnn::attr_elem_bytes(type);
  if (es == 0 || count < 0 || (count > 0 && value == nullptr))
    return emu_cudnn::violation("attribute " + std::to_string(int(name)) + " of an unknown type or no value"),
           CUDNN_STATUS_BAD_PARAM;
  emu_cudnn::Attr a{type, count, std::vector<char>(es * size_t(count))};
  if (count > 0) std::memcpy(a.bytes.data(), value, a.bytes.size());
  x->attrs[int(name)] = std::move(a);
  return CUDNN_STATUS_SUCCESS;
}

inline cudnnStatus_t cudnnBackendFinalize(cudnnBackendDescriptor_t d) {
  using namespace emu_cudnn;
  auto* x = static_cast<Desc*>(d);
  if (x->finalized) return violation("a descriptor finalized twice"), CUDNN_STATUS_BAD_PARAM;
  const std::string why = finalize_problem(*x);
  if (!why.empty()) return violation("finalizing descriptor type " + std::to_string(int(x->type)) + ": " + why), CUDNN_STATUS_BAD_PARAM;
  if (x->type == CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR) ++graphs_finalized;
  if (x->type == CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR) {
    if (!x->has(CUDNN_ATTR_EXECUTION_PLAN_HANDLE) || !x->has(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG))
      return violation("a plan without its handle or engine configuration"), CUDNN_STATUS_BAD_PARAM;
    Desc* cfg = x->ref(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG);
    if (cfg->fails || !accept(*cfg->graph)) return CUDNN_STATUS_NOT_SUPPORTED;  // this engine declines
    x->graph = cfg->graph;
  }
  x->finalized = true;
  return CUDNN_STATUS_SUCCESS;
}

inline cudnnStatus_t cudnnBackendGetAttribute(cudnnBackendDescriptor_t const d, cudnnBackendAttributeName_t name,
                                       cudnnBackendAttributeType_t type, int64_t requested, int64_t* count,
                                       void* values) {
  using namespace emu_cudnn;
  auto* x = static_cast<Desc*>(d);
  if (!x->finalized) return violation("an attribute read from a descriptor not finalized"), CUDNN_STATUS_BAD_PARAM;
  if (x->type == CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR && name == CUDNN_ATTR_ENGINEHEUR_RESULTS) {
    // Two engine configurations, best first; the first fails to finalize a plan when asked.
    const int64_t n = 2;
    if (count) *count = std::min(requested, n);
    if (requested == 0) {
      *count = n;
      return CUDNN_STATUS_SUCCESS;
    }
    auto** cfgs = static_cast<cudnnBackendDescriptor_t*>(values);
    Desc* graph = x->ref(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH);
    for (int64_t i = 0; i < std::min(requested, n); ++i) {
      auto* c = static_cast<Desc*>(cfgs[i]);
      if (!live.count(c) || c->type != CUDNN_BACKEND_ENGINECFG_DESCRIPTOR)
        return violation("heuristic results into something that is not an engine configuration"), CUDNN_STATUS_BAD_PARAM;
      c->graph = graph;
      c->fails = i == 0 && first_engine_fails;
      c->finalized = true;
    }
    return CUDNN_STATUS_SUCCESS;
  }
  if (x->type == CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR && name == CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE &&
      type == CUDNN_TYPE_INT64 && requested >= 1) {
    *count = 1;
    *static_cast<int64_t*>(values) = workspace_bytes;
    return CUDNN_STATUS_SUCCESS;
  }
  violation("attribute " + std::to_string(int(name)) + " read, which the emulation does not know");
  return CUDNN_STATUS_NOT_SUPPORTED;
}

inline cudnnStatus_t cudnnBackendExecute(cudnnHandle_t h, cudnnBackendDescriptor_t plan, cudnnBackendDescriptor_t pack) {
  using namespace emu_cudnn;
  auto* p = static_cast<Desc*>(plan);
  auto* v = static_cast<Desc*>(pack);
  if (!h->stream_set) violation("an execution on a handle whose stream was never set");
  if (!p->finalized || p->type != CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR || !v->finalized ||
      v->type != CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR)
    return violation("an execution of something not a finalized plan and variant pack"), CUDNN_STATUS_BAD_PARAM;
  if (execute_refuses) return CUDNN_STATUS_NOT_SUPPORTED;
  if (!emu_deferred()) return execute(p, v);
  // On the stream (emu_queue.h). What cuDNN reads at the call is read now: the variant
  // pack (the caller may destroy it on return) and the host values of the by-value
  // tensors (the scale: the caller's local variable); device memory is read when the
  // graph runs. The plan and its graph stay alive (the caller caches plans).
  struct Snapshot {
    Desc pack;
    std::vector<std::vector<char>> values;  // the by-value tensors' bytes
  };
  auto snap = std::make_shared<Snapshot>();
  snap->pack = *v;
  const std::vector<int64_t> uids = v->get<int64_t>(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS);
  std::vector<void*> ptrs = v->get<void*>(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS);
  for (void* o : p->graph->get<void*>(CUDNN_ATTR_OPERATIONGRAPH_OPS)) {
    Desc* op = static_cast<Desc*>(o);
    std::vector<Desc*> ts = op_inputs(*op);
    ts.push_back(op_output(*op));
    for (Desc* t : ts) {
      const TensorInfo ti = info(t);
      if (!ti.by_value) continue;
      for (size_t i = 0; i < uids.size(); ++i)
        if (uids[i] == ti.uid && ptrs[i] != nullptr) {
          const char* from = static_cast<const char*>(ptrs[i]);
          snap->values.emplace_back(from, from + ti.span() * int64_t(dtype_bytes(ti.dtype)));
          ptrs[i] = snap->values.back().data();
        }
    }
  }
  std::memcpy(snap->pack.attrs.at(int(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS)).bytes.data(), ptrs.data(),
              ptrs.size() * sizeof(void*));
  emu_defer([p, snap] {
    if (execute(p, &snap->pack) != CUDNN_STATUS_SUCCESS) violation("a deferred execution failed");
  });
  return CUDNN_STATUS_SUCCESS;
}
