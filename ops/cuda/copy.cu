// CUDA kernels of copies and fills (declared in ops/kernels/copy.h; the CPU twin is
// ops/cpu/copy.cpp). A same-dtype copy of one dense tensor into another is one
// device-to-device memcpy on the stream; every other copy (strided, broadcast, or
// converting between any two dtypes) is one thread per destination element, or per
// 16-byte pack of elements where both operands' innermost dim is dense, in a grid-stride
// loop.
#include <cstdint>
#include <cstring>

#include "ops/cuda/dtypes.cuh"
#include "ops/cuda/packs.cuh"
#include "ops/cuda/runtime.cuh"
#include "ops/cuda/strided.cuh"
#include "ops/kernels/copy.h"
#include "tensor/half.h"

namespace mu::cuda_kernels {

using namespace mu::cuda;

template <class TO, class FROM>
__global__ void copy_dense(TO* dst, const FROM* src, int64_t n) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) dst[i] = convert<TO>(src[i]);
}

// A converting dense copy with 16-byte accesses (both pointers aligned): a float32 to
// bfloat16 cast moves 4 elements per thread and step, where one at a time leaves the
// memory system idle between requests. The tail is done one at a time.
// A pack of FROM elements converted one by one into a pack of TO.
template <class TO, class FROM, int kVec>
__device__ __forceinline__ Pack<TO, kVec> convert_pack(const Pack<FROM, kVec>& a) {
  Pack<TO, kVec> r;
#pragma unroll
  for (int k = 0; k < kVec; ++k) r.v[k] = convert<TO>(a.v[k]);
  return r;
}

template <class TO, class FROM, int kVec>
__global__ void copy_dense_vectorized(TO* dst, const FROM* src, int64_t n) {
  const int64_t packs = n / kVec;
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  const int64_t first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t p = first; p < packs; p += step)
    reinterpret_cast<Pack<TO, kVec>*>(dst)[p] = convert_pack<TO>(reinterpret_cast<const Pack<FROM, kVec>*>(src)[p]);
  for (int64_t i = packs * kVec + first; i < n; i += step) dst[i] = convert<TO>(src[i]);
}


// Operand 0 is the destination, 1 the source (broadcast strides).
template <class TO, class FROM>
__global__ void copy_strided(TO* dst, const FROM* src, Strided<2> g, int64_t n) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    int64_t off[2];
    g.offsets(i, off);
    dst[off[0]] = convert<TO>(src[off[1]]);
  }
}

// copy_strided over packs of kVec elements: the innermost dim of both operands is dense
// and every pack starts on 16 bytes (see vector_space), so each thread finds one pack's
// offsets and moves kVec elements with 16-byte accesses. A transposing copy of attention
// heads ((B, H, T, D) <-> (B, T, H, D), D = 64) walks 128-byte rows this way, where one
// element per thread spends its time on index arithmetic.
template <class TO, class FROM, int kVec>
__global__ void copy_strided_vectorized(Pack<TO, kVec>* dst, const Pack<FROM, kVec>* src, Strided<2> g, int64_t n) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    int64_t off[2];
    g.offsets(i, off);
    dst[off[0]] = convert_pack<TO>(src[off[1]]);
  }
}

// The iteration space g in packs of v elements, when it can be: the innermost dim dense
// in both operands with a size divisible by v, and every outer stride divisible by v (the
// pointers' 16-byte alignment is the caller's check). False leaves g as it is.
static bool vector_space(Strided<2>& g, int v) {
  const int in = g.nd - 1;
  if (g.nd == 0 || g.strides[0][in] != 1 || g.strides[1][in] != 1 || g.sizes[in] % v != 0) return false;
  for (int d = 0; d < in; ++d)
    for (int k = 0; k < 2; ++k)
      if (g.strides[k][d] % v != 0) return false;
  g.sizes[in] /= v;
  for (int d = 0; d < in; ++d)
    for (int k = 0; k < 2; ++k) g.strides[k][d] /= v;
  g.prepare();
  return true;
}

