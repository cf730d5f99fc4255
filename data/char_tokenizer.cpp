#include "data/char_tokenizer.h"

#include <algorithm>
#include <set>

#include "data/unicode_classes.h"
#include "tensor/error.h"

namespace mu::data {

namespace {

// The byte values of a character, for messages (it may not be printable or valid UTF-8).
std::string describe(std::string_view c) {
  std::string out = "bytes";
  for (unsigned char b : c) out += " " + std::to_string(int(b));
  return out;
}

}  // namespace

std::vector<std::string_view> CharTokenizer::split(std::string_view text) {
  std::vector<std::string_view> out;
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  for (size_t pos = 0; pos < text.size();) {
    const CodePoint c = decode_utf8(s, text.size(), pos);
    out.push_back(text.substr(pos, c.len));
    pos += c.len;
  }
  return out;
}

CharTokenizer CharTokenizer::from_text(std::string_view corpus) {
  std::set<std::string_view> distinct;
  for (std::string_view c : split(corpus)) distinct.insert(c);
  return CharTokenizer(std::vector<std::string>(distinct.begin(), distinct.end()));
}

CharTokenizer::CharTokenizer(std::vector<std::string> chars) : chars_(std::move(chars)) {
  std::fill(std::begin(byte_id_), std::end(byte_id_), -1);
  MU_CHECK(chars_.size() <= 65536, "CharTokenizer: ", chars_.size(),
           " characters; at most 65536 fit the uint16 token files");
  for (size_t i = 0; i < chars_.size(); ++i) {
    const std::string& c = chars_[i];
    // One character: what split() makes of it is itself.
    MU_CHECK(!c.empty() && split(c).size() == 1, "CharTokenizer: entry ", i, " (", describe(c),
             ") is not one character");
    MU_CHECK(id_of_.emplace(c, int32_t(i)).second, "CharTokenizer: entry ", i, " (", describe(c),
             ") repeats entry ", id_of_[c]);
    if (c.size() == 1) byte_id_[uint8_t(c[0])] = int32_t(i);
  }
}

std::vector<int32_t> CharTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  out.reserve(text.size());
  size_t offset = 0;
  std::string key;
  for (std::string_view c : split(text)) {
    // One-byte characters (ASCII, stray bytes) from the table; longer ones from the map.
    int32_t id = c.size() == 1 ? byte_id_[uint8_t(c[0])] : -1;
    if (c.size() > 1) {
      key.assign(c);
      auto it = id_of_.find(key);
      if (it != id_of_.end()) id = it->second;
    }
    MU_CHECK(id >= 0, "CharTokenizer::encode: the character at byte ", offset, " (", describe(c),
             ") is not in the vocabulary of ", chars_.size(), " characters");
    out.push_back(id);
    offset += c.size();
  }
  return out;
}

std::string CharTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    MU_CHECK(ids[i] >= 0 && ids[i] < vocab_size(), "CharTokenizer::decode: token ", i, " is ", ids[i],
             ", outside 0..", vocab_size() - 1);
    out += chars_[size_t(ids[i])];
  }
  return out;
}

}  // namespace mu::data
