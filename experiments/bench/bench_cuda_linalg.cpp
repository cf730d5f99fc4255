// The CUDA matmul and attention kernels on their own (no autograd, no other CUDA op in a
// step), timed on cuda:0 with a device synchronisation at the end of every step:
//   matmul-<dtype>-<n>: an n x n by n x n product (cuBLAS), 2 n³ flops;
//   attention-fwd|bwd-<dtype>-b<B>-h<H>-t<T>-d<D>: the causal forward (out and lse), or
//   the backward from a forward's out and lse; a causal step does 2 (forward) or 5
//   (backward) T x T x D products at half the T² entries: 2 B H T² D, 5 B H T² D flops.
// float32 runs with TF32 off unless --tf32 1. On a machine without a GPU it says so on
// stderr and prints nothing.
//
//   bench_cuda_linalg [--workload matmul-f32-4096,...] [--tf32 0] [--reps 20] [--warmup 3]
#include <cstdio>
#include <sstream>
#include <string>

#include "experiments/bench/timing.h"
#include "mumoe.h"
#include "ops/kernels/attention.h"
#include "ops/kernels/linalg.h"

using namespace mu;

namespace {

DType parse_dtype(const std::string& s) {
  if (s == "f32") return kFloat32;
  if (s == "f64") return kFloat64;
  if (s == "bf16") return kBFloat16;
  std::fprintf(stderr, "bench_cuda_linalg: unknown dtype %s (f32, f64 or bf16)\n", s.c_str());
  std::exit(2);
}

void print(const std::string& name, const bench::Timing& t, double flops) {
  std::printf("{\"workload\": \"%s\", \"impl\": \"mumoe-cuda\", \"threads\": 0, \"median_ms\": %.3f, "
              "\"min_ms\": %.3f, \"max_ms\": %.3f, \"flops\": %.0f, \"tflops\": %.2f, \"device\": \"%s\"}\n",
              name.c_str(), t.median_ms, t.min_ms, t.max_ms, flops, flops / t.median_ms / 1e9,
              cuda::device_name(0).c_str());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  bench::Options opt("bench_cuda_linalg", 20, 3,
                     {{"workload",
                       "matmul-f32-4096,matmul-bf16-4096,matmul-f64-2048,attention-fwd-f32-b8-h12-t1024-d64,"
                       "attention-bwd-f32-b8-h12-t1024-d64,attention-fwd-bf16-b8-h12-t1024-d64,"
                       "attention-bwd-bf16-b8-h12-t1024-d64"},
                      {"tf32", "0"}});
  opt.parse(argc, argv);
  if (cuda::device_count() == 0) {
    std::fprintf(stderr, "bench_cuda_linalg: no CUDA device, nothing to time\n");
    return 0;
  }
  cuda::set_allow_tf32(opt.str("tf32") == "1");
  const Device dev = Device::cuda(0);
  std::stringstream list(opt.str("workload"));
  std::string name;
  while (std::getline(list, name, ',')) {
    manual_seed(0);
    char kind[16] = {}, dt[8] = {};
    long long n = 0, B = 0, H = 0, T = 0, D = 0;
    if (std::sscanf(name.c_str(), "matmul-%7[a-z0-9]-%lld", dt, &n) == 2) {
      const DType dtype = parse_dtype(dt);
      Tensor a = randn({n, n}).to(dtype).to(dev), b = randn({n, n}).to(dtype).to(dev);
      Tensor out = empty({n, n}, TensorOptions(dtype).device(dev));
      // The kernel itself: the op takes float32 and float64 only, the kernel bfloat16 too.
      auto step = [&] {
        kernels::matmul(dev, out, a, b);
        cuda::synchronize(0);
      };
      print(name, bench::time_it(step, opt.reps, opt.warmup), 2.0 * double(n) * double(n) * double(n));
    } else if (std::sscanf(name.c_str(), "attention-%3[a-z]-%7[a-z0-9]-b%lld-h%lld-t%lld-d%lld", kind, dt, &B, &H,
                           &T, &D) == 6) {
      const DType dtype = parse_dtype(dt);
      const Shape s{B, H, T, D};
      Tensor q = randn(s).to(dtype).to(dev), k = randn(s).to(dtype).to(dev), v = randn(s).to(dtype).to(dev);
      Tensor g = randn(s).to(dtype).to(dev);
      Tensor out = empty(s, TensorOptions(dtype).device(dev)), lse = empty({B, H, T}, TensorOptions(dtype).device(dev));
      Tensor dq = empty(s, TensorOptions(dtype).device(dev)), dk = empty(s, TensorOptions(dtype).device(dev));
      Tensor dv = empty(s, TensorOptions(dtype).device(dev));
      kernels::AttentionParams p;
      p.scale = 1 / std::sqrt(double(D));
      p.causal = true;
      kernels::attention_forward(dev, q, k, v, out, lse, p);  // the backward's out and lse
      const double bhttd = double(B) * double(H) * double(T) * double(T) * double(D);
      if (std::string(kind) == "fwd") {
        auto step = [&] {
          kernels::attention_forward(dev, q, k, v, out, lse, p);
          cuda::synchronize(0);
        };
        print(name, bench::time_it(step, opt.reps, opt.warmup), 2 * bhttd);
      } else if (std::string(kind) == "bwd") {
        auto step = [&] {
          kernels::attention_backward(dev, q, k, v, out, lse, g, dq, dk, dv, p);
          cuda::synchronize(0);
        };
        print(name, bench::time_it(step, opt.reps, opt.warmup), 5 * bhttd);
      } else {
        std::fprintf(stderr, "bench_cuda_linalg: unknown attention kind %s (fwd or bwd)\n", kind);
        return 2;
      }
    } else {
      std::fprintf(stderr, "bench_cuda_linalg: unknown workload %s\n", name.c_str());
      return 2;
    }
  }
  return 0;
}
