// A kernel profiler: the time of every kernel an op runs, summed per kernel and device.
//
//   mu::profile::enable();
//   ... train a step ...
//   std::cout << mu::profile::table();     // waits for the device, then lists kernels by time
//   mu::profile::disable();
//
// Every kernel call goes through its kernel table (ops/dispatch.h), which, while the
// profiler is on, marks the call's start and end: on a CUDA device with events queued on
// the device's stream (the time the GPU spent, launch gaps excluded), on the CPU with the
// wall clock. Times are inclusive: a kernel that runs another kernel's table counts it
// too. Off, the cost is one load and branch per kernel call.
//
// Any program: MUMOE_PROFILE=1 in the environment turns the profiler on when the library
// loads and prints the table of the whole run on stderr when the program exits;
// MUMOE_PROFILE=shapes does the same by shape.
//
// By shape (enable(Detail::Shapes)), each row is one kernel called on one signature: the
// dtypes and shapes of its first two tensor arguments (for most kernels the output, then
// the first input), e.g. "copy  bfloat16[8192, 768], float32[8192, 768]": where the
// time of a kernel called from many places goes. It formats two shapes per call.
//
// Compiled by g++ (C++20) and nvcc (C++17): keep it C++17.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tensor/device.h"

namespace mu {
class Tensor;
}

namespace mu::profile {

// One row per kernel, or per kernel and argument signature (see the top of the file).
enum class Detail { Kernels, Shapes };

void enable(Detail detail = Detail::Kernels);
void disable();
bool enabled();

// One kernel on one device type: how often it ran and for how long in all.
struct KernelTime {
  std::string kernel;  // the kernel table's name, e.g. "matmul", "attention_backward"
  std::string device;  // "CPU" or "CUDA"
  int64_t calls = 0;
  double total_ms = 0;
};

// The kernels run since the last reset (or enable), longest total first. Waits for the
// marks still queued on the devices.
std::vector<KernelTime> report();
// The report as a table: kernel, device, calls, total ms, share of the total, mean us.
std::string table();
// Forgets what was measured.
void reset();

namespace detail {
class Span;
}

// A named region of a program in the same table, beside the kernels it runs (which are
// also listed on their own): on `device`'s stream for a CUDA device, the wall clock for
// the CPU. `name` must outlive the report (a string literal).
//   { profile::Scope s("forward", dev); loss = model.forward(x, y).loss; }
class Scope {
 public:
  explicit Scope(const char* name, Device device = Device::cpu());
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  detail::Span* span_ = nullptr;  // null while the profiler is off
};

namespace detail {
// Read by every kernel table call; written by enable()/disable().
extern bool active;
extern bool by_shape;
// "dtype[shape]" of a tensor, for the by-shape rows.
std::string describe(const Tensor& t);
// Marks one kernel call while the profiler is on (ops/dispatch.h).
class Span {
 public:
  Span(const char* kernel, Device device);
  ~Span();
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;
  // Appended to the kernel's name in the report (the by-shape rows).
  void set_detail(std::string detail) { detail_ = std::move(detail); }

 private:
  const char* kernel_;
  std::string detail_;
  Device device_;
  void* start_event_ = nullptr;  // CUDA
  int64_t start_ns_ = 0;         // CPU
};
}  // namespace detail

}  // namespace mu::profile
