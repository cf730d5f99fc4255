#include "tensor/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "tensor/atomic_file.h"
#include "tensor/regular_file.h"

namespace mu {

// Tensor memory is written and read as is, and the format is little-endian.
static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");

namespace {

// ordered_json keeps header entries in the order they were written.
using json = nlohmann::ordered_json;

constexpr size_t kChecksumDigits = 16;
constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ull;
// The data hash's multiplier: odd (so multiplying is a bijection) with bits spread over
// the whole word (2^64 divided by the golden ratio).
constexpr uint64_t kDataMul = 0x9e3779b97f4a7c15ull;
// The reference implementation refuses larger headers; so a corrupt length cannot make
// us allocate gigabytes before the JSON is even looked at.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

std::string errno_text() { return std::strerror(errno); }

// 64-bit FNV-1a. Every step is a bijection of the running state, so two headers that
// differ in a single byte always hash differently.
uint64_t fnv1a(const std::string& s) {
  uint64_t h = kFnvOffset;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

// One step of the data hash: for every word w a bijection of h (xor, an odd multiplier,
// and an xorshift, each invertible), and for every h an injection of w. The xorshift
// carries high bits down, so that flips of the top bit of two words of a lane (which
// the multiplication alone would let cancel) change the result.
inline uint64_t data_step(uint64_t h, uint64_t w) {
  h = (h ^ w) * kDataMul;
  return h ^ (h >> 32);
}

// The data hash of the n bytes at p (its definition is in tensor/safetensors.h).
uint64_t data_hash(const void* p, size_t n) {
  const unsigned char* b = static_cast<const unsigned char*>(p);
  uint64_t lane[4] = {kFnvOffset, kFnvOffset + 1, kFnvOffset + 2, kFnvOffset + 3};
  const size_t words = n / 8;
  size_t i = 0;
  // Four independent chains run side by side: the hash keeps up with the disk.
  for (; i + 4 <= words; i += 4) {
    uint64_t w[4];
    std::memcpy(w, b + 8 * i, sizeof w);  // any alignment; little-endian (asserted above)
    for (int k = 0; k < 4; ++k) lane[k] = data_step(lane[k], w[k]);
  }
  for (; i < words; ++i) {
    uint64_t w;
    std::memcpy(&w, b + 8 * i, 8);
    lane[i % 4] = data_step(lane[i % 4], w);
  }
  if (n % 8 != 0) {
    uint64_t w = 0;  // the tail, padded with zero bytes
    std::memcpy(&w, b + 8 * words, n % 8);
    lane[words % 4] = data_step(lane[words % 4], w);
  }
  uint64_t h = kFnvOffset ^ uint64_t(n);
  for (uint64_t l : lane) h = data_step(h, l);
  return h;
}

std::string hex16(uint64_t v) {
  char buf[kChecksumDigits + 1];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// `"<key>":"` as nlohmann's compact dump writes it, for a checksum key. Inside any other
// JSON string its quotes would be escaped, so this text occurs only as the real key.
std::string value_prefix(const char* key) { return std::string("\"") + key + "\":\""; }
std::string checksum_prefix() { return value_prefix(kSafetensorsChecksumKey); }

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

// "mumoe.data_checksum" for `n` tensors: n groups of 16 digits, single spaces between.
constexpr size_t data_checksums_size(size_t n) { return n == 0 ? 0 : n * (kChecksumDigits + 1) - 1; }

// The hashes "mumoe.data_checksum" lists, one per tensor in header order; a value of
// the wrong form throws (mumoe writes none such; under a matching header checksum it
// comes from another writer).
std::vector<uint64_t> parse_data_checksums(const std::string& file, const std::string& v, size_t n) {
  std::string where = file + ": \"" + kSafetensorsDataChecksumKey + "\"";
  MU_CHECK(v.size() == data_checksums_size(n), where, " is ", v.size(), " characters long, but ", n,
           " tensors need ", data_checksums_size(n), " (16 hex digits each, separated by spaces)");
  std::vector<uint64_t> out(n);
  for (size_t i = 0; i < n; ++i) {
    const size_t at = i * (kChecksumDigits + 1);
    MU_CHECK(i == 0 || v[at - 1] == ' ', where, ": character ", at - 1, " is '", v[at - 1], "', not a space");
    uint64_t h = 0;
    for (size_t k = at; k < at + kChecksumDigits; ++k) {
      const char c = v[k];
      const bool digit = c >= '0' && c <= '9', letter = c >= 'a' && c <= 'f';
      MU_CHECK(digit || letter, where, ": character ", k, " is '", c, "', not a lowercase hex digit");
      h = h << 4 | uint64_t(digit ? c - '0' : c - 'a' + 10);
    }
    out[i] = h;
  }
  return out;
}

// The hash of `header` with the checksum's digits (starting at `at`) read as zeros:
// the writer hashes with zeros there, then writes the digits in.
std::string header_hash(std::string header, size_t at) {
  header.replace(at, kChecksumDigits, kChecksumDigits, '0');
  return hex16(fnv1a(header));
}

// The format's dtype names for ours, every dtype having one.
constexpr std::pair<const char*, DType> kDtypeNames[] = {
    {"F16", kFloat16}, {"BF16", kBFloat16}, {"F32", kFloat32}, {"F64", kFloat64}, {"I8", kInt8},
    {"I16", kInt16},   {"I32", kInt32},     {"I64", kInt64},   {"U8", kUInt8},    {"BOOL", kBool}};

bool parse_dtype(const std::string& s, DType& out) {
  for (const auto& [name, t] : kDtypeNames)
    if (s == name) {
      out = t;
      return true;
    }
  return false;
}

std::string supported_dtypes() {
  std::string list;
  for (const auto& [name, t] : kDtypeNames) list += (list.empty() ? "" : ", ") + std::string(name);
  return list;
}

// A file descriptor closed on scope exit.
struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
};

// Reads exactly n bytes at `offset`; a short read means the file shrank under us.
void read_all(int fd, void* data, size_t n, uint64_t offset, const std::string& file) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    ssize_t k = ::pread(fd, p, n, off_t(offset));
    if (k < 0 && errno == EINTR) continue;
    MU_CHECK(k >= 0, "cannot read ", file, ": ", errno_text());
    MU_CHECK(k > 0, file, ": unexpected end of file at byte ", offset, " (was it truncated while being read?)");
    p += k;
    n -= size_t(k);
    offset += uint64_t(k);
  }
}

// Writes one tensor's elements, dense and row-major; returns the data hash of the bytes
// written (hashed from the very buffer that went to the file).
uint64_t write_tensor(AtomicFile& out, const Tensor& t) {
  // detach: no autograd node for this copy; contiguous: no copy when already dense.
  Tensor d = t.detach().contiguous();
  size_t nbytes = size_t(d.numel()) * element_size(d.dtype());
  if (nbytes == 0) return data_hash(nullptr, 0);
  if (d.device().is_cpu()) {
    out.write(d.raw_data(), nbytes);
    return data_hash(d.raw_data(), nbytes);
  }
  // Device memory goes through a host buffer, as raw bytes.
  std::vector<char> host(nbytes);
  cuda::memcpy(host.data(), Device::cpu(), d.raw_data(), d.device(), nbytes);
  out.write(host.data(), nbytes);
  return data_hash(host.data(), nbytes);
}


struct Entry {
  std::string name, dtype_str;
  DType dtype;
  Shape shape;
  uint64_t begin, end;
  size_t header_index = 0;  // its place among the entries in the header
};

uint64_t to_u64(const json& v) { return v.get<uint64_t>(); }

Entry parse_entry(const std::string& file, const std::string& name, const json& v, uint64_t data_size,
                  uint64_t data_start) {
  std::string where = file + ": entry \"" + name + "\"";
  MU_CHECK(v.is_object(), where, " is not a JSON object");
  for (const auto& [key, value] : v.items())
    MU_CHECK(key == "dtype" || key == "shape" || key == "data_offsets", where, " has an unexpected key \"", key,
             "\"");
  for (const char* key : {"dtype", "shape", "data_offsets"}) MU_CHECK(v.contains(key), where, " has no \"", key, "\"");

  Entry e;
  e.name = name;
  const json& dt = v["dtype"];
  MU_CHECK(dt.is_string(), where, ": \"dtype\" is not a string");
  e.dtype_str = dt.get<std::string>();
  MU_CHECK(parse_dtype(e.dtype_str, e.dtype), where, " has dtype \"", e.dtype_str, "\", which mumoe cannot hold (",
           "supported: ", supported_dtypes(), ")");

  const json& sh = v["shape"];
  MU_CHECK(sh.is_array(), where, ": \"shape\" is not an array");
  // Bytes needed, built up with overflow checks: a corrupt shape may hold huge numbers.
  uint64_t numel = 1;
  bool overflow = false;
  for (const json& d : sh) {
    // nlohmann parses non-negative integers as unsigned; negatives and fractions fail here.
    MU_CHECK(d.is_number_unsigned() && to_u64(d) <= uint64_t(INT64_MAX), where, ": shape ", sh.dump(),
             " holds ", d.dump(), ", not a dimension size");
    e.shape.push_back(int64_t(to_u64(d)));
    overflow = overflow || __builtin_mul_overflow(numel, to_u64(d), &numel);
  }
  uint64_t nbytes = 0;
  overflow = overflow || __builtin_mul_overflow(numel, uint64_t(element_size(e.dtype)), &nbytes);

  const json& off = v["data_offsets"];
  MU_CHECK(off.is_array() && off.size() == 2 && off[0].is_number_unsigned() && off[1].is_number_unsigned(), where,
           ": \"data_offsets\" is ", off.dump(), ", not [begin, end]");
  e.begin = to_u64(off[0]);
  e.end = to_u64(off[1]);
  MU_CHECK(e.begin <= e.end, where, ": data_offsets [", e.begin, ", ", e.end, "] end before they begin");
  MU_CHECK(e.end <= data_size, where, ": data_offsets [", e.begin, ", ", e.end, "] reach past the end of the ",
           data_size, "-byte data region (file byte ", data_start + e.end, " of ", data_start + data_size,
           "; truncated file?)");
  MU_CHECK(!overflow && e.end - e.begin == nbytes, where, ": data_offsets [", e.begin, ", ", e.end, "] span ",
           e.end - e.begin, " bytes but dtype ", e.dtype_str, " with shape ", sh.dump(), " needs ",
           overflow ? std::string("more than 2^64") : std::to_string(nbytes));
  // Reached by a huge shape only when it is empty (else the check above fails): a size 0
  // makes no elements, but the strides are still products of the other sizes and must fit
  // int64 as for any tensor ([0, 2^62, 2^62] has none). The tensors' own check, named here.
  numel_of(e.shape, where.c_str());
  return e;
}

// Reads an entry's elements into a new CPU tensor, checking them against `hash` (the data
// hash the header records for them) unless it is null.
Tensor read_entry(int fd, const Entry& e, uint64_t data_start, const std::string& file, const uint64_t* hash) {
  uint64_t at = data_start + e.begin;
  size_t nbytes = size_t(e.end - e.begin);
  Tensor t = empty(e.shape, e.dtype);
  if (nbytes > 0) read_all(fd, t.raw_data(), nbytes, at, file);
  if (hash != nullptr) {
    const uint64_t got = data_hash(nbytes > 0 ? t.raw_data() : nullptr, nbytes);
    MU_CHECK(got == *hash, file, ": tensor \"", e.name, "\" (file bytes [", at, ", ", at + nbytes,
             ")): data checksum mismatch: the header records ", hex16(*hash), " but the bytes hash to ", hex16(got),
             ": the data was altered after it was written (a flipped bit?)");
  }
  if (e.dtype == kBool) {
    // Any byte but 0 and 1 is not a bool; as a C++ bool it would be undefined behaviour.
    const unsigned char* b = static_cast<const unsigned char*>(t.raw_data());
    for (size_t i = 0; i < nbytes; ++i)
      MU_CHECK(b[i] <= 1, file, ": entry \"", e.name, "\" (BOOL) holds byte ", int(b[i]), " at file byte ", at + i,
               "; only 0 and 1 are booleans");
  }
  return t;
}

}  // namespace

