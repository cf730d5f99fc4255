// A JSON-lines metrics log: one object per line, flushed as written, so a run's progress
// can be followed (tail -f) and plotted while it trains.
//   {"kind":"train","step":120,"loss":3.214,"lr":0.0006,"time_s":81.2}
//   {"kind":"eval","step":200,"val_loss":3.101,"time_s":135.0}
// On resume the lines of steps after the checkpoint's (written by the run that stopped
// after saving it) are dropped, so the log reads as one run that never stopped.
#pragma once
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace mu::train {

class MetricsLog {
 public:
  // A new log at `path` (an existing file is replaced), or, with resume_step >= 0, the
  // existing one cut back to the lines of steps <= resume_step and continued.
  explicit MetricsLog(const std::string& path, int64_t resume_step = -1);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;

  // One line: kind, step, the fields in order, and the seconds since the log was opened.
  // Non-finite values are written as null (JSON has no NaN).
  void write(const std::string& kind, int64_t step, const std::vector<std::pair<std::string, double>>& fields);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace mu::train
