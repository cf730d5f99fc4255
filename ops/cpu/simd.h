// The target's vector registers as GCC vector types, for the CPU kernels that tile their
// work by hand (ops/cpu/gemm_*.cpp, ops/cpu/attention.cpp), and a W x W block transposed in them.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#if defined(__AVX__) && defined(__x86_64__)
#include <immintrin.h>
#endif

#include "tensor/half.h"

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

// One vector from / to memory of any alignment: a full register of T, or the vector
// type V given (eight float32 lanes, say).
template <class T, class V = typename Vec<T>::type>
inline V load(const T* p) {
  V v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
template <class T, class V>
inline void store(T* p, V v) {
  std::memcpy(p, &v, sizeof(v));
}

// min(c, v) and max(c, v) on every lane of a float vector, NaN lanes of v passed through:
// one instruction each on x86 (its min and max return the second operand when either is
// NaN), where the select `v > c ? c : v` compiles to a compare and a blend.
inline Vec<float>::type min_of(float c, Vec<float>::type v) {
  using VF = Vec<float>::type;
#if defined(__AVX512F__) && defined(__x86_64__)
  // maskz with every lane: GCC 12 warns on the plain form's undefined source operand.
  return VF(_mm512_maskz_min_ps(0xFFFF, __m512(VF{} + c), __m512(v)));
#elif defined(__AVX__) && defined(__x86_64__)
  return VF(_mm256_min_ps(__m256(VF{} + c), __m256(v)));
#else
  return v > c ? VF{} + c : v;
#endif
}
inline Vec<float>::type max_of(float c, Vec<float>::type v) {
  using VF = Vec<float>::type;
#if defined(__AVX512F__) && defined(__x86_64__)
  return VF(_mm512_maskz_max_ps(0xFFFF, __m512(VF{} + c), __m512(v)));
#elif defined(__AVX__) && defined(__x86_64__)
  return VF(_mm256_max_ps(__m256(VF{} + c), __m256(v)));
#else
  return v < c ? VF{} + c : v;
#endif
}

// One vector of T from W values of type S at p: T's own (load), or bfloat16 for float32,
// widened exactly in registers. A bfloat16's 16 bits are the top half of the float32 it
// stands for (tensor/half.h), so each lane is zero-extended and shifted up: autocast's
// bfloat16 operands are read as they are, at half the bytes, with no float32 copy.
template <class T, class S>
inline typename Vec<T>::type load_as(const S* p) {
  if constexpr (std::is_same_v<T, S>) {
    return load(p);
  } else {
    static_assert(std::is_same_v<T, float> && std::is_same_v<S, bfloat16_t>, "load_as: float from bfloat16 only");
    typedef uint32_t Bits __attribute__((vector_size(kVecBytes)));
#if defined(__AVX512F__) && defined(__x86_64__)
    // One zero-extending move: GCC splits the generic conversion below into two halves.
    // (The zero-masked form: the plain one's undefined source trips GCC 12's
    // -Wmaybe-uninitialized.)
    __m256i half;
    std::memcpy(&half, p, sizeof(half));
    const __m512i zext = _mm512_maskz_cvtepu16_epi32(__mmask16(0xffff), half);
    Bits bits;
    std::memcpy(&bits, &zext, sizeof(bits));
#elif defined(__AVX2__) && defined(__x86_64__)
    // Likewise one move on AVX2: GCC 12 lowers the generic conversion to two 128-bit
    // halves, a byte shift and an insertion.
    __m128i half;
    std::memcpy(&half, p, sizeof(half));
    const __m256i zext = _mm256_cvtepu16_epi32(half);
    Bits bits;
    std::memcpy(&bits, &zext, sizeof(bits));
#else
    typedef uint16_t Half __attribute__((vector_size(kVecBytes / 2)));
    Half half;
    std::memcpy(&half, p, sizeof(half));
    Bits bits = __builtin_convertvector(half, Bits);
#endif
    bits <<= 16;
    typename Vec<T>::type v;
    std::memcpy(&v, &bits, sizeof(v));
    return v;
  }
}

// The sum of the N lanes of v: its two halves added, then their halves, down to one
// lane (each half one shuffle or extraction).
template <class T, int N>
struct Lanes {
  typedef T type __attribute__((vector_size(N * sizeof(T))));
};
template <class V, std::size_t... L>
inline auto halves_added(V v, std::index_sequence<L...>) {
  return __builtin_shufflevector(v, v, L...) + __builtin_shufflevector(v, v, (L + sizeof...(L))...);
}
template <class T, int N = Vec<T>::width>
inline T lane_sum(typename Lanes<T, N>::type v) {
  if constexpr (N == 1) return v[0];
  else return lane_sum<T, N / 2>(halves_added(v, std::make_index_sequence<N / 2>()));
}

// The floats of a half-width vector widened to a whole vector of doubles (exactly): one
// conversion on AVX-512, where GCC 12 lowers the generic __builtin_convertvector to two
// 128-bit conversions and an insertion (five instructions; in LayerNorm's double sums and
// the cross-entropy lines, a fifth or more of the loop).
using HalfFloats = Lanes<float, Vec<double>::width>::type;
inline Vec<double>::type widen_to_double(HalfFloats h) {
#if defined(__AVX512F__) && defined(__x86_64__)
  // maskz with every lane: GCC 12 warns on the plain form's undefined source operand.
  if constexpr (Vec<double>::width == 8) return Vec<double>::type(_mm512_maskz_cvtps_pd(0xFF, __m256(h)));
#endif
  return __builtin_convertvector(h, Vec<double>::type);
}

// The low and high halves of a float vector's lanes, widened to doubles (widen_to_double):
// a float32 sum carried in double, a vector at a time.
template <std::size_t Offset, std::size_t... L>
inline HalfFloats float_half(Vec<float>::type v, std::index_sequence<L...>) {
  return __builtin_shufflevector(v, v, (L + Offset)...);
}
inline Vec<double>::type low_to_double(Vec<float>::type v) {
  return widen_to_double(float_half<0>(v, std::make_index_sequence<Vec<double>::width>()));
}
inline Vec<double>::type high_to_double(Vec<float>::type v) {
  return widen_to_double(float_half<Vec<double>::width>(v, std::make_index_sequence<Vec<double>::width>()));
}

// v's lanes rounded to bfloat16 into p[0, width): to nearest, ties to even, NaN as the one
// quiet NaN 0x7fc0, bit for bit what bfloat16_t(float) gives (tensor/half.h), so that a
// kernel that rounds its float32 results here writes what rounding them by a copy would.
inline void store_as(bfloat16_t* p, Vec<float>::type v) {
  typedef uint32_t Bits __attribute__((vector_size(kVecBytes)));
  typedef uint16_t Half __attribute__((vector_size(kVecBytes / 2)));
  Bits x;
  std::memcpy(&x, &v, sizeof(x));
  Bits r = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  r = (v != v) ? Bits{} + 0x7fc0u : r;  // NaN
  const Half h = __builtin_convertvector(r, Half);  // each lane's low half
  std::memcpy(static_cast<void*>(p), &h, sizeof(h));
}

// The same for float32: v stored as it is, so that a kernel over float32 and bfloat16
// writes its results with one call.
inline void store_as(float* p, Vec<float>::type v) { store(p, v); }

// n bfloat16 values widened to float32, and n float32 values rounded to bfloat16
// (store_as), a vector at a time, the last partial vector one by one: GCC keeps the
// element-by-element conversions of a plain loop scalar.
inline void widen_run(const bfloat16_t* x, int64_t n, float* out) {
  constexpr int64_t W = Vec<float>::width;
  int64_t i = 0;
  for (; i + W <= n; i += W) store(out + i, load_as<float>(x + i));
  for (; i < n; ++i) out[i] = float(x[i]);
}
inline void narrow_run(const float* x, int64_t n, bfloat16_t* out) {
  constexpr int64_t W = Vec<float>::width;
  int64_t i = 0;
  for (; i + W <= n; i += W) store_as(out + i, load(x + i));
  for (; i < n; ++i) out[i] = bfloat16_t(x[i]);
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
