// A host stand-in for cub::DeviceRadixSort::SortPairs (index.cu's only use of cub): a
// stable sort of (key, value) pairs by the key bits [begin_bit, end_bit), after the
// usual size query (temp == nullptr). It checks the calling code, not cub.
#pragma once
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>
#include <cuda_runtime.h>
#include "emu_queue.h"

namespace cub {
struct DeviceRadixSort {
  template <class K, class V, class N>
  static cudaError_t SortPairs(void* temp, size_t& temp_bytes, const K* keys_in, K* keys_out, const V* vals_in,
                               V* vals_out, N n, int begin_bit, int end_bit, cudaStream_t = nullptr) {
    if (temp == nullptr) {
      temp_bytes = 64;
      return cudaSuccess;
    }
    // The sort runs on the stream (emu_queue.h), reading the keys when it runs.
    emu_defer([=] { sort(keys_in, keys_out, vals_in, vals_out, n, begin_bit, end_bit); });
    return cudaSuccess;
  }

 private:
  template <class K, class V, class N>
  static void sort(const K* keys_in, K* keys_out, const V* vals_in, V* vals_out, N n, int begin_bit, int end_bit) {
    const uint64_t mask = end_bit >= 64 ? ~uint64_t(0) : (uint64_t(1) << end_bit) - 1;
    auto key = [&](int64_t i) { return (uint64_t(keys_in[i]) & mask) >> begin_bit; };
    std::vector<int64_t> p(static_cast<size_t>(n));
    std::iota(p.begin(), p.end(), int64_t(0));
    std::stable_sort(p.begin(), p.end(), [&](int64_t a, int64_t b) { return key(a) < key(b); });
    std::vector<K> k(static_cast<size_t>(n));
    std::vector<V> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < int64_t(n); ++i) k[size_t(i)] = keys_in[p[size_t(i)]], v[size_t(i)] = vals_in[p[size_t(i)]];
    std::copy(k.begin(), k.end(), keys_out);
    std::copy(v.begin(), v.end(), vals_out);
  }
};
}  // namespace cub
