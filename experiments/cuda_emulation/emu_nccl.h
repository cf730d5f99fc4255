// A stand-in for the NCCL library under the host emulation, for dist/nccl.cu compiled as
// host C++ against the real nccl.h (run.sh's part `nccl`): the functions nccl.cu calls,
// defined with the header's signatures, carried by MPI between the processes mpirun
// started, on host memory (the emulation's device memory). It holds nccl.cu to NCCL's
// documented contract for a nonblocking communicator (ncclConfig_t::blocking = 0): a call
// may return ncclInProgress, and then ncclCommGetAsyncError must be polled until the state
// is ncclSuccess before the next NCCL call on that communicator and before any kernel on
// its stream; after an error, nothing but ncclCommAbort (once). Every use against that
// contract, and a collective called with different arguments on different ranks, is
// recorded in emu_nccl::violations for the harness to report.
//
// Also here: the CUDA streams and events nccl.cu uses, as emu_queue.h runs them (a
// communication stream of its own, waits between it and the device's stream, events
// that fire when their stream reaches them, unless events_stuck), the device properties it reads,
// and faults to inject into the next call: one that fails at once, one that fails when
// polled, one that settles and then fails (a peer lost mid-transfer, as
// ncclCommGetAsyncError reports it later), one that never completes. A fault is injected
// on every rank alike (the harness sets it on each), so the ranks stay paired over MPI.
#pragma once
#include <mpi.h>
#include <nccl.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "emu_devices.h"
#include "emu_extra.h"

namespace emu_nccl {
enum class Fault { none, fail_now, fail_when_polled, fail_after_settling, never_settles };
inline int polls = 0;                   // polls that see ncclInProgress after each call
inline Fault next_fault = Fault::none;  // for the next call (creation or collective)
inline ncclResult_t fault_result = ncclRemoteError;
// Events recorded from now on on a stream other than the device's (the collectives')
// never fire: a collective that hangs.
inline bool events_stuck = false;
inline std::vector<std::string> violations;
inline int live_events = 0;  // created and not yet destroyed
inline void violation(const std::string& what) { violations.push_back(what); }
}  // namespace emu_nccl

// The communicator the real header declares (typedef struct ncclComm* ncclComm_t).
struct ncclComm {
  MPI_Comm mpi = MPI_COMM_NULL;
  int rank = 0, size = 0;
  ncclResult_t state = ncclSuccess;  // what ncclCommGetAsyncError reports once settled
  int polls_left = 0;                // polls still to see ncclInProgress
  ncclResult_t settles_to = ncclSuccess;
  bool never_settles = false;
  bool fails_later = false;  // settled, then fails at the next poll
  bool aborted = false;
  std::string last_error;
};

namespace emu_nccl {
inline std::vector<ncclComm*> comms;  // those not aborted

// Whether `fn` may be called on c now; records the misuse otherwise.
inline bool usable(ncclComm* c, const std::string& fn) {
  if (c == nullptr) return violation(fn + " on a null communicator"), false;
  if (c->aborted) return violation(fn + " on an aborted communicator"), false;
  if (c->state == ncclInProgress)
    return violation(fn + " while the previous call was in progress (ncclCommGetAsyncError had not said ncclSuccess)"),
           false;
  if (c->state != ncclSuccess) return violation(fn + " after an error, instead of ncclCommAbort"), false;
  return true;
}

// A call accepted on c: the injected fault, or `work` (which moves the data, on every
// rank alike), then the call's return as a nonblocking communicator gives it.
template <class W>
ncclResult_t run(ncclComm* c, const char* fn, cudaStream_t stream, W work) {
  // The data moves now: the stream's earlier work (emu_queue.h) runs first, as it would
  // have by the time NCCL's kernel, queued behind it, reads the buffers; and only that
  // (with the work of other streams it waits for), so that a buffer written on another
  // stream without a wait is read stale.
  emu_flush_stream(stream);
  const Fault f = next_fault;
  next_fault = Fault::none;
  c->never_settles = f == Fault::never_settles;
  c->fails_later = f == Fault::fail_after_settling;
  c->settles_to = ncclSuccess;
  if (f == Fault::fail_now || f == Fault::fail_when_polled) {
    c->last_error = std::string("emulated failure injected into ") + fn;
    if (f == Fault::fail_now) return c->state = fault_result;
    c->settles_to = fault_result;
  } else if (f == Fault::none || f == Fault::fail_after_settling) {
    const ncclResult_t r = work();
    if (r != ncclSuccess) return c->state = r;
  }
  if (c->fails_later) c->last_error = std::string("emulated peer lost after ") + fn;
  if (polls == 0 && f != Fault::fail_when_polled && !c->never_settles) return c->state = ncclSuccess;
  c->polls_left = polls;
  return c->state = ncclInProgress;
}

inline size_t element_bytes(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    default: return 8;
  }
}

