#include "data/file_reader.h"

#include <zlib.h>

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>

#include "tensor/error.h"
#include "tensor/regular_file.h"

namespace mu::data {

namespace {

constexpr size_t kBufferBytes = size_t(1) << 17;  // read-ahead: few system calls on 30 MB files
// gzip header flags (RFC 1952 2.3.1).
constexpr uint8_t kFlagHcrc = 0x02, kFlagExtra = 0x04, kFlagName = 0x08, kFlagComment = 0x10, kFlagReserved = 0xe0;

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

uint32_t le32(const uint8_t* p) { return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24; }

}  // namespace

FileReader::FileReader(const std::string& path) : path_(path), buf_(kBufferBytes) {
  fd_ = open_regular_file(path);
  try {
    // The gzip magic decides; an IDX file starts with two zero bytes, never with it.
    gzip_ = ensure(2) >= 2 && buf_[pos_] == 0x1f && buf_[pos_ + 1] == 0x8b;
  } catch (...) {
    ::close(fd_);  // no destructor runs for a constructor that throws
    throw;
  }
  if (!gzip_) return;
  // Raw deflate (negative window bits): the gzip framing is read here, so that its
  // checks and messages are ours.
  zs_ = std::make_unique<z_stream>();  // zero-initialised: zlib's default allocators
  if (inflateInit2(zs_.get(), -MAX_WBITS) != Z_OK) {
    ::close(fd_);
    MU_FAIL(path_, ": zlib could not allocate its state");
  }
  zs_ready_ = true;
}

FileReader::~FileReader() {
  if (zs_ready_) inflateEnd(zs_.get());
  if (fd_ >= 0) ::close(fd_);
}

void FileReader::fail_read(const char* call) const {
  MU_FAIL(path_, ": read error at file byte ", file_read_, ": ", call, ": ", std::strerror(errno));
}

size_t FileReader::ensure(size_t k) {
  while (end_ - pos_ < k && !eof_) {
    // Unread bytes to the front, then fill the rest of the buffer.
    if (pos_ > 0) {
      std::memmove(buf_.data(), buf_.data() + pos_, end_ - pos_);
      end_ -= pos_;
      pos_ = 0;
    }
    ssize_t r = ::read(fd_, buf_.data() + end_, buf_.size() - end_);
    if (r < 0 && errno == EINTR) continue;  // a signal before any byte came: retry
    if (r < 0) fail_read("read");
    if (r == 0) eof_ = true;
    end_ += size_t(r);
    file_read_ += uint64_t(r);
  }
  return end_ - pos_;
}

bool FileReader::next_byte(uint8_t& b) {
  if (ensure(1) == 0) return false;
  b = buf_[pos_++];
  return true;
}

int64_t FileReader::read_plain(uint8_t* out, int64_t n) {
  int64_t got = 0;
  while (got < n) {
    if (pos_ < end_) {
      size_t k = std::min(end_ - pos_, size_t(n - got));
      std::memcpy(out + got, buf_.data() + pos_, k);
      pos_ += k;
      got += int64_t(k);
      continue;
    }
    if (eof_) break;
    // Large reads go straight into the caller's memory.
    ssize_t r = ::read(fd_, out + got, size_t(std::min<int64_t>(n - got, int64_t(1) << 30)));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) fail_read("read");
    if (r == 0) eof_ = true;
    got += r;
    file_read_ += uint64_t(r);
  }
  return got;
}

bool FileReader::read_header() {
  member_start_ = file_offset();
  const std::string where = path_ + ": gzip member at byte " + std::to_string(member_start_);
  // ID1 ID2 CM FLG MTIME(4) XFL OS; MTIME, XFL and OS say nothing that can be checked.
  uint8_t h[10];
  for (uint8_t& b : h)
    if (!next_byte(b)) return false;
  uint32_t hcrc = uint32_t(crc32(0L, h, 10));
  MU_CHECK(h[0] == 0x1f && h[1] == 0x8b, where, ": no gzip magic (0x1f 0x8b)");
  MU_CHECK(h[2] == 8, where, ": compression method ", int(h[2]), " at byte ", member_start_ + 2,
           " is not deflate (8)");
  const uint8_t flags = h[3];
  MU_CHECK((flags & kFlagReserved) == 0, where, ": reserved flag bits set in ", hex32(flags), " at byte ",
           member_start_ + 3, " (corrupt header, or a newer format)");
  // Header bytes after the fixed ten, each counted into the header CRC.
  auto take = [&](uint8_t& b) {
    if (!next_byte(b)) return false;
    hcrc = uint32_t(crc32(hcrc, &b, 1));
    return true;
  };
  uint8_t b = 0;
  if (flags & kFlagExtra) {
    uint8_t lo, hi;
    if (!take(lo) || !take(hi)) return false;
    for (unsigned i = 0, len = unsigned(lo) | unsigned(hi) << 8; i < len; ++i)
      if (!take(b)) return false;
  }
  for (uint8_t flag : {kFlagName, kFlagComment})
    if (flags & flag) {
      do {  // zero-terminated
        if (!take(b)) return false;
      } while (b != 0);
    }
  if (flags & kFlagHcrc) {
    const uint64_t at = file_offset();
    uint8_t lo, hi;
    if (!next_byte(lo) || !next_byte(hi)) return false;
    const uint32_t stored = uint32_t(lo) | uint32_t(hi) << 8;
    MU_CHECK(stored == (hcrc & 0xffff), where, ": the header CRC at byte ", at, " is ", hex32(stored),
             " but the header's CRC-16 is ", hex32(hcrc & 0xffff), ": the header is corrupt");
  }
  MU_CHECK(inflateReset(zs_.get()) == Z_OK, where, ": zlib could not reset its state");
  crc_ = 0;
  member_bytes_ = 0;
  return true;
}

