// meta.json beside a prepared corpus's train.bin and val.bin (experiments/prepare_text):
// which tokenizer made the tokens, its vocabulary size, the counts, where the text came
// from, and for the character tokenizer its vocabulary (each character as its list of
// byte values, so that any byte survives JSON).
//
//   {"tokenizer": "char", "vocab_size": 65, "chars": [[10], [32], ...],
//    "train_tokens": 1003854, "val_tokens": 111540, "source": "..."}
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "data/char_tokenizer.h"

namespace mu::data {

struct TextMeta {
  std::string tokenizer;  // "gpt2" or "char"
  int64_t vocab_size = 0;
  std::optional<CharTokenizer> chars;  // for "char"
  int64_t train_tokens = 0, val_tokens = 0;
  std::string source;
};

// Written atomically (tensor/atomic_file.h).
void save_text_meta(const std::string& path, const TextMeta& meta);
// A missing file, bad JSON or a missing or wrong field is a mu::Error naming the file and field.
TextMeta load_text_meta(const std::string& path);

}  // namespace mu::data
