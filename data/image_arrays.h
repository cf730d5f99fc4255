// Image datasets stored as fixed-size uint8 arrays, read in place (mmap): the layout the
// paper-scale Mixer training reads ImageNet-1k in, decoded and resized once beforehand
// (scripts/image_folder_to_arrays.py converts a folder per class). A directory holds
//
//   meta.json        {"format": "mumoe-image-arrays", "version": 1, "height": H,
//                     "width": W, "channels": C, "classes": K,
//                     "splits": {"train": N, "val": M}, "class_names": [...]}
//   <split>.images   N·H·W·C bytes: image i from byte i·H·W·C, rows top to bottom,
//                    pixels left to right, channels interleaved (RGB for C = 3)
//   <split>.labels   N little-endian uint16 class ids, each below K
//
//   data::ImageArrays train("imagenet-256", "train");
//   Tensor x = train.images({3, 14, 15});   // uint8 (3, H, W, C)
//   Tensor y = train.labels({3, 14, 15});   // int64 (3)
//
// Opening checks everything a reader relies on: meta.json's fields, each file's size
// against the counts (a file cut short names the image at which it ends), every label
// against K (naming the index and byte offset). Writing (write_image_arrays) goes
// through a temporary file and a rename, so a crash never leaves half a split.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "data/mapped_file.h"
#include "tensor/tensor.h"

namespace mu::data {

struct ImageArraysMeta {
  int64_t height = 0, width = 0, channels = 0, classes = 0;
  std::map<std::string, int64_t> splits;  // split name -> image count
  std::vector<std::string> class_names;   // empty, or one per class
  int64_t image_bytes() const { return height * width * channels; }
};

// dir/meta.json. A missing file, bad JSON, or a missing or wrong field is a mu::Error
// naming the file and the field.
ImageArraysMeta load_image_arrays_meta(const std::string& dir);
void save_image_arrays_meta(const std::string& dir, const ImageArraysMeta& meta);

class ImageArrays {
 public:
  ImageArrays(const std::string& dir, const std::string& split);

  int64_t size() const { return count_; }
  int64_t height() const { return meta_.height; }
  int64_t width() const { return meta_.width; }
  int64_t channels() const { return meta_.channels; }
  int64_t classes() const { return meta_.classes; }
  const ImageArraysMeta& meta() const { return meta_; }

  // Image i's H·W·C bytes, in place.
  const uint8_t* image(int64_t i) const;
  int64_t label(int64_t i) const;
  // The images and labels at `indices` (each in [0, size()), else a mu::Error naming it):
  // uint8 (B, H, W, C) and int64 (B).
  Tensor images(const std::vector<int64_t>& indices) const;
  Tensor labels(const std::vector<int64_t>& indices) const;

 private:
  ImageArraysMeta meta_;
  std::string split_;
  int64_t count_ = 0;
  MappedFile images_, labels_;
};

// Writes one split: `images` uint8 (N, H, W, C) and `labels` int64 (N), each label in
// [0, K), into dir/<split>.images and dir/<split>.labels, and records the split in
// dir/meta.json (created from `meta`'s geometry when missing; an existing one must agree).
void write_image_arrays(const std::string& dir, const std::string& split, const Tensor& images, const Tensor& labels,
                        const ImageArraysMeta& meta);

}  // namespace mu::data
