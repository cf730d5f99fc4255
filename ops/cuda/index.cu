// CUDA kernels of the indexing ops (declared in ops/kernels/index.h; the CPU twins are in
// ops/cpu/index.cpp). Indices were checked on the host before these run. Every sum
// that lands in one element runs in the CPU's order, so results are deterministic and
// equal the CPU's bit for bit (cumsum's block scan on few long lines excepted: equal up
// to double rounding).
#include <climits>
#include <cstring>
#include <cub/device/device_radix_sort.cuh>
#include <type_traits>

#include "ops/cuda/bitonic.cuh"
#include "ops/cuda/dtypes.cuh"
#include "ops/cuda/runtime.cuh"
#include "ops/cuda/strided.cuh"
#include "ops/functors.h"
#include "ops/kernels/index.h"

namespace mu::cuda_kernels {

using cuda::Strided;

namespace {

// Calls body(T{}) for the dtypes the CPU's numeric kernels take: float32, float64, int64.
template <class Body>
void dispatch_numeric(DType dtype, const char* op, Body&& body) {
  switch (dtype) {
    case DType::Float32: body(float{}); return;
    case DType::Float64: body(double{}); return;
    case DType::Int64: body(int64_t{}); return;
    default: break;
  }
  MU_FAIL(op, ": expected float32, float64 or int64, got ", dtype_name(dtype));
}

// The iteration space of index's shape with three operands read through their own
// strides (a[0], a[1], a[2]); operand k's stride along `dim` is zeroed where zero_dim[k],
// since that coordinate comes from the index instead. With `lines`, dim's size is 1: the
// space is then the set of lines along dim.
Strided<3> index_space(const Tensor& index, const Tensor* const (&a)[3], int64_t dim, const bool (&zero_dim)[3],
                       bool lines, const char* op) {
  MU_CHECK(index.dim() <= cuda::kMaxDims, op, " on CUDA: at most ", cuda::kMaxDims, " dims are supported, got ",
           index.describe());
  Strided<3> g;
  g.nd = int(index.dim());
  for (int d = 0; d < g.nd; ++d) {
    g.sizes[d] = lines && d == dim ? 1 : index.shape()[size_t(d)];
    for (int k = 0; k < 3; ++k) g.strides[k][d] = zero_dim[k] && d == dim ? 0 : a[k]->strides()[size_t(d)];
  }
  g.prepare();  // 32-bit divisions when every position fits
  return g;
}

// ---------------------------------------------------------------- gather

// One thread per element of index (grid-stride): out[o0] = x[o2 + index[o1] * x_stride].
template <class T>
__global__ void gather_kernel(T* out, const T* x, const int64_t* index, Strided<3> g, int64_t numel, int64_t xsd) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < numel; i += step) {
    int64_t off[3];
    g.offsets(i, off);
    out[off[0]] = x[off[2] + index[off[1]] * xsd];
  }
}

void gather(const Tensor& out, const Tensor& x, int64_t dim, const Tensor& index) {
  const int64_t numel = index.numel();
  if (numel == 0) return;
  const Tensor* ops[3] = {&out, &index, &x};
  const Strided<3> g = index_space(index, ops, dim, {false, false, true}, false, "gather");
  const int64_t xsd = x.strides()[size_t(dim)];
  cuda::dispatch_all(x.dtype(), "gather", [&](auto tag) {
    using T = decltype(tag);
    gather_kernel<T><<<cuda::grid_for(numel, 256), 256, 0, cuda::stream(x)>>>(
        static_cast<T*>(out.raw_data()), static_cast<const T*>(x.raw_data()),
        static_cast<const int64_t*>(index.raw_data()), g, numel, xsd);
    MU_CUDA_CHECK_LAUNCH("gather");
  });
}

// ---------------------------------------------------------------- scatter_add

