// safetensors parity with PyTorch (Debian's python3-torch through /usr/bin/python3):
// a file written here is parsed in Python (struct + json) and its tensors compared bit
// for bit with raw dumps; a file written from torch tensors in Python's usual layout is
// loaded here and compared bit for bit with torch's raw dumps.
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
    // BF16 loads as float32; everything else keeps its dtype.
    CHECK(std::string(safetensors_dtype(t.dtype())) == (dtype == "BF16" ? "F32" : dtype));
    CHECK(bytes_of(t) == read_file(dir / "torch_raw" / (name + ".bin")));
  }
  CHECK(names.size() == 9);
  CHECK(f.tensors.size() == names.size());
  // The data was written in reverse header order, and tensors come back in data order.
  REQUIRE(f.tensors.size() == names.size());
  for (size_t i = 0; i < names.size(); ++i) CHECK(f.tensors[i].first == names[names.size() - 1 - i]);
}
