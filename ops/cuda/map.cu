// The CUDA map kernel of every functor in ops/functors.h (the CPU twin is
// ops/cpu/map.cpp): one thread per output element in a grid-stride loop, each operand
// read through its strides broadcast to the output's shape.
#include <cuda_runtime.h>

#include <type_traits>

#include "ops/kernels/map.h"

namespace mu::cuda_kernels {

// Dims past this are refused with an error; broadcast shapes in the models stay far below.
constexpr int kMaxDims = 10;

// The output's sizes and, per operand k (0 = the output), its strides in elements.
template <int N>
struct Geometry {
  int nd;
  int64_t sizes[kMaxDims];
  int64_t strides[N + 1][kMaxDims];
};

struct Operands {
  const void* p[3];
};

template <class TO, class T0, class T1, class T2, int N, class F>
__global__ void map_kernel(TO* out, Operands in, Geometry<N> g, int64_t numel, F f) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < numel; i += step) {
    // Row-major decomposition of the output index into every operand's offset.
    int64_t off[N + 1] = {};
    int64_t r = i;
    for (int d = g.nd - 1; d >= 0; --d) {
      const int64_t k = r % g.sizes[d];
      r /= g.sizes[d];
      for (int j = 0; j <= N; ++j) off[j] += k * g.strides[j][d];
    }
    const T0* a = static_cast<const T0*>(in.p[0]);
    if constexpr (N == 1) {
      out[off[0]] = f(a[off[1]]);
    } else if constexpr (N == 2) {
      out[off[0]] = f(a[off[1]], static_cast<const T1*>(in.p[1])[off[2]]);
    } else {
      out[off[0]] = f(a[off[1]], static_cast<const T1*>(in.p[1])[off[2]], static_cast<const T2*>(in.p[2])[off[3]]);
    }
  }
}

template <class TO, class T0, class T1, class T2, class F>
static void launch(const Tensor& out, const std::array<Tensor, 3>& in, const F& f) {
  constexpr int N = F::arity;
  const int64_t numel = out.numel();
  if (numel == 0) return;
  MU_CHECK(out.dim() <= kMaxDims, F::name, " on ", out.device().str(), ": at most ", kMaxDims,
           " dims are supported, got ", out.describe());
  Geometry<N> g{};
  g.nd = int(out.dim());
  for (int d = 0; d < g.nd; ++d) {
    g.sizes[d] = out.shape()[size_t(d)];
    g.strides[0][d] = out.strides()[size_t(d)];
  }
  Operands ops{};
  for (int k = 0; k < N; ++k) {
    const Tensor& t = in[size_t(k)];
    Shape st = broadcast_strides(t.shape(), t.strides(), out.shape());
    for (int d = 0; d < g.nd; ++d) g.strides[k + 1][d] = st[size_t(d)];
    ops.p[k] = t.raw_data();
  }
  const int threads = 256;
  const int64_t blocks = (numel + threads - 1) / threads;
  // Enough blocks to fill the GPU; the grid-stride loop covers the rest.
  const unsigned grid = unsigned(blocks < 65536 ? blocks : 65536);
  cudaSetDevice(out.device().index);
  map_kernel<TO, T0, T1, T2, N, F><<<grid, threads>>>(static_cast<TO*>(out.raw_data()), ops, g, numel, f);
  cudaError_t err = cudaGetLastError();
  MU_CHECK(err == cudaSuccess, F::name, ": CUDA kernel launch failed: ", cudaGetErrorString(err));
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