// Many lines: one thread per line of index along dim (grid-stride), adding the line's
// m entries in order. A line of index writes only into the matching line of out, so no
// two threads touch one element, and each element's additions run in the CPU's order.
template <class T>
__global__ void scatter_add_lines_kernel(T* out, const T* src, const int64_t* index, Strided<3> g, int64_t lines,
                                         int64_t m, int64_t osd, int64_t isd, int64_t ssd) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t l = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; l < lines; l += step) {
    int64_t off[3];
    g.offsets(l, off);
    for (int64_t j = 0; j < m; ++j) {
      T* dst = out + off[0] + index[off[1] + j * isd] * osd;
      *dst = fn::wrapping_add(*dst, src[off[2] + j * ssd]);  // integers wrap, as on the CPU
    }
  }
}

// Few long lines, pass 1: for every element of index (row-major position i), the offset
// in out it adds into (the sort key) and i itself (the sorted value).
__global__ void scatter_keys_kernel(uint64_t* keys, int64_t* pos, const int64_t* index, Strided<3> g, int64_t numel,
                                    int64_t osd) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < numel; i += step) {
    int64_t off[3];
    g.offsets(i, off);
    keys[i] = uint64_t(off[0] + index[off[1]] * osd);
    pos[i] = i;
  }
}

// Pass 2, after a stable sort by key: one thread per run of equal keys (its first
// element's thread; grid-stride), adding the run's sources into its element in sorted
// order. The sort is stable and positions along one line increase with j, so that is
// the CPU's order for the element.
template <class T>
__global__ void scatter_runs_kernel(T* out, const T* src, const uint64_t* keys, const int64_t* pos, Strided<3> g,
                                    int64_t numel) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < numel; i += step) {
    const uint64_t key = keys[i];
    if (i > 0 && keys[i - 1] == key) continue;  // not the first of its run
    T acc = out[key];
    for (int64_t p = i; p < numel && keys[p] == key; ++p) {
      int64_t off[3];
      g.offsets(pos[p], off);
      acc = fn::wrapping_add(acc, src[off[2]]);
    }
    out[key] = acc;
  }
}

// The number of bits that hold every value below `bound` (at least 1).
int bits_for(uint64_t bound) {
  int b = 1;
  while (b < 64 && (uint64_t(1) << b) < bound) ++b;
  return b;
}

// Stable radix sort of (keys, values) pairs on the device's stream, over the low `bits`
// bits of the keys; the results land in keys_out and vals_out.
void sort_pairs(const uint64_t* keys_in, uint64_t* keys_out, const int64_t* vals_in, int64_t* vals_out, int64_t n,
                int bits, const Device& dev, const char* op) {
  cudaStream_t s = cuda::stream(dev.index);
  size_t temp_bytes = 0;
  MU_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys_in, keys_out, vals_in, vals_out, n, 0, bits,
                                                s));
  cuda::Workspace temp(temp_bytes > 0 ? temp_bytes : 1, dev.index);
  MU_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.as<void>(), temp_bytes, keys_in, keys_out, vals_in, vals_out, n,
                                                0, bits, s));
}

