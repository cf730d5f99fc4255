// The data layer: IDX files (gzip'd and plain) read back exactly, a mu::Error naming the
// file and byte offset for every kind of damage, the Fashion-MNIST loader on small fake
// files and (when installed) the real dataset, and the DataLoader's epochs.
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>

#include "data/fashion_mnist.h"
#include "data/file_reader.h"
#include "data/idx.h"
#include "data/loader.h"
#include "file_helpers.h"
#include "helpers.h"

using namespace mu;
namespace fs = std::filesystem;
using Bytes = std::vector<uint8_t>;

namespace {

void write_plain(const std::string& path, const Bytes& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  REQUIRE(f.good());
}

// Compressed with zlib's own writer, as the dataset files are.
void write_gz(const std::string& path, const Bytes& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  REQUIRE(f != nullptr);
  // gzwrite of 0 bytes returns 0, which is not a failure.
  REQUIRE(gzwrite(f, bytes.data(), unsigned(bytes.size())) == int(bytes.size()));
  REQUIRE(gzclose(f) == Z_OK);
}

// `bytes` gzip'd in memory at compression `level` (0: stored blocks, the bytes verbatim),
// with the optional header fields of `header` (name, comment, extra field, header CRC).
Bytes gzip_bytes(const Bytes& bytes, int level = Z_DEFAULT_COMPRESSION, gz_header* header = nullptr) {
  z_stream zs{};
  REQUIRE(deflateInit2(&zs, level, Z_DEFLATED, MAX_WBITS + 16, 8, Z_DEFAULT_STRATEGY) == Z_OK);  // +16: gzip
  if (header != nullptr) REQUIRE(deflateSetHeader(&zs, header) == Z_OK);
  Bytes out(deflateBound(&zs, uLong(bytes.size())) + 1024);
  zs.next_in = const_cast<Bytef*>(bytes.data());
  zs.avail_in = uInt(bytes.size());
  zs.next_out = out.data();
  zs.avail_out = uInt(out.size());
  REQUIRE(deflate(&zs, Z_FINISH) == Z_STREAM_END);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

// The little-endian uint32 at `at` replaced by v.
Bytes with_le32(Bytes b, size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) b[at + size_t(i)] = uint8_t(v >> (8 * i));
  return b;
}

Bytes read_plain(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

void put_be32(Bytes& out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(uint8_t(v >> shift));
}

// An IDX file of unsigned bytes: magic 0x0000080<rank>, dims, payload.
Bytes idx(const std::vector<uint32_t>& dims, const Bytes& payload) {
  Bytes out = {0, 0, 0x08, uint8_t(dims.size())};
  for (uint32_t d : dims) put_be32(out, d);
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

// 0, 1, 2, ... (mod 256), n bytes.
Bytes ramp(size_t n) {
  Bytes b(n);
  for (size_t i = 0; i < n; ++i) b[i] = uint8_t(i * 7 % 256);
  return b;
}

// Writes the four Fashion-MNIST files with n_train / n_test samples; label i is i % 10.
void write_fake_fashion_mnist(const TempDir& dir, int64_t n_train, int64_t n_test) {
  for (auto [prefix, n] : {std::pair<std::string, int64_t>{"train", n_train}, {"t10k", n_test}}) {
    Bytes labels;
    for (int64_t i = 0; i < n; ++i) labels.push_back(uint8_t(i % 10));
    write_gz(dir.file(prefix + "-images-idx3-ubyte.gz"), idx({uint32_t(n), 28, 28}, ramp(size_t(n) * 784)));
    write_gz(dir.file(prefix + "-labels-idx1-ubyte.gz"), idx({uint32_t(n)}, labels));
  }
}

// Sets an environment variable for one scope, then restores it.
struct ScopedEnv {
  std::string name;
  std::optional<std::string> old;
  ScopedEnv(std::string n, const std::string& value) : name(std::move(n)) {
    if (const char* v = std::getenv(name.c_str())) old = v;
    ::setenv(name.c_str(), value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old) ::setenv(name.c_str(), old->c_str(), 1);
    else ::unsetenv(name.c_str());
  }
};

}  // namespace

// ---------------------------------------------------------------- IDX reading

TEST_CASE("gzip'd and plain IDX files read back dims and bytes exactly") {
  TempDir dir("data");
  Bytes images = ramp(4 * 3 * 2), labels = {3, 1, 4, 1};
  write_gz(dir.file("images.gz"), idx({4, 3, 2}, images));
  write_plain(dir.file("labels"), idx({4}, labels));
  // A plain file under a .gz name reads too: zlib passes non-gzip data through.
  write_plain(dir.file("plain-named.gz"), idx({4}, labels));

  data::IdxArray a = data::read_idx(dir.file("images.gz"), 3);
  CHECK(a.dims == Shape{4, 3, 2});
  CHECK(a.data == images);
  data::IdxArray b = data::read_idx(dir.file("labels"), 1);
  CHECK(b.dims == Shape{4});
  CHECK(b.data == labels);
  CHECK(data::read_idx(dir.file("plain-named.gz")).data == labels);
  // Any rank is accepted when none is expected.
  CHECK(data::read_idx(dir.file("images.gz")).dims == Shape{4, 3, 2});
}

TEST_CASE("a payload larger than one zlib read chunk (16 MiB) reads back intact") {
  TempDir dir("data");
  Bytes big = ramp(size_t(17) << 20);
  write_gz(dir.file("big.gz"), idx({17, 1024, 1024}, big));
  data::IdxArray a = data::read_idx(dir.file("big.gz"), 3);
  CHECK(a.dims == Shape{17, 1024, 1024});
  CHECK(a.data == big);
}

TEST_CASE("a missing file, a directory, a device or a FIFO is an error naming the path, at once") {
  TempDir dir("data");
  CHECK_THROWS_MU(data::read_idx(dir.file("nope.gz")), "cannot open " + dir.file("nope.gz") + ": No such file or directory");
  CHECK_THROWS_MU(data::read_idx(dir.path.string()), "cannot read " + dir.path.string() + ": it is a directory, not a regular file");
  CHECK_THROWS_MU(data::read_idx("/dev/null"), "cannot read /dev/null: it is a character device, not a regular file");
  // Opening a FIFO for reading waits for a writer: the read runs on another thread so
  // that a hang fails the test instead of stalling it.
  std::string fifo = dir.file("labels.gz");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  Outcome o = outcome_within([&] { data::read_idx(fifo, 1); }, 2.0, fifo);
  CHECK(o.returned);
  CHECK(o.threw_mu);
  CHECK(o.message == "cannot read " + fifo + ": it is a FIFO (named pipe), not a regular file");
}

TEST_CASE("a bad magic number is refused at byte 0") {
  TempDir dir("data");
  // Labels where images are expected: right format, wrong rank.
  write_gz(dir.file("labels.gz"), idx({4}, {1, 2, 3, 4}));
  CHECK_THROWS_MU(data::read_idx(dir.file("labels.gz"), 3),
                  "labels.gz: bad magic number 0x00000801 at byte 0: expected 0x00000803 (unsigned bytes, 3 dims)");
  // Not an IDX file at all (text).
  write_plain(dir.file("text"), {'h', 'e', 'l', 'l', 'o', ' ', 'w', 'o', 'r', 'l', 'd'});
  CHECK_THROWS_MU(data::read_idx(dir.file("text"), 1), "bad magic number 0x68656c6c at byte 0: expected 0x00000801 (unsigned bytes, 1 dim)");
  CHECK_THROWS_MU(data::read_idx(dir.file("text")), "bad magic number 0x68656c6c at byte 0");
  // float elements (type 0x0d) are not read.
  write_plain(dir.file("floats"), {0, 0, 0x0d, 1, 0, 0, 0, 1, 0, 0, 0, 0});
  CHECK_THROWS_MU(data::read_idx(dir.file("floats")), "unsupported element type 0x0d at byte 2: only unsigned bytes (0x08) are read");
  CHECK_THROWS_MU(data::read_idx(dir.file("floats"), 1), "bad magic number 0x00000d01 at byte 0");
  // Rank 0 has no dims to describe a payload.
  write_plain(dir.file("rank0"), {0, 0, 0x08, 0});
  CHECK_THROWS_MU(data::read_idx(dir.file("rank0")), "rank 0");
}

TEST_CASE("a truncated header says where and how much was missing") {
  TempDir dir("data");
  write_gz(dir.file("empty.gz"), {});
  CHECK_THROWS_MU(data::read_idx(dir.file("empty.gz"), 1), "empty.gz: truncated at byte 0: expected 4 bytes of magic number, got 0");
  write_plain(dir.file("two"), {0, 0});
  CHECK_THROWS_MU(data::read_idx(dir.file("two"), 1), "truncated at byte 0: expected 4 bytes of magic number, got 2");
  // Three dims announced, one and a quarter present.
  write_gz(dir.file("dims.gz"), {0, 0, 0x08, 3, 0, 0, 0, 5, 0});
  CHECK_THROWS_MU(data::read_idx(dir.file("dims.gz"), 3), "dims.gz: truncated at byte 4: expected 12 bytes of dims (3 x uint32), got 5");
}

TEST_CASE("a truncated payload names the expected and received byte counts, gzip'd or plain") {
  TempDir dir("data");
  Bytes full = idx({2, 3, 4}, ramp(24));
  Bytes cut(full.begin(), full.begin() + 16 + 10);
  write_gz(dir.file("cut.gz"), cut);
  write_plain(dir.file("cut"), cut);
  CHECK_THROWS_MU(data::read_idx(dir.file("cut.gz"), 3, "image data"),
                  "cut.gz: truncated at byte 16: expected 24 bytes of image data, got 10");
  CHECK_THROWS_MU(data::read_idx(dir.file("cut"), 3, "image data"), "cut: truncated at byte 16: expected 24 bytes of image data, got 10");
  // Header only.
  write_gz(dir.file("header.gz"), idx({5}, {}));
  CHECK_THROWS_MU(data::read_idx(dir.file("header.gz"), 1, "label data"), "truncated at byte 8: expected 5 bytes of label data, got 0");
}

TEST_CASE("a gzip stream cut short reads as truncated; damaged deflate data is refused") {
  TempDir dir("data");
  Bytes payload = ramp(100000);
  write_gz(dir.file("whole.gz"), idx({100000}, payload));
  Bytes gz = read_plain(dir.file("whole.gz"));
  REQUIRE(gz.size() > 100);

  // The compressed file cut in half: fewer payload bytes than the dims promise.
  write_plain(dir.file("half.gz"), Bytes(gz.begin(), gz.begin() + long(gz.size() / 2)));
  CHECK_THROWS_MU(data::read_idx(dir.file("half.gz"), 1), "half.gz: truncated at byte 8: expected 100000 bytes of data, got ");

  // Bytes overwritten inside the deflate stream (after the 10-byte gzip header).
  Bytes bad = gz;
  for (size_t i = 20; i < 60; ++i) bad[i] = uint8_t(0xff);
  write_plain(dir.file("bad.gz"), bad);
  CHECK_THROWS_MU(data::read_idx(dir.file("bad.gz"), 1), "bad.gz: corrupt gzip data near byte ");
}

TEST_CASE("gzip: the trailer's CRC-32 and length are checked against the decompressed bytes") {
  TempDir dir("data");
  const Bytes file = idx({300}, ramp(300));
  const Bytes gz = gzip_bytes(file);
  REQUIRE(gz.size() > 18);
  const size_t trailer = gz.size() - 8;
  const uint32_t crc = uint32_t(crc32(0L, file.data(), uInt(file.size())));
  // The reference values zlib wrote are what the trailer holds.
  REQUIRE(with_le32(with_le32(gz, trailer, crc), trailer + 4, uint32_t(file.size())) == gz);
  const std::string p = dir.file("t.gz");
  write_plain(p, gz);
  CHECK(data::read_idx(p, 1).data == ramp(300));

  char want[16];
  std::snprintf(want, sizeof want, "0x%08x", crc);
  write_plain(p, with_le32(gz, trailer, crc ^ 0x00010000u));
  CHECK_THROWS_MU(data::read_idx(p, 1), p + ": corrupt gzip data: the CRC-32 in the trailer at file byte " +
                                            std::to_string(trailer) + " is ");
  CHECK_THROWS_MU(data::read_idx(p, 1), "but the 308 bytes decompressed from the member at byte 0 have CRC-32 " +
                                            std::string(want));
  write_plain(p, with_le32(gz, trailer + 4, uint32_t(file.size()) + 1));
  CHECK_THROWS_MU(data::read_idx(p, 1), p + ": corrupt gzip data: the length in the trailer at file byte " +
                                            std::to_string(trailer + 4) +
                                            " is 309, but the member at byte 0 decompressed to 308 bytes");

  // A byte of the payload changed where deflate cannot notice: in a stored block (level
  // 0) the bytes stand verbatim, so only the CRC tells.
  const Bytes stored = gzip_bytes(file, 0);
  Bytes changed = stored;
  const size_t at = stored.size() - 8 - 100;  // inside the payload, 100 bytes before the trailer
  REQUIRE(stored[at] == file[file.size() - 100]);
  changed[at] ^= 0x04;
  write_plain(p, changed);
  CHECK_THROWS_MU(data::read_idx(p, 1), "the CRC-32 in the trailer at file byte " + std::to_string(stored.size() - 8));
}

TEST_CASE("gzip: a file cut at any length is refused, naming where it ends") {
  TempDir dir("data");
  const Bytes gz = gzip_bytes(idx({2000}, ramp(2000)));
  for (size_t len = 0; len < gz.size(); ++len) {
    INFO("cut to " << len << " of " << gz.size() << " bytes");
    std::string p = dir.file("cut_" + std::to_string(len) + ".gz");
    write_plain(p, Bytes(gz.begin(), gz.begin() + long(len)));
    CHECK_THROWS_MU(data::read_idx(p, 1), p + ": ");
    if (len >= 10 && len < gz.size() - 8)
      CHECK_THROWS_MU(data::read_idx(p, 1), ", inside the deflate data of the member at byte 0 (truncated file?)");
    if (len >= gz.size() - 8)  // all the data is there; the trailer is not
      CHECK_THROWS_MU(data::read_idx(p, 1), p + ": the gzip data is cut short: the file ends at byte " +
                                                std::to_string(len) + ", inside the trailer of the member at byte 0");
    fs::remove(p);
  }
}

TEST_CASE("gzip: every single-bit flip is refused or leaves the data exactly as written") {
  // Bytes 4-9 (modification time, extra flags, OS) are covered by no check in the format
  // and are left out; a few flips elsewhere cannot change the data either (the unused
  // bits that pad a deflate block header or the last byte to a whole byte), and those
  // load the original bytes. Any other outcome (different data without an error) fails.
  TempDir dir("data");
  const Bytes file = idx({64}, ramp(64));
  for (int level : {0, Z_DEFAULT_COMPRESSION}) {
    const Bytes gz = gzip_bytes(file, level);
    int refused = 0, same = 0, trailer_refused = 0;
    for (size_t byte = 0; byte < gz.size(); ++byte) {
      if (byte >= 4 && byte < 10) continue;
      for (int bit = 0; bit < 8; ++bit) {
        Bytes b = gz;
        b[byte] ^= uint8_t(1u << bit);
        // A new name each time: truncating a file in place is slow on some file systems.
        std::string p = dir.file("flip_" + std::to_string(level) + "_" + std::to_string(byte) + "_" +
                                 std::to_string(bit) + ".gz");
        write_plain(p, b);
        try {
          data::IdxArray a = data::read_idx(p);
          INFO("level " << level << ", bit " << bit << " of byte " << byte << " of " << gz.size());
          CHECK(a.data == ramp(64));
          CHECK(a.dims == Shape{64});
          ++same;
        } catch (const Error& e) {
          CHECK(std::string(e.what()).find(p) != std::string::npos);
          ++refused;
          trailer_refused += byte >= gz.size() - 8;
        }
        fs::remove(p);
      }
    }
    INFO("level " << level << ": " << same << " flips left the data as written");
    CHECK(trailer_refused == 64);  // every bit of the CRC-32 and the length
    CHECK(same <= 16);
    CHECK(refused + same == int(8 * (gz.size() - 6)));
  }
}

TEST_CASE("gzip: header fields, members back to back, and what may not follow") {
  TempDir dir("data");
  const Bytes file = idx({50}, ramp(50));
  const std::string p = dir.file("h.gz");
  // Every optional header field, the header CRC included.
  std::string name = "labels.idx", comment = "made by the test";
  Bytes extra = {'A', 'B', 4, 0, 1, 2, 3, 4};
  gz_header h{};
  h.name = reinterpret_cast<Bytef*>(name.data());
  h.comment = reinterpret_cast<Bytef*>(comment.data());
  h.extra = extra.data();
  h.extra_len = uInt(extra.size());
  h.hcrc = 1;
  const Bytes full = gzip_bytes(file, Z_DEFAULT_COMPRESSION, &h);
  REQUIRE(full[3] == 0x1e);  // FHCRC | FEXTRA | FNAME | FCOMMENT
  write_plain(p, full);
  CHECK(data::read_idx(p, 1).data == ramp(50));
  // A changed name byte: the header CRC no longer matches.
  Bytes b = full;
  b[10 + 2 + extra.size() + 1] ^= 0x20;
  write_plain(p, b);
  CHECK_THROWS_MU(data::read_idx(p, 1), p + ": gzip member at byte 0: the header CRC at byte ");
  CHECK_THROWS_MU(data::read_idx(p, 1), "the header is corrupt");
  // Method and flags.
  b = gzip_bytes(file);
  b[2] = 7;
  write_plain(p, b);
  CHECK_THROWS_MU(data::read_idx(p, 1), p + ": gzip member at byte 0: compression method 7 at byte 2 is not deflate (8)");
  b = gzip_bytes(file);
  b[3] |= 0x40;
  write_plain(p, b);
  CHECK_THROWS_MU(data::read_idx(p, 1), "reserved flag bits set in 0x00000040 at byte 3");

  // Two members back to back are one stream (gzip a b > c); each is checked.
  Bytes first(file.begin(), file.begin() + 20), second(file.begin() + 20, file.end());
  Bytes two = gzip_bytes(first);
  const size_t second_at = two.size();
  Bytes g2 = gzip_bytes(second);
  two.insert(two.end(), g2.begin(), g2.end());
  write_plain(p, two);
  CHECK(data::read_idx(p, 1).data == ramp(50));
  Bytes bad_second = with_le32(two, two.size() - 8, 0);
  write_plain(p, bad_second);
  CHECK_THROWS_MU(data::read_idx(p, 1), "have CRC-32");
  CHECK_THROWS_MU(data::read_idx(p, 1), "from the member at byte " + std::to_string(second_at));

  // Bytes after the last member that are not another member.
  Bytes junk = gzip_bytes(file);
  const size_t end = junk.size();
  junk.push_back(0);
  write_plain(p, junk);
  CHECK_THROWS_MU(data::read_idx(p, 1), p + ": unexpected bytes after the gzip data at file byte " + std::to_string(end));

  // The reader on its own: offsets, and finish() once the data has ended.
  write_plain(p, gzip_bytes(file));
  data::FileReader in(p);
  CHECK(in.gzipped());
  uint8_t buf[100];
  CHECK(in.read(buf, 30) == 30);
  CHECK(in.offset() == 30);
  CHECK(in.read(buf, 100) == 28);
  CHECK(in.cut_short().empty());
  CHECK_NOTHROW(in.finish());
}

TEST_CASE("wrong dims: zero, absurdly large, or more payload than they describe") {
  TempDir dir("data");
  write_gz(dir.file("zero.gz"), idx({2, 0, 4}, {}));
  CHECK_THROWS_MU(data::read_idx(dir.file("zero.gz"), 3), "zero.gz: dim 1 (at byte 8) is 0: every dim must be positive");
  write_gz(dir.file("huge.gz"), idx({0xffffffffu, 0xffffffffu, 16}, {}));
  CHECK_THROWS_MU(data::read_idx(dir.file("huge.gz"), 3), "the header is corrupt");
  // A corrupt dim claiming 4 GB over a short payload: refused as truncation, without
  // allocating the 4 GB first.
  write_gz(dir.file("claims.gz"), idx({0xffffffffu}, ramp(100)));
  CHECK_THROWS_MU(data::read_idx(dir.file("claims.gz"), 1), "truncated at byte 8: expected 4294967295 bytes of data, got 100");
  write_gz(dir.file("long.gz"), idx({2, 2}, {1, 2, 3, 4, 5, 6}));
  CHECK_THROWS_MU(data::read_idx(dir.file("long.gz"), 2),
                  "long.gz: unexpected data at byte 16: the dims [2, 2] describe 4 bytes of data, but the file goes on");
}

// ---------------------------------------------------------------- Fashion-MNIST loader

TEST_CASE("Fashion-MNIST loads from fake files: shapes, [0, 1] pixels, labels, standardisation") {
  TempDir dir("data");
  write_fake_fashion_mnist(dir, 20, 7);
  data::FashionMnist ds = data::load_fashion_mnist(data::FashionMnistOptions().dir(dir.path.string()));
  CHECK(ds.train.images.shape() == Shape{20, 784});
  CHECK(ds.train.images.dtype() == kFloat32);
  CHECK(ds.train.labels.shape() == Shape{20});
  CHECK(ds.train.labels.dtype() == kInt64);
  CHECK(ds.test.size() == 7);
  Bytes raw = ramp(20 * 784);
  std::vector<float> px = ds.train.images.to_vector<float>();
  for (size_t i : {size_t(0), size_t(1), size_t(785), size_t(20 * 784 - 1)}) CHECK(px[i] == doctest::Approx(raw[i] / 255.0));
  CHECK(ds.test.labels.to_vector<int64_t>() == std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6});

  // Standardised: the training pixels have mean 0 and std 1; the test split uses the
  // training statistics, so it maps the same bytes to the same values.
  data::FashionMnist st = data::load_fashion_mnist(data::FashionMnistOptions().dir(dir.path.string()).standardize(true));
  CHECK(mean(st.train.images.to(kFloat64)).item() == doctest::Approx(0).epsilon(1e-6).scale(1));
  CHECK(mu::std(st.train.images.to(kFloat64), {}, 0).item() == doctest::Approx(1).epsilon(1e-5));
  CHECK(st.pixel_mean == doctest::Approx(mean(ds.train.images.to(kFloat64)).item()));
  CHECK(st.test.images.at({0, 5}) == doctest::Approx((ds.test.images.at({0, 5}) - st.pixel_mean) / st.pixel_std).epsilon(1e-5));
}

TEST_CASE("MUMOE_FASHION_MNIST_DIR overrides the default directory") {
  TempDir dir("data");
  write_fake_fashion_mnist(dir, 10, 10);
  ScopedEnv env("MUMOE_FASHION_MNIST_DIR", dir.path.string());
  CHECK(data::fashion_mnist_dir() == dir.path.string());
  CHECK(data::fashion_mnist_available());
  CHECK(data::load_fashion_mnist().train.size() == 10);
}

TEST_CASE("missing Fashion-MNIST says how to get it") {
  TempDir dir("data");
  const std::string how = "install Debian's dataset-fashion-mnist, or set MUMOE_FASHION_MNIST_DIR";
  CHECK_THROWS_MU(data::load_fashion_mnist(data::FashionMnistOptions().dir(dir.file("absent"))), how);
  CHECK_FALSE(data::fashion_mnist_available(dir.file("absent")));
  // The directory exists but one file is missing: the message names that file.
  write_fake_fashion_mnist(dir, 10, 10);
  fs::remove(dir.file("t10k-labels-idx1-ubyte.gz"));
  CHECK_FALSE(data::fashion_mnist_available(dir.path.string()));
  CHECK_THROWS_MU(data::load_fashion_mnist(data::FashionMnistOptions().dir(dir.path.string())),
                  "t10k-labels-idx1-ubyte.gz does not exist; " + how);
}

TEST_CASE("Fashion-MNIST refuses wrong image size, mismatched counts and labels outside 0..9") {
  TempDir dir("data");
  write_fake_fashion_mnist(dir, 10, 10);
  const std::string images = dir.file("train-images-idx3-ubyte.gz"), labels = dir.file("train-labels-idx1-ubyte.gz");
  auto load = [&] { return data::load_fashion_mnist(data::FashionMnistOptions().dir(dir.path.string())); };

  write_gz(images, idx({10, 27, 28}, ramp(10 * 27 * 28)));
  CHECK_THROWS_MU(load(), images + ": wrong dims at byte 8: images are 27x28, expected 28x28");
  write_gz(images, idx({10, 28, 28}, ramp(10 * 784)));

  write_gz(labels, idx({9}, Bytes(9, 1)));
  CHECK_THROWS_MU(load(), labels + ": wrong dims at byte 4: 9 labels for 10 images");

  Bytes l(10, 2);
  l[6] = 10;
  write_gz(labels, idx({10}, l));
  CHECK_THROWS_MU(load(), labels + ": label 10 at byte 14 is outside 0..9");

  // A FIFO in place of a file is refused at once, not waited on.
  write_gz(images, idx({10, 28, 28}, ramp(10 * 784)));
  write_gz(labels, idx({10}, Bytes(10, 1)));
  fs::remove(labels);
  REQUIRE(::mkfifo(labels.c_str(), 0600) == 0);
  Outcome o = outcome_within([&] { load(); }, 2.0, labels);
  CHECK(o.returned);
  CHECK(o.message == "cannot read " + labels + ": it is a FIFO (named pipe), not a regular file");
  fs::remove(labels);
  write_gz(labels, idx({10}, Bytes(10, 1)));

  // A truncated image file under the loader still names the file and offset.
  Bytes cut = idx({10, 28, 28}, ramp(1200));
  write_gz(images, cut);
  CHECK_THROWS_MU(load(), images + ": truncated at byte 16: expected 7840 bytes of image data, got 1200");
}

TEST_CASE("the real Fashion-MNIST: 60000/10000 samples, labels 0..9, 6000 of each class in train") {
  if (!data::fashion_mnist_available()) {
    MESSAGE("skipped: Fashion-MNIST not found in " << data::fashion_mnist_dir()
                                                  << " (install Debian's dataset-fashion-mnist, or set MUMOE_FASHION_MNIST_DIR)");
    return;
  }
  data::FashionMnist ds = data::load_fashion_mnist();
  CHECK(ds.train.images.shape() == Shape{60000, 784});
  CHECK(ds.test.images.shape() == Shape{10000, 784});
  CHECK(ds.train.size() == 60000);
  CHECK(ds.test.size() == 10000);
  for (const data::LabelledImages* split : {&ds.train, &ds.test}) {
    std::vector<int64_t> count(10, 0);
    int64_t outside = 0;
    for (int64_t y : split->labels.to_vector<int64_t>()) {
      if (y < 0 || y >= 10) ++outside;
      else ++count[size_t(y)];
    }
    CHECK(outside == 0);
    for (int64_t c : count) CHECK(c == split->size() / 10);  // 6000 in train, 1000 in test
  }
  CHECK(min(ds.train.images).item() == 0.0);
  CHECK(max(ds.train.images).item() == 1.0);
  // The training-pixel mean every Fashion-MNIST pipeline normalises with (0.2860).
  CHECK(mean(ds.train.images.to(kFloat64)).item() == doctest::Approx(0.2860).epsilon(1e-3));
}

// ---------------------------------------------------------------- DataLoader

TEST_CASE("DataLoader covers every index once per epoch, in batches of batch_size") {
  manual_seed(3);
  data::DataLoader loader(10, data::DataLoaderOptions(3));
  CHECK(loader.batches_per_epoch() == 4);
  for (int epoch = 0; epoch < 3; ++epoch) {
    std::vector<Tensor> batches = loader.epoch();
    REQUIRE(batches.size() == 4);
    std::multiset<int64_t> seen;
    for (size_t k = 0; k < batches.size(); ++k) {
      CHECK(batches[k].dtype() == kInt64);
      CHECK(batches[k].numel() == (k + 1 < batches.size() ? 3 : 1));
      for (int64_t i : batches[k].to_vector<int64_t>()) seen.insert(i);
    }
    CHECK(seen == std::multiset<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  }
}

TEST_CASE("DataLoader drop_last leaves out the short batch; no shuffle keeps index order") {
  manual_seed(0);
  data::DataLoader dropping(10, data::DataLoaderOptions(4).drop_last(true));
  CHECK(dropping.batches_per_epoch() == 2);
  std::vector<Tensor> b = dropping.epoch();
  REQUIRE(b.size() == 2);
  std::set<int64_t> seen;
  for (const Tensor& t : b)
    for (int64_t i : t.to_vector<int64_t>()) seen.insert(i);
  CHECK(seen.size() == 8);  // 8 distinct indices, each once
  CHECK(*seen.rbegin() <= 9);

  data::DataLoader ordered(5, data::DataLoaderOptions(2).shuffle(false));
  std::vector<Tensor> o = ordered.epoch();
  REQUIRE(o.size() == 3);
  CHECK(o[0].to_vector<int64_t>() == std::vector<int64_t>{0, 1});
  CHECK(o[2].to_vector<int64_t>() == std::vector<int64_t>{4});

  CHECK(data::DataLoader(0, data::DataLoaderOptions(4)).epoch().empty());
  CHECK_THROWS_MU(data::DataLoader(10, data::DataLoaderOptions(0)), "batch_size must be positive, got 0");
  CHECK_THROWS_MU(data::DataLoader(-1, data::DataLoaderOptions(2)), "negative dataset size -1");
}

TEST_CASE("DataLoader order is reproducible with a seed and changes between epochs") {
  auto first_epochs = [](uint64_t seed) {
    manual_seed(seed);
    data::DataLoader loader(100, data::DataLoaderOptions(100));
    std::vector<int64_t> a = loader.epoch()[0].to_vector<int64_t>();
    std::vector<int64_t> b = loader.epoch()[0].to_vector<int64_t>();
    return std::pair{a, b};
  };
  auto [a1, b1] = first_epochs(42);
  auto [a2, b2] = first_epochs(42);
  auto [a3, b3] = first_epochs(43);
  CHECK(a1 == a2);
  CHECK(b1 == b2);
  CHECK(a1 != b1);  // a fresh permutation each epoch
  CHECK(a1 != a3);  // and a different one for another seed
}
