// The kernel profiler (ops/profile.h): spans recorded by the kernel tables, resolved and
// summed when a report is asked for.
#include "ops/profile.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <utility>

#include "tensor/cuda.h"

namespace mu::profile {

namespace detail {
bool active = false;
}

namespace {

// One finished span: CPU spans carry their duration, CUDA spans their two events, whose
// time is read only at report() (reading it earlier would wait for the device).
struct Record {
  const char* kernel;
  DeviceType device;
  double ms;            // CPU
  void* start_event;    // CUDA
  void* end_event;
};

std::mutex mu;
std::vector<Record> records;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void release(std::vector<Record>& rs) {
  for (Record& r : rs) {
    cuda::event_destroy(r.start_event);
    cuda::event_destroy(r.end_event);
  }
  rs.clear();
}

}  // namespace

namespace detail {

Span::Span(const char* kernel, Device device) : kernel_(kernel), device_(device) {
  if (device.is_cuda())
    start_event_ = cuda::event_record(device.index);
  else
    start_ns_ = now_ns();
}

Span::~Span() {
  Record r{kernel_, device_.type, 0, nullptr, nullptr};
  if (device_.is_cuda()) {
    r.start_event = start_event_;
    try {
      r.end_event = cuda::event_record(device_.index);
    } catch (...) {  // a destructor must not throw: the span is dropped
      cuda::event_destroy(start_event_);
      return;
    }
  } else {
    r.ms = double(now_ns() - start_ns_) * 1e-6;
  }
  std::lock_guard<std::mutex> lock(mu);
  records.push_back(r);
}

}  // namespace detail

void enable() {
  reset();
  detail::active = true;
}
void disable() { detail::active = false; }
bool enabled() { return detail::active; }

void reset() {
  std::lock_guard<std::mutex> lock(mu);
  release(records);
}

std::vector<KernelTime> report() {
  std::vector<Record> rs;
  {
    std::lock_guard<std::mutex> lock(mu);
    rs.swap(records);
  }
  std::map<std::pair<std::string, DeviceType>, KernelTime> sums;
  for (const Record& r : rs) {
    KernelTime& k = sums[{r.kernel, r.device}];
    k.kernel = r.kernel;
    k.device = r.device == DeviceType::CUDA ? "CUDA" : "CPU";
    k.calls += 1;
    k.total_ms += r.device == DeviceType::CUDA ? double(cuda::event_elapsed_ms(r.start_event, r.end_event)) : r.ms;
  }
  release(rs);
  std::vector<KernelTime> out;
  for (auto& [key, k] : sums) out.push_back(k);
  std::sort(out.begin(), out.end(), [](const KernelTime& a, const KernelTime& b) { return a.total_ms > b.total_ms; });
  return out;
}

std::string table() {
  const std::vector<KernelTime> ks = report();
  double total = 0;
  for (const KernelTime& k : ks) total += k.total_ms;
  std::string s;
  char line[256];
  std::snprintf(line, sizeof line, "%-32s %-5s %8s %11s %7s %11s\n", "kernel", "dev", "calls", "total ms", "share",
                "mean us");
  s += line;
  for (const KernelTime& k : ks) {
    std::snprintf(line, sizeof line, "%-32s %-5s %8lld %11.3f %6.1f%% %11.2f\n", k.kernel.c_str(), k.device.c_str(),
                  (long long)k.calls, k.total_ms, total > 0 ? 100 * k.total_ms / total : 0.0,
                  1e3 * k.total_ms / double(k.calls));
    s += line;
  }
  std::snprintf(line, sizeof line, "%-32s %-5s %8s %11.3f\n", "all kernels", "", "", total);
  s += line;
  return s;
}

}  // namespace mu::profile
