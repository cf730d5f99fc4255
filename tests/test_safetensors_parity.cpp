// safetensors parity with PyTorch (Debian's python3-torch through /usr/bin/python3):
// a file written here is parsed in Python (struct + json) and its tensors compared bit
// for bit with raw dumps; a file written from torch tensors in Python's usual layout is
// loaded here and compared bit for bit with torch's raw dumps.
#include <cmath>
#include <map>

#include "file_helpers.h"
#include "parity_io.h"
#include "tensor/safetensors.h"

using namespace mu;
using namespace parity;
namespace fs = std::filesystem;

namespace {

Shape parse_shape(const std::string& s) {
  Shape out;
  if (s == "scalar") return out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t x = s.find('x', start);
    out.push_back(std::stoll(s.substr(start, x == std::string::npos ? std::string::npos : x - start)));
    if (x == std::string::npos) break;
    start = x + 1;
  }
  return out;
}

// A tensor's elements as bytes, dense and row-major (what a raw dump holds).
std::string bytes_of(const Tensor& t) {
  Tensor c = t.contiguous();
  return std::string(static_cast<const char*>(c.raw_data()), size_t(c.numel()) * element_size(c.dtype()));
}

std::string read_file(const fs::path& p) {
  REQUIRE_MESSAGE(fs::exists(p), "missing file " << p.string());
  return read_bytes(p);
}

}  // namespace

TEST_CASE("safetensors files round trip between mumoe and PyTorch") {
  // The exchange directory, removed however the test ends.
  TempDir exchange("safetensors_parity");
  const fs::path& dir = exchange.path;
  fs::create_directories(dir / "mumoe_raw");

  // (a) mumoe writes; Python reads.
  manual_seed(2024);
  Tensor base = randn({6, 5});
  std::vector<std::pair<std::string, Tensor>> ours = {
      {"weight", randn({33, 17})},
      {"bias", randn({17}, kFloat64)},
      {"tokens", randint(-5000000000, 5000000000, {4, 3})},
      {"mask", randn({9}) > 0.0},
      {"scalar", scalar_tensor(-0.625)},
      {"scalar_i64", scalar_tensor(-7, kInt64)},
      {"empty", zeros({0, 3})},
      {"transposed", base.t()},
      {"narrowed", base.narrow(0, 1, 3)},
      {"half", randn({3, 4}).to(kFloat16)},
      {"brain", randn({5}).to(kBFloat16)},
      {"i8", randint(-128, 128, {6}).to(kInt8)},
      {"i16", randint(-32768, 32768, {2, 2}).to(kInt16)},
      {"i32", randint(-2147483648LL, 2147483648LL, {3}).to(kInt32)},
      {"u8", randint(0, 256, {5}).to(kUInt8)},
  };
  std::map<std::string, std::string> meta = {{"step", "17"}, {"producer", "mumoe test"}};
  save_safetensors((dir / "mumoe.safetensors").string(), ours, meta);
  {
    std::ofstream manifest(dir / "mumoe_manifest.txt");
    for (const auto& [name, t] : ours) {
      manifest << name << ' ' << safetensors_dtype(t.dtype()) << ' ' << shape_arg(t) << '\n';
      write_raw(dir / "mumoe_raw" / (name + ".bin"), t);
    }
    std::ofstream m(dir / "mumoe_metadata.txt");
    for (const auto& [k, v] : meta) m << k << ' ' << v << '\n';
  }

  run_torch_script("torch_safetensors.py", dir);

  // (b) Python wrote torch.safetensors; mumoe reads it.
  SafetensorsFile f = load_safetensors((dir / "torch.safetensors").string());
  CHECK_FALSE(f.checksummed);
  CHECK(f.metadata.at("format") == "pt");
  CHECK(f.metadata.at("source").rfind("torch ", 0) == 0);
  std::ifstream manifest(dir / "torch_manifest.txt");
  std::string name, dtype, shape;
  std::vector<std::string> names;
  while (manifest >> name >> dtype >> shape) {
    INFO("torch tensor " << name << " " << dtype << " " << shape);
    names.push_back(name);
    REQUIRE(f.contains(name));
    Tensor t = f.get(name);
    CHECK(f.dtypes.at(name) == dtype);
    CHECK(t.shape() == parse_shape(shape));
    // Every entry loads in its stored dtype.
    CHECK(std::string(safetensors_dtype(t.dtype())) == dtype);
    CHECK(bytes_of(t) == read_file(dir / "torch_raw" / (name + ".bin")));
  }
  CHECK(names.size() == 27);
  CHECK(f.tensors.size() == names.size());
  // The data was written in reverse header order, and tensors come back in data order.
  REQUIRE(f.tensors.size() == names.size());
  for (size_t i = 0; i < names.size(); ++i) CHECK(f.tensors[i].first == names[names.size() - 1 - i]);

  // torch's conversions, bit for bit: float32 to float16 and bfloat16 (ties, subnormals,
  // overflow, infinities, NaN of either sign), back to float32, and int64 to the narrow
  // integers (wrapping) and on to float16.
  // NaN payloads are left out: torch's own float32 -> bfloat16 gives 0xffff on its
  // vectorised path and 0x7fc0 on its scalar one. Decoding to float64 is exact and tells
  // every other bit pattern apart (the sign of zero by signbit).
  auto same_bits = [&](const Tensor& ours, const std::string& name) {
    INFO("conversion to " << name);
    Tensor theirs = f.get(name);
    REQUIRE(ours.dtype() == theirs.dtype());
    std::vector<double> a = ours.to_vector<double>(), b = theirs.to_vector<double>();
    REQUIRE(a.size() == b.size());
    int64_t wrong = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      bool same = std::isnan(a[i]) ? std::isnan(b[i]) : a[i] == b[i] && std::signbit(a[i]) == std::signbit(b[i]);
      if (!same && wrong++ < 5) MESSAGE("element " << i << ": ours " << a[i] << ", torch " << b[i]);
    }
    CHECK(wrong == 0);
  };
  Tensor src = f.get("cvt_src");
  same_bits(src.to(kFloat16), "cvt_f16");
  same_bits(src.to(kBFloat16), "cvt_bf16");
  same_bits(f.get("cvt_f16").to(kFloat32), "cvt_f16_wide");
  same_bits(f.get("cvt_bf16").to(kFloat32), "cvt_bf16_wide");
  Tensor ints = f.get("cvt_int_src");
  for (auto [name, dtype] : {std::pair{"i8", kInt8}, {"i16", kInt16}, {"i32", kInt32}, {"u8", kUInt8}}) {
    same_bits(ints.to(dtype), std::string("cvt_") + name);
    same_bits(f.get(std::string("cvt_") + name).to(kFloat16), std::string("cvt_") + name + "_f16");
  }
}
