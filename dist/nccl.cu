// The NCCL side of the process group (dist/nccl.h): communicators per device and the
// collectives on CUDA tensors. Every NCCL call's result is checked (ncclGetErrorString,
// and ncclGetLastError's detail), every CUDA call's too.
//
// The collectives run on a stream of their own (the communicator's, created with the
// device's highest priority), so that a gradient all-reduce started during backward runs
// beside the backward's kernels instead of between them. Two events tie it to the
// device's stream: the collective waits for the kernels queued before it (they write its
// inputs), and whoever is done with the collective (a wait that saw it finish, or the
// device's stream, made to wait for it when its Work is dropped early) goes on after it.
//
// The communicators are nonblocking (ncclConfig_t::blocking = 0): an NCCL call may return
// ncclInProgress, and then ncclCommGetAsyncError is polled until the call has taken
// effect before anything else touches the communicator or its stream. That makes every
// wait, creation included, one that can give up at the deadline and abort.
#include <nccl.h>

#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "dist/nccl.h"
#include "ops/cuda/dtypes.cuh"
#include "ops/cuda/runtime.cuh"

namespace mu::dist::detail {

static_assert(sizeof(ncclUniqueId) == kNcclIdBytes, "dist/nccl.h: kNcclIdBytes is not NCCL_UNIQUE_ID_BYTES");

namespace {

// A CUDA failure inside a collective, named after the collective and the rank.
void cuda_check(cudaError_t e, const char* fn, const Caller& c) {
  MU_CHECK(e == cudaSuccess, c.call, ": ", fn, " failed on rank ", c.rank, " of ", c.size, ": ", cudaGetErrorName(e),
           " (", cudaGetErrorString(e), ")");
}

// The element type of a reduction; the caller has refused every other dtype.
ncclDataType_t reduce_type(DType dtype, const char* call) {
  switch (dtype) {
    case DType::Float32: return ncclFloat32;
    case DType::Float64: return ncclFloat64;
    case DType::Int64: return ncclInt64;
    case DType::BFloat16: return ncclBfloat16;
    default: MU_FAIL(call, ": dtype ", dtype_name(dtype), " cannot be reduced (float32, float64, bfloat16, int64)");
  }
}

// ReduceOp::Mean after the sum: x / n in T's own arithmetic (float for bfloat16, rounded
// back once; truncating for int64), as the CPU side (dist/mean.cpp) computes it.
template <class T>
__global__ void divide_kernel(T* p, int64_t n, int divisor) {
  using W = cuda::wide_t<T>;
  const W d = W(divisor);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = cuda::narrow<T>(cuda::widen(p[i]) / d);
}

void divide_on_stream(const Tensor& t, int divisor, cudaStream_t s, const Caller& c) {
  const int64_t n = t.numel();
  if (n == 0 || divisor == 1) return;  // x / 1 is x in every dtype
  constexpr int kThreads = 256;
  const unsigned blocks = cuda::grid_for(n, kThreads);
  switch (t.dtype()) {
    case DType::Float32: divide_kernel<<<blocks, kThreads, 0, s>>>(static_cast<float*>(t.raw_data()), n, divisor); break;
    case DType::Float64: divide_kernel<<<blocks, kThreads, 0, s>>>(static_cast<double*>(t.raw_data()), n, divisor); break;
    case DType::Int64: divide_kernel<<<blocks, kThreads, 0, s>>>(static_cast<int64_t*>(t.raw_data()), n, divisor); break;
    case DType::BFloat16:
      divide_kernel<<<blocks, kThreads, 0, s>>>(static_cast<cuda::bf16*>(t.raw_data()), n, divisor);
      break;
    default: MU_FAIL(c.call, ": dtype ", dtype_name(t.dtype()), " cannot be averaged (float32, float64, bfloat16, int64)");
  }
  MU_CUDA_CHECK_LAUNCH("dist ReduceOp::Mean division");
}

class Comm;

// A new event recorded on s (no timing: it only marks completion, and a timing event
// costs more to record).
cudaEvent_t recorded_event(cudaStream_t s, const Caller& c) {
  cudaEvent_t event = nullptr;
  cuda_check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreateWithFlags", c);
  const cudaError_t e = cudaEventRecord(event, s);
  if (e != cudaSuccess) {
    cudaEventDestroy(event);  // the record's failure is the one to report
    cuda_check(e, "cudaEventRecord", c);
  }
  return event;
}

// One queued collective: done once the event recorded behind it on the communication
// stream has fired.
class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<Comm> comm, const Caller& c, std::vector<Tensor> keep, cudaStream_t device_stream,
           cudaEvent_t event)
      : comm_(std::move(comm)), c_(c), keep_(std::move(keep)), device_stream_(device_stream), event_(event) {}
  ~NcclWork() override;
  bool done() override;
  void wait() override;

 private:
  std::shared_ptr<Comm> comm_;
  Caller c_;
  std::vector<Tensor> keep_;  // alive until the collective is done
  cudaStream_t device_stream_;  // the device's stream, where the kept tensors' memory is reused
  cudaEvent_t event_;
  bool finished_ = false;
};

