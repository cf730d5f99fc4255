// Tensors to and from files in the safetensors format, which PyTorch tooling reads:
//
//   bytes 0-7   N, the header length, unsigned little-endian
//   bytes 8..   N bytes of JSON, padded with spaces to a multiple of 8:
//               {"__metadata__": {"key": "value", ...},
//                "name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...}
//   the rest    the data region: each tensor's elements, dense, row-major, little-endian,
//               at [begin, end) counted from the first byte after the header
//
// Writes are atomic: the file is written to "<path>.tmp.<pid>", flushed to disk and
// renamed over `path`, so a crash leaves either the old file or the complete new one.
// Reads check everything (lengths, JSON, dtypes, shapes, offsets, coverage of the data
// region) and throw a mu::Error naming the file and the entry or byte at fault.
//
// Files written here also carry "mumoe.header_checksum" in __metadata__: a hash of the
// header bytes, so a flipped bit in a name or a metadata value (the step, the RNG state
// of a checkpoint) is caught instead of loading silently. Other readers ignore it; files
// without it (written by PyTorch tools) load unchecked.
#pragma once
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "tensor/tensor.h"

namespace mu {

// The metadata key holding the header hash; reserved, and dropped from what loads return.
inline constexpr const char* kSafetensorsChecksumKey = "mumoe.header_checksum";

struct SafetensorsFile {
  std::string path;
  // Name -> tensor (on the CPU, contiguous, in the stored dtype), in the order of their
  // data in the file. F16, BF16, I8, I16, I32 and U8 load as mumoe's storage dtypes
  // (tensor/dtype.h): .to() converts them; load_state_dict converts into the module's.
  std::vector<std::pair<std::string, Tensor>> tensors;
  std::map<std::string, std::string> metadata;  // the "__metadata__" object
  std::map<std::string, std::string> dtypes;    // name -> dtype as stored ("F32", "BF16", ...)
  // True when the header carried mumoe's checksum (and it matched: a mismatch throws).
  bool checksummed = false;

  bool contains(const std::string& name) const;
  // The tensor named `name`; throws naming the file when there is none.
  Tensor get(const std::string& name) const;
};

// Writes `tensors` (any device, any strides; stored dense from the host) in the given
// order. Names must be unique, non-empty and not "__metadata__".
void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

SafetensorsFile load_safetensors(const std::string& path);

// The safetensors name of a dtype: "F16", "BF16", "F32", "F64", "I8", "I16", "I32", "I64",
// "U8", "BOOL". The format's U16, U32, U64 and 8-bit floats have no mumoe dtype: a file
// holding them is refused, naming the entry.
const char* safetensors_dtype(DType t);

}  // namespace mu
