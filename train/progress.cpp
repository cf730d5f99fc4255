#include "train/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>

namespace mu::train {

Progress::Progress(int64_t first_step, int64_t total, std::string unit, int plain_every, int tty)
    : first_(first_step),
      total_(total),
      unit_(std::move(unit)),
      plain_every_(std::max(1, plain_every)),
      tty_(tty < 0 ? ::isatty(STDERR_FILENO) == 1 : tty == 1),
      start_(std::chrono::steady_clock::now()),
      last_(start_),
      last_step_(first_step) {}

std::string Progress::duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  char buf[32];
  const long t = long(std::lround(s));
  if (t < 60)
    std::snprintf(buf, sizeof buf, "%lds", t);
  else if (t < 3600)
    std::snprintf(buf, sizeof buf, "%ldm%02lds", t / 60, t % 60);
  else
    std::snprintf(buf, sizeof buf, "%ldh%02ldm", t / 3600, (t % 3600) / 60);
  return buf;
}

std::string Progress::rate(double r) {
  char buf[32];
  if (!std::isfinite(r) || r < 0) return "?";
  if (r >= 1e6)
    std::snprintf(buf, sizeof buf, "%.2fM", r / 1e6);
  else if (r >= 1e3)
    std::snprintf(buf, sizeof buf, "%.1fk", r / 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.0f", r);
  return buf;
}

std::string Progress::render(int64_t step, double loss) const {
  const double elapsed = std::chrono::duration<double>(last_ - start_).count();
  const int64_t done = step - first_, left = total_ - step;
  const double eta = done > 0 ? elapsed / double(done) * double(left) : NAN;
  char head[96];
  std::snprintf(head, sizeof head, "step %lld/%lld", (long long)step, (long long)total_);
  std::string s = head;
  if (tty_) {  // a 20-cell bar
    const int width = 20;
    const int filled = total_ > 0 ? int(std::clamp<double>(double(step) / double(total_), 0, 1) * width) : width;
    s += " [" + std::string(size_t(filled), '=') + (filled < width ? ">" : "") +
         std::string(size_t(std::max(0, width - filled - 1)), ' ') + "]";
  }
  char tail[160];
  std::snprintf(tail, sizeof tail, " loss %.4f | %s %s/s | ETA %s", loss, rate(units_per_s_).c_str(), unit_.c_str(),
                duration(eta).c_str());
  return s + tail;
}

void Progress::update(int64_t step, double loss, int64_t units) {
  const auto now = std::chrono::steady_clock::now();
  const double dt = std::chrono::duration<double>(now - last_).count();
  const double r = dt > 0 ? double(units) / dt : 0;
  // Exponential smoothing, seeded by the first measurement: one slow step (a checkpoint
  // save, an evaluation) does not swing the figure.
  units_per_s_ = last_step_ == first_ ? r : 0.8 * units_per_s_ + 0.2 * r;
  last_ = now;
  last_step_ = step;
  if (tty_) {
    std::fprintf(stderr, "\r\033[K%s", render(step, loss).c_str());  // \033[K clears the rest of the line
    open_line_ = true;
  } else if (step % plain_every_ == 0 || step == total_) {
    std::fprintf(stderr, "%s\n", render(step, loss).c_str());
  }
  std::fflush(stderr);
}

void Progress::message(const std::string& text) {
  if (open_line_) std::fprintf(stderr, "\r\033[K");
  std::fprintf(stderr, "%s\n", text.c_str());
  open_line_ = false;
  std::fflush(stderr);
}

void Progress::finish() {
  if (open_line_) std::fprintf(stderr, "\n");
  open_line_ = false;
  std::fflush(stderr);
}

}  // namespace mu::train
