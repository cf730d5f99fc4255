// A file read as a stream of bytes: gzip'd files are decompressed and verified on the
// way, any other file is passed through as it is.
//
//   data::FileReader in("train-labels-idx1-ubyte.gz");
//   int64_t got = in.read(buf, n);   // fewer than n only at the end of the data
//   in.finish();                     // once at the end: throws if the gzip data was cut short
//
// gzip (RFC 1952): every member's header is checked (the deflate method, no reserved
// flag, the header CRC when it has one), its deflate data must decode, and its trailer
// must hold the CRC-32 and the length (mod 2^32) of the bytes decoded; members back to
// back are one stream, as gzip(1) reads them, and anything else after the last one is
// refused. Damage throws a mu::Error naming the file, what is wrong, and the byte offset
// (in the decompressed data, and in the file). A file that ends inside a member ends the
// data early; finish() then says where, as does cut_short().
//
// The file must be a regular file (tensor/regular_file.h): a FIFO or a device is refused
// before anything could block on it.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

// zlib's stream state, held by pointer so that this header does not need zlib's.
struct z_stream_s;

namespace mu::data {

class FileReader {
 public:
  explicit FileReader(const std::string& path);
  ~FileReader();
  FileReader(const FileReader&) = delete;
  FileReader& operator=(const FileReader&) = delete;

  const std::string& path() const { return path_; }
  bool gzipped() const { return gzip_; }
  // Bytes of data (decompressed) handed out so far.
  int64_t offset() const { return offset_; }

  // Reads up to n bytes into out; returns how many came, fewer only at the end of the
  // data. Throws on damage (a bad header, corrupt deflate data, a trailer that does not
  // match, bytes after the last member) and read errors.
  int64_t read(uint8_t* out, int64_t n);

  // Empty while the data is intact so far; once a gzip'd file has ended inside a member,
  // where: "the gzip data is cut short: the file ends at byte B, inside the trailer of
  // the member at byte M".
  std::string cut_short() const;
  // Throws cut_short() (naming the file) if the data was cut short. Call it once read()
  // has returned fewer bytes than asked: before that, the end is not known.
  void finish() const;

 private:
  enum class Part { Header, Deflate, Trailer, Done, Cut };

  // Makes at least k unread file bytes available unless the file ends first; returns
  // how many are available.
  size_t ensure(size_t k);
  bool next_byte(uint8_t& b);
  // File offset of the next unread byte.
  uint64_t file_offset() const { return file_read_ - (end_ - pos_); }
  void fail_read(const char* call) const;

  int64_t read_plain(uint8_t* out, int64_t n);
  bool read_header();
  int64_t inflate_into(uint8_t* out, int64_t n);
  bool read_trailer();
  void start_member_or_end();

  std::string path_;
  int fd_ = -1;
  std::vector<uint8_t> buf_;  // file bytes read ahead; [pos_, end_) not consumed yet
  size_t pos_ = 0, end_ = 0;
  uint64_t file_read_ = 0;  // bytes read from the file so far
  bool eof_ = false;
  bool gzip_ = false;

  Part part_ = Part::Header;
  const char* cut_in_ = "";   // the part of the member where the file ended
  std::unique_ptr<z_stream_s> zs_;
  bool zs_ready_ = false;
  uint64_t member_start_ = 0;  // file offset of the current member
  uint32_t crc_ = 0;           // CRC-32 of the current member's data so far
  uint64_t member_bytes_ = 0;  // its data bytes so far
  int64_t offset_ = 0;
};

}  // namespace mu::data
