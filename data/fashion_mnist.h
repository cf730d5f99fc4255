// Fashion-MNIST (Xiao, Rasul and Vollgraf 2017): 70,000 28×28 grey images of clothing in
// 10 classes, 60,000 for training and 10,000 for testing, read from the four IDX files
// that Debian's dataset-fashion-mnist installs under /usr/share/datasets/fashion-mnist:
// {train,t10k}-{images-idx3,labels-idx1}-ubyte.gz (plain, un-gzip'd copies are read too).
//
//   data::FashionMnist ds = data::load_fashion_mnist();       // pixels in [0, 1]
//   ds.train.images;   // float32 (60000, 784)
//   ds.train.labels;   // int64   (60000), values 0..9
//
// The directory is $MUMOE_FASHION_MNIST_DIR when set, the Debian path otherwise.
#pragma once
#include <array>
#include <string>

#include "tensor/tensor.h"

namespace mu::data {

// Images and their labels, row i of one matching element i of the other.
struct LabelledImages {
  Tensor images;  // float32 (N, 784), row-major 28×28 pixels
  Tensor labels;  // int64 (N)
  int64_t size() const { return labels.defined() ? labels.size(0) : 0; }
};

struct FashionMnist {
  LabelledImages train, test;
  // Pixel statistics of the training set in [0, 1] units: what standardisation subtracted
  // and divided by (0 and 1 when it was off).
  double pixel_mean = 0.0, pixel_std = 1.0;
};

struct FashionMnistOptions {
  // Empty: fashion_mnist_dir().
  FashionMnistOptions& dir(std::string d) { dir_ = std::move(d); return *this; }
  // Subtract the training set's pixel mean and divide by its standard deviation (one
  // scalar each, applied to both splits), instead of leaving pixels in [0, 1].
  FashionMnistOptions& standardize(bool s) { standardize_ = s; return *this; }
  const std::string& dir() const { return dir_; }
  bool standardize() const { return standardize_; }

 private:
  std::string dir_;
  bool standardize_ = false;
};

// The class names, in label order.
inline constexpr std::array<const char*, 10> kFashionMnistClasses = {
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"};

// $MUMOE_FASHION_MNIST_DIR when set and non-empty, else /usr/share/datasets/fashion-mnist.
std::string fashion_mnist_dir();
// Whether all four files are present in `dir` (gzip'd or plain).
bool fashion_mnist_available(const std::string& dir = fashion_mnist_dir());

// Both splits. A missing file is a mu::Error that names it and says how to get the data;
// a damaged one names the file and byte offset (see data/idx.h), a label outside 0..9 too.
FashionMnist load_fashion_mnist(const FashionMnistOptions& options = {});
// One split: prefix "train" or "t10k"; pixels in [0, 1].
LabelledImages load_fashion_mnist_split(const std::string& dir, const std::string& prefix);

}  // namespace mu::data
