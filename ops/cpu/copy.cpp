// CPU kernels of copies and fills (declared in ops/kernels/copy.h).
#include <cstring>

#include "ops/cpu/map.h"
#include "ops/cpu/simd.h"
#include "ops/kernels/copy.h"

namespace mu::cpu {

// A copy between two tensors of the same 4-byte dtype that transposes: dst runs along its
// innermost dim, src along another dim j (a token-mixing block's x.transpose(1, 2) made
// dense). The tiled walk of map_n (loops.h, for_each_tile_run) still moves such tiles one
// element at a time, reading across src's rows; here each whole 16 x 16 tile (W x W on
// other vector widths) is 16 vector loads of src's runs along j, transposed in registers
// (simd.h) and stored as 16 runs of dst, and only the edge tiles go element by element.
// (128, 49, 128) float32 transposed: 166 -> 83 us in cache. False when the copy is not
// of that form.
static bool copy_transposed_words(const Tensor& dst, const Tensor& src) {
  using VF = Vec<float>::type;
  constexpr int64_t W = Vec<float>::width;
  if (dst.dtype() != src.dtype() || element_size(dst.dtype()) != 4 || src.shape() != dst.shape()) return false;
  const StridedLayout<2> L = coalesce<2>(dst.shape(), {dst.strides(), src.strides()});
  const int64_t j = transposed_dim(L);
  const int64_t nd = int64_t(L.shape.size());
  if (j < 0 || L.strides[0][nd - 1] != 1 || L.strides[1][j] != 1) return false;
  const int64_t inner = L.shape[nd - 1], rows = L.shape[j];
  const int64_t d_row = L.strides[0][j], s_col = L.strides[1][nd - 1];
  int64_t batch = 1;
  for (int64_t d = 0; d + 1 < nd; ++d)
    if (d != j) batch *= L.shape[d];
  auto* out = static_cast<char*>(dst.raw_data());
  const auto* in = static_cast<const char*>(src.raw_data());
  const int64_t row_tiles = (rows + W - 1) / W, items = batch * row_tiles;
  const int nt = batch * rows * inner >= kParallelGrain && !omp_in_parallel() ? omp_get_max_threads() : 1;
  parallel_for(items, nt, [&](int64_t item) {
    const int64_t r0 = (item % row_tiles) * W, r1 = std::min(rows, r0 + W);
    const std::array<int64_t, 2> base = offsets_at(L, item / row_tiles, nd - 1, j);
    for (int64_t c0 = 0; c0 < inner; c0 += W) {
      const int64_t c1 = std::min(inner, c0 + W);
      if (r1 - r0 == W && c1 - c0 == W) {
        VF v[W];  // v[c]: src's run along j at column c0 + c
        for (int64_t c = 0; c < W; ++c) std::memcpy(&v[c], in + 4 * (base[1] + r0 + (c0 + c) * s_col), sizeof(VF));
        transpose_block(v);  // v[r]: row r0 + r, columns c0 ..
        for (int64_t r = 0; r < W; ++r) std::memcpy(out + 4 * (base[0] + (r0 + r) * d_row + c0), &v[r], sizeof(VF));
      } else {
        for (int64_t r = r0; r < r1; ++r)
          for (int64_t c = c0; c < c1; ++c)
            std::memcpy(out + 4 * (base[0] + r * d_row + c), in + 4 * (base[1] + r + c * s_col), 4);
      }
    }
  });
  return true;
}

// Every pair of dtypes, storage dtypes included: this is where .to() converts them.
static void copy(const Tensor& dst, const Tensor& src) {
  if (copy_transposed_words(dst, src)) return;
  MU_DISPATCH_STORAGE(dst.dtype(), "copy", [&] {
    using TO = scalar_t;
    MU_DISPATCH_STORAGE(src.dtype(), "copy", [&] {
      map_n<TO, scalar_t>(dst, {src}, [](scalar_t v) { return convert_element<TO>(v); });
    });
  });
}

static void fill(const Tensor& dst, double value) {
  MU_DISPATCH_STORAGE(dst.dtype(), "fill_", [&] {
    const scalar_t v = convert_element<scalar_t>(value);
    scalar_t* base = dst.data_ptr<scalar_t>();
    for_each_run<1>(dst.shape(), {dst.strides()}, [&](const auto& off, int64_t n, const auto& st) {
      scalar_t* o = base + off[0];
      for (int64_t i = 0; i < n; ++i) o[i * st[0]] = v;
    });
  });
}

MU_REGISTER_KERNEL(kernels::copy, DeviceType::CPU, copy);
MU_REGISTER_KERNEL(kernels::fill, DeviceType::CPU, fill);

}  // namespace mu::cpu
