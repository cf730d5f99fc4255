// The target's vector registers as GCC vector types, for the CPU kernels that tile their
// work by hand (ops/cpu/gemm.cpp, ops/cpu/attention.cpp).
#pragma once
#include <cstring>

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

}  // namespace mu::cpu