int64_t FileReader::inflate_into(uint8_t* out, int64_t n) {
  int64_t got = 0;
  while (got < n) {
    ensure(1);
    // With no input left, inflate is still called: it may hold decoded bytes not yet
    // handed out.
    zs_->next_in = buf_.data() + pos_;
    zs_->avail_in = uInt(end_ - pos_);
    zs_->next_out = out + got;
    // inflate counts in unsigned int: at most 1 GiB per call.
    zs_->avail_out = uInt(std::min<int64_t>(n - got, int64_t(1) << 30));
    const uInt asked = zs_->avail_out;
    const int r = inflate(zs_.get(), Z_NO_FLUSH);
    pos_ = end_ - zs_->avail_in;
    const uInt produced = asked - zs_->avail_out;
    crc_ = uint32_t(crc32(crc_, out + got, produced));
    member_bytes_ += produced;
    got += produced;
    if (r == Z_STREAM_END) {
      part_ = Part::Trailer;
      break;
    }
    // Z_BUF_ERROR: no progress possible without more input; at the end of the file there
    // is none to come.
    if (r == Z_BUF_ERROR && pos_ == end_ && eof_) {
      part_ = Part::Cut;
      cut_in_ = "deflate data";
      break;
    }
    if (r == Z_OK || r == Z_BUF_ERROR) continue;
    MU_FAIL(path_, ": corrupt gzip data near byte ", offset_ + got, " (file byte ", file_offset(), "): ",
            zs_->msg != nullptr ? zs_->msg : r == Z_MEM_ERROR ? "out of memory" : "invalid deflate data");
  }
  return got;
}

bool FileReader::read_trailer() {
  const uint64_t at = file_offset();
  uint8_t t[8];
  for (uint8_t& b : t)
    if (!next_byte(b)) return false;
  const uint32_t crc = le32(t), isize = le32(t + 4);
  const std::string member = "the member at byte " + std::to_string(member_start_);
  MU_CHECK(crc == crc_, path_, ": corrupt gzip data: the CRC-32 in the trailer at file byte ", at, " is ",
           hex32(crc), ", but the ", member_bytes_, " bytes decompressed from ", member, " have CRC-32 ",
           hex32(crc_));
  // The trailer keeps the length modulo 2^32.
  MU_CHECK(isize == uint32_t(member_bytes_), path_, ": corrupt gzip data: the length in the trailer at file byte ",
           at + 4, " is ", isize, ", but ", member, " decompressed to ", member_bytes_, " bytes",
           member_bytes_ > UINT32_MAX ? " (" + std::to_string(uint32_t(member_bytes_)) + " mod 2^32)" : "");
  return true;
}

void FileReader::start_member_or_end() {
  if (ensure(1) == 0) {
    part_ = Part::Done;
    return;
  }
  // Another member follows, or the file holds something that is not gzip data.
  MU_CHECK(ensure(2) >= 2 && buf_[pos_] == 0x1f && buf_[pos_ + 1] == 0x8b, path_,
           ": unexpected bytes after the gzip data at file byte ", file_offset(),
           " (the decompressed data ends at byte ", offset_, "; not another gzip member)");
  part_ = Part::Header;
}

int64_t FileReader::read(uint8_t* out, int64_t n) {
  if (!gzip_) {
    int64_t got = read_plain(out, n);
    offset_ += got;
    return got;
  }
  int64_t got = 0;
  // Trailers and following members are read even once `n` bytes have come, when they are
  // next: the end of the data is then known (and checked) as soon as it is reached.
  while (part_ != Part::Done && part_ != Part::Cut && (got < n || part_ == Part::Trailer)) {
    switch (part_) {
      case Part::Header:
        if (read_header()) {
          part_ = Part::Deflate;
        } else {
          part_ = Part::Cut;
          cut_in_ = "header";
        }
        break;
      case Part::Deflate:
        got += inflate_into(out + got, n - got);
        break;
      case Part::Trailer:
        if (read_trailer()) {
          start_member_or_end();
        } else {
          part_ = Part::Cut;
          cut_in_ = "trailer";
        }
        break;
      default:
        break;
    }
  }
  offset_ += got;
  return got;
}

std::string FileReader::cut_short() const {
  if (part_ != Part::Cut) return "";
  return std::string("the gzip data is cut short: the file ends at byte ") + std::to_string(file_read_) +
         ", inside the " + cut_in_ + " of the member at byte " + std::to_string(member_start_) +
         " (truncated file?)";
}

void FileReader::finish() const { MU_CHECK(part_ != Part::Cut, path_, ": ", cut_short()); }

}  // namespace mu::data
