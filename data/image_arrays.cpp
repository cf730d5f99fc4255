#include "data/image_arrays.h"

#include <nlohmann/json.hpp>

#include <bit>
#include <cstring>
#include <filesystem>

#include "data/json_file.h"
#include "tensor/atomic_file.h"
#include "tensor/checked.h"
#include "tensor/error.h"

namespace mu::data {

static_assert(std::endian::native == std::endian::little, "labels are read in place: a little-endian host is assumed");

namespace {

using json = nlohmann::json;
constexpr const char* kFormat = "mumoe-image-arrays";
constexpr int64_t kVersion = 1;

std::string meta_path(const std::string& dir) { return (std::filesystem::path(dir) / "meta.json").string(); }
std::string split_path(const std::string& dir, const std::string& split, const char* ext) {
  return (std::filesystem::path(dir) / (split + ext)).string();
}

// A split name becomes part of a file name: letters, digits, '-' and '_' only.
void check_split_name(const std::string& split, const char* what) {
  MU_CHECK(!split.empty(), what, ": the split name is empty");
  for (char c : split)
    MU_CHECK(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_', what, ": split name \"", split,
             "\" may hold only letters, digits, '-' and '_'");
}

// The path of one of an existing split's files: the name checked, the split in the meta.
std::string existing_split_path(const std::string& dir, const ImageArraysMeta& meta, const std::string& split,
                                const char* ext) {
  check_split_name(split, "ImageArrays");
  MU_CHECK(meta.splits.count(split) != 0, meta_path(dir), " has no split \"", split, "\"");
  return split_path(dir, split, ext);
}

}  // namespace

ImageArraysMeta load_image_arrays_meta(const std::string& dir) {
  const std::string path = meta_path(dir);
  const json j = load_json_object(path);
  auto field = [&](const char* name) -> const json& { return json_field(j, path, name); };
  auto positive = [&](const json& v, const std::string& name) {
    MU_CHECK(v.is_number_integer() && v.get<int64_t>() > 0, path, ": field \"", name,
             "\" must be a positive integer, got ", v.dump());
    return v.get<int64_t>();
  };
  MU_CHECK(field("format") == kFormat, path, ": field \"format\" is ", j["format"].dump(), ", expected \"", kFormat,
           "\"");
  MU_CHECK(field("version") == kVersion, path, ": field \"version\" is ", j["version"].dump(), ", this build reads ",
           kVersion);
  ImageArraysMeta m;
  m.height = positive(field("height"), "height");
  m.width = positive(field("width"), "width");
  m.channels = positive(field("channels"), "channels");
  m.classes = positive(field("classes"), "classes");
  MU_CHECK(m.channels == 1 || m.channels == 3, path, ": field \"channels\" is ", m.channels, ", expected 1 or 3");
  MU_CHECK(m.classes <= 65536, path, ": field \"classes\" is ", m.classes, ", but labels are uint16 (at most 65536)");
  checked_mul(checked_mul(m.height, m.width, path.c_str()), m.channels, path.c_str());
  const json& splits = field("splits");
  MU_CHECK(splits.is_object(), path, ": field \"splits\" must be an object of split name -> image count");
  for (const auto& [name, count] : splits.items()) {
    MU_CHECK(count.is_number_integer() && count.get<int64_t>() >= 0, path, ": splits.", name,
             " must be a non-negative integer, got ", count.dump());
    m.splits[name] = count.get<int64_t>();
  }
  if (j.contains("class_names")) {
    const json& names = j["class_names"];
    MU_CHECK(names.is_array() && int64_t(names.size()) == m.classes, path, ": field \"class_names\" must list ",
             m.classes, " names, got ", names.is_array() ? std::to_string(names.size()) : names.dump());
    for (const json& n : names) {
      MU_CHECK(n.is_string(), path, ": class_names holds ", n.dump(), ", not a string");
      m.class_names.push_back(n.get<std::string>());
    }
  }
  return m;
}

void save_image_arrays_meta(const std::string& dir, const ImageArraysMeta& m) {
  json j = {{"format", kFormat}, {"version", kVersion}, {"height", m.height}, {"width", m.width},
            {"channels", m.channels}, {"classes", m.classes}, {"splits", m.splits}};
  if (!m.class_names.empty()) j["class_names"] = m.class_names;
  const std::string text = j.dump(1) + "\n";
  write_file_atomically(meta_path(dir), {{text.data(), text.size()}}, "save_image_arrays_meta");
}

ImageArrays::ImageArrays(const std::string& dir, const std::string& split)
    : meta_(load_image_arrays_meta(dir)),
      split_(split),
      images_(existing_split_path(dir, meta_, split, ".images")),
      labels_(existing_split_path(dir, meta_, split, ".labels")) {
  count_ = meta_.splits.at(split);
  const int64_t per = meta_.image_bytes();
  const int64_t want = checked_mul(count_, per, "ImageArrays");
  if (images_.size() < want)
    MU_FAIL(images_.path(), ": the file has ", images_.size(), " bytes, meta.json's ", count_, " images of ",
            meta_.height, "x", meta_.width, "x", meta_.channels, " need ", want, "; it ends inside image ",
            images_.size() / per, " (at byte ", images_.size(), ")");
  MU_CHECK(images_.size() == want, images_.path(), ": the file has ", images_.size(), " bytes, ", images_.size() - want,
           " more than meta.json's ", count_, " images of ", per, " bytes (from byte ", want, ")");
  MU_CHECK(labels_.size() == 2 * count_, labels_.path(), ": the file has ", labels_.size(), " bytes, ", count_,
           " uint16 labels take ", 2 * count_);
  for (int64_t i = 0; i < count_; ++i)
    MU_CHECK(label(i) < meta_.classes, labels_.path(), ": label ", i, " at byte ", 2 * i, " is ", label(i),
             ", not below the ", meta_.classes, " classes");
}

const uint8_t* ImageArrays::image(int64_t i) const {
  MU_CHECK(i >= 0 && i < count_, "ImageArrays ", split_, ": image ", i, " is outside 0..", count_ - 1);
  return images_.data() + i * meta_.image_bytes();
}

int64_t ImageArrays::label(int64_t i) const {
  MU_CHECK(i >= 0 && i < count_, "ImageArrays ", split_, ": label ", i, " is outside 0..", count_ - 1);
  uint16_t v;
  std::memcpy(&v, labels_.data() + 2 * i, 2);
  return v;
}

Tensor ImageArrays::images(const std::vector<int64_t>& indices) const {
  const int64_t B = int64_t(indices.size()), per = meta_.image_bytes();
  Tensor out = empty({B, meta_.height, meta_.width, meta_.channels}, kUInt8);
  uint8_t* dst = out.data_ptr<uint8_t>();
  for (int64_t b = 0; b < B; ++b) std::memcpy(dst + b * per, image(indices[size_t(b)]), size_t(per));
  return out;
}

Tensor ImageArrays::labels(const std::vector<int64_t>& indices) const {
  Tensor out = empty({int64_t(indices.size())}, kInt64);
  int64_t* dst = out.data_ptr<int64_t>();
  for (size_t b = 0; b < indices.size(); ++b) dst[b] = label(indices[b]);
  return out;
}

void write_image_arrays(const std::string& dir, const std::string& split, const Tensor& images, const Tensor& labels,
                        const ImageArraysMeta& meta) {
  const char* what = "write_image_arrays";
  check_split_name(split, what);
  MU_CHECK(images.defined() && images.dtype() == kUInt8 && images.dim() == 4, what, ": images must be uint8 (N, H, W, C), got ",
           images.defined() ? dtype_name(images.dtype()) : "undefined", " ",
           images.defined() ? shape_str(images.shape()) : "");
  const int64_t N = images.size(0);
  MU_CHECK(labels.defined() && labels.dtype() == kInt64 && labels.dim() == 1 && labels.size(0) == N, what,
           ": labels must be int64 (", N, "), got ", labels.defined() ? dtype_name(labels.dtype()) : "undefined", " ",
           labels.defined() ? shape_str(labels.shape()) : "");
  ImageArraysMeta m = meta;
  if (std::filesystem::exists(meta_path(dir))) {
    m = load_image_arrays_meta(dir);
    MU_CHECK(m.height == meta.height && m.width == meta.width && m.channels == meta.channels &&
                 m.classes == meta.classes,
             what, ": ", meta_path(dir), " holds images of ", m.height, "x", m.width, "x", m.channels, " in ",
             m.classes, " classes, not ", meta.height, "x", meta.width, "x", meta.channels, " in ", meta.classes);
  }
  MU_CHECK(images.size(1) == m.height && images.size(2) == m.width && images.size(3) == m.channels, what,
           ": images of shape ", shape_str(images.shape()), " do not match the layout's ", m.height, "x", m.width, "x",
           m.channels);
  const Tensor img = images.cpu().contiguous(), lab = labels.cpu().contiguous();
  std::vector<uint16_t> ids(static_cast<size_t>(N));
  const int64_t* lp = lab.data_ptr<int64_t>();
  for (int64_t i = 0; i < N; ++i) {
    MU_CHECK(lp[i] >= 0 && lp[i] < m.classes, what, ": label ", i, " is ", lp[i], ", outside 0..", m.classes - 1);
    ids[size_t(i)] = uint16_t(lp[i]);
  }
  std::filesystem::create_directories(dir);
  write_file_atomically(split_path(dir, split, ".images"), {{img.data_ptr<uint8_t>(), size_t(img.numel())}}, what);
  write_file_atomically(split_path(dir, split, ".labels"), {{ids.data(), ids.size() * 2}}, what);
  // meta.json last: a reader never sees a split counted before its files are whole.
  m.splits[split] = N;
  save_image_arrays_meta(dir, m);
}

}  // namespace mu::data
