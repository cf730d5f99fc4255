// The CUDA map kernel of every functor in ops/functors.h (the CPU twin is
// ops/cpu/map.cpp). A functor computes in its dtype T (float32, float64, int64 or bool);
// the operands and the output hold T, or, when T is float32, bfloat16 or float16
// (autocast's activations), each widened as it is read and rounded as it is written, so
// a bfloat16 op costs one pass over bfloat16 memory and no conversion copies. Schemes:
//  - dense: output and operands contiguous with the output's shape (no broadcast), all
//    of one dtype. Each thread takes 16 bytes of consecutive elements through vector
//    loads and stores when every pointer is 16-byte aligned (the common case: fresh
//    tensors), one at a time otherwise. Bandwidth-bound ops reach the memory's speed
//    only with wide accesses.
//  - strided: one thread per output element, each operand read through its strides
//    broadcast to the output's shape (ops/cuda/strided.cuh).
//  - mixed: float32 computation over operands and output of different 16- and 32-bit
//    float dtypes (a bfloat16 product plus a float32 bias or residual), each element's
//    dtype picked at run time (the same branch for a whole warp); strided addressing,
//    one dim when every tensor is dense.
// All run a grid-stride loop on the device's stream.
#include <cstdint>
#include <type_traits>

#include "ops/cuda/dtypes.cuh"
#include "ops/cuda/packs.cuh"
#include "ops/cuda/runtime.cuh"
#include "ops/cuda/strided.cuh"
#include "ops/kernels/map.h"

namespace mu::cuda_kernels {

using namespace mu::cuda;

struct Operands {
  const void* p[3];
};

// f applied to element `i` of the N operands, each widened to the type f computes in
// (T0 is bool for where's condition).
template <class T0, class T1, class T2, int N, class F>
__device__ __forceinline__ auto apply(const F& f, const Operands& in, const int64_t* off) {
  const auto a = widen(static_cast<const T0*>(in.p[0])[off[0]]);
  if constexpr (N == 1) {
    return f(a);
  } else if constexpr (N == 2) {
    return f(a, widen(static_cast<const T1*>(in.p[1])[off[1]]));
  } else {
    return f(a, widen(static_cast<const T1*>(in.p[1])[off[1]]), widen(static_cast<const T2*>(in.p[2])[off[2]]));
  }
}

template <class TO, class T0, class T1, class T2, int N, class F>
__global__ void map_strided(TO* out, Operands in, Strided<N + 1> g, int64_t numel, F f) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < numel; i += step) {
    int64_t off[N + 1];
    g.offsets(i, off);
    out[off[0]] = narrow<TO>(apply<T0, T1, T2, N>(f, in, off + 1));
  }
}

template <class TO, class T0, class T1, class T2, int N, class F>
__global__ void map_dense(TO* out, Operands in, int64_t numel, F f) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < numel; i += step) {
    const int64_t off[N] = {};  // every operand at i: offsets relative to the shifted bases
    Operands at = in;
    at.p[0] = static_cast<const T0*>(in.p[0]) + i;
    if constexpr (N > 1) at.p[1] = static_cast<const T1*>(in.p[1]) + i;
    if constexpr (N > 2) at.p[2] = static_cast<const T2*>(in.p[2]) + i;
    out[i] = narrow<TO>(apply<T0, T1, T2, N>(f, at, off));
  }
}

// Per operand, 0 when it is dense with the output's shape, else the length in packs of
// the row it repeats (a bias broadcast over all but the last dim).
struct RowPacks {
  int64_t n[3];
};

// Pack p of an operand: p itself, or p modulo its row's pack count.
__device__ __forceinline__ int64_t pack_at(int64_t p, int64_t row) { return row == 0 ? p : p % row; }

