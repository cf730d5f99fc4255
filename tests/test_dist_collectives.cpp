// The collectives of dist/process_group.h against sums, means, gathers and scatters
// computed here. ctest runs this suite as two processes under mpirun (test_dist_collectives,
// and test_dist_collectives_checked with MUMOE_DIST_CHECK=1) and as one process started
// directly (test_dist_single: MPI's singleton init, or the group of one of a build
// without MPI). Every case is written for any group size: each rank fills its tensors
// from its rank, and the expected result is computed over all ranks in a loop.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "helpers.h"

using namespace mu;
using mu::dist::ProcessGroup;
using mu::dist::ReduceOp;

namespace {

ProcessGroup& pg() { return ProcessGroup::world(); }

// What rank r puts at element i. Multiples of 1/4 or 1/2 of small size: every sum and
// mean below is exact in the dtype, so results compare with ==.
double fill_value(int r, int64_t i, DType d) {
  if (d == kInt64) return double(r * 1000 - 7 * i + 3);
  if (d == kBFloat16) return (r + 1) * 0.5 + double(i % 16);  // within bfloat16's 8 significant bits
  return (r + 1) * 0.25 + 1.5 * double(i) - 3.0;
}

Tensor rank_tensor(int r, const Shape& shape, DType d, Device dev = Device::cpu()) {
  std::vector<double> v(static_cast<size_t>(numel_of(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = fill_value(r, int64_t(i), d);
  return from_vector(v, shape, TensorOptions(d)).to(dev);
}

// Sum / n as the group computes Mean: in the dtype, after the sum.
double mean_in(DType d, double sum, int n) {
  switch (d) {
    case DType::Float32: return double(float(sum) / float(n));
    case DType::Float64: return sum / n;
    case DType::Int64: return double(int64_t(sum) / n);
    case DType::BFloat16: return double(float(bfloat16_t(float(sum) / float(n))));
    default: FAIL("no mean for " << dtype_name(d)); return 0;
  }
}

// Element i of the reduction over ranks of fill_value(r, offset + i).
std::vector<double> expected_reduction(int64_t count, int64_t offset, DType d, ReduceOp op) {
  std::vector<double> want(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    double sum = 0;
    for (int r = 0; r < pg().size(); ++r) sum += fill_value(r, offset + i, d);
    want[size_t(i)] = op == ReduceOp::Mean ? mean_in(d, sum, pg().size()) : sum;
  }
  return want;
}

// got's elements equal want's exactly; the first few differences are reported.
void check_equal(const Tensor& got, const std::vector<double>& want) {
  const std::vector<double> g = got.to_vector<double>();
  REQUIRE(g.size() == want.size());
  int bad = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    if (g[i] != want[i] && bad++ < 5) FAIL_CHECK("rank " << pg().rank() << ", element " << i << ": got " << g[i] << ", want " << want[i]);
  }
  CHECK(bad == 0);
}

const char* op_name(ReduceOp op) { return op == ReduceOp::Mean ? "Mean" : "Sum"; }

// Prints from rank 0 only, so that a message appears once however many ranks run.
void say(const std::string& s) {
  if (pg().rank() == 0) std::printf("%s\n", s.c_str());
  std::fflush(stdout);
}

constexpr DType kReduceDTypes[] = {kFloat32, kFloat64, kBFloat16, kInt64};

}  // namespace

TEST_CASE("the group: rank, size, local rank, default device, timeout") {
  const int rank = pg().rank(), size = pg().size();
  CHECK(size >= 1);
  CHECK((rank >= 0 && rank < size));
  CHECK((pg().local_rank() >= 0 && pg().local_rank() < pg().local_size()));
  CHECK(pg().local_size() <= size);
  // Launched by OpenMPI's mpirun: its view of the job and the group's agree.
  if (const char* n = std::getenv("OMPI_COMM_WORLD_SIZE")) CHECK(size == std::atoi(n));
  if (const char* r = std::getenv("OMPI_COMM_WORLD_RANK")) CHECK(rank == std::atoi(r));
  if (const char* lr = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK")) CHECK(pg().local_rank() == std::atoi(lr));
  if (cuda::device_count() == 0) CHECK(pg().default_device() == Device::cpu());
  else CHECK(pg().default_device() == Device::cuda(pg().local_rank() % cuda::device_count()));

  const char* env = std::getenv("MUMOE_DIST_TIMEOUT");
  CHECK(pg().timeout_seconds() == (env ? std::atof(env) : 300.0));
  const double saved = pg().timeout_seconds();
  CHECK_THROWS_MU(pg().set_timeout_seconds(-1), "-1 is not a positive number of seconds");
  CHECK_THROWS_MU(pg().set_timeout_seconds(0), "is not a positive number of seconds");
  CHECK_THROWS_MU(pg().set_timeout_seconds(std::nan("")), "is not a positive number of seconds");
  pg().set_timeout_seconds(42.5);
  CHECK(pg().timeout_seconds() == 42.5);
  pg().set_timeout_seconds(saved);
}

TEST_CASE("all_reduce: Sum and Mean of float32, float64, bfloat16 and int64") {
  for (DType d : kReduceDTypes) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Mean}) {
      INFO(dtype_name(d) << ", " << op_name(op));
      Tensor t = rank_tensor(pg().rank(), {3, 5}, d);
      const uint64_t before = t.version();
      pg().all_reduce(t, op);
      CHECK(t.version() > before);  // written in place
      CHECK(t.dtype() == d);
      check_equal(t, expected_reduction(15, 0, d, op));
    }
  }
}

