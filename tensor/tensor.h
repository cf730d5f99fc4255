// Tensor: a cheap handle (shared ownership) to a TensorImpl, which is a view —
// shape, strides and offset — over a Storage, plus the autograd metadata.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <iosfwd>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "tensor/dtype.h"
#include "tensor/shape.h"
#include "tensor/storage.h"

namespace mu {

namespace autograd {
struct Node;
}
class Generator;  // tensor/random.h
struct ValuesIndices;  // below: what max(dim), min(dim), sort and topk return

// Options for factories, libtorch style: zeros({2, 3}, TensorOptions().dtype(kFloat64)).
// A DType or Device converts implicitly: zeros({2, 3}, kFloat64).
class TensorOptions {
 public:
  TensorOptions() = default;
  TensorOptions(DType d) : dtype_(d) {}    // NOLINT: implicit on purpose
  TensorOptions(Device d) : device_(d) {}  // NOLINT
  TensorOptions dtype(DType d) const { auto o = *this; o.dtype_ = d; return o; }
  TensorOptions device(Device d) const { auto o = *this; o.device_ = d; return o; }
  TensorOptions requires_grad(bool r) const { auto o = *this; o.requires_grad_ = r; return o; }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  bool requires_grad() const { return requires_grad_; }

 private:
  DType dtype_ = kFloat32;
  Device device_ = Device::cpu();
  bool requires_grad_ = false;
};

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  Shape shape;
  Shape strides;    // in elements
  int64_t offset = 0;  // in elements, from storage->data
  DType dtype = kFloat32;

  // Autograd metadata. A tensor with grad_fn is the output of a recorded op; a tensor
  // with requires_grad and no grad_fn is a leaf whose .grad is accumulated.
  bool requires_grad = false;
  std::shared_ptr<TensorImpl> grad;
  std::shared_ptr<autograd::Node> grad_fn;
  uint32_t output_nr = 0;  // which output of grad_fn this tensor is
  std::weak_ptr<autograd::Node> grad_accumulator;  // shared by every use of a leaf
};

class Tensor {
 public:
  Tensor() = default;  // undefined: no storage (an absent gradient, an optional input)
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  bool defined() const { return impl_ != nullptr; }
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool is_same(const Tensor& o) const { return impl_ == o.impl_; }

  // ---- metadata
  int64_t dim() const { return int64_t(checked()->shape.size()); }
  const Shape& shape() const { return checked()->shape; }
  const Shape& sizes() const { return checked()->shape; }
  int64_t size(int64_t d) const;
  const Shape& strides() const { return checked()->strides; }
  int64_t stride(int64_t d) const;
  int64_t storage_offset() const { return checked()->offset; }
  int64_t numel() const { return numel_of(checked()->shape); }
  DType dtype() const { return checked()->dtype; }
  Device device() const { return checked()->storage->device; }
  bool is_contiguous() const;
  bool is_floating_point() const { return is_floating(dtype()); }
  const std::shared_ptr<Storage>& storage() const { return checked()->storage; }
  // Version of the underlying storage, bumped by in-place writes.
  uint64_t version() const { return checked()->storage->version; }
  void bump_version() const { ++checked()->storage->version; }

  // Pointer to the first element (storage + offset); checks the dtype.
  template <class T> T* data_ptr() const;
  void* raw_data() const;

