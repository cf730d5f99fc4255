// PyTorch-like printing: nested brackets, one format for all elements, aligned columns,
// "..." in the middle of dimensions when the tensor is large, then shape and dtype.
#include <cmath>
#include <cstdio>
#include <ostream>
#include <string>

#include "autograd/node.h"
#include "tensor/tensor.h"

namespace mu {

static PrintOptions g_print;
void set_print_options(const PrintOptions& opts) { g_print = opts; }

namespace {

struct Formatter {
  enum Kind { Int, Bool, FloatInt, Fixed, Sci } kind = Fixed;
  int width = 1;
  int precision = 4;

  std::string fmt(double v) const {
    char buf[64];
    switch (kind) {
      case Bool: return v != 0 ? "True" : "False";
      case Int: std::snprintf(buf, sizeof buf, "%lld", (long long)v); break;
      case FloatInt:
        if (std::isfinite(v)) std::snprintf(buf, sizeof buf, "%.0f.", v);
        else std::snprintf(buf, sizeof buf, "%s", std::isnan(v) ? "nan" : v > 0 ? "inf" : "-inf");
        break;
      case Fixed:
        if (std::isfinite(v)) std::snprintf(buf, sizeof buf, "%.*f", precision, v);
        else std::snprintf(buf, sizeof buf, "%s", std::isnan(v) ? "nan" : v > 0 ? "inf" : "-inf");
        break;
      case Sci:
        if (std::isfinite(v)) std::snprintf(buf, sizeof buf, "%.*e", precision, v);
        else std::snprintf(buf, sizeof buf, "%s", std::isnan(v) ? "nan" : v > 0 ? "inf" : "-inf");
        break;
    }
    return buf;
  }
};

struct Printer {
  const Tensor& t;
  bool summarize;
  Formatter f;
  std::string out;

  // Indices printed along a dimension of size n: all, or the first and last edgeitems.
  std::vector<int64_t> shown(int64_t n) const {
    std::vector<int64_t> idx;
    int64_t e = g_print.edgeitems;
    if (!summarize || n <= 2 * e) {
      for (int64_t i = 0; i < n; ++i) idx.push_back(i);
    } else {
      for (int64_t i = 0; i < e; ++i) idx.push_back(i);
      idx.push_back(-1);  // the "..." marker
      for (int64_t i = n - e; i < n; ++i) idx.push_back(i);
    }
    return idx;
  }

  double value(int64_t off) const {
    double v = 0;
    const char* base = static_cast<const char*>(t.storage()->data);
    MU_DISPATCH_STORAGE(t.dtype(), "print",
                        [&] { v = convert_element<double>(reinterpret_cast<const scalar_t*>(base)[off]); });
    return v;
  }

  // An element's text: integers read exactly as int64 (through double, values past 2^53
  // printed as a neighbour), everything else through the format.
  std::string cell(int64_t off) const {
    if (f.kind != Formatter::Int) return f.fmt(value(off));
    int64_t v = 0;
    const char* base = static_cast<const char*>(t.storage()->data);
    MU_DISPATCH_STORAGE(t.dtype(), "print",
                        [&] { v = convert_element<int64_t>(reinterpret_cast<const scalar_t*>(base)[off]); });
    return std::to_string(v);
  }

  void visit_offsets(int64_t d, int64_t off, const std::function<void(int64_t)>& fn) const {
    if (d == t.dim()) return fn(off);
    for (int64_t i : shown(t.shape()[size_t(d)]))
      if (i >= 0) visit_offsets(d + 1, off + i * t.strides()[size_t(d)], fn);
  }

  void visit_values(int64_t d, int64_t off, const std::function<void(double)>& fn) const {
    visit_offsets(d, off, [&](int64_t o) { fn(value(o)); });
  }

  void choose_format() {
    if (t.dtype() == kBool) f.kind = Formatter::Bool;
    if (!is_floating(t.dtype()) && t.dtype() != kBool) f.kind = Formatter::Int;  // every integer dtype
    double max_abs = 0, min_abs = INFINITY;
    bool all_int = true;
    visit_values(0, t.storage_offset(), [&](double v) {
      if (!std::isfinite(v)) return;
      double a = std::fabs(v);
      max_abs = std::max(max_abs, a);
      if (a > 0) min_abs = std::min(min_abs, a);
      if (v != std::floor(v)) all_int = false;
    });
    if (is_floating(t.dtype())) {
      f.precision = g_print.precision;
      if (all_int && max_abs < 1e8) f.kind = Formatter::FloatInt;
      else if (max_abs >= 1e8 || (min_abs < 1e-4 && min_abs > 0) || (min_abs > 0 && max_abs / min_abs > 1e3))
        f.kind = Formatter::Sci;
      else f.kind = Formatter::Fixed;
    }
    visit_offsets(0, t.storage_offset(), [&](int64_t o) { f.width = std::max<int>(f.width, int(cell(o).size())); });
  }

  void print(int64_t d, int64_t off, int indent) {
    if (d == t.dim()) {
      std::string s = cell(off);
      out += std::string(size_t(f.width) - s.size(), ' ') + s;
      return;
    }
    out += '[';
    std::vector<int64_t> idx = shown(t.shape()[size_t(d)]);
    for (size_t k = 0; k < idx.size(); ++k) {
      if (k) {
        out += ',';
        if (d == t.dim() - 1) out += ' ';
        else out += std::string(size_t(t.dim() - d - 1), '\n') + std::string(size_t(indent + 1), ' ');
      }
      if (idx[k] < 0) out += d == t.dim() - 1 ? " ..." : "...";
      else print(d + 1, off + idx[k] * t.strides()[size_t(d)], indent + 1);
    }
    out += ']';
  }
};

}  // namespace

std::string Tensor::str() const {
  if (!defined()) return "tensor(undefined)";
  Tensor c = device().is_cpu() ? *this : cpu();
  Printer p{c, c.numel() > g_print.threshold, {}, {}};
  std::string s = "tensor(";
  if (c.numel() > 0) {
    p.choose_format();
    p.print(0, c.storage_offset(), int(s.size()));
    s += p.out;
  } else {
    s += "[]";
  }
  s += ", shape=" + shape_str(shape()) + ", dtype=" + dtype_name(dtype());
  if (!device().is_cpu()) s += ", device=" + device().str();
  if (grad_fn()) s += ", grad_fn=<" + grad_fn()->name() + ">";
  else if (requires_grad()) s += ", requires_grad=True";
  return s + ")";
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.str(); }

}  // namespace mu
