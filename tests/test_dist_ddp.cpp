// Data parallelism across the ranks mpirun started (label distributed, 2 ranks): DDP with
// shards of the batch against one process with the whole batch (5 AdamW steps), with
// many buckets, accumulation and unused parameters; ZeRO-1 against plain DDP (on the CPU,
// and on CUDA devices when each rank has one); the sampler's
// global batch whatever the number of ranks; the training loop's rank-0-only output and
// its ZeRO checkpoints resumed (also on CUDA).
#include <cmath>
#include <filesystem>
#include <fstream>

#include "dist/ddp.h"
#include "dist/sampler.h"
#include "dist/zero.h"
#include "helpers.h"
#include "optim/adamw.h"
#include "train/loop.h"

using namespace mu;

namespace {

dist::ProcessGroup& pg() { return dist::ProcessGroup::world(); }

// A small MLP with an extra weight used only when asked (on some ranks, or none).
struct Net : nn::Module {
  std::shared_ptr<nn::Linear> fc1, fc2;
  Tensor extra, never;
  Net() : Module("Net") {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(6, 16));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(16, 3));
    extra = register_parameter("extra", randn({3}) * 0.1);
    never = register_parameter("never", randn({5}));
  }
  Tensor forward(const Tensor& x, bool use_extra) {
    Tensor y = fc2->forward(gelu(fc1->forward(x)));
    return use_extra ? y + extra : y;
  }
};

// The same model on every rank: initialised from seed 7.
std::shared_ptr<Net> make_net() {
  manual_seed(7);
  return std::make_shared<Net>();
}

// The global batch of step s: 8 inputs and targets, the same on every rank.
std::pair<Tensor, Tensor> global_batch(int64_t s) {
  Generator g(100 + uint64_t(s));
  return {randn({8, 6}, {}, &g), randn({8, 3}, {}, &g)};
}

Tensor loss_of(Net& m, const Tensor& x, const Tensor& y, bool use_extra) {
  Tensor d = m.forward(x, use_extra) - y;
  return mean(d * d);
}

std::vector<double> flat_params(nn::Module& m) {
  std::vector<double> v;
  for (const Tensor& p : m.parameters())
    for (double x : p.detach().cpu().to(kFloat64).contiguous().to_vector<double>()) v.push_back(x);
  return v;
}

double max_rel_diff(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double scale = 0, diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    scale = std::max(scale, std::fabs(b[i]));
    diff = std::max(diff, std::fabs(a[i] - b[i]));
  }
  return diff / scale;
}

// One process on the CPU, the whole batch, in `dtype`: the reference every data-parallel
// run must reach.
std::vector<double> single_process_run(int steps, bool use_extra, DType dtype = kFloat32) {
  auto m = make_net();
  m->to(dtype);
  optim::AdamW opt(m->parameters(), optim::AdamWOptions(1e-2).weight_decay(0.1));
  for (int s = 0; s < steps; ++s) {
    auto [x, y] = global_batch(s);
    opt.zero_grad();
    loss_of(*m, x.to(dtype), y.to(dtype), use_extra).backward();
    opt.step();
  }
  return flat_params(*m);
}

// Whether every rank of this machine has a CUDA device of its own and the build has NCCL,
// as the CUDA cases need; if not, says why `what` is skipped.
bool cuda_per_rank(const char* what) {
  const int devices = cuda::device_count();
  if (devices < pg().local_size()) {
    MESSAGE("SKIPPED (" << what << " on CUDA): " << pg().local_size() << " ranks on this machine, " << devices
                        << " CUDA device(s); NCCL needs one device per rank");
    return false;
  }
#ifndef MUMOE_NCCL
  MESSAGE("SKIPPED (" << what << " on CUDA): this build has no NCCL");
  return false;
#endif
  return true;
}

}  // namespace

