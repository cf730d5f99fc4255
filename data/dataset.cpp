#include "data/dataset.h"

#include <cmath>

#include "ops/ops.h"
#include "tensor/error.h"
#include "tensor/random.h"

namespace mu::data {

// Every index in [0, size), checked here so that an error names the dataset (`what`, and
// `of`: "a dataset", "a base dataset") rather than the index_select inside it.
static void check_range(const Tensor& flat, int64_t size, const char* what, const char* of) {
  for (int64_t i : flat.to_vector<int64_t>())
    MU_CHECK(i >= 0 && i < size, what, ": index ", i, " is out of range for ", of, " of ", size, " examples");
}

// The indices of one get() call (int64, 0-D or 1-D), range-checked, as 1-D.
static Tensor checked_indices(const Tensor& indices, int64_t size, const char* what) {
  MU_CHECK(indices.defined(), what, ": the indices are an undefined tensor");
  MU_CHECK(indices.dtype() == kInt64, what, ": indices must be int64, got ", dtype_name(indices.dtype()));
  MU_CHECK(indices.dim() <= 1, what, ": indices must be 0-D or 1-D, got shape ", shape_str(indices.shape()));
  const Tensor flat = indices.reshape({-1});
  check_range(flat, size, what, "a dataset");
  return flat;
}

TensorDataset::TensorDataset(Tensor inputs, Tensor targets) : inputs_(std::move(inputs)), targets_(std::move(targets)) {
  MU_CHECK(inputs_.defined() && targets_.defined(), "TensorDataset: inputs and targets must be defined tensors (inputs ",
           inputs_.describe(), ", targets ", targets_.describe(), ")");
  MU_CHECK(inputs_.dim() >= 1 && targets_.dim() >= 1, "TensorDataset: inputs and targets need a first (example) dim, got ",
           inputs_.describe(), " and ", targets_.describe());
  MU_CHECK(inputs_.size(0) == targets_.size(0), "TensorDataset: inputs hold ", inputs_.size(0), " examples (",
           shape_str(inputs_.shape()), ") but targets hold ", targets_.size(0), " (", shape_str(targets_.shape()), ")");
}

Batch TensorDataset::get(const Tensor& indices) const {
  const Tensor i = checked_indices(indices, size(), "TensorDataset::get");
  return {index_select(inputs_, 0, i.to(inputs_.device())), index_select(targets_, 0, i.to(targets_.device()))};
}

Subset::Subset(std::shared_ptr<const Dataset> base, Tensor indices) : base_(std::move(base)), indices_(std::move(indices)) {
  MU_CHECK(base_ != nullptr, "Subset: no base dataset given");
  MU_CHECK(indices_.defined() && indices_.dtype() == kInt64 && indices_.dim() == 1,
           "Subset: indices must be a 1-D int64 tensor, got ", indices_.describe());
  indices_ = indices_.cpu().contiguous();
  check_range(indices_, base_->size(), "Subset", "a base dataset");
}

Batch Subset::get(const Tensor& indices) const {
  return base_->get(index_select(indices_, 0, checked_indices(indices, size(), "Subset::get").cpu()));
}

// The subsets' sizes: `lengths` as given when they are whole numbers summing to n, or
// torch's rounding of fractions summing to 1.
static std::vector<int64_t> split_sizes(const std::vector<double>& lengths, int64_t n) {
  MU_CHECK(!lengths.empty(), "random_split: no lengths given");
  double sum = 0;
  bool fractions = true;
  for (double l : lengths) {
    MU_CHECK(std::isfinite(l) && l >= 0, "random_split: lengths must be finite and >= 0, got ", l);
    sum += l;
    fractions = fractions && l <= 1;
  }
  std::vector<int64_t> sizes;
  if (fractions && std::abs(sum - 1) < 1e-9) {
    int64_t taken = 0;
    for (double f : lengths) {
      sizes.push_back(int64_t(std::floor(f * double(n))));
      taken += sizes.back();
    }
    for (size_t i = 0; taken < n; i = (i + 1) % sizes.size(), ++taken) ++sizes[i];
    return sizes;
  }
  int64_t total = 0;
  for (double l : lengths) {
    MU_CHECK(l == std::floor(l), "random_split: lengths must be whole numbers of examples or fractions summing to 1, got ",
             l, " among lengths summing to ", sum);
    sizes.push_back(int64_t(l));
    total += sizes.back();
  }
  MU_CHECK(total == n, "random_split: the lengths sum to ", total, " but the dataset holds ", n, " examples");
  return sizes;
}

std::vector<Subset> random_split(std::shared_ptr<const Dataset> dataset, const std::vector<double>& lengths,
                                 Generator* gen) {
  MU_CHECK(dataset != nullptr, "random_split: no dataset given");
  const int64_t n = dataset->size();
  const std::vector<int64_t> sizes = split_sizes(lengths, n);
  const Tensor order = randperm(n, kInt64, gen);
  std::vector<Subset> parts;
  int64_t start = 0;
  for (int64_t s : sizes) {
    parts.emplace_back(dataset, order.narrow(0, start, s).clone());
    start += s;
  }
  return parts;
}

std::vector<Subset> random_split(const TensorDataset& dataset, const std::vector<double>& lengths, Generator* gen) {
  return random_split(std::make_shared<TensorDataset>(dataset), lengths, gen);
}

}  // namespace mu::data
