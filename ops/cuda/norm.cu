// CUDA kernels of layer_norm and batch_norm (declared in ops/kernels/norm.h; the CPU twin
// is ops/cpu/norm.cpp). Statistics are two-pass (the mean, then the squared deviations
// from it), float32 sums carried in double, as on the CPU.
//
// layer_norm: x is (rows, n). Forward and dx: one group per row, mapped as in
// ops/cuda/lines.cuh (a warp per row for n <= 1024, a block above). dweight and dbias
// are column sums over the rows, done in two passes without atomics: a grid of
// (column tile, row chunk) blocks of 32 x 8 threads, threadIdx.x on a column (so a warp
// reads 32 consecutive addresses) and threadIdx.y on the rows y, y + 8, ... of the chunk,
// writes one partial per (chunk, column) into a workspace; then one thread per column
// adds its chunks' partials in chunk order. The same layout sums batch_norm's channels
// of an (N, C) or channels-last input (inner == 1). For channels-first input (inner > 1)
// the first pass is a grid of (channel, chunk) blocks of 256 threads striding over the
// chunk's values of the channel, which lie in runs of `inner` consecutive addresses.
// The elementwise passes of batch_norm are one thread per element in a grid-stride loop.
#include "ops/cuda/dtypes.cuh"
#include "ops/cuda/lines.cuh"
#include "ops/kernels/norm.h"

namespace mu::cuda_kernels {

using cuda::acc_t;

template <class T>
static T* ptr_or_null(const Tensor& t) {
  return t.defined() ? static_cast<T*>(t.raw_data()) : nullptr;
}

// Blocks wanted across a two-pass sum: about 16 per SM of an H100, so that the first pass
// fills the GPU even for few columns.
constexpr int64_t kSumBlocks = 132 * 16;
// Row chunks (second grid dim) at most: bounds the partials and the second pass's loop.
constexpr int64_t kMaxChunks = 1024;

// ---------------------------------------------------------------- column sums

// A layout split into chunks along the summed axis: `chunks` chunks of `per` items.
struct Chunks {
  int64_t chunks, per;
};

// items summed per column, split so that tiles * chunks is about kSumBlocks, each chunk
// holding at least min_per items.
static Chunks split(int64_t items, int64_t tiles, int64_t min_per) {
  if (items == 0) return {0, 0};
  int64_t want = (kSumBlocks + tiles - 1) / tiles;
  want = want < kMaxChunks ? want : kMaxChunks;
  const int64_t most = (items + min_per - 1) / min_per;
  want = want < most ? want : most;
  want = want < 1 ? 1 : want;
  const int64_t per = (items + want - 1) / want;
  return {(items + per - 1) / per, per};
}

// First pass over an (outer, c) layout (inner == 1): block (32, 8), blockIdx.x a tile of
// 32 columns, blockIdx.y a chunk of rows. term(e, row, col, acc) adds element e's S terms
// into acc. part is [chunk][S][c].
template <int S, class A, class Term>
__global__ void row_partials_kernel(int64_t outer, int64_t c, int64_t per, Term term, A* part) {
  __shared__ A s[S][8][32];
  const int64_t k = int64_t(blockIdx.x) * 32 + threadIdx.x, chunk = blockIdx.y;
  const int64_t r0 = chunk * per, r1 = r0 + per < outer ? r0 + per : outer;
  A acc[S] = {};
  if (k < c)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += 8) term(r * c + k, r, k, acc);
  for (int q = 0; q < S; ++q) s[q][threadIdx.y][threadIdx.x] = acc[q];
  __syncthreads();
  // Row 0 of the block adds the 8 row partials of its column in row order.
  if (threadIdx.y == 0 && k < c) {
    for (int q = 0; q < S; ++q) {
      A t = s[q][0][threadIdx.x];
      for (int y = 1; y < 8; ++y) t += s[q][y][threadIdx.x];
      part[(chunk * S + q) * c + k] = t;
    }
  }
}