// Whether every rank called `fn` with the same (count, type, root); records it otherwise.
inline bool agree(ncclComm* c, const char* fn, size_t count, int type, int root) {
  long long mine[3] = {static_cast<long long>(count), type, root};
  std::vector<long long> all(size_t(3 * c->size));
  MPI_Allgather(mine, 3, MPI_LONG_LONG, all.data(), 3, MPI_LONG_LONG, c->mpi);
  for (int r = 0; r < c->size; ++r)
    if (std::memcmp(&all[size_t(3 * r)], all.data(), sizeof mine) != 0) {
      violation(std::string(fn) + ": the ranks passed different counts, types or roots");
      return false;
    }
  return true;
}

// out[i] = in_0[i] + in_1[i] + ... in rank order, each sum in T's arithmetic (float for
// bfloat16, rounded back after each), as NCCL's reduction kernels add.
template <class T>
void sum_ranks(void* out, const char* all, size_t count, size_t rank_stride, int ranks, size_t first) {
  for (size_t i = 0; i < count; ++i) {
    T acc;
    std::memcpy(&acc, all + (first + i) * sizeof(T), sizeof(T));
    for (int r = 1; r < ranks; ++r) {
      T x;
      std::memcpy(&x, all + size_t(r) * rank_stride + (first + i) * sizeof(T), sizeof(T));
      if constexpr (std::is_same_v<T, __nv_bfloat16>) acc = __float2bfloat16_rn(__bfloat162float(acc) + __bfloat162float(x));
      else acc = T(acc + x);
    }
    std::memcpy(static_cast<char*>(out) + i * sizeof(T), &acc, sizeof(T));
  }
}

// Every rank's `n_per_rank` elements of `send` gathered (rank order), then `count` sums
// from element `first` of each into recv.
inline ncclResult_t reduce(ncclComm* c, const void* send, void* recv, size_t n_per_rank, size_t count, size_t first,
                           ncclDataType_t type, ncclRedOp_t op, const char* fn) {
  if (op != ncclSum) return violation(std::string(fn) + ": only ncclSum is emulated"), ncclInvalidArgument;
  const size_t es = element_bytes(type), bytes = n_per_rank * es;
  std::vector<char> all(bytes * size_t(c->size));
  MPI_Allgather(send, int(bytes), MPI_BYTE, all.data(), int(bytes), MPI_BYTE, c->mpi);
  switch (type) {
    case ncclFloat32: sum_ranks<float>(recv, all.data(), count, bytes, c->size, first); break;
    case ncclFloat64: sum_ranks<double>(recv, all.data(), count, bytes, c->size, first); break;
    case ncclInt64: sum_ranks<int64_t>(recv, all.data(), count, bytes, c->size, first); break;
    case ncclInt32: sum_ranks<int32_t>(recv, all.data(), count, bytes, c->size, first); break;
    case ncclBfloat16: sum_ranks<__nv_bfloat16>(recv, all.data(), count, bytes, c->size, first); break;
    default: return violation(std::string(fn) + ": a type the emulation does not reduce"), ncclInvalidArgument;
  }
  return ncclSuccess;
}

// Before a kernel or an event on the stream: no communicator may be in progress.
inline void check_stream_idle(const char* what) {
  for (ncclComm* c : comms)
    if (c->state == ncclInProgress) violation(std::string(what) + " while an NCCL call was in progress");
}
inline const bool launch_hooked = (emu_before_launch = [] { check_stream_idle("a kernel launched"); }, true);

