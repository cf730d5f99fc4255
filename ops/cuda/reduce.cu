// CUDA kernels of the reductions (declared in ops/kernels/reduce.h; the CPU twin is
// ops/cpu/reduce.cpp). x is read in place through its strides, whatever they are: the
// kept dims and the reduced dims are each coalesced into a short list of (size, stride),
// so output o's run starts at kept.offset(o) and its element i lies red.offset(i) further
// (i in the row-major order of the reduced dims, as the CPU's runs are ordered).
//
// Threads map to outputs in one of three ways:
//   - one thread per output (grid-stride over outputs) for runs shorter than a warp;
//   - columns: when the runs are strided and neighbouring outputs are neighbours in
//     memory (a reduction over a leading dim, as the bias gradient of a linear layer), a
//     32 x 8 block per tile of 32 outputs: threadIdx.x picks the output, so a warp reads
//     32 consecutive addresses, threadIdx.y the run elements y, y + 8, ..., and the 8
//     partials of an output are combined in order through shared memory;
//   - otherwise one block of 32..256 threads per output (grid-stride over outputs), the
//     threads striding along the run, then a warp-shuffle and shared-memory reduction.
// When the blocks would be too few to fill the GPU and the runs are long, each run is
// cut into `splits` chunks, one block per (output or tile, chunk) writing partial
// results into a workspace, and a second kernel combines each output's partials in
// chunk order.
// Everything is in a fixed order for given sizes, so results are the same on every run.
// float32 sums are carried in double. max, min and their indices combine (value,
// position) pairs: the better value wins, NaN beating every number, and between equal
// values (or two NaN) the earlier position: the first extremum, as the CPU's scan finds.
#include "ops/cuda/dtypes.cuh"
#include "ops/cuda/lines.cuh"
#include "ops/cuda/strided.cuh"
#include "ops/functors.h"
#include "ops/kernels/reduce.h"

namespace mu::cuda_kernels {

using cuda::kFullMask;
using cuda::kMaxDims;

// A set of x's dims coalesced: offset(i) is the element offset of row-major position i.
// (cuda::Strided's layout for one operand, with the outermost dim's division saved: a
// run over one merged dim costs a multiply per element.)
struct Walk {
  int nd;
  int64_t size[kMaxDims];
  int64_t stride[kMaxDims];

  __device__ __forceinline__ int64_t offset(int64_t i) const {
    int64_t off = 0;
    for (int d = nd - 1; d > 0; --d) {
      const int64_t q = i / size[d];
      off += (i - q * size[d]) * stride[d];
      i = q;
    }
    // The outermost dim needs no division (and a single-dim walk none at all).
    return nd > 0 ? off + i * stride[0] : 0;
  }
};

// The kept (reduced == false) or the reduced dims of x, in order, size-1 dims dropped and
// neighbours merged where one steps over the other exactly.
static Walk walk(const Tensor& x, const ReducePlan& p, bool reduced, const char* op) {
  Walk w{};
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (p.reduced[size_t(d)] != reduced) continue;
    const int64_t s = x.shape()[size_t(d)], st = x.strides()[size_t(d)];
    if (s == 1) continue;
    if (w.nd > 0 && w.stride[w.nd - 1] == st * s) {
      w.size[w.nd - 1] *= s;
      w.stride[w.nd - 1] = st;
      continue;
    }
    MU_CHECK(w.nd < kMaxDims, op, " on CUDA: the ", reduced ? "reduced" : "kept", " dims of ", x.describe(),
             " do not merge into ", kMaxDims, " or fewer strided dims");
    w.size[w.nd] = s;
    w.stride[w.nd] = st;
    ++w.nd;
  }
  return w;
}

// ---------------------------------------------------------------- combiners

// A sum carried in Acc, written as O.
template <class T, class Acc, class O>
struct SumOp {
  using State = Acc;
  using Out = O;
  __device__ State identity() const { return Acc(0); }
  __device__ State take(T v, int64_t) const { return Acc(cuda::widen(v)); }
  __device__ State combine(State a, State b) const { return fn::wrapping_add(a, b); }  // integers wrap, as on the CPU
  __device__ Out finish(State s) const { return O(s); }
};