class Comm final : public NcclComm, public std::enable_shared_from_this<Comm> {
 public:
  explicit Comm(int device) : device_(device) {}
  // No ncclCommDestroy: the group's communicators live until the process ends, when the
  // CUDA runtime may already be gone.

  // Creates the communication stream and the communicator; called once, before the Comm
  // is shared.
  void init(const Caller& c, const NcclId& id) {
    ncclUniqueId uid;
    std::memcpy(&uid, id.data(), sizeof uid);
    cuda::stream(device_);  // makes the device current: NCCL binds the communicator to it
    // The highest priority: when backward's kernels and a collective's both wait for SMs,
    // the collective's go first, so that the transfer (the longer pole) starts early.
    // Never destroyed, like the communicator.
    int least = 0, greatest = 0;
    cuda_check(cudaDeviceGetStreamPriorityRange(&least, &greatest), "cudaDeviceGetStreamPriorityRange", c);
    cuda_check(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest), "cudaStreamCreateWithPriority",
               c);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // return at once; the waiting is ours, with a deadline
    // A failure here (or while it settles) aborts whatever part of the communicator exists;
    // the other ranks may be left waiting in their init, so the group is marked unusable.
    settle(c, "ncclCommInitRankConfig", ncclCommInitRankConfig(&comm_, c.size, uid, c.rank, &config), c.deadline());
  }

  std::shared_ptr<Work> all_reduce(const Caller& c, const Tensor& t, ReduceOp op) override {
    const ncclDataType_t type = reduce_type(t.dtype(), c.call);
    return launch(c, "ncclAllReduce", {t}, [&](cudaStream_t s) {
      const ncclResult_t r = ncclAllReduce(t.raw_data(), t.raw_data(), size_t(t.numel()), type, ncclSum, comm_, s);
      settle(c, "ncclAllReduce", r, c.deadline());
      if (op == ReduceOp::Mean) divide_on_stream(t, c.size, s, c);
    });
  }

  std::shared_ptr<Work> broadcast(const Caller& c, const Tensor& t, int root) override {
    // A copy moves bits: any dtype travels as bytes.
    const size_t nbytes = size_t(t.numel()) * element_size(t.dtype());
    return launch(c, "ncclBroadcast", {t}, [&](cudaStream_t s) {
      settle(c, "ncclBroadcast", ncclBroadcast(t.raw_data(), t.raw_data(), nbytes, ncclUint8, root, comm_, s),
             c.deadline());
    });
  }

  std::shared_ptr<Work> all_gather(const Caller& c, const Tensor& in, const Tensor& out) override {
    const size_t nbytes = size_t(in.numel()) * element_size(in.dtype());
    return launch(c, "ncclAllGather", {in, out}, [&](cudaStream_t s) {
      settle(c, "ncclAllGather", ncclAllGather(in.raw_data(), out.raw_data(), nbytes, ncclUint8, comm_, s),
             c.deadline());
    });
  }

  std::shared_ptr<Work> reduce_scatter(const Caller& c, const Tensor& in, const Tensor& out, ReduceOp op) override {
    const ncclDataType_t type = reduce_type(in.dtype(), c.call);
    return launch(c, "ncclReduceScatter", {in, out}, [&](cudaStream_t s) {
      const ncclResult_t r =
          ncclReduceScatter(in.raw_data(), out.raw_data(), size_t(out.numel()), type, ncclSum, comm_, s);
      settle(c, "ncclReduceScatter", r, c.deadline());
      if (op == ReduceOp::Mean) divide_on_stream(out, c.size, s, c);
    });
  }

  // For NcclWork::done: an asynchronous failure (a peer's connection lost) aborts the
  // communicator and is a mu::Error.
  void check_async(const Caller& c) {
    std::lock_guard<std::mutex> g(mu_);
    require_alive(c);
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
    if (r != ncclSuccess) fail_and_abort(c, "ncclCommGetAsyncError", r);
    if (state != ncclSuccess && state != ncclInProgress) fail_and_abort(c, "an earlier NCCL operation", state);
  }

  // For NcclWork::wait at its deadline: the collective will never finish, and aborting
  // is the only way to free the stream that waits on it.
  void abort_after_timeout(const Caller& c) {
    std::lock_guard<std::mutex> g(mu_);
    abort();
    c.fail_timeout();
  }

  bool aborted() {
    std::lock_guard<std::mutex> g(mu_);
    return aborted_;
  }

 private:
  // Queues `enqueue` on the communication stream under the communicator's lock (NCCL
  // calls on one communicator must not overlap), behind the device stream's work so far,
  // then an event behind it for the Work to poll.
  template <class F>
  std::shared_ptr<Work> launch(const Caller& c, const char* fn, std::vector<Tensor> keep, F enqueue) {
    std::lock_guard<std::mutex> g(mu_);
    require_alive(c);
    cudaStream_t device_stream = cuda::stream(device_);  // also makes the device current, as NCCL expects
    // The inputs were written by kernels on the device's stream: the collective waits for
    // them. The event may go at once: the wait has taken the record it waits for.
    cudaEvent_t inputs_ready = recorded_event(device_stream, c);
    const cudaError_t e = cudaStreamWaitEvent(stream_, inputs_ready, 0);
    cudaEventDestroy(inputs_ready);
    cuda_check(e, "cudaStreamWaitEvent", c);
    enqueue(stream_);
    cudaEvent_t done = recorded_event(stream_, c);
    return std::make_shared<NcclWork>(shared_from_this(), c, std::move(keep), device_stream, done);
  }

  // After a nonblocking NCCL call returned r: polls the communicator until the call has
  // taken effect (ncclSuccess), aborting on an error or at the deadline. The caller holds
  // mu_ (or, in init, is the only user).
  void settle(const Caller& c, const char* fn, ncclResult_t r, Clock::time_point deadline) {
    if (r == ncclSuccess) return;
    if (r != ncclInProgress) fail_and_abort(c, fn, r);
    ncclResult_t state = ncclInProgress;
    const bool settled = poll_until(
        [&] {
          const ncclResult_t q = ncclCommGetAsyncError(comm_, &state);
          if (q != ncclSuccess) fail_and_abort(c, "ncclCommGetAsyncError", q);
          return state != ncclInProgress;
        },
        deadline);
    if (!settled) {
      abort();
      c.fail_timeout();
    }
    if (state != ncclSuccess) fail_and_abort(c, fn, state);
  }

  void require_alive(const Caller& c) const {
    MU_CHECK(!aborted_, c.call, ": the NCCL communicator of cuda:", device_, " on rank ", c.rank, " of ", c.size,
             " was aborted after an earlier failure; CUDA collectives cannot continue: exit the process");
  }

  // ncclCommAbort: stops the communicator's kernels and frees it. Its own result is not
  // reported: the failure that led here is, and the communicator is unusable either way.
  void abort() {
    if (aborted_ || comm_ == nullptr) return;
    aborted_ = true;
    ncclCommAbort(comm_);
  }

  // A failed NCCL call as a mu::Error naming the collective, the NCCL function, the rank,
  // ncclGetErrorString's text and ncclGetLastError's detail (the peer, the transport).
  // The communicator is aborted first: nothing can be assumed about it after an error.
  [[noreturn]] void fail_and_abort(const Caller& c, const char* fn, ncclResult_t r) {
    const char* last = ncclGetLastError(comm_);
    const std::string detail = last && last[0] ? std::string(" (") + last + ")" : std::string();  // before the abort frees it
    abort();
    const std::string msg = ::mu::detail::str(c.call, ": ", fn, " failed on rank ", c.rank, " of ", c.size, " (cuda:",
                                              device_, "): ", ncclGetErrorString(r), detail,
                                              "; the NCCL communicator was aborted");
    c.health->mark(msg);
    throw Error(msg);
  }

  int device_;
  cudaStream_t stream_ = nullptr;  // the collectives' stream
  ncclComm_t comm_ = nullptr;
  bool aborted_ = false;  // guarded by mu_
  std::mutex mu_;
};

