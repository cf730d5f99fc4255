// The group's NCCL side (internal to dist/): one communicator per CUDA device over all
// ranks, and the collectives on device memory, queued on the communicator's own stream
// behind the work already on the device's stream.
// Compiled only when the build found NCCL (MUMOE_NCCL); nccl.h stays out of this header.
//
// Compiled by g++ (C++20) and nvcc (C++17): keep it C++17.
#pragma once
#include <array>
#include <memory>

#include "dist/poll.h"
#include "dist/process_group.h"

namespace mu::dist::detail {

// An ncclUniqueId's bytes (NCCL_UNIQUE_ID_BYTES; dist/nccl.cu checks the two agree):
// made on rank 0, sent to the others over MPI.
constexpr size_t kNcclIdBytes = 128;
using NcclId = std::array<char, kNcclIdBytes>;
NcclId nccl_unique_id(const Caller& c);

// The 16 bytes of the device's UUID (cudaDeviceProp::uuid): two ranks with the same one
// would share a GPU, which one NCCL communicator cannot hold.
using DeviceUuid = std::array<unsigned char, 16>;
DeviceUuid device_uuid(int device);

// A communicator of every rank, on one device, with a stream of its own. Each collective
// is queued on that stream behind the kernels already queued on the device's stream, and
// returns a Work whose wait() polls an event recorded after it (and
// ncclCommGetAsyncError) until done or the deadline, when the communicator is aborted
// (ncclCommAbort) and the wait is a mu::Error. A Work dropped unfinished makes the
// device's stream wait for its collective. Tensors are contiguous, on the communicator's
// device; dtypes were checked by the caller.
class NcclComm {
 public:
  virtual ~NcclComm() = default;
  // Mean: the sum, then a division kernel in t's dtype, queued before the event.
  virtual std::shared_ptr<Work> all_reduce(const Caller& c, const Tensor& t, ReduceOp op) = 0;
  virtual std::shared_ptr<Work> broadcast(const Caller& c, const Tensor& t, int root) = 0;
  virtual std::shared_ptr<Work> all_gather(const Caller& c, const Tensor& in, const Tensor& out) = 0;
  virtual std::shared_ptr<Work> reduce_scatter(const Caller& c, const Tensor& in, const Tensor& out, ReduceOp op) = 0;
};

// ncclCommInitRankConfig as a nonblocking communicator (so that creating it can time out
// too), polled until ready or c's deadline.
std::shared_ptr<NcclComm> nccl_comm_create(const Caller& c, int device, const NcclId& id);

}  // namespace mu::dist::detail