static void copy(const Tensor& dst, const Tensor& src) {
  const int64_t n = dst.numel();
  if (n == 0) return;
  const bool dense = dst.is_contiguous() && src.is_contiguous() && dst.shape() == src.shape();
  if (dense && dst.dtype() == src.dtype()) {
    MU_CUDA_CHECK(cudaMemcpyAsync(dst.raw_data(), src.raw_data(), size_t(n) * element_size(dst.dtype()),
                                  cudaMemcpyDeviceToDevice, stream(dst)));
    return;
  }
  cudaStream_t s = stream(dst);
  constexpr int threads = 256;
  const unsigned grid = grid_for(n, threads);
  dispatch_all(dst.dtype(), "copy", [&](auto to_tag) {
    using TO = decltype(to_tag);
    dispatch_all(src.dtype(), "copy", [&](auto from_tag) {
      using FROM = decltype(from_tag);
      TO* d = static_cast<TO*>(dst.raw_data());
      const FROM* p = static_cast<const FROM*>(src.raw_data());
      constexpr int kVec = int(16 / (sizeof(TO) > sizeof(FROM) ? sizeof(TO) : sizeof(FROM)));
      if (dense && kVec > 1 && aligned16(d) && aligned16(p)) {
        copy_dense_vectorized<TO, FROM, kVec><<<grid_for((n + kVec - 1) / kVec, threads), threads, 0, s>>>(d, p, n);
      } else if (dense) {
        copy_dense<TO, FROM><<<grid, threads, 0, s>>>(d, p, n);
      } else {
        const Tensor* ops[2] = {&dst, &src};
        Strided<2> g = strided<2>(dst.shape(), ops, "copy");
        if (kVec > 1 && aligned16(d) && aligned16(p) && vector_space(g, kVec)) {
          const int64_t packs = n / kVec;
          copy_strided_vectorized<TO, FROM, kVec><<<grid_for(packs, threads), threads, 0, s>>>(
              reinterpret_cast<Pack<TO, kVec>*>(d), reinterpret_cast<const Pack<FROM, kVec>*>(p), g, packs);
        } else {
          copy_strided<TO, FROM><<<grid, threads, 0, s>>>(d, p, g, n);
        }
      }
      MU_CUDA_CHECK_LAUNCH("copy");
    });
  });
}

// `value` as a T, rounded on the host exactly as the CPU's fill rounds it.
template <class T>
static T host_value(double value) {
  if constexpr (std::is_same_v<T, bf16>) {
    const uint16_t bits = bfloat16_t(static_cast<float>(value)).bits;
    T out;
    std::memcpy(&out, &bits, sizeof out);
    return out;
  } else if constexpr (std::is_same_v<T, fp16>) {
    const uint16_t bits = half_t(static_cast<float>(value)).bits;
    T out;
    std::memcpy(&out, &bits, sizeof out);
    return out;
  } else {
    return convert_element<T>(value);
  }
}

template <class T>
__global__ void fill_dense(T* dst, T v, int64_t n) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) dst[i] = v;
}

template <class T>
__global__ void fill_strided(T* dst, T v, Strided<1> g, int64_t n) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    int64_t off[1];
    g.offsets(i, off);
    dst[off[0]] = v;
  }
}

static void fill(const Tensor& dst, double value) {
  const int64_t n = dst.numel();
  if (n == 0) return;
  cudaStream_t s = stream(dst);
  constexpr int threads = 256;
  const unsigned grid = grid_for(n, threads);
  dispatch_all(dst.dtype(), "fill_", [&](auto tag) {
    using T = decltype(tag);
    const T v = host_value<T>(value);
    T* d = static_cast<T*>(dst.raw_data());
    if (dst.is_contiguous()) {
      fill_dense<T><<<grid, threads, 0, s>>>(d, v, n);
    } else {
      const Tensor* ops[1] = {&dst};
      fill_strided<T><<<grid, threads, 0, s>>>(d, v, strided<1>(dst.shape(), ops, "fill_"), n);
    }
    MU_CUDA_CHECK_LAUNCH("fill_");
  });
}

MU_REGISTER_KERNEL(kernels::copy, DeviceType::CUDA, copy);
MU_REGISTER_KERNEL(kernels::fill, DeviceType::CUDA, fill);

}  // namespace mu::cuda_kernels
