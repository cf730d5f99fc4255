// Token files (nanoGPT's headerless uint16 and llm.c's 1024-byte header): writing and
// reading back, damage named with the byte offset, and the (B, T+1) windows served from them.
#include <sys/stat.h>

#include <climits>
#include <set>

#include "data/token_file.h"
#include "file_helpers.h"
#include "helpers.h"

using namespace mu;
using namespace mu::data;

namespace {

// Tokens equal to their positions: a window's first token says where it starts.
std::vector<int32_t> positions(int32_t n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) v[size_t(i)] = i;
  return v;
}

// Same shape and the same int64 values.
bool same(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) return false;
  for (int64_t i = 0; i < a.numel(); ++i)
    if (a.data_ptr<int64_t>()[i] != b.data_ptr<int64_t>()[i]) return false;
  return true;
}

std::string le32(int32_t v) { return std::string(reinterpret_cast<const char*>(&v), 4); }

std::string llmc_header(int32_t magic, int32_t version, int32_t count) {
  std::string h = le32(magic) + le32(version) + le32(count);
  h.resize(1024, '\0');
  return h;
}

std::string u16(std::initializer_list<uint16_t> v) {
  std::string s;
  for (uint16_t x : v) s += char(x & 0xFF), s += char(x >> 8);
  return s;
}

}  // namespace

TEST_CASE("write and read back, both layouts") {
  TempDir dir("tokens_rt");
  const std::vector<int32_t> ids = {0, 1, 50256, 65535, 258, 7};
  write_token_file(dir.file("a.bin"), ids);
  write_token_file(dir.file("b.bin"), ids, TokenFileLayout::Headerless);
  // The bytes themselves, against llm.c's layout written out by hand.
  CHECK(read_bytes(dir.file("a.bin")) == llmc_header(20240520, 1, 6) + u16({0, 1, 50256, 65535, 258, 7}));
  CHECK(read_bytes(dir.file("b.bin")) == u16({0, 1, 50256, 65535, 258, 7}));
  for (const char* name : {"a.bin", "b.bin"}) {
    TokenFile f(dir.file(name));
    CHECK(f.has_header() == (std::string(name) == "a.bin"));
    REQUIRE(f.size() == 6);
    for (int64_t i = 0; i < 6; ++i) CHECK(f[i] == ids[size_t(i)]);
  }
  // The layout may be named instead of detected.
  CHECK(TokenFile(dir.file("b.bin"), TokenFileOptions().layout(TokenFileLayout::Headerless)).size() == 6);
  CHECK(TokenFile(dir.file("a.bin"), TokenFileOptions().layout(TokenFileLayout::LlmC)).size() == 6);
  // Nothing but the two files is left in the directory (the temporaries were renamed).
  int entries = 0;
  for (auto& e : std::filesystem::directory_iterator(dir.path)) (void)e, ++entries;
  CHECK(entries == 2);
}

TEST_CASE("writing refuses ids that uint16 cannot hold, and keeps the old file") {
  TempDir dir("tokens_bad_ids");
  write_token_file(dir.file("t.bin"), {1, 2, 3});
  const std::string before = read_bytes(dir.file("t.bin"));
  CHECK_THROWS_MU(write_token_file(dir.file("t.bin"), {1, 65536}), "token 1 is 65536, outside the uint16 range 0..65535");
  CHECK_THROWS_MU(write_token_file(dir.file("t.bin"), {-1}), "token 0 is -1");
  CHECK(read_bytes(dir.file("t.bin")) == before);
  CHECK_THROWS_MU(write_token_file(dir.file("no/such/dir/t.bin"), {1}), "cannot create");
}

