// What every benchmark program shares: its command line (--reps, --warmup and its own
// options) and the timing of a step: warm-up, repeated runs, and the median, minimum and
// maximum in milliseconds (the statistics torch_reference.py reports).
#pragma once
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "ops/profile.h"
#include "tensor/allocator.h"

namespace mu::bench {

// "--name value" pairs. --reps and --warmup always; the program's own options are
// declared with their defaults. An unknown option, a missing value, a count that is not
// a positive integer or a flag that is not 0 or 1 ends the program with a usage line (exit
// status 2).
class Options {
 public:
  Options(const char* program, int reps, int warmup, std::vector<std::pair<std::string, std::string>> own = {})
      : program_(program), own_(own.begin(), own.end()), reps(reps), warmup(warmup) {}

  void parse(int argc, char** argv) {
    for (int i = 1; i < argc; i += 2) {
      std::string k = argv[i];
      if (k.rfind("--", 0) != 0 || i + 1 >= argc) usage(("bad or incomplete option " + k).c_str());
      std::string name = k.substr(2), value = argv[i + 1];
      if (name == "reps") reps = int(count(name, value));
      else if (name == "warmup") warmup = int(count(name, value, true));
      else if (own_.count(name)) own_[name] = value;
      else usage(("unknown option " + k).c_str());
    }
  }
  const std::string& str(const std::string& name) const { return own_.at(name); }
  int64_t integer(const std::string& name) const { return count(name, own_.at(name)); }
  // An option that is 0 or 1.
  bool flag(const std::string& name) const {
    const std::string& v = own_.at(name);
    if (v != "0" && v != "1") usage(("--" + name + " " + v + " is not 0 or 1").c_str());
    return v == "1";
  }

 private:
  const char* program_;
  std::map<std::string, std::string> own_;

  int64_t count(const std::string& name, const std::string& value, bool zero_ok = false) const {
    char* end = nullptr;
    long long v = std::strtoll(value.c_str(), &end, 10);
    if (value.empty() || *end != 0 || v < (zero_ok ? 0 : 1)) usage(("--" + name + " " + value + " is not a count").c_str());
    return v;
  }
  [[noreturn]] void usage(const char* why) const {
    std::string opts = "--reps N --warmup N";
    for (const auto& [k, v] : own_) opts += " --" + k + " " + v;
    std::fprintf(stderr, "%s: %s (options: %s)\n", program_, why, opts.c_str());
    std::exit(2);
  }

 public:
  int reps, warmup;
};

struct Timing {
  double median_ms = 0, min_ms = 0, max_ms = 0;
};

// Under MUMOE_PROFILE (ops/profile.h) the kernel table covers the timed steps only: the
// warm-up's first-touch page faults and one-off setup would otherwise inflate every row.
template <class F>
Timing time_it(F&& step, int reps, int warmup) {
  for (int i = 0; i < warmup; ++i) step();
  if (profile::enabled()) profile::reset();
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    step();
    auto t1 = std::chrono::steady_clock::now();
    ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  size_t n = ms.size();
  // The median as Python's statistics.median: the mean of the middle two for even counts.
  double median = n % 2 ? ms[n / 2] : (ms[n / 2 - 1] + ms[n / 2]) / 2;
  return {median, ms.front(), ms.back()};
}

// One result line of a training-step benchmark, in torch_reference.py's shape; with
// `peak_bytes` (>= 0) also the most bytes the step's tensors held at once.
inline void print_step_result(const std::string& workload, const Timing& t, int threads, long long params,
                              long long peak_bytes = -1) {
  std::printf("{\"workload\": \"%s\", \"impl\": \"mumoe\", \"threads\": %d, \"median_ms\": %.3f, \"min_ms\": %.3f, "
              "\"max_ms\": %.3f, \"params\": %lld",
              workload.c_str(), threads, t.median_ms, t.min_ms, t.max_ms, params);
  if (peak_bytes >= 0) std::printf(", \"peak_tensor_mib\": %.1f", double(peak_bytes) / (1 << 20));
  std::printf("}\n");
  std::fflush(stdout);
}

// One result line of a memory-bound kernel's benchmark: its times, `bytes` (the least a
// call must move) and the rate they imply at the median, then `extra` (further JSON
// fields, each written as ", \"name\": value").
inline void print_bytes_result(const std::string& workload, const Timing& t, int threads, double bytes,
                               const std::string& impl = "mumoe", const std::string& extra = "") {
  std::printf("{\"workload\": \"%s\", \"impl\": \"%s\", \"threads\": %d, \"median_ms\": %.3f, \"min_ms\": %.3f, "
              "\"max_ms\": %.3f, \"bytes\": %.0f, \"gbps\": %.2f%s}\n",
              workload.c_str(), impl.c_str(), threads, t.median_ms, t.min_ms, t.max_ms, bytes,
              bytes / (t.median_ms * 1e-3) / 1e9, extra.c_str());
  std::fflush(stdout);
}

// The most bytes host tensors held at once during one call of `step` (the allocator's
// count of live tensors, caches excluded).
template <class F>
long long peak_tensor_bytes(F&& step) {
  cpu_allocator::reset_peak();
  step();
  return (long long)cpu_allocator::stats().peak_bytes;
}

}  // namespace mu::bench
