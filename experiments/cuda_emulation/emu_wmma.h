// The warp matrix operations of nvcuda::wmma that ops/cuda/hadamard_gemm.cu and
// attention_flash.cu use (16 x 16 x 16 fragments: bfloat16 a and b, row- or column-major,
// float32 accumulators), for emu.h. Every
// lane holds the whole 16 x 16 matrix (num_elements = 256), so element-wise work on
// fragments covers every position, as it does across the 32 lanes on the GPU, where the
// element-to-position map is unspecified but the same for fragments of one type (the
// only property such code may rely on). Each operation is warp-collective: the warp
// meets at its barrier first, as the _sync in the names requires. mma_sync sums in
// float32 in k order; the tensor cores' order differs, so results agree to rounding.
// The loads and stores check what the CUDA programming guide requires of their operands:
// a pointer aligned to 256 bits and a pitch that is a multiple of 16 bytes (8 bfloat16s,
// 4 floats); a kernel breaking either stops with a message.
#pragma once
#include <cuda_bf16.h>
#include "emu.h"
#include <type_traits>

namespace nvcuda::wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <class Use, int M, int N, int K, class T, class Layout = void>
struct fragment {
  static_assert(M == 16 && N == 16 && K == 16, "the emulation knows 16 x 16 x 16 fragments");
  static constexpr int num_elements = 256;
  T x[256];
};

inline void emu_warp_sync() { ctx->warp[linear_tid / 32]->arrive_and_wait(); }

template <class Use, class T, class L>
void fill_fragment(fragment<Use, 16, 16, 16, T, L>& f, T v) {
  emu_warp_sync();
  for (T& e : f.x) e = v;
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
template <class Use, class T, class L>
void load_matrix_sync(fragment<Use, 16, 16, 16, T, L>& f, const T* p, unsigned ld) {
  static_assert(std::is_same_v<L, row_major> || std::is_same_v<L, col_major>, "matrix_a and matrix_b have a layout");
  emu_warp_sync();
  emu_check_operand("load_matrix_sync", p, ld);
  constexpr bool col = std::is_same_v<L, col_major>;
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c) f.x[r * 16 + c] = col ? p[size_t(c) * ld + r] : p[size_t(r) * ld + c];
}

template <class T>
void store_matrix_sync(T* p, const fragment<accumulator, 16, 16, 16, T>& f, unsigned ld, layout_t layout) {
  emu_warp_sync();
  emu_check_operand("store_matrix_sync", p, ld);
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c)
      (layout == mem_row_major ? p[size_t(r) * ld + c] : p[size_t(c) * ld + r]) = f.x[r * 16 + c];
}

// d = a b + c, products of bfloat16 exact in float32, sums in float32.
template <class LA, class LB>
void mma_sync(fragment<accumulator, 16, 16, 16, float>& d, const fragment<matrix_a, 16, 16, 16, __nv_bfloat16, LA>& a,
              const fragment<matrix_b, 16, 16, 16, __nv_bfloat16, LB>& b,
              const fragment<accumulator, 16, 16, 16, float>& c) {
  emu_warp_sync();
  float r[256];
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) {
      float s = c.x[i * 16 + j];
      for (int k = 0; k < 16; ++k) s += __bfloat162float(a.x[i * 16 + k]) * __bfloat162float(b.x[k * 16 + j]);
      r[i * 16 + j] = s;
    }
  for (int e = 0; e < 256; ++e) d.x[e] = r[e];
}
}  // namespace nvcuda::wmma