TEST_CASE("all_reduce of int64 is exact beyond 2^53, and of empty and 0-d tensors") {
  const int64_t big = int64_t(1) << 60;
  Tensor t = from_vector<int64_t>({big + pg().rank(), -(int64_t(1) << 55) - 3 * pg().rank()}, {2});
  pg().all_reduce(t);
  int64_t want0 = 0, want1 = 0;
  for (int r = 0; r < pg().size(); ++r) {
    want0 += big + r;
    want1 += -(int64_t(1) << 55) - 3 * r;
  }
  CHECK(t.to_vector<int64_t>() == std::vector<int64_t>{want0, want1});

  Tensor empty_t = zeros({0, 3});
  pg().all_reduce(empty_t, ReduceOp::Mean);
  CHECK(empty_t.shape() == Shape{0, 3});

  Tensor s = scalar_tensor(fill_value(pg().rank(), 0, kFloat64), kFloat64);
  pg().all_reduce(s);
  CHECK(s.dim() == 0);
  check_equal(s, expected_reduction(1, 0, kFloat64, ReduceOp::Sum));
}

TEST_CASE("all_reduce_async: several in flight, waited out of order; done() after wait") {
  Tensor a = rank_tensor(pg().rank(), {64}, kFloat32);
  Tensor b = rank_tensor(pg().rank(), {7, 3}, kFloat64);
  Tensor c = rank_tensor(pg().rank(), {10}, kInt64);
  auto wa = pg().all_reduce_async(a, ReduceOp::Sum);
  auto wb = pg().all_reduce_async(b, ReduceOp::Mean);
  auto wc = pg().all_reduce_async(c, ReduceOp::Mean);
  wc->wait();
  CHECK(wc->done());
  wb->wait();
  // done() polled until true completes the collective too (Mean's division included).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!wa->done() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(std::chrono::microseconds(50));
  CHECK(wa->done());
  wa->wait();  // a second wait is harmless
  check_equal(a, expected_reduction(64, 0, kFloat32, ReduceOp::Sum));
  check_equal(b, expected_reduction(21, 0, kFloat64, ReduceOp::Mean));
  check_equal(c, expected_reduction(10, 0, kInt64, ReduceOp::Mean));

  // A Work dropped without a wait waits for itself: the tensor still gets its sum.
  Tensor d = rank_tensor(pg().rank(), {5}, kFloat64);
  pg().all_reduce_async(d).reset();
  check_equal(d, expected_reduction(5, 0, kFloat64, ReduceOp::Sum));
}

TEST_CASE("broadcast from every root, numeric and storage dtypes") {
  for (int root = 0; root < pg().size(); ++root) {
    for (DType d : kReduceDTypes) {
      INFO("root " << root << ", " << dtype_name(d));
      Tensor t = rank_tensor(pg().rank(), {4, 3}, d);
      pg().broadcast(t, root);
      check_equal(t, rank_tensor(root, {4, 3}, d).to_vector<double>());
    }
    // A copy moves bits, so any dtype goes: uint8 and bool too.
    INFO("root " << root << ", uint8 and bool");
    Tensor u = arange(0, 9, 1, TensorOptions(kInt64)).add_(double(40 * pg().rank())).to(kUInt8);
    pg().broadcast(u, root);
    check_equal(u, arange(0, 9, 1, TensorOptions(kInt64)).add_(double(40 * root)).to_vector<double>());
    Tensor flags = full({5}, double(pg().rank() == root), kBool);
    pg().broadcast(flags, root);
    check_equal(flags, std::vector<double>(5, 1.0));
  }
}

