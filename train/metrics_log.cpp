#include "train/metrics_log.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>

#include "tensor/atomic_file.h"
#include "tensor/error.h"

namespace mu::train {

namespace {

// Keeps the lines of `path` whose "step" is <= last (and any line that is not a JSON
// object with a step, which a person may have added), rewritten atomically so a crash
// leaves the old log or the new one, never half of one.
void cut_back(const std::string& path, int64_t last) {
  std::ifstream in(path);
  if (!in) return;  // nothing logged yet
  std::string kept, line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    // A torn last line (the run was killed mid-write) is not valid JSON: dropped.
    if (j.is_discarded()) continue;
    if (j.is_object() && j.contains("step") && j["step"].is_number_integer() && j["step"].get<int64_t>() > last)
      continue;
    kept += line + "\n";
  }
  in.close();
  write_file_atomically(path, {{kept.data(), kept.size()}}, "metrics log " + path);
}

}  // namespace

MetricsLog::MetricsLog(const std::string& path, int64_t resume_step)
    : path_(path), start_(std::chrono::steady_clock::now()) {
  if (resume_step >= 0) cut_back(path, resume_step);
  file_ = std::fopen(path.c_str(), resume_step >= 0 ? "a" : "w");
  MU_CHECK(file_ != nullptr, "metrics log ", path, ": cannot open for writing (", std::strerror(errno), ")");
}

MetricsLog::~MetricsLog() {
  if (file_) std::fclose(file_);
}

void MetricsLog::write(const std::string& kind, int64_t step, const std::vector<std::pair<std::string, double>>& fields) {
  nlohmann::ordered_json j;
  j["kind"] = kind;
  j["step"] = step;
  for (const auto& [k, v] : fields) {
    if (std::isfinite(v))
      j[k] = v;
    else
      j[k] = nullptr;
  }
  j["time_s"] = std::round(std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count() * 1000) / 1000;
  const std::string line = j.dump() + "\n";
  MU_CHECK(std::fwrite(line.data(), 1, line.size(), file_) == line.size() && std::fflush(file_) == 0, "metrics log ",
           path_, ": write failed (", std::strerror(errno), ")");
}

}  // namespace mu::train
