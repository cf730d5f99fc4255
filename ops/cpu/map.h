// Elementwise kernels over broadcast operands: out[i] = f(a[i], b[i], ...), where each
// input is read through its broadcast strides and `out` may be any strided view.
// Every unary, binary and ternary CPU op is one call of these.
#pragma once
#include "ops/cpu/loops.h"
#include "tensor/tensor.h"

namespace mu::cpu {

template <class TO, class TA, class F>
void map1(const Tensor& out, const Tensor& a, F f) {
  TO* po = out.data_ptr<TO>();
  const TA* pa = a.data_ptr<TA>();
  Shape sa = broadcast_strides(a.shape(), a.strides(), out.shape());
  for_each_run<2>(out.shape(), {out.strides(), sa}, [&](const auto& off, int64_t n, const auto& st) {
    TO* o = po + off[0];
    const TA* x = pa + off[1];
    if (st[0] == 1 && st[1] == 1) {
      for (int64_t i = 0; i < n; ++i) o[i] = f(x[i]);
    } else {
      for (int64_t i = 0; i < n; ++i) o[i * st[0]] = f(x[i * st[1]]);
    }
  });
}

template <class TO, class TA, class TB, class F>
void map2(const Tensor& out, const Tensor& a, const Tensor& b, F f) {
  TO* po = out.data_ptr<TO>();
  const TA* pa = a.data_ptr<TA>();
  const TB* pb = b.data_ptr<TB>();
  Shape sa = broadcast_strides(a.shape(), a.strides(), out.shape());
  Shape sb = broadcast_strides(b.shape(), b.strides(), out.shape());
  for_each_run<3>(out.shape(), {out.strides(), sa, sb}, [&](const auto& off, int64_t n, const auto& st) {
    TO* o = po + off[0];
    const TA* x = pa + off[1];
    const TB* y = pb + off[2];
    if (st[0] == 1 && st[1] == 1 && st[2] == 1) {
      for (int64_t i = 0; i < n; ++i) o[i] = f(x[i], y[i]);
    } else if (st[0] == 1 && st[1] == 1 && st[2] == 0) {  // tensor op broadcast scalar/row
      const TB yv = *y;
      for (int64_t i = 0; i < n; ++i) o[i] = f(x[i], yv);
    } else {
      for (int64_t i = 0; i < n; ++i) o[i * st[0]] = f(x[i * st[1]], y[i * st[2]]);
    }
  });
}

template <class TO, class TA, class TB, class TC, class F>
void map3(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& c, F f) {
  TO* po = out.data_ptr<TO>();
  const TA* pa = a.data_ptr<TA>();
  const TB* pb = b.data_ptr<TB>();
  const TC* pc = c.data_ptr<TC>();
  Shape sa = broadcast_strides(a.shape(), a.strides(), out.shape());
  Shape sb = broadcast_strides(b.shape(), b.strides(), out.shape());
  Shape sc = broadcast_strides(c.shape(), c.strides(), out.shape());
  for_each_run<4>(out.shape(), {out.strides(), sa, sb, sc}, [&](const auto& off, int64_t n, const auto& st) {
    TO* o = po + off[0];
    const TA* x = pa + off[1];
    const TB* y = pb + off[2];
    const TC* z = pc + off[3];
    for (int64_t i = 0; i < n; ++i) o[i * st[0]] = f(x[i * st[1]], y[i * st[2]], z[i * st[3]]);
  });
}

}  // namespace mu::cpu
