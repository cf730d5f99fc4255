// Single layers on cuda:0, against experiments/bench/torch_gpu.py (the same workloads in
// PyTorch eager on the same GPU), each in float32 and in bf16 (suffix -fp32 / -bf16):
//   cpmumoe-layer, trmumoe-layer: the workloads of ../shared/reference/torch_reference.py:
//     2048 tokens, 768 -> 768, N = 256 experts, CP rank 512 or TR ranks (4, 4, 149); input
//     z and entmax-1.5 coefficients a both require grad; one step = zero grads,
//     mean(layer(z, a)²).backward(). bf16: the forward inside an AutocastGuard (float32
//     factors, bfloat16 products). flops: 6 x tokens x the layer's multiply-adds per token
//     (MuMoELayer::flops_per_token; forward 2 flops per multiply-add, backward twice that).
//   attention-b8-h12-t1024-fwd, attention-b8-h12-t1024-fwd-bwd: the fused causal attention
//     at B 8, H 12, T 1024, D 64 (GPT-2 124M's shape), q, k, v of the run's dtype (bf16:
//     bfloat16 tensors themselves). fwd: scaled_dot_product_attention without a graph;
//     fwd-bwd: clear the grads, sum(out * w).backward() for a fixed random w. flops, with the
//     causal half of the T x T entries: 2 B H T² D forward, 7 B H T² D forward + backward.
//   topk-b8-v50257-k200: a sampling step's top k (nanoGPT's sample.py: k 200) of 8 rows of
//     GPT-2's 50257 logits, values and indices, no graph (bf16: bfloat16 logits). The
//     floor is reading the logits once (1.6 MB in float32): a few microseconds, so both
//     sides are bound by their launches and passes; gb_per_s is that read over the time.
// Every step ends with cuda::synchronize before the clock is read.
//
//   bench_gpu_layers [--workload cpmumoe-layer,trmumoe-layer,attention-b8-h12-t1024-fwd,
//                     attention-b8-h12-t1024-fwd-bwd,topk-b8-v50257-k200] [--dtype fp32,bf16] [--tf32 0]
//                    [--reps 20] [--warmup 3] [--device cuda]
//
// Without a CUDA device it says so on stderr and exits with status 3. --device cpu runs the
// same steps on the CPU, to check the program where there is no GPU (not a benchmark).
#include <cstdio>
#include <memory>
#include <sstream>
#include <string>

#include "experiments/bench/gpu_timing.h"
#include "experiments/bench/timing.h"
#include "mumoe.h"
#include "nn/entmax.h"
#include "nn/mumoe_layer.h"
#include "tensor/cuda.h"

using namespace mu;