// A value and its position in the run; i < 0 marks "no element yet".
template <class T>
struct Best {
  T v;
  int64_t i;
};

template <class T, bool Arg>
struct ExtremumOp {
  using State = Best<T>;
  using Out = std::conditional_t<Arg, int64_t, T>;
  bool take_max;

  // NaN wins every comparison, as in PyTorch: the first NaN replaces any number.
  __device__ bool better(T v, T best) const {
    if (v != v) return best == best;
    return take_max ? v > best : v < best;
  }
  __device__ State identity() const { return {T(0), -1}; }
  __device__ State take(T v, int64_t i) const { return {v, i}; }
  // Commutative and associative: the best value, the earliest position among equals.
  __device__ State combine(State a, State b) const {
    if (b.i < 0) return a;
    if (a.i < 0) return b;
    if (better(b.v, a.v)) return b;
    if (better(a.v, b.v)) return a;
    return b.i < a.i ? b : a;
  }
  __device__ Out finish(State s) const {
    if constexpr (Arg) return s.i;
    else return s.v;
  }
};

template <class A>
__device__ __forceinline__ A shfl_xor(A v, int o) {
  return __shfl_xor_sync(kFullMask, v, o);
}
template <class T>
__device__ __forceinline__ Best<T> shfl_xor(Best<T> s, int o) {
  return {__shfl_xor_sync(kFullMask, s.v, o), __shfl_xor_sync(kFullMask, s.i, o)};
}

// Combines s over the block (a multiple of 32 threads): warp butterflies, one partial
// per warp through shared memory, then warp 0 combines those. The result is valid in
// thread 0. Every thread must call it.
template <class Op>
__device__ typename Op::State block_combine(typename Op::State s, const Op& op, typename Op::State* scratch) {
  const int lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) >> 5, warps = int(blockDim.x) >> 5;
  for (int o = 16; o > 0; o >>= 1) s = op.combine(s, shfl_xor(s, o));
  __syncthreads();  // the previous output's reader (thread 0) is done with scratch
  if (lane == 0) scratch[warp] = s;
  __syncthreads();
  if (warp == 0) {
    s = lane < warps ? scratch[lane] : op.identity();
    for (int o = 16; o > 0; o >>= 1) s = op.combine(s, shfl_xor(s, o));
  }
  return s;
}

// ---------------------------------------------------------------- kernels

// One thread per output, scanning its run in order.
template <class T, class Op>
__global__ void reduce_thread_kernel(const T* x, typename Op::Out* out, Walk kept, Walk red, int64_t outer,
                                     int64_t inner, Op op) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t o = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; o < outer; o += step) {
    const T* base = x + kept.offset(o);
    typename Op::State s = op.identity();
    for (int64_t i = 0; i < inner; ++i) s = op.combine(s, op.take(base[red.offset(i)], i));
    out[o] = op.finish(s);
  }
}

// One block per (output, chunk of `per` run elements), outer * splits of them in a
// grid-stride loop. With splits == 1 the block writes the output; otherwise its partial
// state goes to part[output * splits + chunk].
template <class T, class Op>
__global__ void reduce_block_kernel(const T* x, typename Op::Out* out, typename Op::State* part, Walk kept, Walk red,
                                    int64_t outer, int64_t inner, int64_t splits, int64_t per, Op op) {
  __shared__ typename Op::State scratch[32];
  const int64_t items = outer * splits;
  // The item is the same for the whole block: every thread reaches block_combine.
  for (int64_t w = blockIdx.x; w < items; w += gridDim.x) {
    const int64_t o = w / splits, i0 = (w - o * splits) * per;
    const int64_t i1 = i0 + per < inner ? i0 + per : inner;
    const T* base = x + kept.offset(o);
    typename Op::State s = op.identity();
    for (int64_t i = i0 + threadIdx.x; i < i1; i += blockDim.x) s = op.combine(s, op.take(base[red.offset(i)], i));
    s = block_combine(s, op, scratch);
    if (threadIdx.x == 0) {
      if (splits == 1)
        out[o] = op.finish(s);
      else
        part[w] = s;
    }
  }
}