const char* safetensors_dtype(DType t) {
  for (const auto& [name, d] : kDtypeNames)
    if (d == t) return name;
  MU_FAIL("safetensors_dtype: unknown dtype ", int(t));
}

bool SafetensorsFile::contains(const std::string& name) const {
  for (const auto& [n, t] : tensors)
    if (n == name) return true;
  return false;
}

Tensor SafetensorsFile::get(const std::string& name) const {
  for (const auto& [n, t] : tensors)
    if (n == name) return t;
  MU_FAIL(path, ": no tensor named \"", name, "\"");
}

void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::string what = "save_safetensors " + path;
  // Everything that can be refused is checked before a byte is written.
  std::set<std::string> seen;
  for (const auto& [name, t] : tensors) {
    MU_CHECK(!name.empty(), what, ": a tensor has an empty name");
    MU_CHECK(name != "__metadata__", what, ": \"__metadata__\" is reserved for the metadata, not a tensor name");
    MU_CHECK(seen.insert(name).second, what, ": two tensors are named \"", name, "\"");
    MU_CHECK(t.defined(), what, ": tensor \"", name, "\" is undefined");
  }
  for (const auto& [k, v] : metadata)
    MU_CHECK(!starts_with(k, kSafetensorsReservedPrefix), what, ": metadata key \"", k, "\" starts with \"",
             kSafetensorsReservedPrefix, "\", which is reserved for mumoe's own entries (the checksums)");

  json header = json::object();
  json meta = json::object();
  for (const auto& [k, v] : metadata) meta[k] = v;
  // Placeholders of the final length, filled in once the data has been written and hashed.
  std::string data_sums;
  for (size_t i = 0; i < tensors.size(); ++i) data_sums += (i ? " " : "") + std::string(kChecksumDigits, '0');
  meta[kSafetensorsDataChecksumKey] = data_sums;
  meta[kSafetensorsChecksumKey] = std::string(kChecksumDigits, '0');
  header["__metadata__"] = meta;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    uint64_t nbytes = uint64_t(t.numel()) * element_size(t.dtype());
    header[name] = {{"dtype", safetensors_dtype(t.dtype())},
                    {"shape", t.shape()},
                    {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const json::exception& e) {
    MU_FAIL(what, ": cannot encode the header (names and metadata must be valid UTF-8): ", e.what());
  }
  // Padding makes the data region start 8-byte aligned, as the format asks.
  text.append((8 - text.size() % 8) % 8, ' ');
  const std::string data_prefix = value_prefix(kSafetensorsDataChecksumKey);
  const size_t data_at = text.find(data_prefix) + data_prefix.size();
  const size_t header_at = text.find(checksum_prefix()) + checksum_prefix().size();

  AtomicFile out(path, what);
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(uint64_t(text.size()) >> (8 * i));
  out.write(len, 8);
  out.write(text.data(), text.size());  // with placeholders, rewritten below
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, t] = tensors[i];
    try {
      text.replace(data_at + i * (kChecksumDigits + 1), kChecksumDigits, hex16(write_tensor(out, t)));
    } catch (const Error& e) {
      // Say which tensor failed (a CUDA copy, the disk filling up); the temporary goes.
      MU_FAIL(what, ": tensor \"", name, "\": ", e.what());
    }
  }
  // The header hash covers the data hashes just filled in; same length as the placeholders.
  text.replace(header_at, kChecksumDigits, header_hash(text, header_at));
  out.write_at(text.data(), text.size(), 8);
  out.commit();
}