TEST_CASE("damaged files are refused naming the file and the byte offset") {
  TempDir dir("tokens_damage");
  const std::string p = dir.file("t.bin");
  // Headerless with an odd size: the last token is cut short.
  write_bytes(p, u16({1, 2, 3}) + "x");
  CHECK_THROWS_MU(TokenFile(p), "t.bin: odd byte count: the file has 7 bytes");
  CHECK_THROWS_MU(TokenFile(p), "at byte 6, is cut short");
  // llm.c's header cut short.
  write_bytes(p, llmc_header(20240520, 1, 3).substr(0, 500));
  CHECK_THROWS_MU(TokenFile(p), "truncated header: the file has 500 bytes, llm.c's header alone needs 1024");
  // Tokens cut short after the header: odd, then too few.
  write_bytes(p, llmc_header(20240520, 1, 3) + u16({1, 2}) + "x");
  CHECK_THROWS_MU(TokenFile(p), "odd byte count: 5 bytes of tokens after the 1024-byte header");
  write_bytes(p, llmc_header(20240520, 1, 3) + u16({1, 2}));
  CHECK_THROWS_MU(TokenFile(p), "token count mismatch: the header at byte 8 says 3 tokens, the file holds 2");
  CHECK_THROWS_MU(TokenFile(p), "missing tokens from byte 1028");
  write_bytes(p, llmc_header(20240520, 1, 1) + u16({1, 2}));
  CHECK_THROWS_MU(TokenFile(p), "extra tokens from byte 1026");
  // Wrong version (llm.c's 2 holds uint32 tokens) and a negative count.
  write_bytes(p, llmc_header(20240520, 2, 1) + u16({1}));
  CHECK_THROWS_MU(TokenFile(p), "unsupported version at byte 4: 2, expected 1");
  write_bytes(p, llmc_header(20240520, 1, -5));
  CHECK_THROWS_MU(TokenFile(p), "negative token count at byte 8: -5");
  // Bad magic: when the file is said to be llm.c's (detection would take it as headerless).
  write_bytes(p, llmc_header(20240521, 1, 1) + u16({1}));
  CHECK_THROWS_MU(TokenFile(p, TokenFileOptions().layout(TokenFileLayout::LlmC)),
                  "bad magic at byte 0: 20240521, expected 20240520");
  CHECK(TokenFile(p).size() == 513);  // the same bytes, headerless
}

TEST_CASE("ids at or above the vocabulary size are refused") {
  TempDir dir("tokens_vocab");
  write_token_file(dir.file("t.bin"), {5, 50256, 50257, 3});
  CHECK_THROWS_MU(TokenFile(dir.file("t.bin"), TokenFileOptions().vocab_size(50257)),
                  "token 2 at byte 1028 is 50257, outside the vocabulary of 50257 tokens");
  CHECK(TokenFile(dir.file("t.bin"), TokenFileOptions().vocab_size(50258)).size() == 4);
  write_token_file(dir.file("h.bin"), {5, 9}, TokenFileLayout::Headerless);
  CHECK_THROWS_MU(TokenFile(dir.file("h.bin"), TokenFileOptions().vocab_size(9)), "token 1 at byte 2 is 9");
  CHECK_THROWS_MU(TokenFileOptions().vocab_size(-1), "-1 is outside 0..65536");
  CHECK_THROWS_MU(TokenFileOptions().vocab_size(70000), "70000 is outside 0..65536");
}

TEST_CASE("what is not a regular file is refused before anything blocks") {
  TempDir dir("tokens_fifo");
  REQUIRE(::mkfifo(dir.file("fifo").c_str(), 0600) == 0);
  CHECK_THROWS_MU(TokenFile(dir.file("fifo")), "it is a FIFO (named pipe), not a regular file");
  CHECK_THROWS_MU(TokenFile(dir.path.string()), "it is a directory");
  CHECK_THROWS_MU(TokenFile(dir.file("missing.bin")), "cannot open");
}

TEST_CASE("empty files open with no tokens and serve no windows") {
  TempDir dir("tokens_empty");
  write_bytes(dir.file("e.bin"), "");
  TokenFile e(dir.file("e.bin"));
  CHECK(e.size() == 0);
  CHECK(e.data() == nullptr);
  CHECK_THROWS_MU(random_windows(e, 1, 1), "holds 0 tokens; a window of T+1 = 2 tokens does not fit");
  CHECK(eval_window_count(e, 4) == 0);
  write_token_file(dir.file("h.bin"), {});
  CHECK(TokenFile(dir.file("h.bin")).size() == 0);
}

