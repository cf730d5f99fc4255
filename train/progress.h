// Progress of a training run on stderr. On a terminal: one line redrawn in place,
//   step 120/1000 [=====>              ] loss 3.2140 | 12.3k tok/s | ETA 3m12s
// elsewhere (a log file, CI): a plain line every `plain_every` steps, never a '\r'.
#pragma once
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace mu::train {

class Progress {
 public:
  // total: the last step; unit: what throughput counts ("tok", "img"); tty: draw in place
  // (default: whether stderr is a terminal).
  Progress(int64_t first_step, int64_t total, std::string unit, int plain_every = 10, int tty = -1);
  // After step `step` (1-based count of steps done) of `units` units with this loss.
  void update(int64_t step, double loss, int64_t units);
  // A line of its own (evaluation results, checkpoint saved), not overwritten by the bar.
  void message(const std::string& text);
  // Ends the bar's line.
  void finish();

  // "3m12s", "1h02m", "45s": a duration for people.
  static std::string duration(double seconds);
  // "12.3k", "1.20M", "950": a rate for people.
  static std::string rate(double per_second);

 private:
  std::string render(int64_t step, double loss) const;

  int64_t first_, total_;
  std::string unit_;
  int plain_every_;
  bool tty_;
  bool open_line_ = false;  // a bar is drawn and not yet ended
  std::chrono::steady_clock::time_point start_, last_;
  double units_per_s_ = 0;  // smoothed
  int64_t last_step_ = 0;
};

}  // namespace mu::train
