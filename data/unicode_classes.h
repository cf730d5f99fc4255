// The Unicode character classes that GPT-2's pre-tokenisation pattern distinguishes,
// and a UTF-8 decoder that never fails (tokenizers must take any byte string).
//
//   CodePoint c = decode_utf8(bytes, n, pos);   // c.len bytes from pos
//   unicode_class(c.value);                     // Letter, Number, Space or Other
//
// Letter is \p{L} (general categories Lu Ll Lt Lm Lo), Number is \p{N} (Nd Nl No), from
// the table that scripts/gen_unicode_classes.py generates (data/unicode_classes_table.inc);
// Space is Unicode's White_Space property, which is what \s matches in Python's `regex`
// module (the engine of GPT-2's own encoder.py) and in Rust's regex (tiktoken).
// JavaScript's \s differs in two code points: it also takes U+FEFF and not U+0085.
#pragma once
#include <cstddef>
#include <cstdint>

namespace mu::data {

enum class CharClass : uint8_t { Other = 0, Letter = 1, Number = 2, Space = 3 };

// One character of a UTF-8 byte string: a well-formed sequence (shortest form, no
// surrogates, at most U+10FFFF) is one code point of len 1..4; any other byte is a
// character of its own (len 1, invalid = true, class Other).
struct CodePoint {
  uint32_t value = 0;
  uint8_t len = 1;
  bool invalid = false;
};

// The character at s[pos] (pos < n).
CodePoint decode_utf8(const unsigned char* s, size_t n, size_t pos);

// The class of a code point (any value; those above U+10FFFF are Other).
CharClass unicode_class(uint32_t cp);

// The class of the character at s[pos], invalid bytes being Other; *len receives its length.
CharClass class_at(const unsigned char* s, size_t n, size_t pos, size_t* len);

}  // namespace mu::data
