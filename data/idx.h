// IDX files (the MNIST / Fashion-MNIST format), gzip'd or plain: a 4-byte magic number
// (two zero bytes, an element-type code, the number of dims), one big-endian uint32 per
// dim, then the elements in row-major order.
//
//   data::IdxArray labels = data::read_idx("train-labels-idx1-ubyte.gz", 1);  // magic 0x00000801
//   data::IdxArray images = data::read_idx("train-images-idx3-ubyte.gz", 3);  // magic 0x00000803
//
// Only unsigned-byte elements (type code 0x08) are read: every dataset stored this way
// uses them. gzip'd data is verified (data/file_reader.h: each member's CRC-32 and length
// against the bytes decompressed), and a path that is not a regular file (a FIFO, a
// directory, a device) is refused before anything could block. Each failure is a
// mu::Error naming the file and the byte offset at which it was found, e.g.
// "...: truncated at byte 16: expected 47040000 bytes of image data, got 1200".
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "tensor/shape.h"

namespace mu::data {

struct IdxArray {
  Shape dims;                 // e.g. (60000, 28, 28)
  std::vector<uint8_t> data;  // numel_of(dims) elements, row-major
};

// Reads the whole file. expected_rank >= 1 makes the magic number 0x0000080<rank> the only
// one accepted; -1 accepts any rank. `what` names the payload in messages ("image data").
IdxArray read_idx(const std::string& path, int64_t expected_rank = -1, const std::string& what = "data");

}  // namespace mu::data