// The CUDA runtime calls of nccl.cu (macros below).
// The device's UUID as emu_runtime.h gives it (emu_devices.h).
inline cudaError_t device_properties(cudaDeviceProp* p, int device) {
  std::memset(p, 0, sizeof *p);
  emu_device_uuid(p->uuid.bytes, device);
  return cudaSuccess;
}
inline cudaError_t stream_priority_range(int* least, int* greatest) {
  *least = 0, *greatest = -5;  // some range below 0: lower numbers are higher priorities
  return cudaSuccess;
}
inline cudaError_t stream_create(cudaStream_t* s, int priority) {
  int least = 0, greatest = 0;
  stream_priority_range(&least, &greatest);
  if (priority > least || priority < greatest) violation("cudaStreamCreateWithPriority: priority out of range");
  *s = emu_stream_create();
  return cudaSuccess;
}
inline cudaError_t event_create(cudaEvent_t* e) {
  *e = new CUevent_st;
  ++live_events;
  return cudaSuccess;
}
inline cudaError_t event_record(cudaEvent_t e, cudaStream_t s) {
  check_stream_idle("an event recorded on the stream");
  emu_event_record(e, s, events_stuck && emu_stream_of(s) != &emu_device_stream);
  return cudaSuccess;
}
inline cudaError_t stream_wait_event(cudaStream_t s, cudaEvent_t e) {
  emu_stream_wait_event(s, e);
  return cudaSuccess;
}
// Deferred (emu_queue.h): each query lets the device run one more operation towards the
// event, and it fires once its stream has reached it.
inline cudaError_t event_query(cudaEvent_t e) { return emu_event_progress(e) ? cudaSuccess : cudaErrorNotReady; }
inline cudaError_t event_destroy(cudaEvent_t e) {
  delete e;
  --live_events;
  return cudaSuccess;
}
}  // namespace emu_nccl

#define cudaEventCreateWithFlags(e, flags) emu_nccl::event_create(e)
#define cudaEventRecord(e, stream) emu_nccl::event_record(e, stream)
#define cudaEventQuery(e) emu_nccl::event_query(e)
#define cudaEventDestroy(e) emu_nccl::event_destroy(e)
#define cudaStreamWaitEvent(stream, e, flags) emu_nccl::stream_wait_event(stream, e)
#define cudaDeviceGetStreamPriorityRange(least, greatest) emu_nccl::stream_priority_range(least, greatest)
#define cudaStreamCreateWithPriority(s, flags, priority) emu_nccl::stream_create(s, priority)
#define cudaGetDeviceProperties(prop, device) emu_nccl::device_properties(prop, device)

// ---------------------------------------------------------------- the NCCL functions

inline ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  std::random_device rd;
  for (char& b : id->internal) b = char(rd());
  return ncclSuccess;
}

inline ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                           ncclConfig_t* config) {
  using namespace emu_nccl;
  int world_rank = 0, world_size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  if (nranks != world_size || rank != world_rank) {
    violation("ncclCommInitRankConfig: rank " + std::to_string(rank) + " of " + std::to_string(nranks) +
              ", but the process is rank " + std::to_string(world_rank) + " of " + std::to_string(world_size));
    return ncclInvalidArgument;
  }
  if (config == nullptr || config->blocking != 0) violation("ncclCommInitRankConfig: not a nonblocking communicator");
  auto* c = new ncclComm;  // kept to the end of the program (nccl.cu never destroys one)
  c->rank = rank;
  c->size = nranks;
  *comm = c;
  comms.push_back(c);
  return run(c, "ncclCommInitRankConfig", nullptr, [&] {
    MPI_Comm_dup(MPI_COMM_WORLD, &c->mpi);
    std::vector<char> ids(sizeof id.internal * size_t(nranks));
    MPI_Allgather(id.internal, int(sizeof id.internal), MPI_BYTE, ids.data(), int(sizeof id.internal), MPI_BYTE,
                  c->mpi);
    for (int r = 0; r < nranks; ++r)
      if (std::memcmp(&ids[sizeof id.internal * size_t(r)], ids.data(), sizeof id.internal) != 0) {
        violation("ncclCommInitRankConfig: the ranks passed different unique ids");
        return ncclInvalidArgument;
      }
    return ncclSuccess;
  });
}

