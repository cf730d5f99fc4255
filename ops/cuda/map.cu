// The CUDA map kernel of every functor in ops/functors.h (the CPU twin is
// ops/cpu/map.cpp). Two schemes:
//  - dense: output and operands contiguous with the output's shape (no broadcast). Each
//    thread takes kVec consecutive elements through 16-byte vector loads and stores when
//    every pointer is 16-byte aligned (the common case: fresh tensors), one at a time
//    otherwise. Bandwidth-bound ops reach the memory's speed only with wide accesses.
//  - strided: one thread per output element, each operand read through its strides
//    broadcast to the output's shape (ops/cuda/strided.cuh).
// Both run a grid-stride loop on the device's stream.
#include <cstdint>
#include <type_traits>

#include "ops/cuda/runtime.cuh"
#include "ops/cuda/strided.cuh"
#include "ops/kernels/map.h"

namespace mu::cuda_kernels {

using namespace mu::cuda;

struct Operands {
  const void* p[3];
};

// f applied to element `i` of the N operands (T0 is bool for where's condition).
template <class T0, class T1, class T2, int N, class F>
__device__ __forceinline__ auto apply(const F& f, const Operands& in, const int64_t* off) {
  const T0 a = static_cast<const T0*>(in.p[0])[off[0]];
  if constexpr (N == 1) {
    return f(a);
  } else if constexpr (N == 2) {
    return f(a, static_cast<const T1*>(in.p[1])[off[1]]);
  } else {
    return f(a, static_cast<const T1*>(in.p[1])[off[1]], static_cast<const T2*>(in.p[2])[off[2]]);
  }
}

template <class TO, class T0, class T1, class T2, int N, class F>
__global__ void map_strided(TO* out, Operands in, Strided<N + 1> g, int64_t numel, F f) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < numel; i += step) {
    int64_t off[N + 1];
    g.offsets(i, off);
    out[off[0]] = apply<T0, T1, T2, N>(f, in, off + 1);
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
    out[i] = apply<T0, T1, T2, N>(f, at, off);
  }
}

// kVec elements of T moved as one access of kVec * sizeof(T) bytes (16 for the widest
// operand; narrower ones, such as a comparison's bools, move fewer bytes per pack).
template <class T, int kVec>
struct alignas(sizeof(T) * kVec) Pack {
  T v[kVec];
};

// Thread t handles elements [kVec t, kVec t + kVec) of every operand; the tail of fewer
// than kVec elements is done one at a time by the first threads.
template <class TO, class T0, class T1, class T2, int N, int kVec, class F>
__global__ void map_vectorized(TO* out, Operands in, int64_t numel, F f) {
  const int64_t packs = numel / kVec;
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  const int64_t first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t p = first; p < packs; p += step) {
    Pack<T0, kVec> a = reinterpret_cast<const Pack<T0, kVec>*>(in.p[0])[p];
    Pack<T1, kVec> b;
    Pack<T2, kVec> c;
    if constexpr (N > 1) b = reinterpret_cast<const Pack<T1, kVec>*>(in.p[1])[p];
    if constexpr (N > 2) c = reinterpret_cast<const Pack<T2, kVec>*>(in.p[2])[p];
    Pack<TO, kVec> r;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      if constexpr (N == 1) r.v[k] = f(a.v[k]);
      else if constexpr (N == 2) r.v[k] = f(a.v[k], b.v[k]);
      else r.v[k] = f(a.v[k], b.v[k], c.v[k]);
    }
    reinterpret_cast<Pack<TO, kVec>*>(out)[p] = r;
  }
  for (int64_t i = packs * kVec + first; i < numel; i += step) {
    const int64_t off[N] = {};
    Operands at = in;
    at.p[0] = static_cast<const T0*>(in.p[0]) + i;
    if constexpr (N > 1) at.p[1] = static_cast<const T1*>(in.p[1]) + i;
    if constexpr (N > 2) at.p[2] = static_cast<const T2*>(in.p[2]) + i;
    out[i] = apply<T0, T1, T2, N>(f, at, off);
  }
}

static bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <class TO, class T0, class T1, class T2, class F>
static void launch(const Tensor& out, const std::array<Tensor, 3>& in, const F& f) {
  constexpr int N = F::arity;
  const int64_t numel = out.numel();
  if (numel == 0) return;
  Operands ops{};
  bool dense = out.is_contiguous(), aligned = aligned16(out.raw_data());
  for (int k = 0; k < N; ++k) {
    const Tensor& t = in[size_t(k)];
    ops.p[k] = t.raw_data();
    dense = dense && t.is_contiguous() && t.shape() == out.shape();
    aligned = aligned && aligned16(t.raw_data());
  }
  constexpr int threads = 256;
  cudaStream_t s = stream(out);
  TO* o = static_cast<TO*>(out.raw_data());
  // The widest element sets the pack: 16 bytes of it (2 doubles, 4 floats).
  constexpr size_t widest = sizeof(TO) > sizeof(T0) ? (sizeof(TO) > sizeof(T1) ? sizeof(TO) : sizeof(T1))
                                                    : (sizeof(T0) > sizeof(T1) ? sizeof(T0) : sizeof(T1));
  constexpr int kVec = int(16 / widest);
  if (dense && aligned && kVec > 1) {
    map_vectorized<TO, T0, T1, T2, N, kVec, F><<<grid_for((numel + kVec - 1) / kVec, threads), threads, 0, s>>>(
        o, ops, numel, f);
  } else if (dense) {
    map_dense<TO, T0, T1, T2, N, F><<<grid_for(numel, threads), threads, 0, s>>>(o, ops, numel, f);
  } else {
    Strided<N + 1> g;
    if constexpr (N == 1) {
      const Tensor* t[2] = {&out, &in[0]};
      g = strided<2>(out.shape(), t, F::name);
    } else if constexpr (N == 2) {
      const Tensor* t[3] = {&out, &in[0], &in[1]};
      g = strided<3>(out.shape(), t, F::name);
    } else {
      const Tensor* t[4] = {&out, &in[0], &in[1], &in[2]};
      g = strided<4>(out.shape(), t, F::name);
    }
    map_strided<TO, T0, T1, T2, N, F><<<grid_for(numel, threads), threads, 0, s>>>(o, ops, g, numel, f);
  }
  MU_CUDA_CHECK_LAUNCH(F::name);
}

template <class F>
static void map(const Tensor& out, const std::array<Tensor, 3>& in, const F& f) {
  const Tensor& typed = in[F::select ? 1 : 0];
  kernels::dispatch_functor<F>(typed.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using TO = std::conditional_t<F::result == fn::Result::Bool, bool, T>;
    using T0 = std::conditional_t<F::select, bool, T>;
    launch<TO, T0, T, T>(out, in, f);
  });
}

template <class... F>
static bool register_map_kernels(fn::FunctorList<F...>) {
  (kernels::map<F>().set(DeviceType::CUDA, &map<F>), ...);
  return true;
}

[[maybe_unused]] static const bool registered = register_map_kernels(fn::AllFunctors{});

}  // namespace mu::cuda_kernels
