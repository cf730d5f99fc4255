// A regular file mapped read-only into memory (mmap), the mapping shared between copies
// and released with the last one. Readers of large binary datasets (token files, image
// arrays) index it in place; the kernel pages it in on demand, so opening a file of
// hundreds of gigabytes costs nothing until its bytes are read.
//
//   data::MappedFile f("train.bin");
//   const uint8_t* bytes = f.data();   // f.size() bytes (null when the file is empty)
//
// A path that is not a regular file (a FIFO, a device, a directory; tensor/regular_file.h)
// or a file that cannot be opened, stat'ed or mapped is a mu::Error naming it and why.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

namespace mu::data {

class MappedFile {
 public:
  explicit MappedFile(const std::string& path);

  const std::string& path() const;
  const uint8_t* data() const;  // size() bytes; null for an empty file
  int64_t size() const;         // bytes

 private:
  struct Mapping;
  std::shared_ptr<const Mapping> map_;
};

}  // namespace mu::data
