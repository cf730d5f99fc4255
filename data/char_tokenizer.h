// A character-level tokenizer (as nanoGPT's shakespeare_char): the vocabulary is the
// distinct characters of a corpus, sorted by their UTF-8 bytes, id = place in that order.
// A character is a well-formed UTF-8 code point, or a single byte that is not part of
// one (data/unicode_classes.h), so any byte string is taken and decode(encode(s)) == s.
//
//   data::CharTokenizer tok = data::CharTokenizer::from_text(corpus);
//   std::vector<int32_t> ids = tok.encode("to be");   // a character not in the vocabulary: mu::Error
//
// The vocabulary travels with the token files in their meta.json (data/text_meta.h).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace mu::data {

class CharTokenizer {
 public:
  // The distinct characters of `corpus`.
  static CharTokenizer from_text(std::string_view corpus);
  // The given characters, in this order (id i = chars[i]): each must be one character,
  // and none twice, or a mu::Error naming the entry.
  explicit CharTokenizer(std::vector<std::string> chars);

  // A character missing from the vocabulary is a mu::Error naming it and its byte offset.
  std::vector<int32_t> encode(std::string_view text) const;
  // An id outside 0..vocab_size()-1 is a mu::Error naming it.
  std::string decode(const std::vector<int32_t>& ids) const;

  int32_t vocab_size() const { return int32_t(chars_.size()); }
  const std::vector<std::string>& chars() const { return chars_; }

  // The characters of `text`, in order (each a view into it).
  static std::vector<std::string_view> split(std::string_view text);

 private:
  std::vector<std::string> chars_;
  std::unordered_map<std::string, int32_t> id_of_;
  int32_t byte_id_[256];  // the id of each one-byte character, -1 when not in the vocabulary
};

}  // namespace mu::data