  // ---- element access (copies to the CPU when needed)
  // The single value of a one-element tensor.
  double item() const;
  // item<int64_t>() (any integer T) of an integer tensor is exact, past 2^53 too; of a
  // float tensor, the value truncated toward zero.
  template <class T> T item() const {
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>)
      return static_cast<T>(item_int64());
    else
      return static_cast<T>(item());
  }
  int64_t item_int64() const;
  // One element by index (negative indices count from the end).
  double at(std::initializer_list<int64_t> idx) const;
  double at(const std::vector<int64_t>& idx) const;
  // Writes one element in place (bumps the version; refused on tensors autograd needs).
  void set(const std::vector<int64_t>& idx, double value) const;
  // All elements, in row-major order, converted to T.
  template <class T> std::vector<T> to_vector() const;

  // ---- conversions
  Tensor to(DType t) const;
  Tensor to(Device d) const;
  Tensor cpu() const { return to(Device::cpu()); }
  Tensor contiguous() const;
  Tensor clone() const;
  // Shares storage, drops the autograd history: the result never requires grad.
  Tensor detach() const;
  // Makes this tensor hold src's data (storage, shape, strides, dtype) in place, so every
  // handle to it sees the change; keeps requires_grad, resets the gradient. Modules use
  // it to move parameters between devices and dtypes.
  void set_data(const Tensor& src) const;

  // ---- autograd
  bool requires_grad() const { return checked()->requires_grad; }
  // Marks a leaf as needing gradients; refused on non-leaves and integer tensors.
  Tensor& requires_grad_(bool r = true);
  bool is_leaf() const { return checked()->grad_fn == nullptr; }
  const std::shared_ptr<autograd::Node>& grad_fn() const { return checked()->grad_fn; }
  // The accumulated gradient of a leaf (undefined until a backward pass reaches it).
  Tensor grad() const;
  void set_grad(const Tensor& g) const;
  // Resets the gradient to none.
  void zero_grad() const { checked()->grad.reset(); }
  // Reverse-mode pass from this tensor. A non-scalar needs an explicit `gradient` of its
  // shape. The graph is freed afterwards unless retain_graph is set.
  void backward(const Tensor& gradient = Tensor(), bool retain_graph = false) const;

  // ---- views: share storage with this tensor (defined in ops/shape.cpp)
  Tensor view(const Shape& shape) const;
  Tensor reshape(const Shape& shape) const;
  Tensor permute(const Shape& dims) const;
  Tensor transpose(int64_t d0, int64_t d1) const;
  Tensor t() const;  // transpose of a tensor of rank <= 2
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor select(int64_t dim, int64_t index) const;
  Tensor expand(const Shape& shape) const;
  Tensor expand_as(const Tensor& other) const { return expand(other.shape()); }
  Tensor squeeze() const;
  Tensor squeeze(int64_t dim) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;

  // ---- common math as methods (defined with the ops)
  Tensor sum() const;
  Tensor sum(const Shape& dims, bool keepdim = false) const;
  Tensor mean() const;
  Tensor mean(const Shape& dims, bool keepdim = false) const;
  Tensor exp() const;
  Tensor log() const;
  Tensor sqrt() const;
  Tensor abs() const;
  Tensor neg() const;
  Tensor pow(double exponent) const;
  Tensor matmul(const Tensor& other) const;
  Tensor tanh() const;
  Tensor sigmoid() const;
  Tensor relu() const;
  Tensor clamp(double min, double max) const;  // either bound may be NaN: no bound
  Tensor softmax(int64_t dim) const;
  Tensor log_softmax(int64_t dim) const;
  Tensor max() const;  // over all elements
  Tensor min() const;
  ValuesIndices max(int64_t dim, bool keepdim = false) const;  // values and first indices, as x.max(dim)
  ValuesIndices min(int64_t dim, bool keepdim = false) const;
  Tensor argmax() const;  // an index into the flattened tensor
  Tensor argmin() const;
  Tensor argmax(int64_t dim, bool keepdim = false) const;
  Tensor argmin(int64_t dim, bool keepdim = false) const;
  ValuesIndices topk(int64_t k, int64_t dim = -1, bool largest = true) const;
  Tensor index_select(int64_t dim, const Tensor& index) const;
  // x[i] is x.select(0, i) and x[index] (int64, 1-D) is x.index_select(0, index), as in
  // torch; negative i counts from the end.
  Tensor operator[](int64_t i) const { return select(0, i); }
  Tensor operator[](const Tensor& index) const { return index_select(0, index); }
  // torch's x.float(), x.double(), x.long() (C++ keywords cannot name methods).
  Tensor to_float() const { return to(kFloat32); }
  Tensor to_double() const { return to(kFloat64); }
  Tensor to_long() const { return to(kInt64); }

  // ---- in-place (refused on tensors that require grad while grad mode is on)
  Tensor& fill_(double value);
  Tensor& zero_() { return fill_(0.0); }
  Tensor& copy_(const Tensor& src);  // broadcasts src, converts its dtype
  Tensor& add_(const Tensor& other, double alpha = 1.0);
  Tensor& add_(double value);
  Tensor& sub_(const Tensor& other) { return add_(other, -1.0); }
  Tensor& mul_(const Tensor& other);
  Tensor& mul_(double value);
  Tensor& div_(const Tensor& other);
  Tensor& div_(double value);

  std::string str() const;
  // "Tensor[float32, [2, 3], cpu]": for error messages.
  std::string describe() const;

 private:
  TensorImpl* checked() const;
  std::shared_ptr<TensorImpl> impl_;
};

