// safetensors files: round trips, the exact byte layout, atomic writes, and a clear
// mu::Error for every kind of damaged or malformed file.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cstring>
#include <filesystem>

#include "file_helpers.h"
#include "helpers.h"
#include "nn/module.h"
#include "tensor/safetensors.h"

using namespace mu;
namespace fs = std::filesystem;

namespace {

using Named = std::vector<std::pair<std::string, Tensor>>;

// Writes `bytes` to a file of a new name in `dir` (truncating a file in place is slow on
// some file systems, and the loops below write thousands of variants).
std::string write_fresh(const fs::path& dir, const std::string& bytes) {
  static int counter = 0;
  std::string path = (dir / ("variant_" + std::to_string(counter++) + ".safetensors")).string();
  write_bytes(path, bytes);
  return path;
}

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[size_t(i)] = char((v >> (8 * i)) & 0xff);
  return s;
}

// A file assembled by hand: the length, the header padded with spaces, the data.
std::string assemble(std::string header, const std::string& data) {
  header.append((8 - header.size() % 8) % 8, ' ');
  return le64(header.size()) + header + data;
}

template <class T>
std::string bytes_of(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

// Same dtype, shape and elements (exactly).
void check_same(const Tensor& got, const Tensor& want) {
  REQUIRE(got.defined());
  CHECK(got.dtype() == want.dtype());
  REQUIRE(got.shape() == want.shape());
  CHECK(got.to_vector<double>() == want.to_vector<double>());
}

// Files named like the temporaries a save writes.
int temp_files_in(const fs::path& dir) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().find(".tmp.") != std::string::npos) ++n;
  return n;
}

// A valid small file written by save_safetensors, its bytes, and its header length.
struct Sample {
  Named tensors;
  std::string bytes;
  uint64_t header_len;
};

