// What the GPU benchmarks (bench_gpu_*.cpp) share beside timing.h: the refusal to run
// without a CUDA device, the --dtype / --tf32 options, the H100's peak rates that model
// FLOP utilisation is measured against, and the JSON line they print, in the shape that
// torch_gpu.py prints for the same workloads.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <string>

#include "experiments/bench/timing.h"
#include "tensor/allocator.h"
#include "tensor/cuda.h"
#include "tensor/device.h"

namespace mu::bench {

// Dense (no structured sparsity) tensor-core peaks of the H100 SXM5, in TFLOP/s, from
// NVIDIA's H100 Tensor Core GPU datasheet (the "H100 SXM" column; the sparsity figures
// there are twice these). The H200 has the same SM count and clocks, so the same peaks;
// an H100 PCIe is lower (756 bf16), and --peak-tflops overrides the figure for it.
inline constexpr double kH100Bf16DenseTflops = 989.4;  // BF16 tensor core, dense
inline constexpr double kH100Tf32DenseTflops = 494.7;  // TF32 tensor core, dense
inline constexpr double kH100Fp32Tflops = 66.9;        // FP32 on the CUDA cores (no tensor cores)

// Ends the program, with a message on stderr and exit status 3, when no CUDA device can
// be used (a build without CUDA, or a machine without a GPU): a GPU benchmark has nothing
// to time on the CPU, and a script running it must see the failure.
inline void require_cuda(const char* program) {
  if (cuda::device_count() > 0) return;
  std::fprintf(stderr,
               "%s: no CUDA device found (cuda::device_count() == 0: no GPU on this machine, or a build "
               "without CUDA); this benchmark runs on a GPU only\n",
               program);
  std::exit(3);
}

// The device of --device: "cuda" (cuda:0; require_cuda first) or "cpu", a smoke run that
// checks the program's steps on a machine without a GPU (its timings mean nothing).
inline Device parse_device(const char* program, const std::string& s) {
  if (s == "cuda") {
    require_cuda(program);
    return Device::cuda(0);
  }
  if (s == "cpu") {
    std::fprintf(stderr, "%s: --device cpu is a smoke run of the steps; its timings are not the benchmark\n", program);
    return Device::cpu();
  }
  std::fprintf(stderr, "%s: --device %s is not cuda or cpu\n", program, s.c_str());
  std::exit(2);
}

// The device of --device for a benchmark whose CPU line is as real as its GPU line:
// "cpu", or "cuda" (cuda:0; require_cuda first); anything else ends the program (status 2).
inline Device parse_target_device(const char* program, const std::string& s) {
  if (s == "cuda") {
    require_cuda(program);
    return Device::cuda(0);
  }
  if (s == "cpu") return Device::cpu();
  std::fprintf(stderr, "%s: --device %s is not cpu or cuda\n", program, s.c_str());
  std::exit(2);
}

// Waits for the device's queued kernels (nothing to wait for on the CPU), so that the
// clock is read after the step's work, not after its launches.
inline void sync(Device dev) {
  if (dev.is_cuda()) cuda::synchronize(dev.index);
}

// Bytes held by live tensors at most since the last reset_peak, on the device.
inline MemoryStats memory(Device dev) { return dev.is_cuda() ? cuda::memory_stats(dev.index) : cpu_allocator::stats(); }
inline void reset_peak(Device dev) {
  if (!dev.is_cuda()) return cpu_allocator::reset_peak();
  cuda::empty_cache(dev.index);  // as torch.cuda.empty_cache between workloads
  cuda::reset_peak_memory(dev.index);
}

// "bf16" (autocast, float32 weights) or "fp32"; anything else ends the program (status 2).
inline bool parse_bf16(const char* program, const std::string& dtype) {
  if (dtype == "bf16") return true;
  if (dtype == "fp32") return false;
  std::fprintf(stderr, "%s: --dtype %s is not bf16 or fp32\n", program, dtype.c_str());
  std::exit(2);
}

// "0" or "1"; anything else ends the program (status 2).
inline bool parse_flag(const char* program, const char* name, const std::string& v) {
  if (v == "0" || v == "1") return v == "1";
  std::fprintf(stderr, "%s: --%s %s is not 0 or 1\n", program, name, v.c_str());
  std::exit(2);
}

// The peak a run is measured against: bf16 tensor cores, TF32 tensor cores when float32
// matmuls may use them, the CUDA cores' float32 rate otherwise. `override_tflops` > 0 wins.
inline double peak_tflops(bool bf16, bool tf32, double override_tflops) {
  if (override_tflops > 0) return override_tflops;
  return bf16 ? kH100Bf16DenseTflops : (tf32 ? kH100Tf32DenseTflops : kH100Fp32Tflops);
}

// The fields every GPU result line starts with (the line is left open for more fields,
// closed by end_line).
inline void begin_line(Device dev, const std::string& workload, const std::string& dtype, bool tf32,
                       const Timing& t) {
  std::printf("{\"workload\": \"%s\", \"impl\": \"mumoe-%s\", \"threads\": 0, \"device\": \"%s\", "
              "\"dtype\": \"%s\", \"tf32\": %s, \"median_ms\": %.3f, \"min_ms\": %.3f, \"max_ms\": %.3f",
              workload.c_str(), dev.is_cuda() ? "cuda" : "cpu",
              dev.is_cuda() ? cuda::device_name(dev.index).c_str() : "cpu", dtype.c_str(), tf32 ? "true" : "false",
              t.median_ms, t.min_ms, t.max_ms);
}
inline void end_line() {
  std::printf("}\n");
  std::fflush(stdout);
}

}  // namespace mu::bench