TEST_CASE("all_gather stacks every rank's tensor along a new leading dim") {
  for (DType d : {kFloat32, kFloat64, kInt64, kBFloat16}) {
    INFO(dtype_name(d));
    Tensor t = rank_tensor(pg().rank(), {2, 3}, d);
    Tensor out = pg().all_gather(t);
    CHECK(out.shape() == Shape{pg().size(), 2, 3});
    CHECK(out.dtype() == d);
    for (int r = 0; r < pg().size(); ++r) check_equal(out.select(0, r), rank_tensor(r, {2, 3}, d).to_vector<double>());
  }
  // A strided tensor is read through a copy.
  Tensor strided = rank_tensor(pg().rank(), {2, 3}, kFloat64).transpose(0, 1);
  Tensor out = pg().all_gather(strided);
  CHECK(out.shape() == Shape{pg().size(), 3, 2});
  for (int r = 0; r < pg().size(); ++r)
    check_equal(out.select(0, r), rank_tensor(r, {2, 3}, kFloat64).transpose(0, 1).contiguous().to_vector<double>());
  // 0-d tensors gather into a vector.
  Tensor s = pg().all_gather(scalar_tensor(double(pg().rank()), kInt64));
  CHECK(s.shape() == Shape{pg().size()});
  for (int r = 0; r < pg().size(); ++r) CHECK(s.at({r}) == r);
}

TEST_CASE("reduce_scatter: each rank gets its block of the Sum or Mean") {
  const int size = pg().size(), rank = pg().rank();
  for (DType d : kReduceDTypes) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Mean}) {
      INFO(dtype_name(d) << ", " << op_name(op));
      Tensor t = rank_tensor(rank, {2 * size, 3}, d);
      Tensor out = pg().reduce_scatter(t, op);
      CHECK(out.shape() == Shape{2, 3});
      CHECK(out.dtype() == d);
      // This rank's block: rows [2 * rank, 2 * rank + 2), elements [6 * rank, 6 * rank + 6).
      check_equal(out, expected_reduction(6, 6 * rank, d, op));
    }
  }
}

TEST_CASE("barrier waits for every rank") {
  pg().barrier();
  // Rank 0 arrives late: every other rank's barrier must take about that long.
  const auto late = std::chrono::milliseconds(300);
  if (pg().rank() == 0) std::this_thread::sleep_for(late);
  const auto t0 = std::chrono::steady_clock::now();
  pg().barrier();
  const auto waited = std::chrono::steady_clock::now() - t0;
  if (pg().rank() != 0) CHECK(waited >= late / 2);
  pg().barrier();
}