// One 32 x 8 block per (tile of 32 neighbouring outputs, chunk of `per` run elements),
// tiles * splits of them in a grid-stride loop: threadIdx.x picks the output, threadIdx.y
// the chunk's elements y, y + 8, .... With splits == 1 row 0 writes the outputs;
// otherwise their partial states go to part[output * splits + chunk].
template <class T, class Op>
__global__ void reduce_columns_kernel(const T* x, typename Op::Out* out, typename Op::State* part, Walk kept,
                                      Walk red, int64_t outer, int64_t inner, int64_t splits, int64_t per, Op op) {
  __shared__ typename Op::State s[8][32];
  const int64_t items = (outer + 31) / 32 * splits;
  // The item is the same for the whole block: every thread reaches both barriers.
  for (int64_t w = blockIdx.x; w < items; w += gridDim.x) {
    const int64_t tile = w / splits, chunk = w - tile * splits;
    const int64_t o = tile * 32 + threadIdx.x, i0 = chunk * per;
    const int64_t i1 = i0 + per < inner ? i0 + per : inner;
    typename Op::State st = op.identity();
    if (o < outer) {
      const T* base = x + kept.offset(o);
      for (int64_t i = i0 + threadIdx.y; i < i1; i += 8) st = op.combine(st, op.take(base[red.offset(i)], i));
    }
    __syncthreads();  // the previous item's row 0 is done reading s
    s[threadIdx.y][threadIdx.x] = st;
    __syncthreads();
    if (threadIdx.y == 0 && o < outer) {
      typename Op::State r = s[0][threadIdx.x];
      for (int y = 1; y < 8; ++y) r = op.combine(r, s[y][threadIdx.x]);
      if (splits == 1)
        out[o] = op.finish(r);
      else
        part[o * splits + chunk] = r;
    }
  }
}

// One thread per output: its splits partials combined in chunk order.
template <class Op>
__global__ void reduce_splits_kernel(const typename Op::State* part, typename Op::Out* out, int64_t outer,
                                     int64_t splits, Op op) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t o = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; o < outer; o += step) {
    typename Op::State s = op.identity();
    for (int64_t k = 0; k < splits; ++k) s = op.combine(s, part[o * splits + k]);
    out[o] = op.finish(s);
  }
}

// Runs the reduction `op` of x into out (dense, p.outer elements), choosing the mapping
// described at the top.
template <class T, class Op>
static void run_reduce(const Tensor& out, const Tensor& x, const ReducePlan& p, const Op& op, const char* name) {
  using State = typename Op::State;
  using O = typename Op::Out;
  const int64_t outer = p.outer, inner = p.inner;
  if (outer == 0) return;  // no output
  const Walk kept = walk(x, p, false, name), red = walk(x, p, true, name);
  const T* xp = static_cast<const T*>(x.raw_data());
  O* yp = static_cast<O*>(out.raw_data());
  const cudaStream_t st = cuda::stream(x);
  // A run shorter than a warp: one thread per output. An empty run (a sum over a
  // size-0 dim) comes here too and writes the identity, 0.
  if (inner < 32) {
    reduce_thread_kernel<T, Op><<<cuda::grid_for(outer, 256), 256, 0, st>>>(xp, yp, kept, red, outer, inner, op);
    MU_CUDA_CHECK_LAUNCH(name);
    return;
  }
  // Strided runs of outputs that are neighbours in memory: the column mapping.
  const bool unit_run = red.nd == 1 && red.stride[0] == 1;
  const bool columns = !unit_run && kept.nd > 0 && kept.stride[kept.nd - 1] == 1;
  const int64_t units = columns ? (outer + 31) / 32 : outer;  // blocks without splitting
  // Few blocks with long runs would leave most SMs idle: cut each run into chunks of at
  // least 1024 elements so that units * splits blocks fill the GPU (16 per SM).
  int64_t splits = 1;
  if (units < 2 * 132 && inner >= 2048) {
    const int64_t by_len = inner / 1024, by_fill = (132 * 16 + units - 1) / units;
    splits = by_len < by_fill ? by_len : by_fill;
  }
  const int64_t per = (inner + splits - 1) / splits;
  splits = (inner + per - 1) / per;  // no empty chunk at the end
  const int64_t items = units * splits;
  const unsigned grid = unsigned(items < cuda::kMaxBlocks ? items : cuda::kMaxBlocks);
  cuda::Workspace part(splits > 1 ? size_t(outer * splits) * sizeof(State) : 0, x.device().index);
  State* pp = splits > 1 ? part.as<State>() : nullptr;
  if (columns) {
    reduce_columns_kernel<T, Op><<<grid, dim3(32, 8), 0, st>>>(xp, yp, pp, kept, red, outer, inner, splits, per, op);
  } else {
    // Threads per block: the smallest power of two >= the run, from 32 to 256.
    int threads = 32;
    while (threads < 256 && threads < inner) threads *= 2;
    reduce_block_kernel<T, Op><<<grid, threads, 0, st>>>(xp, yp, pp, kept, red, outer, inner, splits, per, op);
  }
  MU_CUDA_CHECK_LAUNCH(name);
  if (splits > 1) {
    reduce_splits_kernel<Op><<<cuda::grid_for(outer, 256), 256, 0, st>>>(pp, yp, outer, splits, op);
    MU_CUDA_CHECK_LAUNCH(name);
  }
}

