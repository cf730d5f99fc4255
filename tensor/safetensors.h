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
// Files written here also carry two checksums in __metadata__ (other readers ignore them):
//   "mumoe.data_checksum"    one 16-hex-digit hash per tensor, in header order, separated
//                            by single spaces: the hash of that tensor's bytes (below)
//   "mumoe.header_checksum"  64-bit FNV-1a of the padded header bytes with these 16 hex
//                            digits read as '0', so it covers the data checksums too
// On load a flipped bit anywhere is caught: in the header (names, shapes, the step or RNG
// state of a checkpoint, the data checksums) by the header checksum, in a tensor's bytes
// by its data checksum, and in the name of the header checksum's own key by the rule
// that a file carrying "mumoe.data_checksum" must carry "mumoe.header_checksum" too.
// Metadata keys starting with "mumoe." are reserved: a save refuses them, a load refuses
// any but these two. Files with neither (written by PyTorch tools) load unchecked; files
// with only the header checksum (mumoe before data checksums) load with the header checked.
//
// The data hash of n bytes: the bytes as 64-bit little-endian words (the last one padded
// with zero bytes), word i going to lane i % 4; each lane starts at 0xcbf29ce484222325 + lane
// and takes a word w as h = (h ^ w) * 0x9e3779b97f4a7c15, h ^= h >> 32; the result starts
// at 0xcbf29ce484222325 ^ n and takes lanes 0..3 in that order the same way. Each step is
// a bijection of the running value, so a file with one word changed always hashes differently.
//
// Saving to P first removes the temporaries "P.tmp.<pid>" of saves that died before their
// rename (their process no longer exists); another live process's temporary is left alone.
#pragma once
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "tensor/tensor.h"

namespace mu {

// The metadata keys holding the checksums; reserved, and dropped from what loads return.
inline constexpr const char* kSafetensorsChecksumKey = "mumoe.header_checksum";
inline constexpr const char* kSafetensorsDataChecksumKey = "mumoe.data_checksum";
// Metadata keys with this prefix are mumoe's own (a save refuses them from callers).
inline constexpr const char* kSafetensorsReservedPrefix = "mumoe.";

struct SafetensorsFile {
  std::string path;
  // Name -> tensor (on the CPU, contiguous, in the stored dtype), in the order of their
  // data in the file. F16, BF16, I8, I16, I32 and U8 load as mumoe's storage dtypes
  // (tensor/dtype.h): .to() converts them; load_state_dict converts into the module's.
  std::vector<std::pair<std::string, Tensor>> tensors;
  std::map<std::string, std::string> metadata;  // the "__metadata__" object
  std::map<std::string, std::string> dtypes;    // name -> dtype as stored ("F32", "BF16", ...)
  // True when the header carried mumoe's header checksum, and when it carried the data
  // checksums; each matched (a mismatch throws).
  bool checksummed = false;
  bool data_checksummed = false;

  bool contains(const std::string& name) const;
  // The tensor named `name`; throws naming the file when there is none.
  Tensor get(const std::string& name) const;
};

// Writes `tensors` (any device, any strides; stored dense from the host) in the given
// order. Names must be unique, non-empty and not "__metadata__"; metadata keys must not
// start with "mumoe.".
void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// Refuses anything but a regular file (a FIFO, a directory, a device) before it could
// block on it, and any damage, with a mu::Error naming the file and the byte at fault.
SafetensorsFile load_safetensors(const std::string& path);

// The safetensors name of a dtype: "F16", "BF16", "F32", "F64", "I8", "I16", "I32", "I64",
// "U8", "BOOL". The format's U16, U32, U64 and 8-bit floats have no mumoe dtype: a file
// holding them is refused, naming the entry.
const char* safetensors_dtype(DType t);

}  // namespace mu