TEST_CASE("argument errors name the problem and the values") {
  const int size = pg().size();
  Tensor strided = rank_tensor(pg().rank(), {3, 4}, kFloat32).transpose(0, 1);
  CHECK_THROWS_MU(pg().all_reduce(strided), "all_reduce: Tensor[float32, [4, 3], cpu] is not contiguous (strides [1, 4])");
  CHECK_THROWS_MU(pg().all_reduce_async(strided), "all_reduce_async: Tensor[float32, [4, 3], cpu] is not contiguous");
  CHECK_THROWS_MU(pg().broadcast(strided, 0), "broadcast: Tensor[float32, [4, 3], cpu] is not contiguous");

  Tensor t = zeros({4});
  CHECK_THROWS_MU(pg().broadcast(t, size), "broadcast: root " + std::to_string(size) + " is out of range for a group of " +
                                               std::to_string(size) + " (ranks 0 to " + std::to_string(size - 1) + ")");
  CHECK_THROWS_MU(pg().broadcast(t, -1), "root -1 is out of range");

  if (size > 1) {
    CHECK_THROWS_MU(pg().reduce_scatter(zeros({2 * size + 1, 3})),
                    "reduce_scatter: dim 0 of Tensor[float32, [" + std::to_string(2 * size + 1) + ", 3], cpu] is " +
                        std::to_string(2 * size + 1) + ", which is not divisible by the group's size " + std::to_string(size));
  }
  CHECK_THROWS_MU(pg().reduce_scatter(scalar_tensor(1.0)), "reduce_scatter: Tensor[float32, [], cpu] has no dim 0 to scatter");

  Tensor i32 = zeros({3}, kInt32);
  CHECK_THROWS_MU(pg().all_reduce(i32), "all_reduce: Tensor[int32, [3], cpu] has dtype int32, which cannot be reduced");
  CHECK_THROWS_MU(pg().reduce_scatter(zeros({size}, kBool)), "has dtype bool, which cannot be reduced");

  Tensor undefined;
  CHECK_THROWS_MU(pg().all_reduce(undefined), "all_reduce: the tensor is undefined");
  CHECK_THROWS_MU(pg().all_gather(undefined), "all_gather: the tensor is undefined");

  // In place on a leaf that autograd tracks only under NoGradGuard, as optimizer updates.
  Tensor w = rank_tensor(pg().rank(), {3}, kFloat32).requires_grad_();
  CHECK_THROWS_MU(pg().broadcast(w, 0), "wrap the update in NoGradGuard");
  {
    autograd::NoGradGuard g;
    pg().broadcast(w, 0);
  }
  check_equal(w, rank_tensor(0, {3}, kFloat32).to_vector<double>());

  // None of the refusals above left the group unusable.
  Tensor ok = rank_tensor(pg().rank(), {2}, kFloat64);
  pg().all_reduce(ok);
  check_equal(ok, expected_reduction(2, 0, kFloat64, ReduceOp::Sum));
}

TEST_CASE("MUMOE_DIST_CHECK=1: ranks that disagree on dtype or shape are all told so") {
  const char* env = std::getenv("MUMOE_DIST_CHECK");
  if (env == nullptr || std::string(env) != "1" || pg().size() < 2) {
    say("note: the disagreement checks need MUMOE_DIST_CHECK=1 and two ranks (test_dist_collectives_checked)");
    return;
  }
  Tensor t = zeros({4}, pg().rank() == 1 ? kFloat64 : kFloat32);
  CHECK_THROWS_MU(pg().all_reduce(t), "all_reduce: the ranks disagree (MUMOE_DIST_CHECK=1): rank 0 called all_reduce of "
                                      "float32 [4] (4 elements) on cpu, ReduceOp::Sum but rank 1 called all_reduce of "
                                      "float64 [4] (4 elements) on cpu, ReduceOp::Sum");
  Tensor g = zeros({pg().rank() == 1 ? 3 : 2, 2});
  CHECK_THROWS_MU(pg().all_gather(g), "rank 1 called all_gather of float32 [3, 2]");
  Tensor b = zeros({2});
  CHECK_THROWS_MU(pg().broadcast(b, pg().rank() == 1 ? 1 : 0), "root 1");
  // A disagreement is found before any data moves: the group goes on.
  Tensor ok = rank_tensor(pg().rank(), {3}, kFloat32);
  pg().all_reduce(ok, ReduceOp::Mean);
  check_equal(ok, expected_reduction(3, 0, kFloat32, ReduceOp::Mean));
}

// Every rank's tensor on cuda:0 of one machine: the group sees the shared device (by its
// UUID) before NCCL does, and says what to do; nothing was sent, so the group goes on.
// Before the case below: the check runs where a communicator for the device is made, and
// once made (there rank 0's, for its cuda:0) it is reused as it is.
TEST_CASE("two ranks on one GPU are refused before NCCL is called") {
#ifndef MUMOE_NCCL
  say("SKIPPED (one GPU for two ranks): this build has no NCCL");
#else
  const int devices = cuda::device_count();
  if (devices == 0 || pg().size() < 2 || pg().local_size() != pg().size()) {
    say("SKIPPED (one GPU for two ranks): it needs a CUDA device and two or more ranks, all on this machine");
    return;
  }
  Tensor t = zeros({4}, Device::cuda(0));
  // The remedy depends on whether this machine has a device for every rank.
  const char* remedy =
      devices < pg().local_size() ? "CUDA device(s) for its" : "put each rank's tensors on ProcessGroup::default_device()";
  CHECK_THROWS_MU(pg().all_reduce(t), "would share one GPU");
  CHECK_THROWS_MU(pg().all_reduce(t), remedy);  // refused again: no communicator was left half made
  Tensor ok = rank_tensor(pg().rank(), {3}, kFloat32);
  pg().all_reduce(ok);
  check_equal(ok, expected_reduction(3, 0, kFloat32, ReduceOp::Sum));
#endif
}

