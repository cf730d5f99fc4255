// The target's vector registers as GCC vector types, for the CPU kernels that tile their
// work by hand (ops/cpu/gemm.cpp, ops/cpu/attention.cpp), and a W x W block transposed in them.
#pragma once
#include <cstddef>
#include <cstring>
#include <utility>

namespace mu::cpu {

// The widest vector the target has. AVX-512 also doubles the register file (32 zmm
// instead of 16 ymm), which lets register tiles grow.
#if defined(__AVX512F__)
inline constexpr int kVecBytes = 64;
inline constexpr int kVecRegs = 32;
#elif defined(__AVX__)
inline constexpr int kVecBytes = 32;
inline constexpr int kVecRegs = 16;
#else
inline constexpr int kVecBytes = 16;
inline constexpr int kVecRegs = 16;
#endif

// A GCC vector of T as wide as the target's vector registers (v16f / v8d on AVX-512).
template <class T>
struct Vec {
  typedef T type __attribute__((vector_size(kVecBytes)));
  static constexpr int width = kVecBytes / int(sizeof(T));
};

// One vector from / to memory of any alignment.
template <class T>
inline typename Vec<T>::type load(const T* p) {
  typename Vec<T>::type v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
template <class T>
inline void store(T* p, typename Vec<T>::type v) {
  std::memcpy(p, &v, sizeof(v));
}

// r[i][l] <-> r[l][i]: the W x W block held in W vectors, transposed in registers. Each
// stage swaps the off-diagonal H x H sub-blocks of every 2H x 2H block: rows i and i + H
// (i with bit H clear) exchange the lanes with bit H set in row i for those with it clear
// in row i + H. log2(W) stages of W shuffles (64 for 16 x 16 floats).
template <int H, class V, std::size_t... L>
inline void swap_blocks(V& lo, V& hi, std::index_sequence<L...>) {
  constexpr int W = int(sizeof...(L));
  const V a = lo, b = hi;
  lo = __builtin_shufflevector(a, b, ((int(L) & H) == 0 ? int(L) : W + int(L) - H)...);
  hi = __builtin_shufflevector(a, b, ((int(L) & H) == 0 ? int(L) + H : W + int(L))...);
}
template <int H, class V, int W>
inline void transpose_stage(V (&r)[W]) {
  if constexpr (H >= 1) {
    for (int i = 0; i < W; ++i)
      if ((i & H) == 0) swap_blocks<H>(r[i], r[i + H], std::make_index_sequence<W>{});
    transpose_stage<H / 2>(r);
  }
}
template <class V, int W>
inline void transpose_block(V (&r)[W]) {
  transpose_stage<W / 2>(r);
}

}  // namespace mu::cpu