SafetensorsFile load_safetensors(const std::string& path) {
  Fd fd(open_regular_file(path));
  struct stat st;
  MU_CHECK(::fstat(fd.fd, &st) == 0, "cannot stat ", path, ": ", errno_text());
  const uint64_t size = uint64_t(st.st_size);
  MU_CHECK(size >= 8, path, ": the file is ", size,
           " bytes long, shorter than the 8-byte header length (truncated, or not a safetensors file)");

  unsigned char len[8];
  read_all(fd.fd, len, 8, 0, path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
  MU_CHECK(n <= size - 8, path, ": the header length in bytes 0-7 is ", n, " but only ", size - 8,
           " bytes follow (truncated file, or a corrupt length)");
  MU_CHECK(n <= kMaxHeaderBytes, path, ": the header length in bytes 0-7 is ", n, ", over the format's limit of ",
           kMaxHeaderBytes);
  std::string text(n, '\0');
  read_all(fd.fd, text.data(), n, 8, path);

  json header;
  // The format forbids a key twice in one object; JSON parsers keep the first or the
  // last, so such a header can show one tensor to a checker and another to a loader.
  // The parse records the first repeat and the tensor entry it is in.
  std::vector<std::set<std::string>> open_objects;
  std::string entry, repeated, repeated_in;
  const json::parser_callback_t note_keys = [&](int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) open_objects.emplace_back();
    if (event == json::parse_event_t::object_end && !open_objects.empty()) open_objects.pop_back();
    if (event == json::parse_event_t::key && !open_objects.empty()) {
      const std::string key = parsed.get<std::string>();
      if (depth == 1) entry = key;
      if (!open_objects.back().insert(key).second && repeated.empty()) {
        repeated = key;
        repeated_in = depth == 1 ? std::string("the header") : "entry \"" + entry + "\"";
      }
    }
    return true;
  };
  try {
    header = json::parse(text, note_keys);
  } catch (const json::parse_error& e) {
    // e.byte counts from 1 within the header, which starts at file byte 8.
    MU_FAIL(path, ": the header is not valid JSON (error at file byte ", 8 + e.byte - 1, "): ", e.what());
  } catch (const json::exception& e) {  // a number beyond double's range (out_of_range 406), ...
    MU_FAIL(path, ": the header (file bytes 8 to ", 8 + n - 1, ") cannot be read as JSON: ", e.what());
  }
  MU_CHECK(header.is_object(), path, ": the header is a JSON ", header.type_name(), ", not an object");
  MU_CHECK(repeated.empty(), path, ": key \"", repeated, "\" appears twice in ", repeated_in,
           " (the format allows each key once: readers disagree on which one counts)");

  SafetensorsFile out;
  out.path = path;
  if (header.contains("__metadata__")) {
    const json& meta = header["__metadata__"];
    MU_CHECK(meta.is_object(), path, ": \"__metadata__\" is not a JSON object");
    for (const auto& [k, v] : meta.items()) {
      MU_CHECK(v.is_string(), path, ": \"__metadata__\" entry \"", k, "\" is ", v.dump(), ", not a string");
      out.metadata[k] = v.get<std::string>();
    }
  }
  // Checked before the entries: when the hash disagrees, a corrupt header is the cause of
  // whatever else looks wrong.
  if (auto it = out.metadata.find(kSafetensorsChecksumKey); it != out.metadata.end()) {
    size_t at = text.find(checksum_prefix());
    MU_CHECK(at != std::string::npos, path, ": the header checksum entry is not where it was written");
    at += checksum_prefix().size();
    std::string computed = at + kChecksumDigits <= text.size() ? header_hash(text, at) : "";
    MU_CHECK(computed == it->second, path, ": the header checksum is ", it->second, " but the header hashes to ",
             computed, ": the header was altered after it was written (a flipped bit, or an edit by a tool that "
             "kept this file's metadata)");
    out.metadata.erase(it);
    out.checksummed = true;
  }
  // The header checksum covers every key but cannot vouch for its own: a damaged name of
  // it leaves a file that looks unchecked. mumoe writes the data checksums with it, so
  // they betray it; and no other key may claim mumoe's prefix.
  for (const auto& [k, v] : out.metadata)
    MU_CHECK(!starts_with(k, kSafetensorsReservedPrefix) || k == kSafetensorsDataChecksumKey, path,
             ": unknown metadata key \"", k, "\": keys starting with \"", kSafetensorsReservedPrefix,
             "\" are mumoe's own (a damaged header, or a file from a newer mumoe)");
  std::string data_sums;
  if (auto it = out.metadata.find(kSafetensorsDataChecksumKey); it != out.metadata.end()) {
    MU_CHECK(out.checksummed, path, ": the metadata holds \"", kSafetensorsDataChecksumKey, "\" but no \"",
             kSafetensorsChecksumKey, "\", which mumoe always writes with it: the header is damaged (the name of "
             "the header checksum's key altered?)");
    data_sums = it->second;
    out.metadata.erase(it);
    out.data_checksummed = true;
  }

  const uint64_t data_start = 8 + n, data_size = size - data_start;
  std::vector<Entry> entries;
  for (const auto& [name, v] : header.items())
    if (name != "__metadata__") {
      entries.push_back(parse_entry(path, name, v, data_size, data_start));
      entries.back().header_index = entries.size() - 1;
    }
  std::vector<uint64_t> hashes;
  if (out.data_checksummed) hashes = parse_data_checksums(path, data_sums, entries.size());
  // Data order. An empty tensor shares its offset with the next one and goes first (by
  // end); equal entries (several empty ones) keep header order.
  std::stable_sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t covered = 0;  // the data region is covered up to here
  const Entry* prev = nullptr;
  for (const Entry& e : entries) {
    MU_CHECK(e.begin >= covered, path, ": entry \"", e.name, "\" (data_offsets [", e.begin, ", ", e.end,
             "]) overlaps entry \"", prev ? prev->name : "", "\", which ends at ", covered);
    MU_CHECK(e.begin == covered, path, ": data bytes [", covered, ", ", e.begin, ") (file bytes ", data_start + covered,
             " to ", data_start + e.begin, ") belong to no entry");
    covered = e.end;
    prev = &e;
  }
  MU_CHECK(covered == data_size, path, ": the last ", data_size - covered, " bytes of the data region (from file byte ",
           data_start + covered, ") belong to no entry");

  for (const Entry& e : entries) {
    const uint64_t* hash = out.data_checksummed ? &hashes[e.header_index] : nullptr;
    out.tensors.emplace_back(e.name, read_entry(fd.fd, e, data_start, path, hash));
    out.dtypes[e.name] = e.dtype_str;
  }
  return out;
}

}  // namespace mu