// Thread t handles elements [kVec t, kVec t + kVec) of every operand; the tail of fewer
// than kVec elements is done one at a time by the first threads (never with a row
// operand: its length is a multiple of kVec, and so is numel).
template <class TO, class T0, class T1, class T2, int N, int kVec, class F>
__global__ void map_vectorized(TO* out, Operands in, RowPacks rows, int64_t numel, F f) {
  const int64_t packs = numel / kVec;
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  const int64_t first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t p = first; p < packs; p += step) {
    Pack<T0, kVec> a = reinterpret_cast<const Pack<T0, kVec>*>(in.p[0])[pack_at(p, rows.n[0])];
    Pack<T1, kVec> b;
    Pack<T2, kVec> c;
    if constexpr (N > 1) b = reinterpret_cast<const Pack<T1, kVec>*>(in.p[1])[pack_at(p, rows.n[1])];
    if constexpr (N > 2) c = reinterpret_cast<const Pack<T2, kVec>*>(in.p[2])[pack_at(p, rows.n[2])];
    Pack<TO, kVec> r;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      if constexpr (N == 1) r.v[k] = narrow<TO>(f(widen(a.v[k])));
      else if constexpr (N == 2) r.v[k] = narrow<TO>(f(widen(a.v[k]), widen(b.v[k])));
      else r.v[k] = narrow<TO>(f(widen(a.v[k]), widen(b.v[k]), widen(c.v[k])));
    }
    reinterpret_cast<Pack<TO, kVec>*>(out)[p] = r;
  }
  for (int64_t i = packs * kVec + first; i < numel; i += step) {
    const int64_t off[N] = {};
    Operands at = in;
    at.p[0] = static_cast<const T0*>(in.p[0]) + i;
    if constexpr (N > 1) at.p[1] = static_cast<const T1*>(in.p[1]) + i;
    if constexpr (N > 2) at.p[2] = static_cast<const T2*>(in.p[2]) + i;
    out[i] = narrow<TO>(apply<T0, T1, T2, N>(f, at, off));
  }
}

// The iteration space of out and the N operands (their broadcast strides, dims merged
// where all allow: one dim when every tensor is dense with out's shape).
template <int N>
static Strided<N + 1> layout(const Tensor& out, const std::array<Tensor, 3>& in, const char* op) {
  if constexpr (N == 1) {
    const Tensor* t[2] = {&out, &in[0]};
    return strided<2>(out.shape(), t, op);
  } else if constexpr (N == 2) {
    const Tensor* t[3] = {&out, &in[0], &in[1]};
    return strided<3>(out.shape(), t, op);
  } else {
    const Tensor* t[4] = {&out, &in[0], &in[1], &in[2]};
    return strided<4>(out.shape(), t, op);
  }
}

// Whether out and the operands are contiguous with out's shape; whether all their data
// pointers are 16-byte aligned.
template <int N>
static std::pair<bool, bool> dense_aligned(const Tensor& out, const std::array<Tensor, 3>& in) {
  bool dense = out.is_contiguous(), aligned = aligned16(out.raw_data());
  for (int k = 0; k < N; ++k) {
    const Tensor& t = in[size_t(k)];
    dense = dense && t.is_contiguous() && t.shape() == out.shape();
    aligned = aligned && aligned16(t.raw_data());
  }
  return {dense, aligned};
}

// The row pack counts of map_vectorized for out and the N operands, or -1 in n[0] when
// that kernel cannot run them: out must be dense and every operand either dense with
// out's shape or one contiguous row along out's last dim (strides 0 elsewhere) whose
// length is a multiple of kVec, all 16-byte aligned.
template <int N>
static RowPacks row_packs(const Tensor& out, const std::array<Tensor, 3>& in, int kVec) {
  RowPacks r{{0, 0, 0}};
  const RowPacks no{{-1, -1, -1}};
  if (!out.is_contiguous() || out.dim() == 0 || !aligned16(out.raw_data())) return no;
  const int64_t last = out.size(-1);
  if (last % kVec != 0) return no;
  for (int k = 0; k < N; ++k) {
    const Tensor& t = in[size_t(k)];
    if (!aligned16(t.raw_data())) return no;
    if (t.is_contiguous() && t.shape() == out.shape()) continue;
    const Shape st = broadcast_strides(t.shape(), t.strides(), out.shape());
    bool row = st.back() == 1;
    for (size_t d = 0; d + 1 < st.size() && row; ++d) row = st[d] == 0 || out.shape()[d] == 1;
    if (!row) return no;
    r.n[k] = last / kVec;
  }
  return r;
}