void scatter_add(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src) {
  const int64_t numel = index.numel();
  if (numel == 0) return;
  const int64_t m = index.shape()[size_t(dim)], lines = numel / m;
  const int64_t osd = out.strides()[size_t(dim)], isd = index.strides()[size_t(dim)],
                ssd = src.strides()[size_t(dim)];
  const Tensor* ops[3] = {&out, &index, &src};
  const int64_t* pi = static_cast<const int64_t*>(index.raw_data());
  cudaStream_t s = cuda::stream(out);
  // Enough lines to fill the GPU, or lines so short that walking them is cheap: a
  // thread per line. Otherwise (a few long lines) a sort by destination spreads the work.
  const bool per_line = lines >= 4096 || m <= 64;
  dispatch_numeric(out.dtype(), "scatter_add", [&](auto tag) {
    using T = decltype(tag);
    T* po = static_cast<T*>(out.raw_data());
    const T* ps = static_cast<const T*>(src.raw_data());
    if (per_line) {
      const Strided<3> g = index_space(index, ops, dim, {false, false, false}, true, "scatter_add");
      scatter_add_lines_kernel<T><<<cuda::grid_for(lines, 128), 128, 0, s>>>(po, ps, pi, g, lines, m, osd, isd, ssd);
      MU_CUDA_CHECK_LAUNCH("scatter_add");
      return;
    }
    const Strided<3> g = index_space(index, ops, dim, {true, false, false}, false, "scatter_add");
    // Keys are element offsets in out: below 1 + the largest offset out reaches.
    uint64_t span = 1;
    for (int64_t d = 0; d < out.dim(); ++d) span += uint64_t((out.shape()[size_t(d)] - 1) * out.strides()[size_t(d)]);
    cuda::Workspace ws(size_t(numel) * 4 * sizeof(int64_t), out.device().index);
    uint64_t* keys = ws.as<uint64_t>();
    uint64_t* keys_sorted = keys + numel;
    int64_t* pos = reinterpret_cast<int64_t*>(keys_sorted + numel);
    int64_t* pos_sorted = pos + numel;
    scatter_keys_kernel<<<cuda::grid_for(numel, 256), 256, 0, s>>>(keys, pos, pi, g, numel, osd);
    MU_CUDA_CHECK_LAUNCH("scatter_add (keys)");
    sort_pairs(keys, keys_sorted, pos, pos_sorted, numel, bits_for(span), out.device(), "scatter_add");
    scatter_runs_kernel<T><<<cuda::grid_for(numel, 256), 256, 0, s>>>(po, ps, keys_sorted, pos_sorted, g, numel);
    MU_CUDA_CHECK_LAUNCH("scatter_add (runs)");
  });
}

// ---------------------------------------------------------------- index_select

// One thread per element of the dense out (outer, m, inner), grid-stride.
template <class T>
__global__ void index_select_kernel(T* out, const T* x, const int64_t* idx, int64_t numel, int64_t n, int64_t m,
                                    int64_t inner) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < numel; i += step) {
    const int64_t r = i / inner, c = i - r * inner;  // row (o, j) of out, column
    const int64_t o = r / m, j = r - o * m;
    out[i] = x[(o * n + idx[j]) * inner + c];
  }
}

void index_select(const Tensor& out, const Tensor& x, const Tensor& index, int64_t outer, int64_t n, int64_t m,
                  int64_t inner) {
  const int64_t numel = outer * m * inner;
  if (numel == 0) return;
  cuda::dispatch_all(x.dtype(), "index_select", [&](auto tag) {
    using T = decltype(tag);
    index_select_kernel<T><<<cuda::grid_for(numel, 256), 256, 0, cuda::stream(x)>>>(
        static_cast<T*>(out.raw_data()), static_cast<const T*>(x.raw_data()),
        static_cast<const int64_t*>(index.raw_data()), numel, n, m, inner);
    MU_CUDA_CHECK_LAUNCH("index_select");
  });
}

// ---------------------------------------------------------------- index_add_rows

// Positions 0..m-1, the values sorted along with the indices.
__global__ void iota_kernel(int64_t* p, int64_t m) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < m; i += step) p[i] = i;
}

// After a stable sort of the indices (rows[] sorted, js[] their positions): one block per
// (o, run of equal rows) pair, grid-stride over (o, start of run) pairs (a block whose
// position does not start a run skips it); the block's threads own the columns of that
// destination row and add the run's source rows in order of j, the CPU's order. Every
// destination row is written by exactly one block: no atomics, deterministic.
template <class T>
__global__ void add_rows_kernel(T* grad, const T* g, const uint64_t* rows, const int64_t* js, int64_t outer, int64_t n,
                                int64_t m, int64_t inner) {
  for (int64_t b = blockIdx.x; b < outer * m; b += gridDim.x) {
    const int64_t o = b / m, p = b - o * m;
    const uint64_t row = rows[p];
    if (p > 0 && rows[p - 1] == row) continue;  // the same for every thread of the block
    T* dst = grad + (o * n + int64_t(row)) * inner;
    const T* src = g + o * m * inner;
    for (int64_t c = threadIdx.x; c < inner; c += blockDim.x) {
      T acc = dst[c];
      for (int64_t q = p; q < m && rows[q] == row; ++q) acc = acc + src[js[q] * inner + c];
      dst[c] = acc;
    }
  }
}

