#include "data/unicode_classes.h"

#include <algorithm>
#include <array>

namespace mu::data {

namespace {

struct Range {
  uint32_t first, last;
  uint8_t cls;
};

constexpr Range kRanges[] = {
#include "data/unicode_classes_table.inc"
};

// Unicode's White_Space property (PropList.txt): stable since Unicode 6.3.
constexpr uint32_t kWhiteSpace[] = {0x0009, 0x000A, 0x000B, 0x000C, 0x000D, 0x0020, 0x0085, 0x00A0, 0x1680,
                                    0x2000, 0x2001, 0x2002, 0x2003, 0x2004, 0x2005, 0x2006, 0x2007, 0x2008,
                                    0x2009, 0x200A, 0x2028, 0x2029, 0x202F, 0x205F, 0x3000};

CharClass lookup(uint32_t cp) {
  for (uint32_t w : kWhiteSpace)
    if (w == cp) return CharClass::Space;
  // The last range starting at or before cp is the only one that can hold it.
  const Range* end = std::end(kRanges);
  const Range* it = std::upper_bound(std::begin(kRanges), end, cp, [](uint32_t v, const Range& r) { return v < r.first; });
  if (it == std::begin(kRanges)) return CharClass::Other;
  --it;
  return cp <= it->last ? CharClass(it->cls) : CharClass::Other;
}

// The first 256 code points, looked up once: ASCII and Latin-1 are most of any text.
const std::array<CharClass, 256> kLatin1 = [] {
  std::array<CharClass, 256> t{};
  for (uint32_t c = 0; c < 256; ++c) t[c] = lookup(c);
  return t;
}();

bool continuation(unsigned char b) { return (b & 0xC0) == 0x80; }

}  // namespace

CodePoint decode_utf8(const unsigned char* s, size_t n, size_t pos) {
  const unsigned char b0 = s[pos];
  CodePoint bad{b0, 1, true};
  if (b0 < 0x80) return {b0, 1, false};
  size_t len;
  uint32_t v, min;
  if (b0 >= 0xC2 && b0 <= 0xDF) len = 2, v = b0 & 0x1F, min = 0x80;
  else if ((b0 & 0xF0) == 0xE0) len = 3, v = b0 & 0x0F, min = 0x800;
  else if (b0 >= 0xF0 && b0 <= 0xF4) len = 4, v = b0 & 0x07, min = 0x10000;
  else return bad;  // a continuation byte, C0/C1 (always overlong) or F5..FF
  if (pos + len > n) return bad;
  for (size_t k = 1; k < len; ++k) {
    if (!continuation(s[pos + k])) return bad;
    v = (v << 6) | (s[pos + k] & 0x3F);
  }
  // Overlong forms, UTF-16 surrogates and values past U+10FFFF are not UTF-8.
  if (v < min || (v >= 0xD800 && v <= 0xDFFF) || v > 0x10FFFF) return bad;
  return {v, uint8_t(len), false};
}

CharClass unicode_class(uint32_t cp) { return cp < 256 ? kLatin1[cp] : lookup(cp); }

CharClass class_at(const unsigned char* s, size_t n, size_t pos, size_t* len) {
  if (s[pos] < 0x80) {
    *len = 1;
    return kLatin1[s[pos]];
  }
  CodePoint c = decode_utf8(s, n, pos);
  *len = c.len;
  return c.invalid ? CharClass::Other : unicode_class(c.value);
}

}  // namespace mu::data
