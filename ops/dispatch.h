// The one seam where a device plugs in: a per-device kernel table.
//
// Every kernel an op reaches is declared once, with its signature, as a KernelTable in
// ops/kernels/*.h (MU_DECLARE_KERNEL). Each backend fills its slot from its own folder
// with the same kernel name: ops/cpu/*.cpp for the CPU, ops/cuda/*.cu for CUDA
// (MU_REGISTER_KERNEL). The op in ops/*.cpp checks shapes, dtypes and devices,
// broadcasts, allocates and records autograd once, then calls table(device, args...),
// which runs the kernel of that device or raises one error naming the kernel and the
// device. Nothing outside ops/cpu and ops/cuda touches device code.
//
// This header is compiled by g++ (C++20) and nvcc (C++17): keep it C++17.
#pragma once
#include <cstddef>
#include <string>
#include <type_traits>
#include <utility>

#include "ops/profile.h"
#include "tensor/device.h"
#include "tensor/error.h"

namespace mu {

inline constexpr size_t kNumDeviceTypes = 2;  // DeviceType::CPU, DeviceType::CUDA

inline const char* device_type_name(DeviceType t) { return t == DeviceType::CPU ? "CPU" : "CUDA"; }

template <class Signature>
class KernelTable;

template <class R, class... Args>
class KernelTable<R(Args...)> {
 public:
  using Fn = R (*)(Args...);

  // constexpr, so that a table is filled with nulls before any registration runs,
  // whatever order the shared library's static initialisers take.
  constexpr explicit KernelTable(const char* name) : name_(name), fns_{} {}

  const char* name() const { return name_; }
  void set(DeviceType d, Fn f) { fns_[size_t(d)] = f; }
  bool has(DeviceType d) const { return fns_[size_t(d)] != nullptr; }

  // Runs the kernel registered for `device`.
  template <class... A>
  R operator()(Device device, A&&... args) const {
    Fn f = fns_[size_t(device.type)];
    if (f == nullptr) missing(device);
    if (profile::detail::active) {  // the kernel profiler (ops/profile.h) marks this call
      profile::detail::Span span(name_, device);
      if (profile::detail::by_shape) span.set_detail(describe_tensors(args...));
      return f(std::forward<A>(args)...);
    }
    return f(std::forward<A>(args)...);
  }

 private:
  // The dtypes and shapes of the call's first two tensor arguments (the profiler's
  // by-shape rows; for most kernels the output, then the first input).
  template <class... A>
  static std::string describe_tensors(const A&... args) {
    std::string s;
    int n = 0;
    auto one = [&](const auto& a) {
      if constexpr (std::is_same_v<std::decay_t<decltype(a)>, Tensor>)
        if (n++ < 2) s += (s.empty() ? "" : ", ") + profile::detail::describe(a);
    };
    (one(args), ...);
    return s;
  }

  [[noreturn]] void missing(Device device) const {
    MU_FAIL(name_, ": no ", device_type_name(device.type), " kernel for this op (tensor on ", device.str(), ")",
            device.is_cuda() ? "; move the tensors to the CPU with .cpu()" : "");
  }

  const char* name_;
  Fn fns_[kNumDeviceTypes];
};

}  // namespace mu

#define MU_CONCAT_IMPL_(a, b) a##b
#define MU_CONCAT_(a, b) MU_CONCAT_IMPL_(a, b)

// Declares the kernel table `name` (in a header under ops/kernels/, inside namespace
// mu::kernels). ops/kernel_tables.cpp defines MU_DEFINE_KERNEL_TABLES and includes every
// such header, so each table is defined exactly once, inside the library: a program that
// includes the header reaches the library's table, never a copy of its own.
#ifdef MU_DEFINE_KERNEL_TABLES
#define MU_DECLARE_KERNEL(name, ...) ::mu::KernelTable<__VA_ARGS__> name{#name}
#else
#define MU_DECLARE_KERNEL(name, ...) extern ::mu::KernelTable<__VA_ARGS__> name
#endif

// Fills `table`'s slot for `device_type` (DeviceType::CPU or DeviceType::CUDA) with
// `fn`, when the library is loaded. Used at namespace scope in ops/cpu/ and ops/cuda/.
// The library is a shared object, so no registering file is ever left out of a link.
#define MU_REGISTER_KERNEL(table, device_type, fn) \
  [[maybe_unused]] static const bool MU_CONCAT_(mu_kernel_registered_, __LINE__) = ((table).set(device_type, fn), true)
