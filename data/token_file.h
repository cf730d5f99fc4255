// Token files in the layout of nanoGPT and llm.c: token ids as little-endian uint16, one
// after another. Two layouts are read:
//   - headerless (nanoGPT's train.bin/val.bin): the file is the tokens;
//   - llm.c's (dev/data/*.py): a header of 256 little-endian int32 (1024 bytes) holding
//     magic 20240520 at byte 0, version 1 at byte 4 and the token count at byte 8, the
//     tokens after it.
// write_token_file writes llm.c's header by default (the count in it lets a reader catch
// a file cut short), headerless on request; either way through a temporary file and a
// rename, so a crash never leaves a half-written file under the final name.
//
//   data::write_token_file("train.bin", ids);
//   data::TokenFile f("train.bin", data::TokenFileOptions().vocab_size(50257));
//   Generator gen(1);
//   data::TokenBatch b = data::random_windows(f, 8, 64, &gen);   // b.x, b.y: int64 (8, 64)
//
// A TokenFile maps its file read-only (mmap) and shares the mapping between copies.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tensor/random.h"
#include "tensor/tensor.h"

namespace mu::data {

inline constexpr int32_t kLlmcMagic = 20240520;
inline constexpr int32_t kLlmcVersion = 1;  // uint16 tokens (llm.c's version 2 holds uint32)
inline constexpr int64_t kLlmcHeaderBytes = 256 * 4;

enum class TokenFileLayout {
  Auto,        // reading: llm.c's when the file starts with the magic, else headerless
  Headerless,  // nanoGPT's
  LlmC,        // llm.c's 1024-byte header
};

struct TokenFileOptions {
  // How the file is laid out; Auto by default.
  TokenFileOptions& layout(TokenFileLayout l) { layout_ = l; return *this; }
  // When positive, every id must be below it (checked once when the file is opened).
  TokenFileOptions& vocab_size(int64_t v);
  TokenFileLayout layout() const { return layout_; }
  int64_t vocab_size() const { return vocab_size_; }

 private:
  TokenFileLayout layout_ = TokenFileLayout::Auto;
  int64_t vocab_size_ = 0;
};

// Writes `ids` (each in 0..65535) to `path`; layout Auto means LlmC.
void write_token_file(const std::string& path, const std::vector<int32_t>& ids,
                      TokenFileLayout layout = TokenFileLayout::LlmC);

class TokenFile {
 public:
  // Opens and checks the file: a path that is not a regular file, a bad header (magic,
  // version, a count that disagrees with the size), an odd number of token bytes, or an
  // id at or above the vocabulary size is a mu::Error naming the file and the byte offset.
  explicit TokenFile(const std::string& path, const TokenFileOptions& options = {});

  const std::string& path() const;
  int64_t size() const;            // tokens
  bool has_header() const;         // llm.c's layout
  const uint16_t* data() const;    // size() tokens (null when there are none)
  int32_t operator[](int64_t i) const { return data()[i]; }

 private:
  struct Mapping;
  std::shared_ptr<const Mapping> map_;
};

// Inputs and next-token targets: x = tokens [s, s+T), y = tokens [s+1, s+T+1) for each
// window start s; both int64 (B, T).
struct TokenBatch {
  Tensor x, y;
};

// B windows of T+1 tokens at starts drawn uniformly from 0..size()-T-1 under `gen`
// (default_generator() when null): the same seed draws the same windows. B, T >= 1 and
// T+1 <= size(), or a mu::Error naming them.
TokenBatch random_windows(const TokenFile& file, int64_t B, int64_t T, Generator* gen = nullptr);

// For evaluation: the file cut into consecutive windows w = 0, 1, ... starting at w*T
// (each window's y overlaps the next window's x by one token), as many as fit whole.
int64_t eval_window_count(const TokenFile& file, int64_t T);
// Windows first .. first+B-1 of those, fewer when the file runs out first.
TokenBatch eval_windows(const TokenFile& file, int64_t first, int64_t B, int64_t T);

}  // namespace mu::data