// First pass over an (outer, c, inner) layout (inner > 1): a block of 256 threads per
// (channel blockIdx.x, chunk blockIdx.y) strides over the chunk's flat positions p in
// [0, outer * inner) of the channel: element (p / inner) * c * inner + k * inner + p % inner.
template <int S, class A, class Term>
__global__ void line_partials_kernel(int64_t c, int64_t inner, int64_t count, int64_t per, Term term, A* part) {
  __shared__ alignas(8) unsigned char scratch[cuda::kScratchBytes];
  const cuda::BlockGroup g{int(threadIdx.x), int(blockDim.x), scratch};
  const int64_t k = blockIdx.x, chunk = blockIdx.y;
  const int64_t p0 = chunk * per, p1 = p0 + per < count ? p0 + per : count;
  A acc[S] = {};
  for (int64_t p = p0 + threadIdx.x; p < p1; p += blockDim.x) {
    const int64_t o = p / inner, i = p - o * inner;
    term((o * c + k) * inner + i, o, k, acc);
  }
  for (int q = 0; q < S; ++q) {
    const A t = g.reduce(acc[q], cuda::SumOf{}, A(0));
    if (threadIdx.x == 0) part[(chunk * S + q) * c + k] = t;
  }
}

// Second pass: out[q] = (sum over chunks of part[chunk][q], in chunk order) / divisor,
// for q in [0, len), one thread per q. With no chunks, out is 0.
template <class A>
__global__ void sum_chunks_kernel(const A* part, int64_t chunks, int64_t len, A divisor, A* out) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t q = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; q < len; q += step) {
    A t = 0;
    for (int64_t ch = 0; ch < chunks; ++ch) t += part[ch * len + q];
    out[q] = t / divisor;
  }
}

// out ([S][c], device) = per-channel sums of term over (outer, c, inner), each divided
// by divisor. Deterministic: the chunking depends on the sizes only.
template <int S, class A, class Term>
static void channel_sums(int64_t outer, int64_t c, int64_t inner, const Term& term, A divisor, A* out, int device,
                         cudaStream_t st, const char* name) {
  if (c == 0) return;
  const bool rows = inner == 1;
  const int64_t tiles = rows ? (c + 31) / 32 : c;
  const int64_t count = rows ? outer : outer * inner;  // items summed per channel
  const Chunks ch = split(count, tiles, rows ? 8 : 256);
  const int64_t len = int64_t(S) * c;
  cuda::Workspace part(size_t(ch.chunks > 0 ? ch.chunks : 1) * size_t(len) * sizeof(A), device);
  if (ch.chunks > 0) {
    if (rows)
      row_partials_kernel<S, A><<<dim3(unsigned(tiles), unsigned(ch.chunks)), dim3(32, 8), 0, st>>>(
          outer, c, ch.per, term, part.as<A>());
    else
      line_partials_kernel<S, A><<<dim3(unsigned(tiles), unsigned(ch.chunks)), 256, 0, st>>>(
          c, inner, count, ch.per, term, part.as<A>());
    MU_CUDA_CHECK_LAUNCH(name);
  }
  sum_chunks_kernel<A><<<cuda::grid_for(len, 256), 256, 0, st>>>(part.as<A>(), ch.chunks, len, divisor, out);
  MU_CUDA_CHECK_LAUNCH(name);
}

// ---------------------------------------------------------------- layer_norm

template <class T>
struct LayerNormForward {
  const T *x, *w, *b;
  T *y, *mean, *rstd;
  int64_t n;
  double eps;

  template <class G>
  __device__ void operator()(const G& g, int64_t off, int64_t, int64_t row, bool) const {
    using A = acc_t<T>;
    const T* xr = x + off;
    T* yr = y + off;
    A s = 0;
    for (int64_t j = g.rank; j < n; j += g.size) s += A(xr[j]);
    // n == 0 gives 0 / 0 = NaN statistics, as on the CPU.
    const A m = g.reduce(s, cuda::SumOf{}, A(0)) / A(n);
    A v = 0;
    for (int64_t j = g.rank; j < n; j += g.size) {
      const A d = A(xr[j]) - m;
      v += d * d;
    }
    v = g.reduce(v, cuda::SumOf{}, A(0));
    const A rs = A(1) / sqrt(v / A(n) + A(eps));  // biased variance, as torch
    if (g.rank == 0) {
      mean[row] = T(m);
      rstd[row] = T(rs);
    }
    // The elementwise pass in T: the statistics are what needed the wide type.
    const T mt = T(m), rt = T(rs);
    for (int64_t j = g.rank; j < n; j += g.size) {
      T o = (xr[j] - mt) * rt;
      if (w) o = o * w[j];
      if (b) o = o + b[j];
      yr[j] = o;
    }
  }
};