TEST_CASE("CUDA tensors through NCCL") {
  const int devices = cuda::device_count();
  if (devices == 0) {
    say("SKIPPED (CUDA collectives): no CUDA device on this machine");
    return;
  }
  if (devices < pg().local_size()) {
    say("SKIPPED (CUDA collectives): " + std::to_string(pg().local_size()) + " ranks on this machine but " +
        std::to_string(devices) + " CUDA device(s); NCCL needs one device per rank");
    return;
  }
  const Device dev = pg().default_device();
#ifndef MUMOE_NCCL
  if (pg().size() > 1) {
    Tensor t = zeros({2}, dev);
    CHECK_THROWS_MU(pg().all_reduce(t), "NCCL was not found at build time");
    say("SKIPPED (CUDA collectives): this build has no NCCL");
    return;
  }
#endif
  const int size = pg().size(), rank = pg().rank();
  for (DType d : kReduceDTypes) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Mean}) {
      INFO("cuda all_reduce " << dtype_name(d) << ", " << op_name(op));
      Tensor t = rank_tensor(rank, {33, 5}, d, dev);
      pg().all_reduce(t, op);
      CHECK(t.device() == dev);
      check_equal(t, expected_reduction(165, 0, d, op));

      Tensor a = rank_tensor(rank, {1000}, d, dev);
      auto w = pg().all_reduce_async(a, op);
      w->wait();
      CHECK(w->done());
      check_equal(a, expected_reduction(1000, 0, d, op));

      INFO("cuda reduce_scatter");
      Tensor rs = pg().reduce_scatter(rank_tensor(rank, {2 * size, 3}, d, dev), op);
      CHECK(rs.device() == dev);
      check_equal(rs, expected_reduction(6, 6 * rank, d, op));
    }
    INFO("cuda all_gather and broadcast " << dtype_name(d));
    Tensor out = pg().all_gather(rank_tensor(rank, {2, 3}, d, dev));
    CHECK(out.device() == dev);
    CHECK(out.shape() == Shape{size, 2, 3});
    for (int r = 0; r < size; ++r) check_equal(out.select(0, r), rank_tensor(r, {2, 3}, d).to_vector<double>());
    for (int root = 0; root < size; ++root) {
      Tensor b = rank_tensor(rank, {7}, d, dev);
      pg().broadcast(b, root);
      check_equal(b, rank_tensor(root, {7}, d).to_vector<double>());
    }
  }
  Tensor strided = rank_tensor(rank, {3, 4}, kFloat32, dev).transpose(0, 1);
  CHECK_THROWS_MU(pg().all_reduce(strided), "is not contiguous");
}

// After the case above, each rank has a communicator for its default device. A rank that
// moves its CUDA collectives to another device would make a new one (an MPI exchange)
// while the others reuse theirs (NCCL): unchecked, both sides wait until the timeout;
// MUMOE_DIST_CHECK=1 says so at once, on every rank.
TEST_CASE("MUMOE_DIST_CHECK=1: a rank that moves its CUDA collectives to another device is told so") {
  const char* env = std::getenv("MUMOE_DIST_CHECK");
#ifdef MUMOE_NCCL
  const bool nccl = true;
#else
  const bool nccl = false;
#endif
  if (env == nullptr || std::string(env) != "1" || pg().size() < 2 || !nccl ||
      cuda::device_count() < pg().local_size() || pg().local_size() < 2) {
    say("note: the device-move check needs MUMOE_DIST_CHECK=1, NCCL, and two ranks with a CUDA device each on one "
        "machine");
    return;
  }
  Tensor warm = zeros({2}, pg().default_device());
  pg().all_reduce(warm);  // every rank's communicator for its own device exists now
  // Rank 1 moves to rank 0's device: its first collective there, rank 0's device as before.
  Tensor moved = zeros({2}, pg().rank() == 1 ? Device::cuda(0) : pg().default_device());
  CHECK_THROWS_MU(pg().all_reduce(moved), "(its first collective on that device)");
  // Found before any data moved: the group goes on, each rank on its own device.
  Tensor t = rank_tensor(pg().rank(), {5}, kFloat32, pg().default_device());
  pg().all_reduce(t);
  check_equal(t, expected_reduction(5, 0, kFloat32, ReduceOp::Sum));
}
