// The group's MPI side (internal to dist/): initialisation and finalisation, and the
// nonblocking collectives on host memory that dist/process_group.cpp polls. mpi.h stays
// out of this header, so that it compiles (and the group works as one process) in a
// build without MPI.
#pragma once
#include <cstdint>
#include <memory>

#include "tensor/dtype.h"

namespace mu::dist::detail {

// One nonblocking MPI operation in flight (an MPI_Request).
class MpiRequest {
 public:
  virtual ~MpiRequest() = default;
  // MPI_Test: true once the operation has completed; an MPI failure is a mu::Error.
  virtual bool test() = 0;
};

// MPI_COMM_WORLD as the group uses it: a duplicate with MPI_ERRORS_RETURN, so that every
// failure comes back as a return code, turned into a mu::Error that names the call, the
// rank and MPI_Error_string's text. Every MPI call (tests included) holds one process-wide
// lock: MPI was asked for MPI_THREAD_SERIALIZED, and callers may be on several threads.
//
// Each start returns at once; `call` is the collective's name for messages. Counts are in
// elements of `dtype`. The reductions sum float32, float64, int64 and bfloat16 (the last
// through a user-defined MPI_Op that adds in float and rounds once per addition); the
// copies (broadcast, all_gather) take any dtype.
class MpiComm {
 public:
  virtual ~MpiComm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual int local_rank() const = 0;  // among the processes of this machine
  virtual int local_size() const = 0;

  virtual std::unique_ptr<MpiRequest> all_reduce(const char* call, void* buf, int64_t count, DType dtype) = 0;
  virtual std::unique_ptr<MpiRequest> broadcast(const char* call, void* buf, int64_t count, DType dtype, int root) = 0;
  // recv holds size() blocks of `count` elements, rank r's in block r.
  virtual std::unique_ptr<MpiRequest> all_gather(const char* call, const void* send, void* recv, int64_t count,
                                                 DType dtype) = 0;
  // send holds size() blocks of `count` elements; recv gets the sum of block rank().
  virtual std::unique_ptr<MpiRequest> reduce_scatter(const char* call, const void* send, void* recv, int64_t count,
                                                     DType dtype) = 0;
  virtual std::unique_ptr<MpiRequest> barrier(const char* call) = 0;

  // After a collective timed out its request is still pending here and on the other
  // ranks: MPI_Finalize could wait on it forever, so the exit handler skips it (mpirun
  // then ends the job, the others included).
  virtual void mark_broken() = 0;
};

// The processes mpirun started, MPI initialised by the first call (unless the program
// did it itself) and finalised at exit. Built without MPI: nullptr (one process), or a
// mu::Error when the environment shows a launcher that started more than one.
std::unique_ptr<MpiComm> open_mpi_world();

}  // namespace mu::dist::detail