// With xh = (x - mean) rstd and gw = g w (g without weight), per row:
//   dx = rstd (gw - mean_j(gw) - xh mean_j(gw xh)).
template <class T>
struct LayerNormBackwardDx {
  const T *g_, *x, *mean, *rstd, *w;
  T* dx;
  int64_t n;

  template <class G>
  __device__ void operator()(const G& g, int64_t off, int64_t, int64_t row, bool) const {
    using A = acc_t<T>;
    const T *gr = g_ + off, *xr = x + off;
    T* dr = dx + off;
    const T m = mean[row], rs = rstd[row];
    A s1 = 0, s2 = 0;  // sum gw, sum gw xh
    for (int64_t j = g.rank; j < n; j += g.size) {
      const A gw = w ? A(gr[j]) * A(w[j]) : A(gr[j]);
      s1 += gw;
      s2 += gw * A((xr[j] - m) * rs);
    }
    s1 = g.reduce(s1, cuda::SumOf{}, A(0));
    s2 = g.reduce(s2, cuda::SumOf{}, A(0));
    const T c1 = T(s1 / A(n)), c2 = T(s2 / A(n));
    for (int64_t j = g.rank; j < n; j += g.size) {
      const T gw = w ? gr[j] * w[j] : gr[j];
      dr[j] = rs * (gw - c1 - (xr[j] - m) * rs * c2);
    }
  }
};

// dweight's and dbias's terms of element e = row * n + j: g xh and g.
template <class T>
struct LayerNormParamTerms {
  const T *g, *x, *mean, *rstd;
  __device__ void operator()(int64_t e, int64_t row, int64_t, acc_t<T> (&acc)[2]) const {
    using A = acc_t<T>;
    acc[0] += A(g[e]) * A((x[e] - mean[row]) * rstd[row]);
    acc[1] += A(g[e]);
  }
};

// dweight and dbias from the column sums [2][n].
template <class T>
__global__ void layer_norm_params_kernel(const acc_t<T>* sums, int64_t n, T* dw, T* db) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < n; j += step) {
    if (dw) dw[j] = T(sums[j]);
    if (db) db[j] = T(sums[n + j]);
  }
}

static void layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& y,
                               const Tensor& mean, const Tensor& rstd, int64_t rows, int64_t n, double eps) {
  // Rows of n == 0 elements still get their (NaN) statistics, so only rows == 0 skips.
  if (rows == 0) return;
  cuda::dispatch_float(x.dtype(), "layer_norm", [&](auto tag) {
    using T = decltype(tag);
    const LayerNormForward<T> body{static_cast<const T*>(x.raw_data()), ptr_or_null<const T>(weight),
                                   ptr_or_null<const T>(bias), static_cast<T*>(y.raw_data()),
                                   static_cast<T*>(mean.raw_data()), static_cast<T*>(rstd.raw_data()), n, eps};
    cuda::launch_lines(rows, n, 1, cuda::stream(x), "layer_norm_forward", body);
  });
}

static void layer_norm_backward(const Tensor& g, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                                const Tensor& weight, const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                                int64_t rows, int64_t n) {
  if (n == 0) return;  // every output is empty
  cuda::dispatch_float(x.dtype(), "layer_norm backward", [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const cudaStream_t st = cuda::stream(x);
    const T *gp = static_cast<const T*>(g.raw_data()), *xp = static_cast<const T*>(x.raw_data());
    const T *mp = static_cast<const T*>(mean.raw_data()), *rp = static_cast<const T*>(rstd.raw_data());
    if (dx.defined() && rows > 0) {
      const LayerNormBackwardDx<T> body{gp, xp, mp, rp, ptr_or_null<const T>(weight), static_cast<T*>(dx.raw_data()),
                                        n};
      cuda::launch_lines(rows, n, 1, st, "layer_norm_backward", body);
    }
    if (dweight.defined() || dbias.defined()) {
      // Column sums over the rows (0 with no rows), then narrowed into dweight and dbias.
      cuda::Workspace sums(size_t(2 * n) * sizeof(A), x.device().index);
      channel_sums<2, A>(rows, n, 1, LayerNormParamTerms<T>{gp, xp, mp, rp}, A(1), sums.as<A>(), x.device().index,
                         st, "layer_norm_backward (weight and bias)");
      layer_norm_params_kernel<T><<<cuda::grid_for(n, 256), 256, 0, st>>>(sums.as<A>(), n, ptr_or_null<T>(dweight),
                                                                          ptr_or_null<T>(dbias));
      MU_CUDA_CHECK_LAUNCH("layer_norm_backward (weight and bias)");
    }
  });
}

