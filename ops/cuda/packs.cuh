// 16-byte vector accesses, shared by the bandwidth-bound kernels (map.cu, copy.cu): a
// pack of elements moved as one load or store, and the alignment test that allows it.
// nvcc only.
#pragma once
#include <cstdint>

namespace mu::cuda {

// kVec elements of T moved as one access of kVec * sizeof(T) bytes (16 for the widest
// operand of a kernel; narrower ones, such as a comparison's bools, move fewer bytes).
template <class T, int kVec>
struct alignas(sizeof(T) * kVec) Pack {
  T v[kVec];
};

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace mu::cuda