TEST_CASE("2 ranks with half the batch each reach the parameters of 1 rank with the whole batch") {
  REQUIRE(pg().size() == 2);
  const std::vector<double> want = single_process_run(5, true);
  for (int64_t bucket_bytes : {int64_t(25) << 20, int64_t(4)}) {  // one bucket; one per parameter
    for (int accum : {1, 2}) {
      INFO("bucket_bytes " << bucket_bytes << ", accumulation " << accum);
      auto m = make_net();
      // Rank 1 starts from other weights: the broadcast from rank 0 must overwrite them.
      if (pg().rank() == 1) {
        NoGradGuard ng;
        for (Tensor p : m->parameters()) p.copy_(randn(p.shape()));
      }
      dist::DDPOptions o;
      o.bucket_bytes = bucket_bytes;
      dist::DistributedDataParallel ddp(*m, pg(), o);
      CHECK(ddp.bucket_count() == (bucket_bytes == 4 ? 6 : 1));
      optim::AdamW opt(m->parameters(), optim::AdamWOptions(1e-2).weight_decay(0.1));
      const dist::Shard shard = dist::batch_shard(8, pg().rank(), pg().size());
      for (int s = 0; s < 5; ++s) {
        auto [x, y] = global_batch(s);
        opt.zero_grad();
        // This rank's 4 rows, in `accum` micro-batches; each loss is scaled so that the
        // accumulated gradient is that of the mean over the 4 rows.
        const int64_t per = shard.count / accum;
        for (int micro = 0; micro < accum; ++micro) {
          ddp.set_sync(micro == accum - 1);
          const int64_t at = shard.begin + micro * per;
          (loss_of(*m, x.narrow(0, at, per), y.narrow(0, at, per), true) * (1.0 / accum)).backward();
        }
        opt.step();
      }
      CHECK(max_rel_diff(flat_params(*m), want) <= 1e-6);
      // A parameter no rank used has no gradient, as in one process.
      CHECK_FALSE(m->never.grad().defined());
    }
  }
}

// The same on the ranks' CUDA devices (float64, so that the CPU's single-process run is
// the reference to within rounding): gradients averaged by NCCL during the backward, the
// parameters broadcast by it at the start. Skipped, saying why, without a device per rank
// or without NCCL.
TEST_CASE("on CUDA, 2 ranks with half the batch each reach the parameters of 1 rank with the whole batch") {
  REQUIRE(pg().size() == 2);
  if (!cuda_per_rank("DDP")) return;
  const Device dev = pg().default_device();
  const std::vector<double> want = single_process_run(5, true, kFloat64);
  auto m = make_net();
  m->to(kFloat64);
  if (pg().rank() == 1) {  // other weights on rank 1: the broadcast must overwrite them
    NoGradGuard ng;
    for (Tensor p : m->parameters()) p.copy_(randn(p.shape()).to(kFloat64));
  }
  m->to(dev);
  dist::DDPOptions o;
  o.bucket_bytes = 64;  // several buckets, their all-reduces started during the backward
  dist::DistributedDataParallel ddp(*m, pg(), o);
  optim::AdamW opt(m->parameters(), optim::AdamWOptions(1e-2).weight_decay(0.1));
  const dist::Shard shard = dist::batch_shard(8, pg().rank(), pg().size());
  for (int s = 0; s < 5; ++s) {
    auto [x, y] = global_batch(s);
    opt.zero_grad();
    loss_of(*m, x.narrow(0, shard.begin, shard.count).to(kFloat64).to(dev),
            y.narrow(0, shard.begin, shard.count).to(kFloat64).to(dev), true)
        .backward();
    opt.step();
  }
  CHECK(m->fc1->weight.device() == dev);
  CHECK(max_rel_diff(flat_params(*m), want) <= 1e-12);
  CHECK_FALSE(m->never.grad().defined());
}

TEST_CASE("a parameter only some ranks use gets the mean with zeros from the others") {
  auto m = make_net();
  dist::DistributedDataParallel ddp(*m, pg());
  auto [x, y] = global_batch(0);
  const dist::Shard shard = dist::batch_shard(8, pg().rank(), pg().size());
  Tensor xs = x.narrow(0, shard.begin, shard.count), ys = y.narrow(0, shard.begin, shard.count);
  const bool mine = pg().rank() == 0;
  loss_of(*m, xs, ys, mine).backward();
  // By hand: rank 0's gradient of `extra`, halved (rank 1 contributes nothing).
  auto ref = make_net();
  Tensor rx = x.narrow(0, 0, 4), ry = y.narrow(0, 0, 4);
  loss_of(*ref, rx, ry, true).backward();
  const std::vector<double> want = (ref->extra.grad() * 0.5).to(kFloat64).to_vector<double>();
  check_close(m->extra.grad(), want, 1e-7);
}