template <class TO, class T0, class T1, class T2, class F>
static void launch(const Tensor& out, const std::array<Tensor, 3>& in, const F& f) {
  constexpr int N = F::arity;
  const int64_t numel = out.numel();
  if (numel == 0) return;
  Operands ops{};
  for (int k = 0; k < N; ++k) ops.p[k] = in[size_t(k)].raw_data();
  const auto [dense, aligned] = dense_aligned<N>(out, in);
  constexpr int threads = 256;
  cudaStream_t s = stream(out);
  TO* o = static_cast<TO*>(out.raw_data());
  // The widest element sets the pack: 16 bytes of it (2 doubles, 4 floats, 8 bfloat16s).
  constexpr size_t widest = sizeof(TO) > sizeof(T0) ? (sizeof(TO) > sizeof(T1) ? sizeof(TO) : sizeof(T1))
                                                    : (sizeof(T0) > sizeof(T1) ? sizeof(T0) : sizeof(T1));
  constexpr int kVec = int(16 / widest);
  const RowPacks rows = kVec > 1 ? row_packs<N>(out, in, kVec) : RowPacks{{-1, -1, -1}};
  if (dense && aligned && kVec > 1) {
    map_vectorized<TO, T0, T1, T2, N, kVec, F><<<grid_for((numel + kVec - 1) / kVec, threads), threads, 0, s>>>(
        o, ops, RowPacks{{0, 0, 0}}, numel, f);
  } else if (rows.n[0] >= 0 && rows.n[1] >= 0 && rows.n[2] >= 0) {
    // out dense, each operand dense or a repeated row (a bias): still 16-byte accesses.
    map_vectorized<TO, T0, T1, T2, N, kVec, F><<<grid_for(numel / kVec, threads), threads, 0, s>>>(o, ops, rows,
                                                                                                   numel, f);
  } else if (dense) {
    map_dense<TO, T0, T1, T2, N, F><<<grid_for(numel, threads), threads, 0, s>>>(o, ops, numel, f);
  } else {
    map_strided<TO, T0, T1, T2, N, F><<<grid_for(numel, threads), threads, 0, s>>>(o, ops, layout<N>(out, in, F::name),
                                                                                    numel, f);
  }
  MU_CUDA_CHECK_LAUNCH(F::name);
}

// ---------------------------------------------------------------- mixed float dtypes

enum class Kind : uint8_t { f32, bf16, f16, boolean };

// The kind of a value operand, or of the output (bool for a comparison's).
static Kind kind_of(DType d, bool output_bool, const char* op) {
  if (output_bool) {
    MU_CHECK(d == DType::Bool, op, " on CUDA: a comparison writes bool, the destination is ", dtype_name(d));
    return Kind::boolean;
  }
  switch (d) {
    case DType::Float32: return Kind::f32;
    case DType::BFloat16: return Kind::bf16;
    case DType::Float16: return Kind::f16;
    default: break;
  }
  MU_FAIL(op, " on CUDA: operands of mixed dtypes must be float32, bfloat16 or float16, got ", dtype_name(d));
}

struct Kinds {
  Kind in[3];
  Kind out;
};

__device__ __forceinline__ float load_float(const void* p, int64_t i, Kind k) {
  if (k == Kind::bf16) return __bfloat162float(static_cast<const bf16*>(p)[i]);
  if (k == Kind::f16) return __half2float(static_cast<const fp16*>(p)[i]);
  return static_cast<const float*>(p)[i];
}

