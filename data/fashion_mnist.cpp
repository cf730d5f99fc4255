#include "data/fashion_mnist.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "data/idx.h"
#include "tensor/error.h"

namespace mu::data {

namespace fs = std::filesystem;

namespace {

constexpr int64_t kSide = 28, kPixels = kSide * kSide, kClasses = 10;
constexpr const char* kDefaultDir = "/usr/share/datasets/fashion-mnist";
constexpr const char* kHowToGet = "install Debian's dataset-fashion-mnist, or set MUMOE_FASHION_MNIST_DIR";

// `dir/stem.gz` when present, else the plain `dir/stem`; empty when neither exists.
// Whatever is there is taken, so that a FIFO or a directory of that name is refused by
// read_idx as what it is, not reported missing.
std::string find_file(const std::string& dir, const std::string& stem) {
  std::error_code ec;
  for (const std::string& name : {stem + ".gz", stem}) {
    fs::path p = fs::path(dir) / name;
    if (fs::exists(p, ec)) return p.string();
  }
  return "";
}

// Like find_file, but a missing file is an error that says how to get the data.
std::string require_file(const std::string& dir, const std::string& stem) {
  std::string path = find_file(dir, stem);
  MU_CHECK(!path.empty(), "Fashion-MNIST not found: ", (fs::path(dir) / (stem + ".gz")).string(),
           " does not exist; ", kHowToGet);
  return path;
}

std::string images_stem(const std::string& prefix) { return prefix + "-images-idx3-ubyte"; }
std::string labels_stem(const std::string& prefix) { return prefix + "-labels-idx1-ubyte"; }

}  // namespace

std::string fashion_mnist_dir() {
  const char* env = std::getenv("MUMOE_FASHION_MNIST_DIR");
  return env != nullptr && env[0] != '\0' ? std::string(env) : std::string(kDefaultDir);
}

bool fashion_mnist_available(const std::string& dir) {
  for (const char* prefix : {"train", "t10k"})
    if (find_file(dir, images_stem(prefix)).empty() || find_file(dir, labels_stem(prefix)).empty()) return false;
  return true;
}

LabelledImages load_fashion_mnist_split(const std::string& dir, const std::string& prefix) {
  MU_CHECK(prefix == "train" || prefix == "t10k", "load_fashion_mnist_split: prefix must be \"train\" or \"t10k\", got \"",
           prefix, "\"");
  std::string images_path = require_file(dir, images_stem(prefix));
  std::string labels_path = require_file(dir, labels_stem(prefix));
  IdxArray images = read_idx(images_path, 3, "image data");
  IdxArray labels = read_idx(labels_path, 1, "label data");

  // Dims live at byte 4 onwards: one uint32 per dim.
  MU_CHECK(images.dims[1] == kSide && images.dims[2] == kSide, images_path, ": wrong dims at byte 8: images are ",
           images.dims[1], "x", images.dims[2], ", expected 28x28");
  const int64_t n = images.dims[0];
  MU_CHECK(labels.dims[0] == n, labels_path, ": wrong dims at byte 4: ", labels.dims[0], " labels for ", n,
           " images in ", images_path);

  LabelledImages out;
  out.images = empty({n, kPixels});
  float* px = out.images.data_ptr<float>();
  // Bytes 0..255 to [0, 1], as torchvision's ToTensor.
  for (int64_t i = 0; i < n * kPixels; ++i) px[i] = float(images.data[size_t(i)]) / 255.0f;

  out.labels = empty({n}, kInt64);
  int64_t* lb = out.labels.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    lb[i] = labels.data[size_t(i)];
    // The label payload starts after the 4-byte magic and one 4-byte dim.
    MU_CHECK(lb[i] < kClasses, labels_path, ": label ", lb[i], " at byte ", 8 + i, " is outside 0..9");
  }
  return out;
}

FashionMnist load_fashion_mnist(const FashionMnistOptions& options) {
  std::string dir = options.dir().empty() ? fashion_mnist_dir() : options.dir();
  std::error_code ec;
  MU_CHECK(fs::is_directory(dir, ec), "Fashion-MNIST not found: directory ", dir, " does not exist; ", kHowToGet);
  FashionMnist ds;
  ds.train = load_fashion_mnist_split(dir, "train");
  ds.test = load_fashion_mnist_split(dir, "t10k");
  if (options.standardize()) {
    // One scalar mean and std over every training pixel, accumulated in double: 47M
    // float additions would lose digits.
    const float* p = ds.train.images.data_ptr<float>();
    const int64_t count = ds.train.images.numel();
    double s = 0, s2 = 0;
    for (int64_t i = 0; i < count; ++i) {
      s += p[i];
      s2 += double(p[i]) * p[i];
    }
    ds.pixel_mean = s / double(count);
    ds.pixel_std = std::sqrt(std::max(s2 / double(count) - ds.pixel_mean * ds.pixel_mean, 1e-12));
    for (LabelledImages* split : {&ds.train, &ds.test}) {
      float* q = split->images.data_ptr<float>();
      const float mean = float(ds.pixel_mean), inv_std = float(1.0 / ds.pixel_std);
      for (int64_t i = 0, m = split->images.numel(); i < m; ++i) q[i] = (q[i] - mean) * inv_std;
    }
  }
  return ds;
}

}  // namespace mu::data