static void sum(const Tensor& out, const Tensor& x, const ReducePlan& p) {
  switch (x.dtype()) {
    case DType::Float32: return run_reduce<float>(out, x, p, SumOp<float, double, float>{}, "sum");
    case DType::Float64: return run_reduce<double>(out, x, p, SumOp<double, double, double>{}, "sum");
    case DType::Int64: return run_reduce<int64_t>(out, x, p, SumOp<int64_t, int64_t, int64_t>{}, "sum");
    case DType::Bool: return run_reduce<bool>(out, x, p, SumOp<bool, int64_t, int64_t>{}, "sum");  // a count
    // The 16-bit floats are read as they are and summed in float32 into a float32 out.
    case DType::BFloat16: return run_reduce<cuda::bf16>(out, x, p, SumOp<cuda::bf16, float, float>{}, "sum");
    case DType::Float16: return run_reduce<cuda::fp16>(out, x, p, SumOp<cuda::fp16, float, float>{}, "sum");
    default: break;
  }
  MU_FAIL("sum: dtype ", dtype_name(x.dtype()), " is a narrow integer dtype; convert the tensor with .to(kInt64)");
}

// max/min (Arg false) or argmax/argmin (Arg true) for x's dtype.
template <bool Arg>
static void best_of(const Tensor& out, const Tensor& x, const ReducePlan& p, bool take_max) {
  const char* name = Arg ? (take_max ? "argmax" : "argmin") : (take_max ? "amax" : "amin");
  switch (x.dtype()) {
    case DType::Float32: return run_reduce<float>(out, x, p, ExtremumOp<float, Arg>{take_max}, name);
    case DType::Float64: return run_reduce<double>(out, x, p, ExtremumOp<double, Arg>{take_max}, name);
    case DType::Int64: return run_reduce<int64_t>(out, x, p, ExtremumOp<int64_t, Arg>{take_max}, name);
    default: break;
  }
  MU_FAIL(name, ": expected float32, float64 or int64, got ", dtype_name(x.dtype()));
}

static void extremum(const Tensor& out, const Tensor& x, const ReducePlan& p, bool take_max) {
  best_of<false>(out, x, p, take_max);
}

static void arg_extremum(const Tensor& out, const Tensor& x, const ReducePlan& p, bool take_max) {
  best_of<true>(out, x, p, take_max);
}

MU_REGISTER_KERNEL(kernels::sum, DeviceType::CUDA, sum);
MU_REGISTER_KERNEL(kernels::extremum, DeviceType::CUDA, extremum);
MU_REGISTER_KERNEL(kernels::arg_extremum, DeviceType::CUDA, arg_extremum);

}  // namespace mu::cuda_kernels