// Values and their indices along one dim (int64), as torch's (values, indices) pairs;
// `auto [values, indices] = x.max(1);` unpacks them.
struct ValuesIndices {
  Tensor values;
  Tensor indices;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);

// Builds a tensor header over existing storage (views and kernels use this).
Tensor make_view(const std::shared_ptr<Storage>& storage, const Shape& shape, const Shape& strides,
                 int64_t offset, DType dtype);
// Refuses an in-place write to `t` that autograd could not account for.
void check_inplace(const Tensor& t, const char* op);
// Refuses to write elementwise into t when two of its elements share memory (a dim
// expanded by stride 0): each write would land on the others, and the result would
// depend on the order (x.expand({4}).add_(1) adding 4 times), as torch refuses.
void check_distinct_elements(const Tensor& t, const char* op);

// ---- factories
Tensor empty(const Shape& shape, TensorOptions opts = {});
Tensor zeros(const Shape& shape, TensorOptions opts = {});
Tensor ones(const Shape& shape, TensorOptions opts = {});
Tensor full(const Shape& shape, double value, TensorOptions opts = {});
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
Tensor empty_like(const Tensor& t);
Tensor full_like(const Tensor& t, double value);
Tensor scalar_tensor(double value, TensorOptions opts = {});
// [start, end) in steps of `step`; int64 unless opts says otherwise.
Tensor arange(double start, double end, double step = 1.0, TensorOptions opts = TensorOptions(kInt64));
Tensor arange(int64_t end, TensorOptions opts = TensorOptions(kInt64));
Tensor eye(int64_t n, int64_t m = -1, TensorOptions opts = {});
Tensor linspace(double start, double end, int64_t steps, TensorOptions opts = {});
// From host data, copied. The dtype follows T unless opts names another.
template <class T>
Tensor from_vector(const std::vector<T>& data, const Shape& shape, TensorOptions opts = TensorOptions(dtype_of<T>()));
// 1-D tensors from a braced list: tensor({1.0, 2.0}) is float32, tensor({1, 2}) int64.
Tensor tensor(std::initializer_list<double> values, TensorOptions opts = {});
Tensor tensor(std::initializer_list<int> values, TensorOptions opts = TensorOptions(kInt64));
// 2-D from nested lists: tensor({{1, 2}, {3, 4}}).
Tensor tensor(std::initializer_list<std::initializer_list<double>> rows, TensorOptions opts = {});

// ---- random (tensor/random.cpp): drawn from `gen`, or from default_generator() (seeded
// by manual_seed) when it is null; each call draws its whole tensor under the
// generator's lock (thread-safe; see tensor/random.h)
void manual_seed(uint64_t seed);
Tensor rand(const Shape& shape, TensorOptions opts = {}, Generator* gen = nullptr);   // U[0, 1)
Tensor randn(const Shape& shape, TensorOptions opts = {}, Generator* gen = nullptr);  // N(0, 1)
Tensor randint(int64_t low, int64_t high, const Shape& shape, TensorOptions opts = TensorOptions(kInt64),
               Generator* gen = nullptr);
Tensor randperm(int64_t n, TensorOptions opts = TensorOptions(kInt64), Generator* gen = nullptr);

// ---- printing options (PyTorch's defaults)
struct PrintOptions {
  int precision = 4;
  int64_t threshold = 1000;  // summarise tensors with more elements than this
  int64_t edgeitems = 3;     // elements kept at each end of a summarised dimension
};
void set_print_options(const PrintOptions& opts);

}  // namespace mu