void index_add_rows(const Tensor& grad, const Tensor& g, const Tensor& index, int64_t outer, int64_t n, int64_t m,
                    int64_t inner) {
  if (outer * m * inner == 0) return;
  cudaStream_t s = cuda::stream(g);
  const int dev = g.device().index;
  // Sorted rows and their positions; indices lie in [0, n), so they sort as unsigned.
  cuda::Workspace ws(size_t(m) * 3 * sizeof(int64_t), dev);
  uint64_t* rows = ws.as<uint64_t>();
  int64_t* pos = reinterpret_cast<int64_t*>(rows + m);
  int64_t* js = pos + m;
  iota_kernel<<<cuda::grid_for(m, 256), 256, 0, s>>>(pos, m);
  MU_CUDA_CHECK_LAUNCH("index_add_rows (positions)");
  sort_pairs(static_cast<const uint64_t*>(index.raw_data()), rows, pos, js, m, bits_for(uint64_t(n)), g.device(),
             "index_add_rows");
  // A block's threads span the row's columns (a multiple of a warp, at most 256).
  const int threads = int(inner >= 256 ? 256 : (inner + 31) / 32 * 32);
  const int64_t blocks = outer * m;
  const unsigned grid = unsigned(blocks < 65535 * 16 ? blocks : 65535 * 16);
  cuda::dispatch_float(g.dtype(), "index_select_backward", [&](auto tag) {
    using T = decltype(tag);
    add_rows_kernel<T><<<grid, threads, 0, s>>>(static_cast<T*>(grad.raw_data()), static_cast<const T*>(g.raw_data()),
                                                rows, js, outer, n, m, inner);
    MU_CUDA_CHECK_LAUNCH("index_add_rows");
  });
}

// ---------------------------------------------------------------- cumsum

// One thread per line (o, column c) of the dense (outer, n, inner) x, grid-stride; the
// threads of a warp take neighbouring columns, so their loads coalesce. The running sum
// is carried in acc_t (double for float32) and walked in order, as on the CPU.
template <class T>
__global__ void cumsum_lines_kernel(T* out, const T* x, int64_t outer, int64_t n, int64_t inner, bool reverse) {
  using A = cuda::acc_t<T>;
  const int64_t lines = outer * inner, step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t l = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; l < lines; l += step) {
    const int64_t o = l / inner, c = l - o * inner;
    A acc = A(0);
    for (int64_t s = 0; s < n; ++s) {
      const int64_t off = (o * n + (reverse ? n - 1 - s : s)) * inner + c;
      acc = fn::wrapping_add(acc, A(x[off]));  // integers wrap, as on the CPU
      out[off] = T(acc);
    }
  }
}

constexpr int kScanThreads = 512;