namespace {

// ZeRO-1 against plain DDP on `dev`: the same parameters after 5 steps, each rank holding
// a strict part of the AdamW moments, and the gathered state the unsharded one's.
void check_zero_equals_ddp(Device dev) {
  auto run = [&](bool zero) {
    auto m = make_net();
    m->to(dev);
    dist::DistributedDataParallel ddp(*m, pg());
    optim::AdamW opt(m->parameters(), optim::AdamWOptions(1e-2).weight_decay(0.1));
    std::unique_ptr<dist::ZeroOptimizer> z = zero ? std::make_unique<dist::ZeroOptimizer>(opt, pg()) : nullptr;
    const dist::Shard shard = dist::batch_shard(8, pg().rank(), pg().size());
    for (int s = 0; s < 5; ++s) {
      auto [x, y] = global_batch(s);
      opt.zero_grad();
      loss_of(*m, x.narrow(0, shard.begin, shard.count).to(dev), y.narrow(0, shard.begin, shard.count).to(dev), true)
          .backward();
      if (z) z->step(); else opt.step();
    }
    int64_t bytes = z ? z->state_bytes() : 0;
    nn::StateDict full;
    if (z) {
      z->gather_state();
      for (auto& [k, t] : opt.state_dict()) full.emplace_back(k, t.clone());
      z->release_state();
      CHECK(z->state_bytes() == bytes);
    } else {
      for (auto& [k, t] : opt.state_dict()) full.emplace_back(k, t.clone());
    }
    return std::make_tuple(flat_params(*m), bytes, full);
  };
  auto [plain, none, plain_state] = run(false);
  auto [sharded, bytes, gathered] = run(true);
  CHECK(max_rel_diff(sharded, plain) == 0.0);
  // Each rank holds a strict part of the moments (two buffers per parameter, and the step).
  int64_t total = 0;
  for (auto& [k, t] : plain_state)
    if (k.rfind("state.", 0) == 0) total += t.numel() * int64_t(element_size(t.dtype()));
  CHECK(bytes > 0);
  CHECK(bytes < total);
  Tensor all = from_vector(std::vector<int64_t>{bytes}, {1});
  pg().all_reduce(all);
  CHECK(all.to_vector<int64_t>()[0] == total);
  // The gathered state is the unsharded optimizer's, entry for entry.
  REQUIRE(gathered.size() == plain_state.size());
  for (auto& [k, t] : plain_state) {
    const Tensor g = nn::find(gathered, k);
    REQUIRE(g.defined());
    CHECK(g.device() == t.device());
    CHECK(max_abs_diff(g.cpu().to(kFloat64), t.cpu().to(kFloat64)) == 0.0);
  }
}

}  // namespace

TEST_CASE("ZeRO-1 takes the same steps as plain DDP with each rank holding part of the state") {
  check_zero_equals_ddp(Device::cpu());
}

// The same on the ranks' CUDA devices: the gradients averaged and the owners' parameters
// broadcast by NCCL, on its stream, after the kernels that wrote them.
TEST_CASE("on CUDA, ZeRO-1 takes the same steps as plain DDP") {
  if (!cuda_per_rank("ZeRO-1")) return;
  check_zero_equals_ddp(pg().default_device());
}

TEST_CASE("the sampler's global batch does not depend on the number of ranks") {
  dist::DistributedSampler one(100, 12, 5, 0, 1);
  dist::DistributedSampler mine(100, 12, 5, pg().rank(), pg().size());
  for (int64_t k : {0, 7, 8, 20}) {  // 8 batches per epoch: k = 8 starts the second epoch
    const std::vector<int64_t> local = mine.local_batch(k);
    REQUIRE(local.size() == 6);
    Tensor gathered = pg().all_gather(from_vector(local, {6}));
    CHECK(gathered.reshape({-1}).to_vector<int64_t>() == one.global_batch(k));
  }
  CHECK_THROWS_MU(dist::batch_shard(7, 0, 2), "does not split evenly over 2 ranks");
}

