// The NCCL side of the process group (dist/nccl.cu, as written, compiled as host C++
// against the real nccl.h) over emu_nccl.h's stand-in for the NCCL library, under
// `mpirun -np 2`; CPU tensors stand for the device memory. Each rank checks:
//  - the communicator made from rank 0's unique id, sent over MPI;
//  - all_reduce (sum and mean: float32, float64, int64 with the mean truncating towards
//    zero, bfloat16 rounded after the sum and after the division), broadcast of any dtype
//    as bytes from either root, all_gather, reduce_scatter (sum, mean), an empty tensor,
//    against values computed here from every rank's inputs; and a dtype NCCL cannot reduce
//    refused with a message naming it;
//  - the same with every NCCL call answering ncclInProgress for three polls first;
//  - the collectives' own stream (run.sh runs this harness with the device's work
//    deferred too, where the order shows): a collective reads what a kernel queued
//    before it on the device's stream wrote; a Work dropped unfinished makes the device's
//    stream wait for it (a later kernel there sees the mean, not the sum); and, deferred,
//    a collective does not wait for kernels queued after it;
//  - failures, each on a fresh communicator: a call failing at once, one failing when
//    polled, one failing after it settled (found by Work::done), a call or a creation that
//    never completes and an event that never fires (each giving up at the deadline): each
//    a mu::Error naming the collective, the NCCL function, the rank, NCCL's text and its
//    last-error detail, the communicator aborted and later calls refused;
//  - nothing against NCCL's contract (emu_nccl::violations) and no event left undestroyed.
#include "nccl_cuda.h"
#include <cstdio>
#include <functional>
#include "tensor/tensor.h"
using namespace mu;
using namespace mu::dist::detail;
using mu::dist::ReduceOp;
using bf16 = __nv_bfloat16;

static int rank = 0, size = 1, failures = 0;
static void report(const std::string& what, bool ok) {
  if (!ok) printf("  rank %d FAIL: %s\n", rank, what.c_str());
  failures += !ok;
}

// A communicator over every rank, made as the process group makes one.
static std::shared_ptr<NcclComm> make_comm(const Caller& c) {
  NcclId id{};
  if (rank == 0) id = nccl_unique_id(c);
  MPI_Bcast(id.data(), int(id.size()), MPI_BYTE, 0, MPI_COMM_WORLD);
  return nccl_comm_create(c, rank, id);
}

template <class T>
static bool equal(const Tensor& t, const std::vector<T>& want) {
  const std::vector<T> got = t.to_vector<T>();
  return got.size() == want.size() && std::memcmp(got.data(), want.data(), want.size() * sizeof(T)) == 0;
}