template <class R>
__device__ __forceinline__ void store(void* p, int64_t i, Kind k, R v) {
  if constexpr (std::is_same_v<R, bool>) {
    static_cast<bool*>(p)[i] = v;  // a comparison: the output is bool
  } else if (k == Kind::bf16) {
    static_cast<bf16*>(p)[i] = __float2bfloat16_rn(v);
  } else if (k == Kind::f16) {
    static_cast<fp16*>(p)[i] = __float2half_rn(v);
  } else {
    static_cast<float*>(p)[i] = v;
  }
}

template <int N, bool kSelect, class F>
__global__ void map_mixed(void* out, Operands in, Kinds kinds, Strided<N + 1> g, int64_t numel, F f) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < numel; i += step) {
    int64_t off[N + 1];
    g.offsets(i, off);
    if constexpr (kSelect) {
      const bool c = static_cast<const bool*>(in.p[0])[off[1]];
      store(out, off[0], kinds.out,
            f(c, load_float(in.p[1], off[2], kinds.in[1]), load_float(in.p[2], off[3], kinds.in[2])));
    } else if constexpr (N == 1) {
      store(out, off[0], kinds.out, f(load_float(in.p[0], off[1], kinds.in[0])));
    } else if constexpr (N == 2) {
      store(out, off[0], kinds.out, f(load_float(in.p[0], off[1], kinds.in[0]), load_float(in.p[1], off[2], kinds.in[1])));
    } else {
      store(out, off[0], kinds.out,
            f(load_float(in.p[0], off[1], kinds.in[0]), load_float(in.p[1], off[2], kinds.in[1]),
              load_float(in.p[2], off[3], kinds.in[2])));
    }
  }
}

template <class F>
static void launch_mixed(const Tensor& out, const std::array<Tensor, 3>& in, const F& f) {
  constexpr int N = F::arity;
  const int64_t numel = out.numel();
  if (numel == 0) return;
  Operands ops{};
  Kinds kinds{};
  for (int k = 0; k < N; ++k) {
    ops.p[k] = in[size_t(k)].raw_data();
    // where's condition is read as bool (kinds.in[0] unused).
    if (!(F::select && k == 0)) kinds.in[k] = kind_of(in[size_t(k)].dtype(), false, F::name);
  }
  kinds.out = kind_of(out.dtype(), F::result == fn::Result::Bool, F::name);
  constexpr int threads = 256;
  map_mixed<N, F::select, F><<<grid_for(numel, threads), threads, 0, stream(out)>>>(
      out.raw_data(), ops, kinds, layout<N>(out, in, F::name), numel, f);
  MU_CUDA_CHECK_LAUNCH(F::name);
}

template <class F>
static void map(const Tensor& out, const std::array<Tensor, 3>& in, const F& f) {
  constexpr bool kBoolOut = F::result == fn::Result::Bool;
  const size_t first = F::select ? 1 : 0;
  const DType s = in[first].dtype();
  bool uniform = out.dtype() == (kBoolOut ? kBool : s);
  for (size_t k = first + 1; k < size_t(F::arity); ++k) uniform = uniform && in[k].dtype() == s;
  if (uniform && s == kBFloat16) {
    // All bfloat16: the dense path moves 8 elements per 16-byte access.
    using TO = std::conditional_t<kBoolOut, bool, bf16>;
    using T0 = std::conditional_t<F::select, bool, bf16>;
    launch<TO, T0, bf16, bf16>(out, in, f);
  } else if (!uniform || !is_compute_dtype(s)) {
    launch_mixed<F>(out, in, f);  // float32 with 16-bit floats (kind_of refuses the rest)
  } else {
    kernels::dispatch_functor<F>(s, [&](auto tag) {
      using T = decltype(tag);
      using TO = std::conditional_t<kBoolOut, bool, T>;
      using T0 = std::conditional_t<F::select, bool, T>;
      launch<TO, T0, T, T>(out, in, f);
    });
  }
}

template <class... F>
static bool register_map_kernels(fn::FunctorList<F...>) {
  (kernels::map<F>().set(DeviceType::CUDA, &map<F>), ...);
  return true;
}

[[maybe_unused]] static const bool registered = register_map_kernels(fn::AllFunctors{});

}  // namespace mu::cuda_kernels