namespace {

// The training loop under DDP and ZeRO-1 with the model on `dev` in `dtype`: 3 steps, a
// checkpoint, 5 steps resumed from it, against one CPU process with the whole batch.
void check_loop_resumes(Device dev, DType dtype, double tolerance) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("mumoe_dist_loop_" + std::string(dev.is_cpu() ? "cpu" : "cuda")))
          .string();
  if (pg().rank() == 0) std::filesystem::remove_all(dir);
  pg().barrier();
  auto run = [&](int64_t steps, bool resume) {
    auto m = make_net();
    m->to(dtype);
    m->to(dev);
    dist::DistributedDataParallel ddp(*m, pg());
    optim::AdamW opt(m->parameters(), optim::AdamWOptions(1e-2).weight_decay(0.1));
    dist::ZeroOptimizer zero(opt, pg());
    train::LoopOptions o;
    o.max_steps = steps;
    o.grad_accum = 2;
    o.out_dir = dir;
    o.resume = resume;
    o.progress = false;
    o.ddp = &ddp;
    o.zero = &zero;
    const dist::Shard shard = dist::batch_shard(8, pg().rank(), pg().size());
    train::LoopHooks h;
    h.micro_batch_loss = [&](int64_t step, int64_t micro) {
      auto [x, y] = global_batch(step);
      const int64_t at = shard.begin + micro * 2;
      return loss_of(*m, x.narrow(0, at, 2).to(dtype).to(dev), y.narrow(0, at, 2).to(dtype).to(dev), true);
    };
    train::LoopResult r = train::run_training(*m, opt, optim::constant_lr(1e-2), o, h);
    return std::make_pair(r, flat_params(*m));
  };
  auto [first, p3] = run(3, false);
  pg().barrier();
  auto [second, p5] = run(5, true);
  CHECK(second.start_step == 3);
  // The same 5 steps in one process, the whole batch at once (clipping at 1.0 as the loop does).
  auto m = make_net();
  m->to(dtype);
  optim::AdamW opt(m->parameters(), optim::AdamWOptions(1e-2).weight_decay(0.1));
  for (int s = 0; s < 5; ++s) {
    auto [x, y] = global_batch(s);
    opt.zero_grad();
    loss_of(*m, x.to(dtype), y.to(dtype), true).backward();
    optim::clip_grad_norm(m->parameters(), 1.0);
    opt.step();
  }
  CHECK(max_rel_diff(p5, flat_params(*m)) <= tolerance);
  // Both ranks log the same mean loss; the metrics file is rank 0's alone (one line per step).
  Tensor l = from_vector(std::vector<double>{second.last_loss}, {1});
  Tensor both = pg().all_gather(l);
  CHECK(both.to_vector<double>()[0] == both.to_vector<double>()[1]);
  pg().barrier();
  if (pg().rank() == 0) {
    std::ifstream log(dir + "/metrics.jsonl");
    int lines = 0;
    for (std::string line; std::getline(log, line);) lines += line.find("\"train\"") != std::string::npos;
    CHECK(lines == 5);
  }
  pg().barrier();
  if (pg().rank() == 0) std::filesystem::remove_all(dir);
}

}  // namespace

TEST_CASE("the training loop under DDP: the loss is the ranks' mean, only rank 0 writes, ZeRO checkpoints resume") {
  check_loop_resumes(Device::cpu(), kFloat32, 1e-6);
}

// The same with the model on the ranks' CUDA devices (float64, so that the CPU's run is
// the reference to within rounding): ZeRO's checkpoint gathers the moments from their
// owners' GPUs, and the resumed run deals them out again.
TEST_CASE("on CUDA, the training loop under DDP and ZeRO-1 resumes from its checkpoint") {
  if (!cuda_per_rank("training loop")) return;
  check_loop_resumes(pg().default_device(), kFloat64, 1e-12);
}