TEST_CASE("random windows: x then y shifted by one, in bounds, repeatable under a seed") {
  TempDir dir("tokens_windows");
  const int32_t n = 50;
  write_token_file(dir.file("t.bin"), positions(n));
  TokenFile f(dir.file("t.bin"));
  const int64_t B = 64, T = 8;
  Generator g1(42), g2(42), g3(43);
  TokenBatch a = random_windows(f, B, T, &g1), b = random_windows(f, B, T, &g2), c = random_windows(f, B, T, &g3);
  CHECK(a.x.shape() == Shape{B, T});
  CHECK(a.y.shape() == Shape{B, T});
  CHECK(a.x.dtype() == kInt64);
  const int64_t* x = a.x.data_ptr<int64_t>();
  const int64_t* y = a.y.data_ptr<int64_t>();
  std::set<int64_t> starts;
  for (int64_t i = 0; i < B; ++i) {
    const int64_t s = x[i * T];
    CHECK(s >= 0);
    CHECK(s + T <= n - 1);  // the target's last token is in the file
    starts.insert(s);
    for (int64_t t = 0; t < T; ++t) {
      CHECK(x[i * T + t] == s + t);
      CHECK(y[i * T + t] == s + t + 1);
    }
  }
  CHECK(starts.size() > 10);  // drawn, not fixed
  CHECK(same(a.x, b.x));
  CHECK(same(a.y, b.y));
  CHECK_FALSE(same(a.x, c.x));
  // Over many draws both ends of the range come up: starts 0 and n-T-1.
  Generator g(1);
  TokenBatch many = random_windows(f, 4000, T, &g);
  std::set<int64_t> all;
  for (int64_t i = 0; i < 4000; ++i) all.insert(many.x.data_ptr<int64_t>()[i * T]);
  CHECK(*all.begin() == 0);
  CHECK(*all.rbegin() == n - T - 1);
  CHECK(all.size() == size_t(n - T));
  // T = n-1: the one window there is.
  TokenBatch whole = random_windows(f, 2, n - 1, &g);
  CHECK(whole.x.data_ptr<int64_t>()[0] == 0);
  CHECK(whole.y.data_ptr<int64_t>()[n - 2] == n - 1);
}

TEST_CASE("evaluation windows cover the file in order") {
  TempDir dir("tokens_eval");
  write_token_file(dir.file("t.bin"), positions(23));
  TokenFile f(dir.file("t.bin"));
  const int64_t T = 5;
  REQUIRE(eval_window_count(f, T) == 4);  // windows at 0, 5, 10, 15; the one at 20 lacks tokens
  TokenBatch first = eval_windows(f, 0, 3, T);
  CHECK(first.x.size(0) == 3);
  for (int64_t w = 0; w < 3; ++w)
    for (int64_t t = 0; t < T; ++t) {
      CHECK(first.x.data_ptr<int64_t>()[w * T + t] == w * T + t);
      CHECK(first.y.data_ptr<int64_t>()[w * T + t] == w * T + t + 1);
    }
  TokenBatch rest = eval_windows(f, 3, 3, T);  // only one left
  CHECK(rest.x.shape() == Shape{1, T});
  CHECK(rest.y.data_ptr<int64_t>()[T - 1] == 20);
  CHECK_THROWS_MU(eval_windows(f, 4, 1, T), "window 4 is outside 0..3");
  CHECK_THROWS_MU(eval_windows(f, -1, 1, T), "window -1 is outside 0..3");
  CHECK_THROWS_MU(eval_window_count(f, 0), "T must be at least 1, got 0");
}

TEST_CASE("hostile batch sizes and window lengths are refused with their values") {
  TempDir dir("tokens_hostile");
  write_token_file(dir.file("t.bin"), positions(100));
  TokenFile f(dir.file("t.bin"));
  CHECK_THROWS_MU(random_windows(f, 0, 4), "the batch size B must be at least 1, got 0");
  CHECK_THROWS_MU(random_windows(f, -3, 4), "got -3");
  CHECK_THROWS_MU(random_windows(f, 2, 0), "the window length T must be at least 1, got 0");
  CHECK_THROWS_MU(random_windows(f, 2, 100), "holds 100 tokens; a window of T+1 = 101 tokens does not fit");
  CHECK_THROWS_MU(random_windows(f, 2, INT64_MAX), "a window of T+1 = 2^63 tokens does not fit");
  CHECK_THROWS_MU(random_windows(f, INT64_MAX, 50), "does not fit in int64");
  CHECK_THROWS_MU(random_windows(f, int64_t(1) << 45, 50), "more than any machine holds");
  CHECK_THROWS_MU(eval_windows(f, 0, INT64_MAX / 2, 50), "does not fit in int64");
}
