// The cpmumoe-layer and trmumoe-layer workloads of ../shared/reference/torch_reference.py:
// 2048 tokens, 768 -> 768, N = 256 experts; CP rank 512, or TR ranks (4, 4, 149); input z
// and entmax-1.5 coefficients a both require grad; one step = zero grads, y = layer(z, a),
// mean(y^2).backward(). Prints one JSON line per workload in the reference's shape.
//
//   bench_mumoe_layers [--workload cpmumoe-layer,trmumoe-layer] [--reps 10] [--warmup 3]
#include <omp.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>

#include "experiments/bench/timing.h"
#include "mumoe.h"
#include "nn/entmax.h"
#include "nn/mumoe_layer.h"

using namespace mu;

int main(int argc, char** argv) {
  bench::Options opt("bench_mumoe_layers", 10, 3, {{"workload", "cpmumoe-layer,trmumoe-layer"}});
  opt.parse(argc, argv);
  const int reps = opt.reps, warmup = opt.warmup;
  const std::string workloads = opt.str("workload");
  const int64_t tokens = 2048, in = 768, out = 768, n = 256;
  std::stringstream list(workloads);
  std::string name;
  while (std::getline(list, name, ',')) {
    manual_seed(0);
    nn::MoEShape shape{in, out, {n}, true};
    std::shared_ptr<nn::MuMoELayer> layer;
    if (name == "cpmumoe-layer") layer = std::make_shared<nn::CPMuMoE>(shape, 512);
    else if (name == "trmumoe-layer") layer = std::make_shared<nn::TRMuMoE>(shape, std::vector<int64_t>{4, 4, 149});
    else {
      std::fprintf(stderr, "bench_mumoe_layers: unknown workload %s\n", name.c_str());
      return 2;
    }
    Tensor z = randn({1, tokens, in}).requires_grad_();
    Tensor a = nn::entmax15(randn({1, tokens, n})).detach().requires_grad_();
    auto step = [&] {
      layer->zero_grad();
      z.zero_grad();
      a.zero_grad();
      square(layer->forward(z, {a})).mean().backward();
    };
    bench::Timing t = bench::time_it(step, reps, warmup);
    std::printf("{\"workload\": \"%s\", \"impl\": \"mumoe\", \"threads\": %d, \"median_ms\": %.3f, \"min_ms\": %.3f, "
                "\"max_ms\": %.3f, \"params\": %lld}\n",
                name.c_str(), omp_get_max_threads(), t.median_ms, t.min_ms, t.max_ms, (long long)layer->num_parameters());
    std::fflush(stdout);
  }
  return 0;
}
