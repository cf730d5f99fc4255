#include "data/token_file.h"

#include <bit>
#include <cstring>
#include <filesystem>

#include "data/mapped_file.h"
#include "tensor/atomic_file.h"
#include "tensor/checked.h"
#include "tensor/error.h"

namespace mu::data {

static_assert(std::endian::native == std::endian::little, "token files are read in place: a little-endian host is assumed");

namespace {

int32_t read_i32(const unsigned char* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

void check_window(const TokenFile& f, int64_t B, int64_t T, const char* what) {
  MU_CHECK(B >= 1, what, ": the batch size B must be at least 1, got ", B);
  MU_CHECK(T >= 1, what, ": the window length T must be at least 1, got ", T);
  // Compared as T >= size() so that a huge T cannot overflow T + 1.
  MU_CHECK(T < f.size(), what, ": ", f.path(), " holds ", f.size(), " tokens; a window of T+1 = ",
           T == INT64_MAX ? std::string("2^63") : std::to_string(T + 1), " tokens does not fit");
  // Two int64 tensors of B*T values.
  const int64_t bytes = checked_mul(checked_mul(B, T, what, ": B*T"), 16, what, ": bytes of x and y");
  MU_CHECK(bytes <= kMaxAllocationBytes, what, ": B = ", B, " windows of T = ", T, " tokens need ", bytes,
           " bytes, more than any machine holds");
}

// Copies the windows starting at starts[0..B) into x and y.
TokenBatch gather(const TokenFile& f, const std::vector<int64_t>& starts, int64_t T) {
  const int64_t B = int64_t(starts.size());
  TokenBatch b{empty({B, T}, kInt64), empty({B, T}, kInt64)};
  int64_t* x = b.x.data_ptr<int64_t>();
  int64_t* y = b.y.data_ptr<int64_t>();
  const uint16_t* tok = f.data();
  for (int64_t i = 0; i < B; ++i) {
    const uint16_t* w = tok + starts[size_t(i)];
    for (int64_t t = 0; t < T; ++t) x[i * T + t] = w[t], y[i * T + t] = w[t + 1];
  }
  return b;
}

}  // namespace

TokenFileOptions& TokenFileOptions::vocab_size(int64_t v) {
  MU_CHECK(v >= 0 && v <= 65536, "TokenFileOptions::vocab_size: ", v,
           " is outside 0..65536 (0: unchecked; uint16 ids reach 65535)");
  vocab_size_ = v;
  return *this;
}

void write_token_file(const std::string& path, const std::vector<int32_t>& ids, TokenFileLayout layout) {
  const bool header = layout != TokenFileLayout::Headerless;
  MU_CHECK(!header || ids.size() <= size_t(INT32_MAX), "write_token_file: ", path, ": ", ids.size(),
           " tokens do not fit llm.c's int32 count; write the file headerless");
  std::vector<uint16_t> data(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    MU_CHECK(ids[i] >= 0 && ids[i] <= 65535, "write_token_file: ", path, ": token ", i, " is ", ids[i],
             ", outside the uint16 range 0..65535");
    data[i] = uint16_t(ids[i]);
  }
  int32_t h[256] = {kLlmcMagic, kLlmcVersion, int32_t(header ? ids.size() : 0)};
  std::vector<std::pair<const void*, size_t>> parts;
  if (header) parts.emplace_back(h, sizeof h);
  parts.emplace_back(data.data(), data.size() * 2);
  write_file_atomically(path, parts, "write_token_file");
}

struct TokenFile::Mapping {
  MappedFile file;
  const uint16_t* tokens = nullptr;
  int64_t count = 0;
  bool header = false;
  explicit Mapping(const std::string& path) : file(path) {}
};

TokenFile::TokenFile(const std::string& path, const TokenFileOptions& options) {
  auto m = std::make_shared<Mapping>(path);
  const unsigned char* bytes = m->file.data();
  const int64_t size = m->file.size();

  TokenFileLayout layout = options.layout();
  if (layout == TokenFileLayout::Auto)
    layout = size >= 4 && read_i32(bytes) == kLlmcMagic ? TokenFileLayout::LlmC : TokenFileLayout::Headerless;
  int64_t start = 0;
  if (layout == TokenFileLayout::LlmC) {
    MU_CHECK(size >= kLlmcHeaderBytes, path, ": truncated header: the file has ", size,
             " bytes, llm.c's header alone needs ", kLlmcHeaderBytes);
    MU_CHECK(read_i32(bytes) == kLlmcMagic, path, ": bad magic at byte 0: ", read_i32(bytes), ", expected ",
             kLlmcMagic, " (llm.c's token file header)");
    MU_CHECK(read_i32(bytes + 4) == kLlmcVersion, path, ": unsupported version at byte 4: ", read_i32(bytes + 4),
             ", expected ", kLlmcVersion, " (uint16 tokens)");
    const int64_t count = read_i32(bytes + 8);
    const int64_t payload = size - kLlmcHeaderBytes;
    MU_CHECK(count >= 0, path, ": negative token count at byte 8: ", count);
    MU_CHECK(payload % 2 == 0, path, ": odd byte count: ", payload, " bytes of tokens after the ",
             kLlmcHeaderBytes, "-byte header; the last token, at byte ", size - 1, ", is cut short");
    MU_CHECK(payload / 2 == count, path, ": token count mismatch: the header at byte 8 says ", count,
             " tokens, the file holds ", payload / 2, " (", size, " bytes; ", count < payload / 2 ? "extra" : "missing",
             " tokens from byte ", kLlmcHeaderBytes + 2 * std::min(count, payload / 2), ")");
    start = kLlmcHeaderBytes;
    m->header = true;
  } else {
    MU_CHECK(size % 2 == 0, path, ": odd byte count: the file has ", size,
             " bytes, but uint16 tokens take 2 each; the last token, at byte ", size - 1, ", is cut short");
  }
  m->count = (size - start) / 2;
  m->tokens = m->count > 0 ? reinterpret_cast<const uint16_t*>(bytes + start) : nullptr;
  if (options.vocab_size() > 0) {
    const uint16_t limit = uint16_t(std::min<int64_t>(options.vocab_size() - 1, 65535));
    for (int64_t i = 0; i < m->count; ++i)
      MU_CHECK(m->tokens[i] <= limit, path, ": token ", i, " at byte ", start + 2 * i, " is ", m->tokens[i],
               ", outside the vocabulary of ", options.vocab_size(), " tokens");
  }
  map_ = std::move(m);
}

const std::string& TokenFile::path() const { return map_->file.path(); }
int64_t TokenFile::size() const { return map_->count; }
bool TokenFile::has_header() const { return map_->header; }
const uint16_t* TokenFile::data() const { return map_->tokens; }

TokenBatch random_windows(const TokenFile& file, int64_t B, int64_t T, Generator* gen) {
  check_window(file, B, T, "random_windows");
  // Starts 0 .. size()-T-1: the last window's target ends at the file's last token.
  Tensor s = randint(0, file.size() - T, {B}, TensorOptions(kInt64), gen);
  const int64_t* sp = s.data_ptr<int64_t>();
  return gather(file, std::vector<int64_t>(sp, sp + B), T);
}

int64_t eval_window_count(const TokenFile& file, int64_t T) {
  MU_CHECK(T >= 1, "eval_window_count: the window length T must be at least 1, got ", T);
  // Window w needs tokens w*T .. w*T+T.
  return file.size() > T ? (file.size() - 1) / T : 0;
}

TokenBatch eval_windows(const TokenFile& file, int64_t first, int64_t B, int64_t T) {
  check_window(file, B, T, "eval_windows");
  const int64_t count = eval_window_count(file, T);
  MU_CHECK(first >= 0 && first < count, "eval_windows: window ", first, " is outside 0..", count - 1, " (", file.path(),
           " holds ", count, " windows of T = ", T, ")");
  const int64_t n = std::min(B, count - first);
  std::vector<int64_t> starts(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) starts[size_t(i)] = (first + i) * T;
  return gather(file, starts, T);
}

}  // namespace mu::data
