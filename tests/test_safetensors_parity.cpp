// safetensors parity with PyTorch (Debian's python3-torch through /usr/bin/python3):
// a file written here is parsed in Python (struct + json) and its tensors compared bit
// for bit with raw dumps; a file written from torch tensors in Python's usual layout is
// loaded here and compared bit for bit with torch's raw dumps.
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "helpers.h"
#include "tensor/safetensors.h"

using namespace mu;
namespace fs = std::filesystem;

namespace {

std::string shape_arg(const Shape& shape) {
  if (shape.empty()) return "scalar";
  std::string s;
  for (int64_t d : shape) s += (s.empty() ? "" : "x") + std::to_string(d);
  return s;
}

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
  std::ifstream f(p, std::ios::binary);
  REQUIRE_MESSAGE(f.good(), "missing file " << p.string());
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// The exchange directory, removed however the test ends.
struct ExchangeDir {
  fs::path path = fs::temp_directory_path() / ("mumoe_safetensors_parity_" + std::to_string(::getpid()));
  ExchangeDir() {
    fs::remove_all(path);
    fs::create_directories(path / "mumoe_raw");
  }
  ~ExchangeDir() { fs::remove_all(path); }
};

}  // namespace

TEST_CASE("safetensors files round trip between mumoe and PyTorch") {
  const char* src = std::getenv("MUMOE_SOURCE_DIR");
  REQUIRE_MESSAGE(src != nullptr, "MUMOE_SOURCE_DIR is not set (ctest sets it)");
  ExchangeDir exchange;
  const fs::path& dir = exchange.path;

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
      manifest << name << ' ' << safetensors_dtype(t.dtype()) << ' ' << shape_arg(t.shape()) << '\n';
      std::ofstream raw(dir / "mumoe_raw" / (name + ".bin"), std::ios::binary);
      std::string b = bytes_of(t);
      raw.write(b.data(), std::streamsize(b.size()));
    }
    std::ofstream m(dir / "mumoe_metadata.txt");
    for (const auto& [k, v] : meta) m << k << ' ' << v << '\n';
  }

  std::string cmd = "/usr/bin/python3 " + std::string(src) + "/tests/parity/torch_safetensors.py " + dir.string();
  int rc = std::system(cmd.c_str());
  REQUIRE_MESSAGE(rc == 0, "the PyTorch side failed (" << cmd << "); is python3-torch installed? "
                               "scripts/setup.sh installs it");

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
