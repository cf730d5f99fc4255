// Tensor metadata, element access and factories: everything about a tensor that needs
// no kernel beyond filling fresh memory.
#include "tensor/tensor.h"

#include <cmath>
#include <cstring>
#include <type_traits>

#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "tensor/checked.h"

namespace mu {

TensorImpl* Tensor::checked() const {
  MU_CHECK(impl_ != nullptr, "operation on an undefined tensor (a default-constructed Tensor, "
           "or a gradient that was never computed)");
  return impl_.get();
}

int64_t Tensor::size(int64_t d) const { return shape()[size_t(wrap_sized_dim(d, dim(), "size"))]; }
int64_t Tensor::stride(int64_t d) const { return strides()[size_t(wrap_sized_dim(d, dim(), "stride"))]; }

bool Tensor::is_contiguous() const {
  const TensorImpl* i = checked();
  if (numel_of(i->shape) == 0) return true;  // no element to misplace, as PyTorch
  int64_t expected = 1;
  for (size_t d = i->shape.size(); d-- > 0;) {
    if (i->shape[d] == 1) continue;
    if (i->strides[d] != expected) return false;
    expected *= i->shape[d];
  }
  return true;
}

void* Tensor::raw_data() const {
  const TensorImpl* i = checked();
  return static_cast<char*>(i->storage->data) + i->offset * int64_t(element_size(i->dtype));
}

template <class T>
T* Tensor::data_ptr() const {
  MU_CHECK(dtype() == dtype_of<T>(), "data_ptr: tensor has dtype ", dtype_name(dtype()),
           ", requested ", dtype_name(dtype_of<T>()));
  return static_cast<T*>(raw_data());
}
template float* Tensor::data_ptr<float>() const;
template double* Tensor::data_ptr<double>() const;
template int64_t* Tensor::data_ptr<int64_t>() const;
template bool* Tensor::data_ptr<bool>() const;
template bfloat16_t* Tensor::data_ptr<bfloat16_t>() const;
template half_t* Tensor::data_ptr<half_t>() const;
template int8_t* Tensor::data_ptr<int8_t>() const;
template int16_t* Tensor::data_ptr<int16_t>() const;
template int32_t* Tensor::data_ptr<int32_t>() const;
template uint8_t* Tensor::data_ptr<uint8_t>() const;

// Reads the element at storage offset `off` of a CPU tensor as a double.
static double read_element(const Tensor& t, int64_t off) {
  const char* base = static_cast<const char*>(t.storage()->data);
  double v = 0;
  MU_DISPATCH_STORAGE(t.dtype(), "read",
                      [&] { v = convert_element<double>(reinterpret_cast<const scalar_t*>(base)[off]); });
  return v;
}

static int64_t element_offset(const Tensor& t, const std::vector<int64_t>& idx, const char* op) {
  MU_CHECK(int64_t(idx.size()) == t.dim(), op, ": got ", idx.size(), " indices for a tensor with ",
           t.dim(), " dimensions (shape ", shape_str(t.shape()), ")");
  int64_t off = t.storage_offset();
  for (size_t d = 0; d < idx.size(); ++d) {
    int64_t i = idx[d], n = t.shape()[d];
    MU_CHECK(i >= -n && i < n, op, ": index ", i, " out of range for dimension ", d, " of size ", n,
             " (shape ", shape_str(t.shape()), ")");
    off += (i < 0 ? i + n : i) * t.strides()[d];
  }
  return off;
}

static void require_one_element(const Tensor& t) {
  MU_CHECK(t.numel() == 1, "item: only a one-element tensor converts to a number; this one has shape ",
           shape_str(t.shape()), " (", t.numel(), " elements)");
}

double Tensor::item() const {
  require_one_element(*this);
  if (!device().is_cpu()) return cpu().item();
  return read_element(*this, storage_offset());
}

int64_t Tensor::item_int64() const {
  require_one_element(*this);
  if (is_floating_point()) return static_cast<int64_t>(item());
  const Tensor t = (dtype() == kInt64 ? *this : to(kInt64)).cpu();  // exact: every integer dtype fits in int64
  return t.data_ptr<int64_t>()[0];
}

double Tensor::at(std::initializer_list<int64_t> idx) const { return at(std::vector<int64_t>(idx)); }

double Tensor::at(const std::vector<int64_t>& idx) const {
  if (!device().is_cpu()) return cpu().at(idx);
  return read_element(*this, element_offset(*this, idx, "at"));
}

void Tensor::set(const std::vector<int64_t>& idx, double value) const {
  MU_CHECK(device().is_cpu(), "set: element writes need a CPU tensor, this one is on ", device().str());
  check_inplace(*this, "set");
  int64_t off = element_offset(*this, idx, "set");
  check_value_fits(value, dtype(), "set");
  char* base = static_cast<char*>(storage()->data);
  MU_DISPATCH_STORAGE(dtype(), "set",
                      [&] { reinterpret_cast<scalar_t*>(base)[off] = convert_element<scalar_t>(value); });
  bump_version();
}

template <class T>
std::vector<T> Tensor::to_vector() const {
  Tensor c = to(Device::cpu()).to(dtype_of<T>()).contiguous();
  const T* p = c.data_ptr<T>();
  return std::vector<T>(p, p + c.numel());
}
template std::vector<float> Tensor::to_vector<float>() const;
template std::vector<double> Tensor::to_vector<double>() const;
template std::vector<int64_t> Tensor::to_vector<int64_t>() const;
template std::vector<bool> Tensor::to_vector<bool>() const;

Tensor Tensor::detach() const {
  const TensorImpl* i = checked();
  return make_view(i->storage, i->shape, i->strides, i->offset, i->dtype);
}

void Tensor::set_data(const Tensor& src) const {
  TensorImpl* i = checked();
  MU_CHECK(src.defined(), "set_data: source is an undefined tensor");
  MU_CHECK(i->grad_fn == nullptr, "set_data: only leaf tensors can take new data (this one is the output of ",
           "an op)");
  i->storage = src.storage();
  i->shape = src.shape();
  i->strides = src.strides();
  i->offset = src.storage_offset();
  i->dtype = src.dtype();
  i->grad.reset();
  if (!is_floating(i->dtype)) i->requires_grad = false;
}

std::string Tensor::describe() const {
  if (!defined()) return "Tensor[undefined]";
  return detail::str("Tensor[", dtype_name(dtype()), ", ", shape_str(shape()), ", ", device().str(), "]");
}

Tensor make_view(const std::shared_ptr<Storage>& storage, const Shape& shape, const Shape& strides,
                 int64_t offset, DType dtype) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = storage;
  impl->shape = shape;
  impl->strides = strides;
  impl->offset = offset;
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

void check_inplace(const Tensor& t, const char* op) {
  if (!autograd::is_grad_enabled() || !t.requires_grad()) return;
  MU_CHECK(!t.is_leaf(), op, ": in-place operation on a leaf tensor that requires grad (",
           t.describe(), "); wrap the update in NoGradGuard, as optimizers do");
  MU_FAIL(op, ": in-place operation on a tensor that is part of the autograd graph (", t.describe(),
          ", output of ", t.grad_fn()->name(), "); use the out-of-place form");
}

void check_distinct_elements(const Tensor& t, const char* op) {
  for (int64_t d = 0; d < t.dim(); ++d)
    MU_CHECK(t.stride(d) != 0 || t.size(d) <= 1, op, ": more than one element of the written-to tensor ",
             t.describe(), " refers to one memory location (dim ", d, " has size ", t.size(d),
             " and stride 0, an expanded view); write into a copy of it (.contiguous() or .clone())");
}

// ---------------------------------------------------------------- factories

Tensor empty(const Shape& shape, TensorOptions opts) {
  check_dtype(opts.dtype(), "empty");
  const int64_t n = numel_of(shape, "empty");
  const int64_t nbytes = checked_mul(n, int64_t(element_size(opts.dtype())), "empty: shape ", ShapeText{shape}, " of ",
                                     dtype_name(opts.dtype()), " needs too many bytes");
  MU_CHECK(nbytes <= kMaxAllocationBytes, "empty: shape ", shape_str(shape), " of ", dtype_name(opts.dtype()),
           " needs ", nbytes, " bytes, more than any machine can address (", kMaxAllocationBytes, ")");
  auto storage = std::make_shared<Storage>(size_t(nbytes), opts.device());
  Tensor t = make_view(storage, shape, contiguous_strides(shape), 0, opts.dtype());
  if (opts.requires_grad()) t.requires_grad_(true);
  return t;
}

Tensor full(const Shape& shape, double value, TensorOptions opts) {
  Tensor t = empty(shape, opts.requires_grad(false));
  {
    NoGradGuard g;
    t.fill_(value);
  }
  if (opts.requires_grad()) t.requires_grad_(true);
  return t;
}

Tensor zeros(const Shape& shape, TensorOptions opts) { return full(shape, 0.0, opts); }
Tensor ones(const Shape& shape, TensorOptions opts) { return full(shape, 1.0, opts); }
static TensorOptions like(const Tensor& t) { return TensorOptions(t.dtype()).device(t.device()); }
Tensor zeros_like(const Tensor& t) { return zeros(t.shape(), like(t)); }
Tensor ones_like(const Tensor& t) { return ones(t.shape(), like(t)); }
Tensor empty_like(const Tensor& t) { return empty(t.shape(), like(t)); }
Tensor full_like(const Tensor& t, double value) { return full(t.shape(), value, like(t)); }
Tensor scalar_tensor(double value, TensorOptions opts) { return full({}, value, opts); }

// Host-side construction, then one copy to the requested device.
template <class Fill>
static Tensor build_on_host(const Shape& shape, TensorOptions opts, Fill fill) {
  Tensor t = empty(shape, TensorOptions(opts.dtype()));
  MU_DISPATCH_STORAGE(opts.dtype(), "factory", [&] {
    scalar_t* p = t.data_ptr<scalar_t>();
    for (int64_t i = 0, n = t.numel(); i < n; ++i) p[i] = convert_element<scalar_t>(fill(i));
  });
  if (!opts.device().is_cpu()) t = t.to(opts.device());
  if (opts.requires_grad()) t.requires_grad_(true);
  return t;
}

Tensor arange(double start, double end, double step, TensorOptions opts) {
  MU_CHECK(step != 0, "arange: step must be nonzero");
  MU_CHECK((end - start) / step >= 0, "arange: the range [", start, ", ", end,
           ") is empty or runs against the step ", step);
  const double count = std::ceil((end - start) / step);
  // A NaN or infinite bound, or more elements than int64 holds, has no tensor.
  MU_CHECK(std::isfinite(count) && count < 9.2e18, "arange: [", start, ", ", end, ") in steps of ", step, " has ",
           count, " elements");
  int64_t n = int64_t(count);
  // An integer dtype with whole start and step counts in int64, as torch does: in double,
  // values past 2^53 would round (2^53 + 1 became 2^53, twice).
  const auto whole = [](double v) { return v == std::floor(v) && std::fabs(v) < 9.2e18; };
  if (is_integral(opts.dtype()) && whole(start) && whole(step)) {
    const int64_t first = int64_t(start), by = int64_t(step);
    if (n > 0) checked_add(first, checked_mul(n - 1, by, "arange: the last value"), "arange: the last value");
    return build_on_host({n}, opts, [&](int64_t i) { return first + i * by; });
  }
  return build_on_host({n}, opts, [&](int64_t i) { return start + double(i) * step; });
}

Tensor arange(int64_t end, TensorOptions opts) { return arange(0, double(end), 1, opts); }

Tensor eye(int64_t n, int64_t m, TensorOptions opts) {
  if (m == -1) m = n;  // the default: square
  MU_CHECK(n >= 0, "eye: negative size ", n);
  MU_CHECK(m >= 0, "eye: negative number of columns ", m, " (-1, the default, means n)");
  return build_on_host({n, m}, opts, [&](int64_t i) { return i / m == i % m ? 1.0 : 0.0; });
}

Tensor linspace(double start, double end, int64_t steps, TensorOptions opts) {
  MU_CHECK(steps >= 0, "linspace: negative number of steps ", steps);
  double h = steps > 1 ? (end - start) / double(steps - 1) : 0.0;
  return build_on_host({steps}, opts, [&](int64_t i) { return start + h * double(i); });
}

template <class T>
Tensor from_vector(const std::vector<T>& data, const Shape& shape, TensorOptions opts) {
  MU_CHECK(int64_t(data.size()) == numel_of(shape), "from_vector: ", data.size(),
           " values do not fill shape ", shape_str(shape), " (", numel_of(shape), " elements)");
  // An integer dtype takes only values it holds exactly (int64 into int64 always does).
  if (!is_floating(opts.dtype()) && !(std::is_integral_v<T> && opts.dtype() == kInt64))
    for (const T& v : data) check_value_fits(double(v), opts.dtype(), "from_vector");
  // Each value converted once, to the tensor's dtype: int64 values above 2^53 stay exact.
  return build_on_host(shape, opts, [&](int64_t i) { return data[size_t(i)]; });
}
template Tensor from_vector<float>(const std::vector<float>&, const Shape&, TensorOptions);
template Tensor from_vector<double>(const std::vector<double>&, const Shape&, TensorOptions);
template Tensor from_vector<int64_t>(const std::vector<int64_t>&, const Shape&, TensorOptions);
template Tensor from_vector<int>(const std::vector<int>&, const Shape&, TensorOptions);
template <>
Tensor from_vector<bool>(const std::vector<bool>& data, const Shape& shape, TensorOptions opts) {
  std::vector<int64_t> v(data.begin(), data.end());
  return from_vector(v, shape, opts);
}

Tensor tensor(std::initializer_list<double> values, TensorOptions opts) {
  return from_vector(std::vector<double>(values), {int64_t(values.size())}, opts);
}

Tensor tensor(std::initializer_list<int> values, TensorOptions opts) {
  return from_vector(std::vector<int>(values), {int64_t(values.size())}, opts);
}

Tensor tensor(std::initializer_list<std::initializer_list<double>> rows, TensorOptions opts) {
  std::vector<double> flat;
  size_t cols = rows.size() ? rows.begin()->size() : 0;
  for (const auto& r : rows) {
    MU_CHECK(r.size() == cols, "tensor: ragged nested list (rows of ", cols, " and ", r.size(), " values)");
    flat.insert(flat.end(), r.begin(), r.end());
  }
  return from_vector(flat, {int64_t(rows.size()), int64_t(cols)}, opts);
}

}  // namespace mu