// Few long contiguous lines (inner == 1): one block per line (grid-stride), scanning
// kScanThreads elements at a time (one per thread) with warp shuffles and the warps'
// totals in shared memory, a carry running from chunk to chunk. The sums are those of
// the CPU up to the rounding of the acc_t additions (exact for int64).
template <class T>
__global__ void __launch_bounds__(kScanThreads)
    cumsum_scan_kernel(T* out, const T* x, int64_t lines, int64_t n, bool reverse) {
  using A = cuda::acc_t<T>;
  __shared__ A warp_tot[kScanThreads / 32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int64_t l = blockIdx.x; l < lines; l += gridDim.x) {
    const T* xl = x + l * n;
    T* ol = out + l * n;
    A carry = A(0);
    for (int64_t base = 0; base < n; base += kScanThreads) {
      const int64_t s = base + threadIdx.x;                 // walk position
      const int64_t j = reverse ? n - 1 - s : s;            // element
      A v = s < n ? A(xl[j]) : A(0);
      // Inclusive scan within the warp.
      for (int o = 1; o < 32; o <<= 1) {
        const A u = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v = fn::wrapping_add(v, u);
      }
      if (lane == 31) warp_tot[warp] = v;
      __syncthreads();
      // The totals of the warps before this one, then the carry of earlier chunks.
      A before = carry;
      for (int w = 0; w < warp; ++w) before = fn::wrapping_add(before, warp_tot[w]);
      if (s < n) ol[j] = T(fn::wrapping_add(before, v));
      A chunk = A(0);
      for (int w = 0; w < kScanThreads / 32; ++w) chunk = fn::wrapping_add(chunk, warp_tot[w]);
      carry = fn::wrapping_add(carry, chunk);
      __syncthreads();  // warp_tot is rewritten by the next chunk
    }
  }
}

void cumsum(const Tensor& out, const Tensor& x, int64_t outer, int64_t n, int64_t inner, bool reverse) {
  const int64_t lines = outer * inner;
  if (lines * n == 0) return;
  cudaStream_t s = cuda::stream(x);
  dispatch_numeric(x.dtype(), "cumsum", [&](auto tag) {
    using T = decltype(tag);
    T* po = static_cast<T*>(out.raw_data());
    const T* px = static_cast<const T*>(x.raw_data());
    // A thread per line leaves the GPU idle when there are few lines, each long.
    if (inner == 1 && lines < 2048 && n >= 2048) {
      cumsum_scan_kernel<T><<<unsigned(lines), kScanThreads, 0, s>>>(po, px, lines, n, reverse);
      MU_CUDA_CHECK_LAUNCH("cumsum (scan)");
    } else {
      cumsum_lines_kernel<T><<<cuda::grid_for(lines, 128), 128, 0, s>>>(po, px, outer, n, inner, reverse);
      MU_CUDA_CHECK_LAUNCH("cumsum");
    }
  });
}

// ---------------------------------------------------------------- sort_indices

// The CPU's strict order of (value, position) pairs (LineOrder in ops/cpu/index.cpp):
// by value, NaN above every number, ties by position. Positions >= n are padding and
// come after everything.
template <class T>
struct PosOrder {
  bool descending;
  int64_t n;
  __device__ bool operator()(T x, int64_t a, T y, int64_t b) const {
    if (a >= n || b >= n) return a < b;  // padding last (a real position is < n)
    const bool xn = x != x, yn = y != y;
    if (xn || yn) {
      if (xn && yn) return a < b;
      return descending ? xn : yn;  // NaN first when descending, last when ascending
    }
    if (x != y) return descending ? x > y : x < y;
    return a < b;
  }
};

constexpr int64_t kSharedSortMax = 2048;  // longest line sorted in shared memory
// Threads of a sort block: one per compared pair, up to this. The kernels are compiled
// for it (__launch_bounds__): at most 64 registers a thread, else a block of 1024 would
// not launch.
constexpr int kSortMaxThreads = 1024;

