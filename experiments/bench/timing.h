// Timing for the benchmark programs: warm-up, repeated runs, and the median, minimum
// and maximum in milliseconds (the statistics torch_reference.py reports).
#pragma once
#include <algorithm>
#include <chrono>
#include <vector>

namespace mu::bench {

struct Timing {
  double median_ms = 0, min_ms = 0, max_ms = 0;
};

template <class F>
Timing time_it(F&& step, int reps, int warmup) {
  for (int i = 0; i < warmup; ++i) step();
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

}  // namespace mu::bench