Sample write_sample(const std::string& path) {
  manual_seed(7);
  Sample s;
  s.tensors = {{"weight", randn({3, 4})}, {"bias", randn({4}, kFloat64)}, {"steps", arange(5)},
               {"mask", randn({2, 3}) > 0.0}, {"scale", scalar_tensor(0.5)}};
  save_safetensors(path, s.tensors, {{"step", "42"}, {"note", "sample"}});
  s.bytes = read_bytes(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | uint8_t(s.bytes[size_t(i)]);
  s.header_len = n;
  return s;
}

// 64-bit FNV-1a, the header checksum. Written out here on purpose rather than shared
// with tensor/safetensors.cpp: the byte-layout test needs a reference independent of the
// code it checks.
uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

std::string hex16(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// The data checksum of `bytes`, as tensor/safetensors.h defines it, written out from that
// definition: words assembled byte by byte, one lane at a time.
uint64_t data_hash(const std::string& bytes) {
  auto step = [](uint64_t h, uint64_t w) {
    h = (h ^ w) * 0x9e3779b97f4a7c15ull;
    return h ^ (h >> 32);
  };
  const size_t words = (bytes.size() + 7) / 8;
  auto word = [&](size_t i) {
    uint64_t w = 0;
    for (size_t k = 0; k < 8 && 8 * i + k < bytes.size(); ++k) w |= uint64_t(uint8_t(bytes[8 * i + k])) << (8 * k);
    return w;
  };
  uint64_t out = 0xcbf29ce484222325ull ^ bytes.size();
  for (uint64_t lane = 0; lane < 4; ++lane) {
    uint64_t h = 0xcbf29ce484222325ull + lane;
    for (size_t i = lane; i < words; i += 4) h = step(h, word(i));
    out = step(out, h);
  }
  return out;
}

// A hand-written header made into what save_safetensors would write: padded, and its
// "mumoe.header_checksum" (written as 16 '0's) filled in.
std::string assemble_sealed(std::string header, const std::string& data) {
  header.append((8 - header.size() % 8) % 8, ' ');
  const std::string key = "\"mumoe.header_checksum\":\"";
  size_t at = header.find(key);
  REQUIRE(at != std::string::npos);
  at += key.size();
  header.replace(at, 16, hex16(fnv1a(header)));
  return le64(header.size()) + header + data;
}

}  // namespace

TEST_CASE("round trip of every CPU dtype, 0-dim, empty and non-contiguous tensors") {
  TempDir dir("safetensors");
  manual_seed(1);
  Tensor base = randn({4, 6});
  Named in = {
      {"f32", randn({2, 3})},
      {"f64", randn({5}, kFloat64)},
      {"i64", randint(-1000000000000, 1000000000000, {3, 2})},
      {"bool", randn({7}) > 0.0},
      {"scalar", scalar_tensor(-2.75)},
      {"scalar_i64", scalar_tensor(9, kInt64)},
      {"empty", zeros({0, 4})},
      {"empty_i64", zeros({3, 0}, kInt64)},
      {"transposed", base.t()},                 // strides (1, 6)
      {"narrowed", base.narrow(1, 2, 3)},       // offset and row gaps
      {"expanded", randn({3, 1}).expand({3, 5})},  // stride 0
      {"grad_leaf", randn({2}).requires_grad_()},
  };
  std::map<std::string, std::string> meta = {{"step", "10"}, {"empty", ""}, {"unicode", "µ-MoE ✓"},
                                             {"json-ish", "{\"a\": [1, 2]}\n"}};
  std::string path = dir.file("rt.safetensors");
  save_safetensors(path, in, meta);
  SafetensorsFile f = load_safetensors(path);

  CHECK(f.path == path);
  REQUIRE(f.tensors.size() == in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    INFO("tensor " << in[i].first);
    CHECK(f.tensors[i].first == in[i].first);  // file order is the order given
    check_same(f.tensors[i].second, in[i].second);
    if (in[i].second.numel() > 0) CHECK(f.tensors[i].second.is_contiguous());
    CHECK_FALSE(f.tensors[i].second.requires_grad());
  }
  CHECK(f.metadata == meta);  // the checksum entry is not handed back
  CHECK(f.checksummed);
  CHECK(f.dtypes.at("f32") == "F32");
  CHECK(f.dtypes.at("f64") == "F64");
  CHECK(f.dtypes.at("i64") == "I64");
  CHECK(f.dtypes.at("bool") == "BOOL");
  CHECK(f.contains("scalar"));
  CHECK_FALSE(f.contains("nope"));
  check_same(f.get("scalar"), in[4].second);
  CHECK_THROWS_MU(f.get("nope"), "no tensor named \"nope\"");

  // Saving over an existing file replaces it.
  save_safetensors(path, {{"only", ones({2})}});
  SafetensorsFile g = load_safetensors(path);
  REQUIRE(g.tensors.size() == 1);
  CHECK(g.tensors[0].first == "only");
  CHECK(g.metadata.empty());
}

TEST_CASE("an empty file (no tensors, no metadata) round trips") {
  TempDir dir("safetensors");
  save_safetensors(dir.file("e.safetensors"), {});
  SafetensorsFile f = load_safetensors(dir.file("e.safetensors"));
  CHECK(f.tensors.empty());
  CHECK(f.metadata.empty());
}

TEST_CASE("the byte layout matches one assembled by hand") {
  TempDir dir("safetensors");
  std::string path = dir.file("layout.safetensors");
  save_safetensors(path, {{"a", tensor({1.5, -2.0})}, {"b", scalar_tensor(7, kInt64)}}, {{"k", "v"}});

  // Compact JSON, metadata first, entries in the order given, offsets from the end of the
  // header; padded with spaces to a multiple of 8; the checksum is FNV-1a 64 of the padded
  // header with the checksum's 16 digits read as '0'.
  // The data checksum lists each tensor's data hash in header order.
  std::string a_bytes = bytes_of(std::vector<float>{1.5f, -2.0f}), b_bytes = bytes_of(std::vector<int64_t>{7});
  std::string header =
      "{\"__metadata__\":{\"k\":\"v\",\"mumoe.data_checksum\":\"" + hex16(data_hash(a_bytes)) + " " +
      hex16(data_hash(b_bytes)) +
      "\",\"mumoe.header_checksum\":\"0000000000000000\"},"
      "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
      "\"b\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[8,16]}}";
  header.append((8 - header.size() % 8) % 8, ' ');
  size_t at = header.find("0000000000000000");
  header.replace(at, 16, hex16(fnv1a(header)));
  std::string data = a_bytes + b_bytes;
  // The little-endian encodings spelled out, so the test does not lean on this host's order.
  CHECK(data == std::string("\x00\x00\xc0\x3f\x00\x00\x00\xc0\x07\x00\x00\x00\x00\x00\x00\x00", 16));
  std::string expected = le64(header.size()) + header + data;

  std::string got = read_bytes(path);
  CHECK(header.size() % 8 == 0);
  CHECK(got.size() == expected.size());
  CHECK(got == expected);
}

TEST_CASE("writes are atomic: a failed save leaves the old file and no temporary") {
  TempDir dir("safetensors");
  std::string path = dir.file("ckpt.safetensors");
  save_safetensors(path, {{"w", ones({3})}}, {{"version", "1"}});
  const std::string before = read_bytes(path);

  // A directory that does not exist: the temporary cannot even be created.
  CHECK_THROWS_MU(save_safetensors(dir.file("missing/ckpt.safetensors"), {{"w", ones({3})}}),
                  "cannot create " + dir.file("missing/ckpt.safetensors") + ".tmp.");
  // Tensors that cannot be written: refused before anything touches the disk.
  CHECK_THROWS_MU(save_safetensors(path, {{"w", zeros({3})}, {"u", Tensor()}}), "tensor \"u\" is undefined");
  CHECK_THROWS_MU(save_safetensors(path, {{"w", zeros({3})}, {"w", zeros({3})}}), "two tensors are named \"w\"");
  CHECK_THROWS_MU(save_safetensors(path, {{"", zeros({3})}}), "empty name");
  CHECK_THROWS_MU(save_safetensors(path, {{"__metadata__", zeros({3})}}), "reserved");
  CHECK_THROWS_MU(save_safetensors(path, {{"w", zeros({3})}}, {{"mumoe.header_checksum", "x"}}), "reserved");
  CHECK_THROWS_MU(save_safetensors(path, {{"w", zeros({3})}}, {{"mumoe.data_checksum", "x"}}), "reserved");
  CHECK_THROWS_MU(save_safetensors(path, {{"w", zeros({3})}}, {{"mumoe.note", "x"}}),
                  "metadata key \"mumoe.note\" starts with \"mumoe.\", which is reserved");
  CHECK_THROWS_MU(save_safetensors(path, {{"w\xff", zeros({3})}}), "valid UTF-8");
  CHECK(read_bytes(path) == before);
  CHECK(temp_files_in(dir.path) == 0);

  // The rename fails after the whole temporary was written (the target is a non-empty
  // directory): the temporary is removed and the directory left as it was.
  fs::create_directories(dir.path / "taken");
  write_bytes(dir.file("taken/inside"), "keep");
  CHECK_THROWS_MU(save_safetensors(dir.file("taken"), {{"w", zeros({3})}}), "cannot rename");
  CHECK(temp_files_in(dir.path) == 0);
  CHECK(read_bytes(dir.file("taken/inside")) == "keep");
  CHECK(read_bytes(path) == before);
  CHECK(load_safetensors(path).metadata.at("version") == "1");
}

TEST_CASE("missing files and non-files are named, and a FIFO never blocks the load") {
  TempDir dir("safetensors");
  CHECK_THROWS_MU(load_safetensors(dir.file("absent.safetensors")),
                  "cannot open " + dir.file("absent.safetensors") + ": No such file");
  CHECK_THROWS_MU(load_safetensors(dir.path.string()),
                  "cannot read " + dir.path.string() + ": it is a directory, not a regular file");
  CHECK_THROWS_MU(load_safetensors("/dev/null"), "cannot read /dev/null: it is a character device, not a regular file");
  // A FIFO with no writer: opening it for reading would wait for one. The load runs on
  // another thread so that a hang fails the test; it takes microseconds.
  std::string fifo = dir.file("pipe.safetensors");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  Outcome o = outcome_within([&] { load_safetensors(fifo); }, 2.0, fifo);
  CHECK(o.returned);
  CHECK(o.threw_mu);
  CHECK(o.message == "cannot read " + fifo + ": it is a FIFO (named pipe), not a regular file");
  // A link to the FIFO is followed, and refused as well.
  std::string link = dir.file("link.safetensors");
  fs::create_symlink(fifo, link);
  o = outcome_within([&] { load_safetensors(link); }, 2.0, fifo);
  CHECK(o.returned);
  CHECK(o.message == "cannot read " + link + ": it is a FIFO (named pipe), not a regular file");
}

TEST_CASE("a truncated file is refused at every length") {
  TempDir dir("safetensors");
  Sample s = write_sample(dir.file("full.safetensors"));
  const uint64_t data_start = 8 + s.header_len;
  REQUIRE(s.bytes.size() > data_start);
  for (size_t len = 0; len < s.bytes.size(); ++len) {
    INFO("truncated to " << len << " of " << s.bytes.size() << " bytes");
    std::string cut = write_fresh(dir.path, s.bytes.substr(0, len));
    if (len < 8)
      CHECK_THROWS_MU(load_safetensors(cut), "shorter than the 8-byte header length");
    else if (len < data_start)
      CHECK_THROWS_MU(load_safetensors(cut), "bytes follow (truncated file");
    else
      CHECK_THROWS_MU(load_safetensors(cut), "reach past the end of the");
    // Every message names the file.
    CHECK_THROWS_MU(load_safetensors(cut), cut);
    fs::remove(cut);
  }
}

TEST_CASE("every single-bit flip anywhere in the file is caught") {
  TempDir dir("safetensors");
  Sample s = write_sample(dir.file("full.safetensors"));
  const size_t data_start = 8 + s.header_len;
  REQUIRE(s.bytes.size() > data_start + 100);
  // Where a flip lands decides which check catches it; each region must be hit.
  const size_t header_key = s.bytes.find("\"mumoe.header_checksum\"") + 1;
  const size_t data_key = s.bytes.find("\"mumoe.data_checksum\"") + 1;
  REQUIRE(header_key > 8);
  REQUIRE(data_key > 8);
  std::map<std::string, int> by_check;
  int tried = 0, loaded = 0, other = 0;
  for (size_t byte = 0; byte < s.bytes.size(); ++byte) {
    for (int bit = 0; bit < 8; ++bit, ++tried) {
      std::string b = s.bytes;
      b[byte] = char(uint8_t(b[byte]) ^ (1u << bit));
      std::string bad = write_fresh(dir.path, b);
      try {
        load_safetensors(bad);
        ++loaded;
        FAIL_CHECK("flip of bit " << bit << " of byte " << byte << " loaded without error");
      } catch (const Error& e) {
        std::string m = e.what();
        CHECK(m.find(bad) != std::string::npos);  // names the file
        for (const char* what : {"data checksum mismatch", "header was altered", "but no \"mumoe.header_checksum\"",
                                 "unknown metadata key"})
          if (m.find(what) != std::string::npos) ++by_check[what];
      } catch (...) {
        ++other;
      }
      fs::remove(bad);
    }
  }
  CHECK(tried == int(8 * s.bytes.size()));
  CHECK(loaded == 0);
  CHECK(other == 0);
  // Every data byte's flips are caught by the data checksums.
  CHECK(by_check["data checksum mismatch"] == int(8 * (s.bytes.size() - data_start)));
  CHECK(by_check["header was altered"] > 1000);
  // Flips in the name of the header checksum's key: the data checksums give it away.
  CHECK(by_check["but no \"mumoe.header_checksum\""] > 0);
}

TEST_CASE("a data checksum mismatch names the tensor and its file bytes") {
  TempDir dir("safetensors");
  std::string path = dir.file("d.safetensors");
  save_safetensors(path, {{"first", zeros({2})}, {"w", arange(4)}, {"last", ones({3})}});
  std::string b = read_bytes(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | uint8_t(b[size_t(i)]);
  const size_t w_begin = 8 + n + 8, w_end = w_begin + 32;  // after "first" (2 float32)
  b[w_begin + 17] = char(b[w_begin + 17] ^ 0x10);
  write_bytes(path, b);
  CHECK_THROWS_MU(load_safetensors(path), path + ": tensor \"w\" (file bytes [" + std::to_string(w_begin) + ", " +
                                              std::to_string(w_end) + ")): data checksum mismatch");
}

TEST_CASE("damaged headers give messages that say what is wrong") {
  TempDir dir("safetensors");
  Sample s = write_sample(dir.file("full.safetensors"));
  std::string bad = dir.file("bad.safetensors");
  auto with = [&](size_t at, char c) {
    std::string b = s.bytes;
    b[at] = c;
    write_bytes(bad, b);
  };
  with(8, 'x');  // the opening brace
  CHECK_THROWS_MU(load_safetensors(bad), "the header is not valid JSON (error at file byte 8)");
  with(8 + s.header_len - 1, '}');  // trailing padding turned into a stray brace
  CHECK_THROWS_MU(load_safetensors(bad), "not valid JSON");
  // A digit of the step in the metadata: valid JSON, wrong content, caught by the checksum.
  with(s.bytes.find("\"step\":\"42\"") + 8, '3');
  CHECK_THROWS_MU(load_safetensors(bad), "the header was altered after it was written");
  // A different dtype of the same length.
  with(s.bytes.find("\"F64\"") + 1, 'I');
  CHECK_THROWS_MU(load_safetensors(bad), "header checksum");
  // Huge header length.
  std::string b = s.bytes;
  b[6] = 1;
  write_bytes(bad, b);
  CHECK_THROWS_MU(load_safetensors(bad), "only " + std::to_string(s.bytes.size() - 8) + " bytes follow");
}

TEST_CASE("hand-written headers: each malformation is named") {
  TempDir dir("safetensors");
  std::string p = dir.file("hand.safetensors");
  std::string f32x2 = bytes_of(std::vector<float>{1.0f, 2.0f});
  auto check = [&](const std::string& header, const std::string& data, const std::string& needle) {
    INFO("header " << header);
    write_bytes(p, assemble(header, data));
    CHECK_THROWS_MU(load_safetensors(p), needle);
  };

  // A number beyond double's range is valid JSON syntax that the reader refuses: a
  // mu::Error naming the file and the header's bytes, not the JSON library's exception.
  check("{\"x\":{\"dtype\":\"F32\",\"shape\":[1e999],\"data_offsets\":[0,8]}}", f32x2,
        p + ": the header (file bytes 8 to ");
  check("{\"x\":{\"dtype\":\"F32\",\"shape\":[1e999],\"data_offsets\":[0,8]}}", f32x2, "cannot be read as JSON");

  // A valid foreign file (Python's json.dumps spacing, no checksum) loads.
  write_bytes(p, assemble("{\"__metadata__\": {\"format\": \"pt\"}, \"x\": {\"dtype\": \"F32\", \"shape\": [2], "
                          "\"data_offsets\": [0, 8]}}",
                          f32x2));
  SafetensorsFile ok = load_safetensors(p);
  check_same(ok.get("x"), tensor({1.0, 2.0}));
  CHECK(ok.metadata.at("format") == "pt");
  CHECK_FALSE(ok.checksummed);

  // An empty tensor listed after the one that shares its offset is no overlap.
  write_bytes(p, assemble("{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                          "\"e\":{\"dtype\":\"I64\",\"shape\":[0,3],\"data_offsets\":[0,0]},"
                          "\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,8]}}",
                          f32x2));
  SafetensorsFile empties = load_safetensors(p);
  REQUIRE(empties.tensors.size() == 3);
  CHECK(empties.tensors[0].first == "e");
  CHECK(empties.tensors[1].first == "x");
  CHECK(empties.tensors[2].first == "z");
  CHECK(empties.get("e").shape() == Shape{0, 3});
  check_same(empties.get("x"), tensor({1.0, 2.0}));

  check("{\"x\":{\"dtype\":\"U16\",\"shape\":[2],\"data_offsets\":[0,4]}}", f32x2.substr(0, 4),
        "entry \"x\" has dtype \"U16\", which mumoe cannot hold (supported: F16, BF16, F32, F64, I8, I16, I32, I64, "
        "U8, BOOL)");
  check("{\"x\":{\"dtype\":\"F8_E4M3\",\"shape\":[8],\"data_offsets\":[0,8]}}", f32x2, "dtype \"F8_E4M3\"");
  check("{\"x\":{\"dtype\":4,\"shape\":[2],\"data_offsets\":[0,8]}}", f32x2, "\"dtype\" is not a string");
  check("{\"x\":{\"shape\":[2],\"data_offsets\":[0,8]}}", f32x2, "entry \"x\" has no \"dtype\"");
  check("{\"x\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", f32x2, "entry \"x\" has no \"shape\"");
  check("{\"x\":{\"dtype\":\"F32\",\"shape\":[2]}}", f32x2, "entry \"x\" has no \"data_offsets\"");
  check("{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"crc\":1}}", f32x2, "unexpected key \"crc\"");
  check("{\"x\":[1,2]}", f32x2, "entry \"x\" is not a JSON object");
  check("{\"x\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", f32x2, "holds -2, not a dimension size");
  check("{\"x\":{\"dtype\":\"F32\",\"shape\":[2.5],\"data_offsets\":[0,8]}}", f32x2, "not a dimension size");
  check("{\"x\":{\"dtype\":\"F32\",\"shape\":2,\"data_offsets\":[0,8]}}", f32x2, "\"shape\" is not an array");
  check("{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", f32x2, "not [begin, end]");
  check("{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", f32x2, "end before they begin");
  // Offsets that do not match shape x dtype.
  check("{\"x\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", f32x2,
        "data_offsets [0, 8] span 8 bytes but dtype F32 with shape [3] needs 12");
  check("{\"x\":{\"dtype\":\"F64\",\"shape\":[2],\"data_offsets\":[0,8]}}", f32x2, "needs 16");
  check("{\"x\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4],\"data_offsets\":[0,8]}}", f32x2,
        "needs more than 2^64");
  // Out of range, overlapping, not covering the data region.
  check("{\"x\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", f32x2,
        "data_offsets [0, 16] reach past the end of the 8-byte data region");
  check("{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
        "\"y\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
        f32x2, "entry \"y\" (data_offsets [4, 8]) overlaps entry \"x\", which ends at 8");
  check("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", f32x2, "data bytes [0, 4)");
  check("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", f32x2,
        "the last 4 bytes of the data region");
  check("{}", f32x2, "the last 8 bytes of the data region");
  // Header shape and metadata.
  check("[1,2]", "", "the header is a JSON array, not an object");
  check("", "", "not valid JSON");
  check("{\"__metadata__\":{\"step\":5}}", "", "\"__metadata__\" entry \"step\" is 5, not a string");
  check("{\"__metadata__\":[]}", "", "\"__metadata__\" is not a JSON object");
  check("{\"__metadata__\":{\"mumoe.header_checksum\":\"0123456789abcdef\"}}", "",
        "the header checksum is 0123456789abcdef");
  // mumoe's keys: the data checksums only with the header checksum, no other "mumoe." key.
  check("{\"__metadata__\":{\"mumoe.data_checksum\":\"\"}}", "",
        "the metadata holds \"mumoe.data_checksum\" but no \"mumoe.header_checksum\"");
  check("{\"__metadata__\":{\"mumoe.header_checksun\":\"0123456789abcdef\"}}", "",
        "unknown metadata key \"mumoe.header_checksun\": keys starting with \"mumoe.\" are mumoe's own");
  auto check_sealed = [&](const std::string& header, const std::string& data, const std::string& needle) {
    INFO("header " << header);
    write_bytes(p, assemble_sealed(header, data));
    CHECK_THROWS_MU(load_safetensors(p), needle);
  };
  const std::string x_entry = "\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
  const std::string x_hash = hex16(data_hash(f32x2));
  auto meta = [](const std::string& data_sums, const std::string& extra = "") {
    return "{\"__metadata__\":{" + extra + "\"mumoe.data_checksum\":\"" + data_sums +
           "\",\"mumoe.header_checksum\":\"0000000000000000\"},";
  };
  // Sealed by hand, the reference data hash: loads.
  write_bytes(p, assemble_sealed(meta(x_hash) + x_entry, f32x2));
  SafetensorsFile sealed = load_safetensors(p);
  CHECK(sealed.checksummed);
  CHECK(sealed.data_checksummed);
  CHECK(sealed.metadata.empty());
  check_same(sealed.get("x"), tensor({1.0, 2.0}));
  check_sealed(meta(x_hash, "\"mumoe.extra\":\"1\",") + x_entry, f32x2, "unknown metadata key \"mumoe.extra\"");
  check_sealed(meta(x_hash + " " + x_hash) + x_entry, f32x2,
               "\"mumoe.data_checksum\" is 33 characters long, but 1 tensors need 16");
  check_sealed(meta("") + x_entry, f32x2, "is 0 characters long, but 1 tensors need 16");
  std::string upper = x_hash;
  for (char& c : upper) c = char(std::toupper(c));
  if (upper != x_hash)
    check_sealed(meta(upper) + x_entry, f32x2, "is '" + std::string(1, upper[upper.find_first_of("ABCDEF")]) +
                                                   "', not a lowercase hex digit");
  std::string wrong = x_hash;
  wrong[15] = wrong[15] == '0' ? '1' : '0';
  check_sealed(meta(wrong) + x_entry, f32x2, "tensor \"x\" (file bytes [");
  check_sealed(meta(wrong) + x_entry, f32x2, "data checksum mismatch: the header records " + wrong);
  // Written by mumoe before data checksums (header checksum only): the header is checked.
  write_bytes(p, assemble_sealed("{\"__metadata__\":{\"mumoe.header_checksum\":\"0000000000000000\"}," + x_entry,
                                 f32x2));
  SafetensorsFile legacy = load_safetensors(p);
  CHECK(legacy.checksummed);
  CHECK_FALSE(legacy.data_checksummed);
  check_same(legacy.get("x"), tensor({1.0, 2.0}));
  // Element values that are not of the type.
  check("{\"m\":{\"dtype\":\"BOOL\",\"shape\":[2],\"data_offsets\":[0,2]}}", std::string("\x01\x02", 2),
        "entry \"m\" (BOOL) holds byte 2");
  // An empty shape whose other sizes overflow int64 (no tensor can have its strides).
  check("{\"x\":{\"dtype\":\"F32\",\"shape\":[0,4611686018427387904,4611686018427387904],\"data_offsets\":[0,0]}}",
        "", p + ": entry \"x\": shape [0, 4611686018427387904, 4611686018427387904] has too many elements");
  // A key twice in one object: one reader keeps the first, another the last (here U8 [4]
  // against F32 [1] over the same four bytes), so the file is refused.
  const std::string one = bytes_of(std::vector<float>{1.0f});
  check("{\"w\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
        "\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
        one, p + ": key \"w\" appears twice in the header");
  check("{\"w\":{\"dtype\":\"U8\",\"shape\":[4],\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", one,
        "key \"dtype\" appears twice in entry \"w\"");
  check("{\"__metadata__\":{\"format\":\"pt\",\"format\":\"np\"},"
        "\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
        one, "key \"format\" appears twice in entry \"__metadata__\"");
  // The same key in two different objects is no repeat.
  write_bytes(p, assemble("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                          "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                          f32x2));
  check_same(load_safetensors(p).get("b"), tensor({2.0}));
}

TEST_CASE("BF16 entries load as bfloat16 with their bits, and widen exactly to float32") {
  TempDir dir("safetensors");
  std::string p = dir.file("bf16.safetensors");
  // 1.5, -2, 0.1 rounded to bfloat16 (0x3dcd = 0.10009765625), and 3.0e38.
  std::vector<uint16_t> raw = {0x3fc0, 0xc000, 0x3dcd, 0x7f62};
  write_bytes(p, assemble("{\"h\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[0,8]}}", bytes_of(raw)));
  SafetensorsFile f = load_safetensors(p);
  CHECK(f.dtypes.at("h") == "BF16");
  Tensor h = f.get("h");
  CHECK(h.dtype() == kBFloat16);
  CHECK(h.shape() == Shape{2, 2});
  CHECK(std::memcmp(h.raw_data(), raw.data(), 8) == 0);
  std::vector<float> v = h.to_vector<float>();
  CHECK(v[0] == 1.5f);
  CHECK(v[1] == -2.0f);
  CHECK(v[2] == 0.10009765625f);
  uint32_t bits;
  std::memcpy(&bits, &v[3], 4);
  CHECK(bits == 0x7f620000u);
}

TEST_CASE("CUDA tensors are written from the host; bfloat16 keeps its bits") {
  if (cuda::device_count() == 0) {
    MESSAGE("no CUDA device: only the error for a missing device is checked");
    CHECK_THROWS_MU(ones({2}).to(Device::cuda()), "CUDA");
    return;
  }
  TempDir dir("safetensors");
  std::string p = dir.file("cuda.safetensors");
  manual_seed(3);
  Tensor a = randn({3, 5});
  std::vector<uint16_t> raw = {0x3fc0, 0xc000, 0x3dcd};
  Tensor h = empty({3}, TensorOptions(DType::BFloat16).device(Device::cuda()));
  cuda::memcpy(h.raw_data(), h.device(), raw.data(), Device::cpu(), 6);
  save_safetensors(p, {{"a", a.to(Device::cuda())}, {"h", h}});
  SafetensorsFile f = load_safetensors(p);
  check_same(f.get("a"), a);
  CHECK(f.dtypes.at("h") == "BF16");
  CHECK(f.get("h").to_vector<float>() == std::vector<float>{1.5f, -2.0f, 0.10009765625f});
  std::string bytes = read_bytes(p);
  CHECK(bytes.substr(bytes.size() - 6) == bytes_of(raw));
}

TEST_CASE("loading into a module refuses a shape mismatch") {
  struct Net : nn::Module {
    Tensor w;
    Net() : Module("Net") { w = register_parameter("w", zeros({2, 3})); }
  };
  TempDir dir("safetensors");
  std::string p = dir.file("m.safetensors");
  save_safetensors(p, {{"w", ones({3, 2})}});
  Net net;
  CHECK_THROWS_MU(net.load_state_dict(load_safetensors(p).tensors),
                  "entry \"w\" has shape [3, 2] but the module's tensor has shape [2, 3]");
  save_safetensors(p, {{"w", ones({2, 3})}});
  net.load_state_dict(load_safetensors(p).tensors);
  CHECK(net.w.sum().item() == 6.0);
}

TEST_CASE("a save removes the temporaries of dead saves of the same file, never a live one's") {
  TempDir dir("safetensors");
  const std::string path = dir.file("ckpt.safetensors");
  // A dead process's pid: a child that has exited and been reaped.
  pid_t dead = ::fork();
  REQUIRE(dead >= 0);
  if (dead == 0) ::_exit(0);
  REQUIRE(::waitpid(dead, nullptr, 0) == dead);
  REQUIRE((::kill(dead, 0) == -1 && errno == ESRCH));
  // A live one: a child that waits until it is killed (by the guard, however the test ends).
  struct Child {
    pid_t pid = ::fork();
    ~Child() {
      if (pid > 0 && ::kill(pid, SIGKILL) == 0) ::waitpid(pid, nullptr, 0);
    }
  } child;
  if (child.pid == 0) {
    for (;;) ::pause();
  }
  REQUIRE(child.pid > 0);
  const pid_t live = child.pid;
  const std::string stale = path + ".tmp." + std::to_string(dead);
  const std::string writing = path + ".tmp." + std::to_string(live);
  // Names that are not temporaries of this file's saves, or not of a dead process.
  const std::vector<std::string> kept = {writing,
                                         dir.file("other.safetensors.tmp." + std::to_string(dead)),
                                         path + ".tmp.0" + std::to_string(dead),
                                         path + ".tmp." + std::to_string(dead) + "x",
                                         path + ".tmp.",
                                         path + ".tmp.0"};
  write_bytes(stale, "half a file");
  for (const std::string& k : kept) write_bytes(k, "keep");
  fs::create_directory(path + ".tmp.999999999");  // a directory of that form is not ours

  save_safetensors(path, {{"w", ones({2})}});
  CHECK_FALSE(fs::exists(stale));
  for (const std::string& k : kept) {
    INFO(k);
    CHECK(read_bytes(k) == "keep");
  }
  CHECK(fs::is_directory(path + ".tmp.999999999"));
  CHECK(load_safetensors(path).get("w").to_vector<float>() == std::vector<float>{1, 1});

  // Once the live writer is gone its temporary is stale too, and the next save removes it.
  REQUIRE(::kill(live, SIGKILL) == 0);
  REQUIRE(::waitpid(live, nullptr, 0) == live);
  child.pid = -1;
  save_safetensors(path, {{"w", zeros({2})}});
  CHECK_FALSE(fs::exists(writing));
}