MU_REGISTER_KERNEL(kernels::layer_norm_forward, DeviceType::CUDA, layer_norm_forward);
MU_REGISTER_KERNEL(kernels::layer_norm_backward, DeviceType::CUDA, layer_norm_backward);

// ---------------------------------------------------------------- batch_norm

template <class T>
struct ValueTerm {  // sum x
  const T* x;
  __device__ void operator()(int64_t e, int64_t, int64_t, acc_t<T> (&acc)[1]) const { acc[0] += acc_t<T>(x[e]); }
};

template <class T>
struct SquaredDeviationTerm {  // sum (x - mean)^2, mean in the wide type
  const T* x;
  const acc_t<T>* mean;
  __device__ void operator()(int64_t e, int64_t, int64_t k, acc_t<T> (&acc)[1]) const {
    const acc_t<T> d = acc_t<T>(x[e]) - mean[k];
    acc[0] += d * d;
  }
};

template <class T>
struct GradTerms {  // sum g, sum g (x - mean)
  const T *g, *x, *mean;
  __device__ void operator()(int64_t e, int64_t, int64_t k, acc_t<T> (&acc)[2]) const {
    acc[0] += acc_t<T>(g[e]);
    acc[1] += acc_t<T>(g[e]) * acc_t<T>(x[e] - mean[k]);
  }
};

// One thread per channel. training: the batch mean m and biased variance var (wide, from
// the sums) become save_mean and save_invstd, and the running statistics move (the
// variance's by the unbiased estimate). Otherwise: the running statistics are used.
template <class T>
__global__ void batch_norm_stats_kernel(const acc_t<T>* m, const acc_t<T>* var, T* rm, T* rv, T* mean, T* invstd,
                                        int64_t c, int64_t n, bool training, double momentum, double eps) {
  using A = acc_t<T>;
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < c; k += step) {
    if (training) {
      mean[k] = T(m[k]);
      invstd[k] = T(A(1) / sqrt(var[k] + A(eps)));
      if (rm) {
        rm[k] = T((1 - momentum) * double(rm[k]) + momentum * double(m[k]));
        rv[k] = T((1 - momentum) * double(rv[k]) + momentum * double(var[k]) * double(n) / double(n - 1));
      }
    } else {
      mean[k] = rm[k];
      invstd[k] = T(A(1) / sqrt(A(rv[k]) + A(eps)));
    }
  }
}

// y = (x - mean) * scale + shift, scale = invstd * w, shift = b, per channel; one thread
// per element in a grid-stride loop.
template <class T>
__global__ void batch_norm_apply_kernel(const T* x, const T* w, const T* b, const T* mean, const T* invstd, T* y,
                                        int64_t total, int64_t c, int64_t inner) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += step) {
    const int64_t k = (e / inner) % c;
    const T sc = w ? invstd[k] * w[k] : invstd[k], sh = b ? b[k] : T(0);
    y[e] = (x[e] - mean[k]) * sc + sh;
  }
}

// From the sums [2][c] (sum g, sum g (x - mean); null when not needed): dbias, dweight and
// dx's coefficients coef = [a, cg, cx] per channel, dx = a (g - cg - (x - mean) cx).
template <class T>
__global__ void batch_norm_grad_coef_kernel(const acc_t<T>* s, const T* invstd, const T* w, T* dw, T* db, T* coef,
                                            int64_t c, int64_t n, bool training) {
  using A = acc_t<T>;
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < c; k += step) {
    const A is = A(invstd[k]);
    if (db) db[k] = T(s[k]);
    if (dw) dw[k] = T(s[c + k] * is);
    if (coef) {
      coef[k] = T(w ? is * A(w[k]) : is);
      // eval: the mean and invstd are constants, so only the first term remains.
      coef[c + k] = training ? T(s[k] / A(n)) : T(0);
      coef[2 * c + k] = training ? T(is * is * s[c + k] / A(n)) : T(0);
    }
  }
}

template <class T>
__global__ void batch_norm_dx_kernel(const T* g, const T* x, const T* mean, const T* coef, T* dx, int64_t total,
                                     int64_t c, int64_t inner) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += step) {
    const int64_t k = (e / inner) % c;
    dx[e] = coef[k] * (g[e] - coef[c + k] - (x[e] - mean[k]) * coef[2 * c + k]);
  }
}