// The collectives against values computed from every rank's inputs (rank r's depend on r).
static void collectives(const std::string& label) {
  Health health;
  Caller c{"collective", rank, size, 20.0, &health};
  auto comm = make_comm(c);
  const int n = 5;

  {  // float32 sum
    std::vector<float> x(n), want(n, 0.f);
    for (int i = 0; i < n; ++i) x[i] = 0.25f * float(rank + 1) + float(i);
    for (int r = 0; r < size; ++r)
      for (int i = 0; i < n; ++i) want[i] += 0.25f * float(r + 1) + float(i);
    Tensor t = from_vector(x, {n});
    auto w = comm->all_reduce(c, t, ReduceOp::Sum);
    w->wait();
    report(label + "all_reduce sum float32", equal(t, want) && w->done());
  }
  {  // float64 mean
    std::vector<double> x(n), want(n, 0.0);
    for (int i = 0; i < n; ++i) x[i] = 3.0 * rank + 0.5 * i;
    for (int i = 0; i < n; ++i) {
      for (int r = 0; r < size; ++r) want[i] += 3.0 * r + 0.5 * i;
      want[i] /= size;
    }
    Tensor t = from_vector(x, {n});
    comm->all_reduce(c, t, ReduceOp::Mean)->wait();
    report(label + "all_reduce mean float64", equal(t, want));
  }
  {  // int64 mean: the sum divided with truncation towards zero (-7 / 2 = -3)
    std::vector<int64_t> x = {3 + rank, -3 - rank, 10 * rank, 0, 1}, want(5, 0);
    for (int r = 0; r < size; ++r) {
      const int64_t xr[5] = {3 + r, -3 - r, 10 * r, 0, 1};
      for (int i = 0; i < 5; ++i) want[i] += xr[i];
    }
    for (int64_t& v : want) v /= size;
    Tensor t = from_vector(x, {5});
    comm->all_reduce(c, t, ReduceOp::Mean)->wait();
    report(label + "all_reduce mean int64 (truncating)", equal(t, want));
  }
  {  // bfloat16 mean: the sum rounded to bfloat16 after each addition, then / size in float, rounded once
    auto value = [](int r, int i) { return __float2bfloat16_rn(1.0f + float(r) / 3.0f + float(i) / 7.0f); };
    std::vector<bf16> x(n), want(n);
    for (int i = 0; i < n; ++i) {
      x[i] = value(rank, i);
      bf16 acc = value(0, i);
      for (int r = 1; r < size; ++r) acc = __float2bfloat16_rn(__bfloat162float(acc) + __bfloat162float(value(r, i)));
      want[i] = __float2bfloat16_rn(__bfloat162float(acc) / float(size));
    }
    Tensor t = from_vector(std::vector<float>(n), {n}).to(kBFloat16);
    std::memcpy(t.raw_data(), x.data(), x.size() * sizeof(bf16));
    comm->all_reduce(c, t, ReduceOp::Mean)->wait();
    std::vector<bf16> got(n);
    std::memcpy(got.data(), t.raw_data(), got.size() * sizeof(bf16));
    report(label + "all_reduce mean bfloat16", std::memcmp(got.data(), want.data(), n * sizeof(bf16)) == 0);
  }
  {  // an empty tensor
    Tensor t = from_vector(std::vector<float>{}, {0});
    comm->all_reduce(c, t, ReduceOp::Mean)->wait();
    report(label + "all_reduce of an empty tensor", t.numel() == 0);
  }
  {  // a dtype NCCL does not reduce here
    Tensor t = from_vector(std::vector<int32_t>{1, 2}, {2});
    bool named = false;
    try {
      comm->all_reduce(c, t, ReduceOp::Sum);
    } catch (const Error& e) {
      named = std::string(e.what()).find("collective: dtype int32 cannot be reduced") != std::string::npos;
    }
    report(label + "all_reduce of int32 refused, naming the dtype", named);
  }
  for (int root = 0; root < size; ++root) {  // broadcast: int16 and bool as bytes
    const std::vector<int64_t> x = {100 * rank + 1, -7 * rank, 3}, want = {100 * root + 1, -7 * root, 3};
    Tensor t = from_vector(x, {3}).to(kInt16);
    comm->broadcast(c, t, root)->wait();
    Tensor b = from_vector(std::vector<float>{float(rank == root), 1.f, float(rank != root)}, {3}).to(kBool);
    comm->broadcast(c, b, root)->wait();
    report(label + "broadcast from rank " + std::to_string(root),
           equal(t.to(kInt64), want) && equal(b.to(kFloat32), std::vector<float>{1.f, 1.f, 0.f}));
  }
  {  // all_gather: rank order
    std::vector<float> x(3), want;
    for (int i = 0; i < 3; ++i) x[i] = 10.f * rank + i;
    for (int r = 0; r < size; ++r)
      for (int i = 0; i < 3; ++i) want.push_back(10.f * r + i);
    Tensor in = from_vector(x, {3}), out = zeros({3 * size});
    comm->all_gather(c, in, out)->wait();
    report(label + "all_gather", equal(out, want));
  }
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Mean}) {  // reduce_scatter: rank q gets block q
    const int m = 4;
    std::vector<double> x(size_t(m * size)), want(m, 0.0);
    for (int i = 0; i < m * size; ++i) x[size_t(i)] = 100.0 * rank + i;
    for (int j = 0; j < m; ++j) {
      for (int r = 0; r < size; ++r) want[j] += 100.0 * r + rank * m + j;
      if (op == ReduceOp::Mean) want[j] /= size;
    }
    Tensor in = from_vector(x, {m * size}), out = zeros({m}, kFloat64);
    comm->reduce_scatter(c, in, out, op)->wait();
    report(label + "reduce_scatter " + (op == ReduceOp::Sum ? "sum" : "mean"), equal(out, want));
  }
}

// "A kernel on the device's stream": host work queued on the framework's stream
// (stream 0, emu_queue.h), run at once or deferred as that mode says.
static void on_device_stream(std::function<void()> kernel) { emu_defer(std::move(kernel)); }

// The order between the collectives' stream and the device's (see the header).
static void streams() {
  Health health;
  Caller c{"all_reduce", rank, size, 20.0, &health};
  auto comm = make_comm(c);
  const int n = 3;
  float sum = 0.f;
  for (int r = 0; r < size; ++r) sum += float(r + 1);
  const std::vector<float> want_sum(n, sum), want_mean(n, sum / float(size));
  {  // the input written by a kernel queued before the collective
    Tensor t = zeros({n});
    float* p = static_cast<float*>(t.raw_data());
    on_device_stream([p, v = float(rank + 1)] { std::fill(p, p + n, v); });
    comm->all_reduce(c, t, ReduceOp::Sum)->wait();
    report("a collective reads what a kernel queued before it on the device's stream wrote", equal(t, want_sum));
  }
  {  // a Work dropped at once: a later kernel on the device's stream sees the finished mean
    Tensor t = full({n}, float(rank + 1)), seen = zeros({n});
    const float* src = static_cast<const float*>(t.raw_data());
    float* dst = static_cast<float*>(seen.raw_data());
    comm->all_reduce(c, t, ReduceOp::Mean);  // the Work dropped unwaited
    on_device_stream([src, dst] { std::copy(src, src + n, dst); });
    emu_stream_synchronize(nullptr);  // the device's stream, as cuda::synchronize waits for it
    report("a Work dropped unfinished: the device's stream waits for its collective", equal(seen, want_mean));
  }
  if (emu_deferred()) {  // work queued after a collective on the device's stream does not hold it up
    Tensor t = full({n}, float(rank + 1));
    auto ran = std::make_shared<bool>(false);
    auto w = comm->all_reduce(c, t, ReduceOp::Sum);
    on_device_stream([ran] { *ran = true; });
    w->wait();
    report("a collective finishes without the device's kernels queued after it", !*ran && equal(t, want_sum));
    emu_stream_synchronize(nullptr);
    report("those kernels run at the device's synchronisation", *ran);
  }
}

