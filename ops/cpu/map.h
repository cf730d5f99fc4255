// Elementwise CPU loops over broadcast operands: out[i] = f(a[i], b[i], ...), where each
// input is read through its broadcast strides and `out` may be any strided view. Every
// map kernel (ops/cpu/map.cpp) and the dtype conversion of copies are one call of map_n.
#pragma once
#include <array>
#include <tuple>
#include <utility>

#include "ops/cpu/loops.h"
#include "tensor/tensor.h"

namespace mu::cpu {

// `in` in out's layout (a dense copy of out's shape), when it is transposed against out
// (loops.h, transposed_dim) and out has more than one input to walk: a tiled copy and a
// dense pass beat one pass reading across the transposed operand's rows (an add of
// (128, 49, 128) floats and a transposed view: 2.5-3.2 ms -> ~1.1 ms on one thread).
// Otherwise `in` itself.
template <class TO, class... TI, class F>
void map_n(const Tensor& out, const std::array<Tensor, sizeof...(TI)>& in, const F& f);

template <class T>
Tensor untransposed(const Tensor& out, const Tensor& in) {
  const Shape bs = broadcast_strides(in.shape(), in.strides(), out.shape());
  if (transposed_dim(coalesce<2>(out.shape(), {out.strides(), bs})) < 0) return in;
  Tensor dense = empty(out.shape(), TensorOptions(in.dtype()).device(in.device()));
  map_n<T, T>(dense, {in}, [](T v) { return v; });  // one input: the tiled walk
  return dense;
}

template <class TO, class... TI, class F, size_t... K>
void map_n_impl(const Tensor& out, const std::array<Tensor, sizeof...(TI)>& in_given, const F& f,
                std::index_sequence<K...>) {
  constexpr size_t N = sizeof...(TI);
  std::array<Tensor, N> in = in_given;
  if constexpr (N >= 2) ((in[K] = untransposed<TI>(out, in[K])), ...);
  TO* po = out.data_ptr<TO>();
  const std::tuple<const TI*...> pin{in[K].template data_ptr<TI>()...};
  std::array<Shape, N + 1> strides{out.strides(), broadcast_strides(in[K].shape(), in[K].strides(), out.shape())...};
  for_each_run<N + 1>(out.shape(), strides, [&](const auto& off, int64_t n, const auto& st) {
    TO* o = po + off[0];
    const std::tuple<const TI*...> x{std::get<K>(pin) + off[K + 1]...};
    if (st[0] == 1 && ((st[K + 1] == 1) && ...)) {
      // Dense run: the functor's own loop over whole vectors where it has one (run),
      // else a plain loop the compiler vectorises.
      if constexpr (requires { f.run(o, std::get<K>(x)..., n); })
        f.run(o, std::get<K>(x)..., n);
      else
        for (int64_t i = 0; i < n; ++i) o[i] = f(std::get<K>(x)[i]...);
    } else if constexpr (N == 2) {
      // tensor (op) broadcast scalar or row, the commonest broadcast: hoist the scalar.
      // Either side: a backward's g is often the broadcast one (the gradient of a sum
      // reaching square's g · 2x), and the strided loop below stays scalar.
      if (st[0] == 1 && st[1] == 1 && st[2] == 0) {
        const auto yv = *std::get<1>(x);
        for (int64_t i = 0; i < n; ++i) o[i] = f(std::get<0>(x)[i], yv);
      } else if (st[0] == 1 && st[1] == 0 && st[2] == 1) {
        const auto xv = *std::get<0>(x);
        for (int64_t i = 0; i < n; ++i) o[i] = f(xv, std::get<1>(x)[i]);
      } else {
        for (int64_t i = 0; i < n; ++i) o[i * st[0]] = f(std::get<K>(x)[i * st[K + 1]]...);
      }
    } else {
      // A functor that has its own loop for a dense output with operands dense or
      // broadcast (where's select) takes such runs.
      if constexpr (requires { f.run_broadcast(o, std::get<K>(x)..., st, n); })
        if (st[0] == 1 && (((st[K + 1] == 0) | (st[K + 1] == 1)) && ...))
          return f.run_broadcast(o, std::get<K>(x)..., st, n);
      for (int64_t i = 0; i < n; ++i) o[i * st[0]] = f(std::get<K>(x)[i * st[K + 1]]...);
    }
  }, /*free_order=*/N == 1);
}

// out = f(in...), in[k] holding TI[k] elements, out TO.
template <class TO, class... TI, class F>
void map_n(const Tensor& out, const std::array<Tensor, sizeof...(TI)>& in, const F& f) {
  map_n_impl<TO, TI...>(out, in, f, std::index_sequence_for<TI...>{});
}

}  // namespace mu::cpu
