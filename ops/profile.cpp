// The kernel profiler (ops/profile.h): spans recorded by the kernel tables, resolved and
// summed when a report is asked for.
#include "ops/profile.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

#include "tensor/cuda.h"
#include "tensor/tensor.h"

namespace mu::profile {

namespace detail {
bool active = false;
bool by_shape = false;

// An undefined tensor is an optional argument left out (a kernel's absent bias or mask).
std::string describe(const Tensor& t) {
  return t.defined() ? std::string(dtype_name(t.dtype())) + shape_str(t.shape()) : std::string("undefined");
}
}  // namespace detail

namespace {

// MUMOE_PROFILE=1: on from the start, the table printed at exit.
const bool g_from_env = [] {
  const char* v = std::getenv("MUMOE_PROFILE");
  const bool shapes = v != nullptr && std::strcmp(v, "shapes") == 0;
  const bool on = v != nullptr && (std::strcmp(v, "1") == 0 || shapes);
  if (on) detail::active = true;
  if (shapes) detail::by_shape = true;
  return on;
}();

// The exit report. The CUDA runtime tears its context down in an exit handler of its own,
// registered when CUDA first starts, and handlers run in reverse order of registration:
// a handler registered before CUDA started would run after that teardown, when the
// events can no longer be read. So a new handler is registered once the first CUDA span
// has started CUDA, and only the newest handler prints.
std::atomic<int> g_newest_handler{0};
void print_at_exit(int generation) {
  if (g_newest_handler.load() != generation) return;
  try {
    std::fprintf(stderr, "mumoe kernel profile (MUMOE_PROFILE=1):\n%s", table().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mumoe kernel profile (MUMOE_PROFILE=1): unavailable at exit: %s\n", e.what());
  }
}
void exit_handler_1() { print_at_exit(1); }
void exit_handler_2() { print_at_exit(2); }

void register_exit_report(bool cuda) {
  static std::once_flag first, after_cuda;
  std::call_once(first, [] {
    g_newest_handler = 1;
    std::atexit(exit_handler_1);
  });
  if (cuda)
    std::call_once(after_cuda, [] {
      g_newest_handler = 2;
      std::atexit(exit_handler_2);
    });
}

}  // namespace

namespace {

// One finished span: CPU spans carry their duration, CUDA spans their two events, whose
// time is read only at report() (reading it earlier would wait for the device).
struct Record {
  const char* kernel;
  std::string detail;   // by shape: the call's signature (else empty)
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
    start_event_ = cuda::event_record(device.index);  // starts CUDA, if nothing did yet
  else
    start_ns_ = now_ns();
  if (g_from_env) register_exit_report(device.is_cuda());
}

Span::~Span() {
  Record r{kernel_, std::move(detail_), device_.type, 0, nullptr, nullptr};
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

Scope::Scope(const char* name, Device device) {
  if (detail::active) span_ = new detail::Span(name, device);
}
Scope::~Scope() { delete span_; }

void enable(Detail d) {
  reset();
  detail::by_shape = d == Detail::Shapes;
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
    const std::string name = r.detail.empty() ? std::string(r.kernel) : std::string(r.kernel) + "  " + r.detail;
    KernelTime& k = sums[{name, r.device}];
    k.kernel = name;
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
  // The name column fits the longest name (by-shape names run long), at least 32 wide.
  int w = 32;
  for (const KernelTime& k : ks) w = std::max(w, int(k.kernel.size()));
  std::string s;
  char line[512];
  std::snprintf(line, sizeof line, "%-*s %-5s %8s %11s %7s %11s\n", w, "kernel", "dev", "calls", "total ms", "share",
                "mean us");
  s += line;
  for (const KernelTime& k : ks) {
    s += k.kernel + std::string(size_t(w) - k.kernel.size(), ' ');
    std::snprintf(line, sizeof line, " %-5s %8lld %11.3f %6.1f%% %11.2f\n", k.device.c_str(), (long long)k.calls,
                  k.total_ms, total > 0 ? 100 * k.total_ms / total : 0.0, 1e3 * k.total_ms / double(k.calls));
    s += line;
  }
  std::snprintf(line, sizeof line, "%-*s %-5s %8s %11.3f\n", w, "all kernels", "", "", total);
  s += line;
  return s;
}

}  // namespace mu::profile