namespace {

constexpr const char* kProg = "bench_gpu_layers";

void print(Device dev, const std::string& name, const std::string& dtype, bool tf32, const bench::Timing& t, double flops) {
  bench::begin_line(dev, name + "-" + dtype, dtype, tf32, t);
  std::printf(", \"flops\": %.0f, \"tflops\": %.2f", flops, flops / (t.median_ms * 1e-3) / 1e12);
  bench::end_line();
}

// cpmumoe-layer / trmumoe-layer: forward and backward of one μMoE layer.
void run_layer(Device dev, const std::string& name, const std::string& dtype, bool tf32, const bench::Options& opt) {
  const bool bf16 = bench::parse_bf16(kProg, dtype);
  const int64_t tokens = 2048, in = 768, out = 768, n = 256;
  manual_seed(0);
  nn::MoEShape shape{in, out, {n}, true};
  std::shared_ptr<nn::MuMoELayer> layer;
  if (name == "cpmumoe-layer") layer = std::make_shared<nn::CPMuMoE>(shape, 512);
  else layer = std::make_shared<nn::TRMuMoE>(shape, std::vector<int64_t>{4, 4, 149});
  layer->to(dev);
  // Drawn on the CPU (the reference's values), moved, then made leaves that take gradients.
  Tensor z = randn({1, tokens, in}).to(dev).requires_grad_();
  Tensor a = nn::entmax15(randn({1, tokens, n})).to(dev).requires_grad_();
  auto step = [&] {
    layer->zero_grad();
    z.zero_grad();
    a.zero_grad();
    Tensor loss;
    {
      AutocastGuard amp(kBFloat16, bf16);
      loss = square(layer->forward(z, {a})).mean();
    }
    loss.backward();
    bench::sync(dev);
  };
  const bench::Timing t = bench::time_it(step, opt.reps, opt.warmup);
  print(dev, name, dtype, tf32, t, 6.0 * double(layer->flops(tokens)));
}

// attention-b8-h12-t1024-fwd / -fwd-bwd: the fused causal attention alone.
void run_attention(Device dev, const std::string& name, const std::string& dtype, bool tf32,
                   const bench::Options& opt) {
  const DType dt = bench::parse_bf16(kProg, dtype) ? kBFloat16 : kFloat32;
  const int64_t B = 8, H = 12, T = 1024, D = 64;
  manual_seed(0);
  const Shape s{B, H, T, D};
  Tensor q = randn(s).to(dt).to(dev).requires_grad_(), k = randn(s).to(dt).to(dev).requires_grad_();
  Tensor v = randn(s).to(dt).to(dev).requires_grad_();
  Tensor w = randn(s).to(dt).to(dev);
  const double bhttd = double(B) * double(H) * double(T) * double(T) * double(D);
  if (name == "attention-b8-h12-t1024-fwd") {
    auto step = [&] {
      NoGradGuard ng;
      scaled_dot_product_attention(q, k, v, true);
      bench::sync(dev);
    };
    print(dev, name, dtype, tf32, bench::time_it(step, opt.reps, opt.warmup), 2 * bhttd);
  } else {
    auto step = [&] {
      q.zero_grad(), k.zero_grad(), v.zero_grad();
      (scaled_dot_product_attention(q, k, v, true) * w).sum().backward();
      bench::sync(dev);
    };
    print(dev, name, dtype, tf32, bench::time_it(step, opt.reps, opt.warmup), 7 * bhttd);
  }
}

// topk-b8-v50257-k200: topk along the vocabulary.
void run_topk(Device dev, const std::string& name, const std::string& dtype, bool tf32, const bench::Options& opt) {
  const DType dt = bench::parse_bf16(kProg, dtype) ? kBFloat16 : kFloat32;
  const int64_t B = 8, V = 50257, k = 200;
  manual_seed(0);
  const Tensor x = randn({B, V}).to(dt).to(dev);
  auto step = [&] {
    NoGradGuard ng;
    topk(x, k, 1);
    bench::sync(dev);
  };
  const bench::Timing t = bench::time_it(step, opt.reps, opt.warmup);
  const double bytes = double(B * V) * double(element_size(dt));
  bench::begin_line(dev, name + "-" + dtype, dtype, tf32, t);
  std::printf(", \"bytes\": %.0f, \"gb_per_s\": %.2f", bytes, bytes / (t.median_ms * 1e-3) / 1e9);
  bench::end_line();
}

}  // namespace

int main(int argc, char** argv) {
  bench::Options opt(kProg, 20, 3,
                     {{"workload",
                       "cpmumoe-layer,trmumoe-layer,attention-b8-h12-t1024-fwd,attention-b8-h12-t1024-fwd-bwd,"
                       "topk-b8-v50257-k200"},
                      {"dtype", "fp32,bf16"},
                      {"tf32", "0"},
                      {"device", "cuda"}});
  opt.parse(argc, argv);
  const Device dev = bench::parse_device(kProg, opt.str("device"));
  const bool tf32 = bench::parse_flag(kProg, "tf32", opt.str("tf32"));
  cuda::set_allow_tf32(tf32);
  std::stringstream dtypes(opt.str("dtype"));
  std::string dtype;
  while (std::getline(dtypes, dtype, ',')) {
    bench::parse_bf16(kProg, dtype);  // refuses a bad dtype before anything runs
    std::stringstream list(opt.str("workload"));
    std::string name;
    while (std::getline(list, name, ',')) {
      if (name == "cpmumoe-layer" || name == "trmumoe-layer") {
        run_layer(dev, name, dtype, tf32, opt);
      } else if (name == "attention-b8-h12-t1024-fwd" || name == "attention-b8-h12-t1024-fwd-bwd") {
        run_attention(dev, name, dtype, tf32, opt);
      } else if (name == "topk-b8-v50257-k200") {
        run_topk(dev, name, dtype, tf32, opt);
      } else {
        std::fprintf(stderr, "%s: unknown workload %s\n", kProg, name.c_str());
        return 2;
      }
    }
  }
  return 0;
}