// The message of the mu::Error `f` throws ("" when it throws none).
static std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
static bool has(const std::string& s, const std::string& part) {
  const bool ok = s.find(part) != std::string::npos;
  if (!ok) printf("  rank %d: '%s' not in '%s'\n", rank, part.c_str(), s.c_str());
  return ok;
}

// A fault in an all_reduce on a fresh communicator: the error's text, the group marked,
// the communicator aborted, and the next call refused.
static void failure(const std::string& label, emu_nccl::Fault fault, const std::string& want, bool events_stuck = false) {
  Health health;
  Caller c{"all_reduce", rank, size, 0.5, &health};
  auto comm = make_comm(c);
  Tensor t = from_vector(std::vector<float>{1.f, 2.f}, {2});
  emu_nccl::next_fault = fault;
  emu_nccl::events_stuck = events_stuck;
  const std::string e = error_of([&] { comm->all_reduce(c, t, ReduceOp::Mean)->wait(); });
  emu_nccl::events_stuck = false;
  report(label + ": " + want, has(e, want));
  report(label + ": the group is marked unusable", health.broken());
  const std::string again = error_of([&] { comm->all_reduce(c, t, ReduceOp::Sum); });
  report(label + ": a later call is refused",
         has(again, "all_reduce: the NCCL communicator of cuda:" + std::to_string(rank) + " on rank " +
                        std::to_string(rank) + " of " + std::to_string(size) + " was aborted after an earlier failure"));
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const std::string where = "on rank " + std::to_string(rank) + " of " + std::to_string(size);
  const std::string dev = " (cuda:" + std::to_string(rank) + "): ";

  emu_nccl::polls = 0;
  collectives("");
  emu_nccl::polls = 3;
  collectives("in progress for 3 polls: ");
  emu_nccl::polls = 0;
  streams();

  using F = emu_nccl::Fault;
  const std::string remote = ncclGetErrorString(ncclRemoteError);
  for (int p : {0, 2}) {
    emu_nccl::polls = p;
    const std::string l = "polls " + std::to_string(p) + ", ";
    failure(l + "failing at once", F::fail_now,
            "all_reduce: ncclAllReduce failed " + where + dev + remote +
                " (emulated failure injected into ncclAllReduce); the NCCL communicator was aborted");
    failure(l + "failing when polled", F::fail_when_polled,
            "all_reduce: ncclAllReduce failed " + where + dev + remote +
                " (emulated failure injected into ncclAllReduce); the NCCL communicator was aborted");
    failure(l + "failing after settling", F::fail_after_settling,
            "all_reduce: an earlier NCCL operation failed " + where + dev + remote +
                " (emulated peer lost after ncclAllReduce); the NCCL communicator was aborted");
    failure(l + "never completing", F::never_settles,
            "all_reduce " + where + " did not complete within 0.5 s; another rank may have died or stalled");
    failure(l + "an event that never fires", F::none,
            "all_reduce " + where + " did not complete within 0.5 s; another rank may have died or stalled", true);
  }
  {  // a creation that never completes, and one that fails
    emu_nccl::polls = 1;
    Health health;
    Caller c{"barrier", rank, size, 0.5, &health};
    emu_nccl::next_fault = F::never_settles;
    report("a creation that never completes gives up",
           has(error_of([&] { make_comm(c); }), "barrier " + where + " did not complete within 0.5 s"));
    Health health2;
    Caller c2{"barrier", rank, size, 0.5, &health2};
    emu_nccl::next_fault = F::fail_now;
    report("a creation that fails",
           has(error_of([&] { make_comm(c2); }), "barrier: ncclCommInitRankConfig failed " + where + dev + remote));
  }

  for (const std::string& v : emu_nccl::violations) report("against NCCL's contract: " + v, false);
  report("every event destroyed (" + std::to_string(emu_nccl::live_events) + " left)", emu_nccl::live_events == 0);
  int all = 0;
  MPI_Allreduce(&failures, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) printf("%d ranks, %d failures\n%s\n", size, all, all ? "FAIL" : "PASS");
  MPI_Finalize();
  return all ? 1 : 0;
}