// Lines up to kSharedSortMax: one block per line (grid-stride). The line's values and
// positions (padded to the power of two P) are sorted in shared memory by PosOrder, a
// total order, so the result is the stable order; the first k positions are written.
template <class T>
__global__ void __launch_bounds__(kSortMaxThreads)
    sort_shared_kernel(int64_t* idx, const T* x, int64_t lines, int64_t n, int64_t inner, int64_t k, int64_t P,
                       bool descending) {
  extern __shared__ __align__(16) unsigned char smem[];  // values first: aligned for T
  T* vals = reinterpret_cast<T*>(smem);
  int* pos = reinterpret_cast<int*>(vals + P);
  const PosOrder<T> order{descending, n};
  for (int64_t l = blockIdx.x; l < lines; l += gridDim.x) {
    const int64_t o = l / inner, c = l - o * inner;
    const T* xl = x + o * n * inner + c;
    __syncthreads();  // the previous line's results were read
    for (int64_t i = threadIdx.x; i < P; i += blockDim.x) {
      pos[i] = int(i);
      if (i < n) vals[i] = xl[i * inner];
    }
    cuda::block_bitonic_sort(pos, P, [&](int a, int b) {
      return order(a < n ? vals[a] : T(0), a, b < n ? vals[b] : T(0), b);
    });
    int64_t* dst = idx + o * k * inner + c;
    for (int64_t j = threadIdx.x; j < k; j += blockDim.x) dst[j * inner] = pos[j];
  }
}

// Longer lines: the same, on positions in a global workspace of P per block, the values
// read from x.
template <class T>
__global__ void __launch_bounds__(kSortMaxThreads)
    sort_global_kernel(int64_t* idx, const T* x, int64_t* work, int64_t lines, int64_t n, int64_t inner, int64_t k,
                       int64_t P, bool descending) {
  int64_t* pos = work + int64_t(blockIdx.x) * P;
  const PosOrder<T> order{descending, n};
  for (int64_t l = blockIdx.x; l < lines; l += gridDim.x) {
    const int64_t o = l / inner, c = l - o * inner;
    const T* xl = x + o * n * inner + c;
    __syncthreads();
    for (int64_t i = threadIdx.x; i < P; i += blockDim.x) pos[i] = i;
    cuda::block_bitonic_sort(pos, P, [&](int64_t a, int64_t b) {
      return order(a < n ? xl[a * inner] : T(0), a, b < n ? xl[b * inner] : T(0), b);
    });
    int64_t* dst = idx + o * k * inner + c;
    for (int64_t j = threadIdx.x; j < k; j += blockDim.x) dst[j * inner] = pos[j];
  }
}

// The first k of a long line (topk with k <= kSharedSortMax, e.g. a sampling step's top
// k of GPT-2's 50257 logits), by radix selection rather than a sort of the whole line:
// the bitonic sort of 50257 positions padded to 65536 is 136 stages over global memory,
// milliseconds a line, where the selection reads the line once per byte of its keys.
//
// The first k in PosOrder are the k smallest pairs (key, position), key an unsigned
// integer ordered as PosOrder orders the values (select_key). The k-th smallest pair is
// found a byte at a time, from the key's top byte down to the position's lowest: a
// histogram of the next byte over the pairs matching the bytes chosen so far, and the
// byte whose bin holds the pair of the rank sought. It stops at the first bin that holds
// exactly the pairs still wanted (with distinct values, within the key's bytes; ties at
// the k-th place take the position's bytes too). The pairs whose chosen bytes are at or
// below the prefix found are then the first k; they are gathered in shared memory and
// sorted there.

// 32-bit keys for float32, 64-bit for float64 and int64.
template <class T>
using SelectKey = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;

// PosOrder's order of values (ascending, or descending) as the order of unsigned keys.
template <class T>
__device__ SelectKey<T> select_key(T x, bool descending) {
  using K = SelectKey<T>;
  constexpr K top = K(1) << (8 * sizeof(K) - 1);
  K key;
  if constexpr (std::is_floating_point_v<T>) {
    if (x != x) {
      key = ~K(0);  // NaN above every number; every NaN equal (ties by position)
    } else {
      const T v = x == T(0) ? T(0) : x;  // -0 equals +0: one key, so ties by position
      K bits;
      memcpy(&bits, &v, sizeof bits);
      // Positives above negatives; negatives' magnitudes reversed.
      key = (bits & top) ? ~bits : (bits | top);
    }
  } else {
    key = K(x) ^ top;  // two's complement with the sign bit flipped orders as unsigned
  }
  return descending ? ~key : key;  // descending: the largest, and NaN, first
}

