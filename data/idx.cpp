#include "data/idx.h"

#include <algorithm>
#include <cstdio>

#include "data/file_reader.h"
#include "tensor/error.h"

namespace mu::data {

namespace {

// " (the gzip data is cut short: ...)" when that is why the data ended early.
std::string why_short(const FileReader& in) {
  std::string cut = in.cut_short();
  return cut.empty() ? "" : " (" + cut + ")";
}

// Fails unless exactly n bytes could be read: "truncated at byte B: expected n bytes of <what>, got g".
void read_exact(FileReader& in, uint8_t* out, int64_t n, const std::string& path, const std::string& what) {
  int64_t start = in.offset();
  int64_t got = in.read(out, n);
  MU_CHECK(got == n, path, ": truncated at byte ", start, ": expected ", n, " bytes of ", what, ", got ", got,
           why_short(in));
}

std::string hex(uint32_t v, int digits) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%0*x", digits, v);
  return buf;
}

// "1 dim", "3 dims".
std::string dims_word(int64_t n) { return std::to_string(n) + (n == 1 ? " dim" : " dims"); }

// Big-endian uint32 at p (IDX stores every header field that way).
uint32_t be32(const uint8_t* p) { return uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | p[3]; }

// Larger payloads are taken for a corrupt header (and keep the element count far from overflow).
constexpr int64_t kMaxPayload = int64_t(1) << 36;
// The buffer is reserved up front only up to this size (64 MiB, more than any Fashion-MNIST
// file holds); beyond, it grows as data arrives.
constexpr int64_t kReserveLimit = int64_t(1) << 26;

}  // namespace

IdxArray read_idx(const std::string& path, int64_t expected_rank, const std::string& what) {
  MU_CHECK(expected_rank == -1 || (expected_rank >= 1 && expected_rank <= 255),
           "read_idx: expected_rank must be -1 (any) or in [1, 255], got ", expected_rank);
  // A FIFO or a device is refused here, before any read could block on it.
  FileReader in(path);

  // ---- magic: 0x00, 0x00, element type, rank
  uint8_t magic[4];
  read_exact(in, magic, 4, path, "magic number");
  uint32_t m = be32(magic);
  const bool ubyte = magic[0] == 0 && magic[1] == 0 && magic[2] == 0x08;
  if (expected_rank > 0) {
    MU_CHECK(ubyte && magic[3] == expected_rank, path, ": bad magic number ", hex(m, 8), " at byte 0: expected ",
             hex(0x800u | uint32_t(expected_rank), 8), " (unsigned bytes, ", dims_word(expected_rank), ")");
  } else {
    MU_CHECK(magic[0] == 0 && magic[1] == 0, path, ": bad magic number ", hex(m, 8),
             " at byte 0: an IDX file starts with two zero bytes");
    MU_CHECK(magic[2] == 0x08, path, ": unsupported element type ", hex(magic[2], 2),
             " at byte 2: only unsigned bytes (0x08) are read");
    MU_CHECK(magic[3] >= 1, path, ": bad magic number ", hex(m, 8), " at byte 0: rank 0 (no dims)");
  }
  const int64_t rank = magic[3];

  // ---- dims: one big-endian uint32 each
  std::vector<uint8_t> raw(size_t(rank) * 4);
  read_exact(in, raw.data(), rank * 4, path, "dims (" + std::to_string(rank) + " x uint32)");
  IdxArray out;
  int64_t numel = 1;
  for (int64_t d = 0; d < rank; ++d) {
    int64_t v = be32(&raw[size_t(d) * 4]);
    MU_CHECK(v > 0, path, ": dim ", d, " (at byte ", 4 + 4 * d, ") is 0: every dim must be positive");
    out.dims.push_back(v);
    // Checked before multiplying, so the product can never overflow.
    MU_CHECK(v <= kMaxPayload / numel, path, ": dims ", shape_str(out.dims), "... at byte 4 describe more than ",
             kMaxPayload, " bytes: the header is corrupt");
    numel *= v;
  }

  // ---- payload, and nothing after it. Read in chunks, growing the buffer as data comes,
  // so a corrupt dim claiming gigabytes fails as truncation instead of allocating them.
  const int64_t payload_start = in.offset();
  constexpr int64_t kChunk = int64_t(1) << 24;
  out.data.reserve(size_t(std::min(numel, kReserveLimit)));
  int64_t got = 0;
  while (got < numel) {
    const int64_t want = std::min(kChunk, numel - got);
    out.data.resize(size_t(got + want));
    const int64_t r = in.read(out.data.data() + got, want);
    got += r;
    if (r < want) break;
  }
  out.data.resize(size_t(got));
  MU_CHECK(got == numel, path, ": truncated at byte ", payload_start, ": expected ", numel, " bytes of ", what,
           ", got ", got, why_short(in));
  uint8_t extra[64];
  int64_t tail_start = in.offset();
  int64_t tail = in.read(extra, sizeof extra);
  MU_CHECK(tail == 0, path, ": unexpected data at byte ", tail_start, ": the dims ", shape_str(out.dims),
           " describe ", numel, " bytes of ", what, ", but the file goes on");
  // All the data came, but a gzip'd file may still end inside its last trailer.
  in.finish();
  return out;
}

}  // namespace mu::data