// Destroying an event that has not fired yet is allowed: CUDA releases it once it has.
// A Work dropped before it was seen to finish makes the device's stream wait for the
// collective, so that the kept tensors' memory, handed back to the caching allocator
// here, is not reused by a kernel while the collective still reads or writes it. After a
// failure the communicator is aborted and nothing can be assumed about its stream: the
// memory is never handed back (nor the device's stream made to wait for an event that
// may never fire).
NcclWork::~NcclWork() {
  // Failures here have no one to tell; a failed wait keeps the memory instead.
  if (!finished_ && (comm_->aborted() || cudaStreamWaitEvent(device_stream_, event_, 0) != cudaSuccess))
    keep_forever(std::move(keep_));
  cudaEventDestroy(event_);
}

bool NcclWork::done() {
  if (finished_) return true;
  comm_->check_async(c_);
  const cudaError_t e = cudaEventQuery(event_);
  if (e == cudaErrorNotReady) return false;
  cuda_check(e, "cudaEventQuery", c_);
  finished_ = true;
  return true;
}

void NcclWork::wait() {
  if (poll_until([this] { return done(); }, c_.deadline())) return;
  comm_->abort_after_timeout(c_);
}

}  // namespace

NcclId nccl_unique_id(const Caller& c) {
  ncclUniqueId uid;
  const ncclResult_t r = ncclGetUniqueId(&uid);
  MU_CHECK(r == ncclSuccess, c.call, ": ncclGetUniqueId failed on rank ", c.rank, " of ", c.size, ": ",
           ncclGetErrorString(r));
  NcclId id;
  std::memcpy(id.data(), &uid, sizeof uid);
  return id;
}

DeviceUuid device_uuid(int device) {
  cuda::stream(device);  // checks that the device exists, with the framework's message
  cudaDeviceProp prop{};
  MU_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  DeviceUuid u;
  std::memcpy(u.data(), prop.uuid.bytes, u.size());
  return u;
}

std::shared_ptr<NcclComm> nccl_comm_create(const Caller& c, int device, const NcclId& id) {
  auto comm = std::make_shared<Comm>(device);
  comm->init(c, id);
  return comm;
}

}  // namespace mu::dist::detail
