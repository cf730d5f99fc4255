// The warp matrix operations of nvcuda::wmma that ops/cuda/attention_flash.cu and
// tile_gemm.cuh (hadamard_gemm.cu's and ring_gemm.cu's products) use, for emu.h: 16 x 16 x 16 fragments
// (bfloat16 a and b) and 16 x 16 x 8 ones (tf32 a and b, held as floats), row- or
// column-major, float32 accumulators. Every lane holds the whole matrix (a: 16 x K, b: K x
// 16, accumulator: 16 x 16), so element-wise work on fragments covers every position, as
// it does across the 32 lanes on the GPU, where the element-to-position map is
// unspecified but the same for fragments of one type (the only property such code may
// rely on); a store writes each lane's share only (see store_matrix_sync). Each operation
// is warp-collective: the warp meets at its barrier first, as the _sync in the names
// requires. mma_sync sums in float32 in k order; the tensor cores' order differs, so
// results agree to rounding. A tf32 operand takes part with its low 13 mantissa bits
// dropped, as the tensor cores read a float register, so a product that skipped its split
// into two tf32 halves shows as tf32's 2^-11 relative error.
// The loads and stores check what the CUDA programming guide requires of their operands:
// a pointer aligned to 256 bits and a pitch that is a multiple of 16 bytes (8 bfloat16s,
// 4 floats); a kernel breaking either stops with a message.
#pragma once
#include <cuda_bf16.h>
#include "emu.h"
#include <cstring>
#include <type_traits>

namespace nvcuda::wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };
namespace precision {
struct tf32 {};
}  // namespace precision

// The type a fragment's elements are held in: float for tf32, else the type itself.
template <class T>
struct emu_storage {
  using type = T;
};
template <>
struct emu_storage<precision::tf32> {
  using type = float;
};

template <class Use, int M, int N, int K, class T, class Layout = void>
struct fragment {
  static_assert(M == 16 && N == 16 && (K == 16 || K == 8),
                "the emulation knows 16 x 16 x 16 and 16 x 16 x 8 fragments");
  static_assert(K == 16 || !std::is_same_v<T, __nv_bfloat16>, "bfloat16 fragments are 16 x 16 x 16");
  static_assert(K == 8 || !std::is_same_v<T, precision::tf32>, "tf32 fragments are 16 x 16 x 8");
  static constexpr int rows = std::is_same_v<Use, matrix_b> ? K : M;
  static constexpr int cols = std::is_same_v<Use, matrix_a> ? K : N;
  static constexpr int num_elements = rows * cols;
  typename emu_storage<T>::type x[num_elements];
};

inline void emu_warp_sync() { ctx->warp[linear_tid / 32]->arrive_and_wait(); }

template <class Use, int K, class T, class L, class V>
void fill_fragment(fragment<Use, 16, 16, K, T, L>& f, V v) {
  emu_warp_sync();
  for (auto& e : f.x) e = v;
}

template <class T>
void emu_check_operand(const char* fn, const T* p, unsigned ld) {
  if (reinterpret_cast<uintptr_t>(p) % 32 != 0 || (size_t(ld) * sizeof(T)) % 16 != 0) {
    fprintf(stderr, "wmma::%s: pointer %p (not 32-byte aligned?) or pitch %u elements of %zu bytes (not a multiple of 16 bytes?) in block %u,%u thread %u\n",
            fn, static_cast<const void*>(p), ld, sizeof(T), blockIdx_.x, blockIdx_.y, linear_tid);
    std::abort();
  }
}

// A fragment from p: element (r, c) at p[r ld + c] (row_major) or p[c ld + r] (col_major).
template <class Use, int K, class T, class L, class P>
void load_matrix_sync(fragment<Use, 16, 16, K, T, L>& f, const P* p, unsigned ld) {
  static_assert(std::is_same_v<L, row_major> || std::is_same_v<L, col_major>, "matrix_a and matrix_b have a layout");
  static_assert(std::is_same_v<P, typename emu_storage<T>::type>, "a fragment loads from its own element type");
  using F = fragment<Use, 16, 16, K, T, L>;
  emu_warp_sync();
  emu_check_operand("load_matrix_sync", p, ld);
  constexpr bool col = std::is_same_v<L, col_major>;
  for (int r = 0; r < F::rows; ++r)
    for (int c = 0; c < F::cols; ++c) f.x[r * F::cols + c] = col ? p[size_t(c) * ld + r] : p[size_t(r) * ld + c];
}

// An accumulator from p, laid out as `layout` says.
template <int K, class T>
void load_matrix_sync(fragment<accumulator, 16, 16, K, T>& f, const T* p, unsigned ld, layout_t layout) {
  emu_warp_sync();
  emu_check_operand("load_matrix_sync", p, ld);
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c)
      f.x[r * 16 + c] = layout == mem_row_major ? p[size_t(r) * ld + c] : p[size_t(c) * ld + r];
}

// Each lane stores its share only, element e = 16 r + c by lane e % 32 (on the GPU a lane
// holds 8 of the 256 and stores those): a lane that reads what the others stored with no
// __syncwarp (or __syncthreads) between reads what was there before, in at least one of
// emu.h's two orders, as it may on the GPU.
template <int K, class T>
void store_matrix_sync(T* p, const fragment<accumulator, 16, 16, K, T>& f, unsigned ld, layout_t layout) {
  emu_warp_sync();
  emu_check_operand("store_matrix_sync", p, ld);
  if (ctx->warp[linear_tid / 32]->expected != 32) {
    fprintf(stderr, "wmma::store_matrix_sync: a warp of %u lanes (block %u,%u thread %u): fragments need whole warps\n",
            ctx->warp[linear_tid / 32]->expected, blockIdx_.x, blockIdx_.y, linear_tid);
    std::abort();
  }
  const int lane = int(linear_tid % 32);
  for (int e = lane; e < 256; e += 32) {
    const int r = e / 16, c = e % 16;
    (layout == mem_row_major ? p[size_t(r) * ld + c] : p[size_t(c) * ld + r]) = f.x[e];
  }
}

// An operand's value as the tensor cores take it: bfloat16 exactly, tf32 as the float's
// top 19 bits.
inline float emu_mma_operand(__nv_bfloat16 x) { return __bfloat162float(x); }
inline float emu_mma_operand(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u &= 0xffffe000u;
  std::memcpy(&x, &u, 4);
  return x;
}

// d = a b + c: products exact in float32 (bfloat16 and tf32 both), sums in float32.
template <int K, class T, class LA, class LB>
void mma_sync(fragment<accumulator, 16, 16, K, float>& d, const fragment<matrix_a, 16, 16, K, T, LA>& a,
              const fragment<matrix_b, 16, 16, K, T, LB>& b, const fragment<accumulator, 16, 16, K, float>& c) {
  emu_warp_sync();
  float r[256];
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) {
      float s = c.x[i * 16 + j];
      for (int k = 0; k < K; ++k) s += emu_mma_operand(a.x[i * K + k]) * emu_mma_operand(b.x[k * 16 + j]);
      r[i * 16 + j] = s;
    }
  for (int e = 0; e < 256; ++e) d.x[e] = r[e];
}
}  // namespace nvcuda::wmma