static void batch_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                               const Tensor& running_var, const Tensor& y, const Tensor& save_mean,
                               const Tensor& save_invstd, int64_t outer, int64_t c, int64_t inner, bool training,
                               double momentum, double eps) {
  if (c == 0) return;  // no channel: every output is empty
  cuda::dispatch_float(x.dtype(), "batch_norm", [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const cudaStream_t st = cuda::stream(x);
    const int dev = x.device().index;
    const int64_t n = outer * inner, total = n * c;  // values per channel, in all
    const T* xp = static_cast<const T*>(x.raw_data());
    T *mean = static_cast<T*>(save_mean.raw_data()), *invstd = static_cast<T*>(save_invstd.raw_data());
    cuda::Workspace stats(size_t(2 * c) * sizeof(A), dev);  // [mean, var], wide
    A *m = stats.as<A>(), *var = m + c;
    if (training) {
      // The op guarantees n > 1 when training.
      channel_sums<1, A>(outer, c, inner, ValueTerm<T>{xp}, A(n), m, dev, st, "batch_norm (mean)");
      channel_sums<1, A>(outer, c, inner, SquaredDeviationTerm<T>{xp, m}, A(n), var, dev, st, "batch_norm (var)");
    }
    batch_norm_stats_kernel<T><<<cuda::grid_for(c, 256), 256, 0, st>>>(
        m, var, ptr_or_null<T>(running_mean), ptr_or_null<T>(running_var), mean, invstd, c, n, training, momentum,
        eps);
    MU_CUDA_CHECK_LAUNCH("batch_norm (statistics)");
    if (total == 0) return;
    batch_norm_apply_kernel<T><<<cuda::grid_for(total, 256), 256, 0, st>>>(
        xp, ptr_or_null<const T>(weight), ptr_or_null<const T>(bias), mean, invstd, static_cast<T*>(y.raw_data()),
        total, c, inner);
    MU_CUDA_CHECK_LAUNCH("batch_norm_forward");
  });
}

static void batch_norm_backward(const Tensor& g, const Tensor& x, const Tensor& save_mean, const Tensor& save_invstd,
                                const Tensor& weight, const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                                int64_t outer, int64_t c, int64_t inner, bool training) {
  if (c == 0) return;
  cuda::dispatch_float(x.dtype(), "batch_norm backward", [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const cudaStream_t st = cuda::stream(x);
    const int dev = x.device().index;
    const int64_t n = outer * inner, total = n * c;
    const T *gp = static_cast<const T*>(g.raw_data()), *xp = static_cast<const T*>(x.raw_data());
    const T *mean = static_cast<const T*>(save_mean.raw_data()), *invstd = static_cast<const T*>(save_invstd.raw_data());
    const bool want_dx = dx.defined() && total > 0;
    const bool need_sums = dweight.defined() || dbias.defined() || (want_dx && training);
    cuda::Workspace sums(size_t(2 * c) * sizeof(A), dev);
    if (need_sums)
      channel_sums<2, A>(outer, c, inner, GradTerms<T>{gp, xp, mean}, A(1), sums.as<A>(), dev, st,
                         "batch_norm_backward (sums)");
    cuda::Workspace coef(size_t(3 * c) * sizeof(T), dev);
    batch_norm_grad_coef_kernel<T><<<cuda::grid_for(c, 256), 256, 0, st>>>(
        need_sums ? sums.as<A>() : nullptr, invstd, ptr_or_null<const T>(weight), ptr_or_null<T>(dweight),
        ptr_or_null<T>(dbias), want_dx ? coef.as<T>() : nullptr, c, n, training);
    MU_CUDA_CHECK_LAUNCH("batch_norm_backward (coefficients)");
    if (!want_dx) return;
    batch_norm_dx_kernel<T><<<cuda::grid_for(total, 256), 256, 0, st>>>(gp, xp, mean, coef.as<T>(),
                                                                        static_cast<T*>(dx.raw_data()), total, c,
                                                                        inner);
    MU_CUDA_CHECK_LAUNCH("batch_norm_backward");
  });
}

MU_REGISTER_KERNEL(kernels::batch_norm_forward, DeviceType::CUDA, batch_norm_forward);
MU_REGISTER_KERNEL(kernels::batch_norm_backward, DeviceType::CUDA, batch_norm_backward);

}  // namespace mu::cuda_kernels
