// What the PyTorch parity suites share: raw row-major files in a per-process temp dir,
// the comparison measure, and the call to the Python side through Debian's /usr/bin/python3.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>
#include <vector>

#include "helpers.h"

namespace parity {

// "2x3x4", or "scalar" for a 0-dim shape: how the Python side reads a shape.
inline std::string shape_arg(const mu::Shape& shape) {
  if (shape.empty()) return "scalar";
  std::string s;
  for (int64_t d : shape) s += (s.empty() ? "" : "x") + std::to_string(d);
  return s;
}
inline std::string shape_arg(const mu::Tensor& t) { return shape_arg(t.shape()); }

// The tensor's elements, row-major, in its own dtype.
inline void write_raw(const std::filesystem::path& p, const mu::Tensor& t) {
  mu::Tensor c = t.contiguous();
  std::ofstream f(p, std::ios::binary);
  f.write(static_cast<const char*>(c.raw_data()),
          std::streamsize(c.numel() * int64_t(mu::element_size(c.dtype()))));
}

// A float32 file of exactly numel(shape) elements written by the Python side.
inline mu::Tensor read_float(const std::filesystem::path& p, const mu::Shape& shape) {
  std::ifstream f(p, std::ios::binary);
  REQUIRE_MESSAGE(f.good(), "PyTorch produced no file " << p.string());
  std::vector<float> v(size_t(mu::numel_of(shape)));
  f.read(reinterpret_cast<char*>(v.data()), std::streamsize(v.size() * sizeof(float)));
  REQUIRE_MESSAGE(f.gcount() == std::streamsize(v.size() * sizeof(float)), "short file " << p.string());
  return mu::from_vector(v, shape);
}

// max |ours - ref| / max |ref|: relative to the scale of the whole tensor, so entries
// near zero do not dominate.
inline double rel_error(const mu::Tensor& ours, const mu::Tensor& ref) {
  REQUIRE(ours.shape() == ref.shape());
  std::vector<double> a = ours.to_vector<double>(), b = ref.to_vector<double>();
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return scale > 0 ? diff / scale : diff;
}

// <tmp>/mumoe_<tag>_<pid>, created empty.
inline std::filesystem::path make_temp_dir(const std::string& tag) {
  std::filesystem::path dir = std::filesystem::temp_directory_path() / ("mumoe_" + tag + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// Runs tests/parity/<script> on `dir` with /usr/bin/python3 (Debian's python3-torch), or
// the interpreter $MUMOE_PYTHON names; stops the test case when it fails.
inline void run_torch_script(const std::string& script, const std::filesystem::path& dir) {
  const char* src = std::getenv("MUMOE_SOURCE_DIR");
  REQUIRE_MESSAGE(src != nullptr, "MUMOE_SOURCE_DIR is not set (ctest sets it)");
  const char* python = std::getenv("MUMOE_PYTHON");
  std::string cmd = std::string(python && *python ? python : "/usr/bin/python3") + " " + std::string(src) + "/tests/parity/" + script + " " + dir.string();
  int rc = std::system(cmd.c_str());
  REQUIRE_MESSAGE(rc == 0, "the PyTorch side failed (" << cmd << "); is python3-torch installed? "
                               "scripts/setup.sh installs it");
}

// One case of a layer manifest (tests/parity/layer_manifest.py): its line, the input
// files it names, and our values to compare with the Python side's afterwards.
struct CaseWriter {
  std::filesystem::path dir;
  std::ofstream& manifest;
  std::string name;
  std::vector<std::pair<std::string, mu::Tensor>>& expected;  // (file stem, our value)

  void begin(const std::string& kind, const std::string& args) {
    manifest << name << ' ' << kind << ' ' << args << " |";
  }
  void input(const std::string& role, const mu::Tensor& t) {
    std::string file = name + "." + role + ".bin";
    write_raw(dir / file, t.cpu());
    manifest << ' ' << role << '=' << file << ':' << shape_arg(t);
  }
  void expect(const std::string& what, const mu::Tensor& ours) {
    REQUIRE(ours.defined());
    expected.emplace_back(name + "." + what, ours.detach().cpu().clone());
  }
  void end() { manifest << '\n'; }
};

}  // namespace parity