inline ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error) {
  using namespace emu_nccl;
  if (comm == nullptr || comm->aborted) {
    violation("ncclCommGetAsyncError on a null or aborted communicator");
    return ncclInvalidArgument;
  }
  if (comm->state == ncclInProgress && !comm->never_settles) {
    if (comm->polls_left > 0) --comm->polls_left;
    else comm->state = comm->settles_to;
  } else if (comm->state == ncclSuccess && comm->fails_later) {
    comm->fails_later = false;
    comm->state = fault_result;
  }
  *async_error = comm->state;
  return ncclSuccess;
}

inline ncclResult_t ncclCommAbort(ncclComm_t comm) {
  using namespace emu_nccl;
  if (comm == nullptr || comm->aborted) {
    violation("ncclCommAbort on a null or already aborted communicator");
    return ncclInvalidArgument;
  }
  comm->aborted = true;
  comms.erase(std::find(comms.begin(), comms.end(), comm));
  return ncclSuccess;
}

inline const char* ncclGetLastError(ncclComm_t comm) { return comm ? comm->last_error.c_str() : ""; }

// Each result's own text (the harness looks for it in nccl.cu's messages).
inline const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "emulated: success";
    case ncclUnhandledCudaError: return "emulated: a CUDA call failed";
    case ncclSystemError: return "emulated: a system call failed";
    case ncclInternalError: return "emulated: internal error";
    case ncclInvalidArgument: return "emulated: invalid argument";
    case ncclInvalidUsage: return "emulated: invalid usage";
    case ncclRemoteError: return "emulated: a remote rank failed";
    case ncclInProgress: return "emulated: in progress";
    default: return "emulated: unknown result";
  }
}

inline ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                                  ncclComm_t comm, cudaStream_t stream) {
  if (!emu_nccl::usable(comm, "ncclAllReduce")) return ncclInvalidUsage;
  return emu_nccl::run(comm, "ncclAllReduce", stream, [&] {
    if (!emu_nccl::agree(comm, "ncclAllReduce", count, type, 0)) return ncclInvalidArgument;
    return emu_nccl::reduce(comm, send, recv, count, count, 0, type, op, "ncclAllReduce");
  });
}

inline ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t recv_count, ncclDataType_t type,
                                      ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  if (!emu_nccl::usable(comm, "ncclReduceScatter")) return ncclInvalidUsage;
  return emu_nccl::run(comm, "ncclReduceScatter", stream, [&] {
    if (!emu_nccl::agree(comm, "ncclReduceScatter", recv_count, type, 0)) return ncclInvalidArgument;
    return emu_nccl::reduce(comm, send, recv, recv_count * size_t(comm->size), recv_count,
                            recv_count * size_t(comm->rank), type, op, "ncclReduceScatter");
  });
}

inline ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type, int root,
                                  ncclComm_t comm, cudaStream_t stream) {
  if (!emu_nccl::usable(comm, "ncclBroadcast")) return ncclInvalidUsage;
  return emu_nccl::run(comm, "ncclBroadcast", stream, [&] {
    if (!emu_nccl::agree(comm, "ncclBroadcast", count, type, root)) return ncclInvalidArgument;
    const size_t bytes = count * emu_nccl::element_bytes(type);
    if (comm->rank == root && send != recv) std::memmove(recv, send, bytes);
    MPI_Bcast(recv, int(bytes), MPI_BYTE, root, comm->mpi);
    return ncclSuccess;
  });
}

inline ncclResult_t ncclAllGather(const void* send, void* recv, size_t send_count, ncclDataType_t type,
                                  ncclComm_t comm, cudaStream_t stream) {
  if (!emu_nccl::usable(comm, "ncclAllGather")) return ncclInvalidUsage;
  return emu_nccl::run(comm, "ncclAllGather", stream, [&] {
    if (!emu_nccl::agree(comm, "ncclAllGather", send_count, type, 0)) return ncclInvalidArgument;
    const int bytes = int(send_count * emu_nccl::element_bytes(type));
    // NCCL's in place: send is this rank's slot of recv.
    const bool in_place = send == static_cast<char*>(recv) + size_t(comm->rank) * size_t(bytes);
    MPI_Allgather(in_place ? MPI_IN_PLACE : send, bytes, MPI_BYTE, recv, bytes, MPI_BYTE, comm->mpi);
    return ncclSuccess;
  });
}