template <class K>
struct KeyPos {
  K key;
  int pos;
};

// One block per line (grid-stride); `chosen` holds P = next_pow2(k) pairs in dynamic
// shared memory; pos_bytes is the bytes of n - 1 (1 to 4).
template <class T>
__global__ void __launch_bounds__(kSortMaxThreads)
    select_kernel(int64_t* idx, const T* x, int64_t lines, int64_t n, int64_t inner, int64_t k, int64_t P,
                  int pos_bytes, bool descending) {
  using K = SelectKey<T>;
  constexpr int key_bytes = int(sizeof(K));
  extern __shared__ __align__(16) unsigned char smem[];
  KeyPos<K>* chosen = reinterpret_cast<KeyPos<K>*>(smem);
  __shared__ unsigned hist[256];
  // The bin found (its byte, the pairs in the bins below it, its own count), and the
  // count of pairs gathered.
  __shared__ unsigned found[4];
  for (int64_t l = blockIdx.x; l < lines; l += gridDim.x) {
    const int64_t o = l / inner, c = l - o * inner;
    const T* xl = x + o * n * inner + c;
    K want_key = 0, key_mask = 0;  // the key's bytes chosen so far, and which they are
    unsigned want_pos = 0, pos_mask = 0;
    unsigned rank = unsigned(k);  // the rank (from 1) sought among the pairs matching them
    for (int b = 0; b < key_bytes + pos_bytes; ++b) {
      const bool in_key = b < key_bytes;
      const int shift = 8 * (in_key ? key_bytes - 1 - b : pos_bytes - 1 - (b - key_bytes));
      __syncthreads();  // the previous byte's (or line's) hist and found were read
      for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
      __syncthreads();
      for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        const K key = select_key(xl[i * inner], descending);
        if ((key & key_mask) != want_key || (unsigned(i) & pos_mask) != want_pos) continue;
        atomicAdd(&hist[in_key ? unsigned(key >> shift) & 255u : (unsigned(i) >> shift) & 255u], 1u);
      }
      __syncthreads();
      if (threadIdx.x < 32) {
        // Lane j holds bins [8j, 8j + 8); the lanes' counts summed by a shuffle scan.
        const int lane = int(threadIdx.x);
        unsigned own = 0;
        for (int j = 0; j < 8; ++j) own += hist[8 * lane + j];
        unsigned upto = own;  // the bins of lanes 0..lane
        for (int d = 1; d < 32; d <<= 1) {
          const unsigned u = __shfl_up_sync(0xffffffffu, upto, d);
          if (lane >= d) upto += u;
        }
        unsigned below = upto - own;
        // rank never exceeds the pairs matching, so exactly one lane holds it.
        if (below < rank && rank <= upto) {
          int j = 8 * lane;
          while (below + hist[j] < rank) below += hist[j++];
          found[0] = unsigned(j);
          found[1] = below;
          found[2] = hist[j];
        }
      }
      __syncthreads();
      const unsigned byte = found[0];
      rank -= found[1];
      if (in_key) {
        want_key |= K(byte) << shift;
        key_mask |= K(255) << shift;
      } else {
        want_pos |= byte << shift;
        pos_mask |= 255u << shift;
      }
      if (found[2] == rank) break;  // every pair in the bin is wanted
    }
    // Gather the pairs at or below the prefix (in any order), pad to P, sort.
    if (threadIdx.x == 0) found[3] = 0;
    __syncthreads();
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const K key = select_key(xl[i * inner], descending);
      const K km = key & key_mask;
      const unsigned pm = unsigned(i) & pos_mask;
      if (km < want_key || (km == want_key && pm <= want_pos)) {
        const unsigned slot = atomicAdd(&found[3], 1u);
        if (slot < unsigned(k)) chosen[slot] = {key, int(i)};  // exactly k of them
      }
    }
    for (int64_t j = k + threadIdx.x; j < P; j += blockDim.x) chosen[j] = {~K(0), INT_MAX};  // after every pair
    cuda::block_bitonic_sort(chosen, P, [](const KeyPos<K>& a, const KeyPos<K>& b) {
      return a.key != b.key ? a.key < b.key : a.pos < b.pos;
    });
    int64_t* dst = idx + o * k * inner + c;
    for (int64_t j = threadIdx.x; j < k; j += blockDim.x) dst[j * inner] = chosen[j].pos;
  }
}

void sort_indices(const Tensor& idx, const Tensor& x, int64_t outer, int64_t n, int64_t inner, int64_t k,
                  bool descending) {
  const int64_t lines = outer * inner;
  if (lines * k == 0) return;
  cudaStream_t s = cuda::stream(x);
  const int64_t P = cuda::next_pow2(n);
  // Half as many threads as elements (one per compared pair), a multiple of 32, <= 1024.
  const int threads = int(P / 2 < 32 ? 32 : P / 2 > kSortMaxThreads ? kSortMaxThreads : P / 2);
  dispatch_numeric(x.dtype(), "sort", [&](auto tag) {
    using T = decltype(tag);
    int64_t* pi = static_cast<int64_t*>(idx.raw_data());
    const T* px = static_cast<const T*>(x.raw_data());
    if (P <= kSharedSortMax) {
      const size_t smem = size_t(P) * (sizeof(T) + sizeof(int));
      sort_shared_kernel<T><<<cuda::grid_for(lines, 1), threads, smem, s>>>(pi, px, lines, n, inner, k, P, descending);
      MU_CUDA_CHECK_LAUNCH("sort");
    } else if (k <= kSharedSortMax && n <= int64_t(INT_MAX) - kSharedSortMax) {
      const int64_t Pk = cuda::next_pow2(k);
      int pos_bytes = 1;  // the bytes of the largest position, n - 1
      while (pos_bytes < 4 && ((n - 1) >> (8 * pos_bytes)) != 0) ++pos_bytes;
      const size_t smem = size_t(Pk) * sizeof(KeyPos<SelectKey<T>>);
      select_kernel<T><<<cuda::grid_for(lines, 1), kSortMaxThreads, smem, s>>>(pi, px, lines, n, inner, k, Pk,
                                                                                pos_bytes, descending);
      MU_CUDA_CHECK_LAUNCH("topk (radix selection)");
    } else {
      // One line in flight per block, a workspace of P positions for each: up to two
      // blocks per SM, fewer where that would take more than 256 MiB.
      const unsigned grid = cuda::work_grid(lines, P * int64_t(sizeof(int64_t)));
      cuda::Workspace ws(size_t(grid) * size_t(P) * sizeof(int64_t), x.device().index);
      sort_global_kernel<T><<<grid, threads, 0, s>>>(pi, px, ws.as<int64_t>(), lines, n, inner, k, P, descending);
      MU_CUDA_CHECK_LAUNCH("sort (long lines)");
    }
  });
}

}  // namespace

MU_REGISTER_KERNEL(kernels::gather, DeviceType::CUDA, gather);
MU_REGISTER_KERNEL(kernels::scatter_add, DeviceType::CUDA, scatter_add);
MU_REGISTER_KERNEL(kernels::index_select, DeviceType::CUDA, index_select);
MU_REGISTER_KERNEL(kernels::index_add_rows, DeviceType::CUDA, index_add_rows);
MU_REGISTER_KERNEL(kernels::cumsum, DeviceType::CUDA, cumsum);
MU_REGISTER_KERNEL(kernels::sort_indices, DeviceType::CUDA, sort_indices);

}  // namespace mu::cuda_kernels
