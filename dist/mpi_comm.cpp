// The MPI side of the process group (dist/mpi_comm.h). Without MUMOE_MPI (no MPI when
// CMake configured the build) only open_mpi_world remains: one process.
#include "dist/mpi_comm.h"

#include <cstdlib>
#include <string>

#include "tensor/error.h"

#ifdef MUMOE_MPI
#include <mpi.h>

#include <atomic>
#include <climits>
#include <cstdio>
#include <mutex>

#include "tensor/half.h"
#endif

namespace mu::dist::detail {

#ifdef MUMOE_MPI

namespace {

// Every MPI call of the process holds this (MPI_THREAD_SERIALIZED allows one thread in
// MPI at a time). Never destroyed: a Work may be tested while statics are torn down.
std::mutex& mpi_lock() {
  static std::mutex* m = new std::mutex;
  return *m;
}

// Set once a collective timed out: the exit handler must not call MPI_Finalize then.
std::atomic<bool> g_broken{false};

// A failed MPI call as a mu::Error: the collective, the MPI function, where, and MPI's
// own text for the code. rank < 0: before MPI told us the rank.
[[noreturn]] void fail(int rc, const char* mpi_fn, const char* call, int rank, int size) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  // MPI_Error_string itself failing leaves the code as the only description.
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) len = std::snprintf(text, sizeof text, "error code %d", rc);
  const std::string where = rank < 0 ? std::string("while starting MPI") : ::mu::detail::str("on rank ", rank, " of ", size);
  MU_FAIL(call, ": ", mpi_fn, " failed ", where, ": ", std::string(text, size_t(len)));
}

inline void check(int rc, const char* mpi_fn, const char* call, int rank, int size) {
  if (rc != MPI_SUCCESS) fail(rc, mpi_fn, call, rank, size);
}

// MPI counts are ints: a larger tensor is refused rather than silently truncated.
int mpi_count(int64_t count, const char* call) {
  MU_CHECK(count <= INT_MAX, call, ": ", count, " elements are more than one MPI call takes (", INT_MAX,
           "); split the tensor");
  return int(count);
}

// bfloat16 has no MPI type: its values travel as 16-bit integers and this op adds them.
// Each addition is done in float and rounded back once, as NCCL does for bfloat16.
void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  const bfloat16_t* a = static_cast<const bfloat16_t*>(in);
  bfloat16_t* b = static_cast<bfloat16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = bfloat16_t(float(a[i]) + float(b[i]));
}

// The element type a reduction of `dtype` works on.
MPI_Datatype reduce_type(DType dtype, const char* call) {
  switch (dtype) {
    case DType::Float32: return MPI_FLOAT;
    case DType::Float64: return MPI_DOUBLE;
    case DType::Int64: return MPI_INT64_T;
    case DType::BFloat16: return MPI_UINT16_T;  // with bf16_sum, never MPI_SUM
    default:
      MU_FAIL(call, ": dtype ", dtype_name(dtype), " cannot be reduced (float32, float64, bfloat16, int64)");
  }
}

// Copies care only for the width of an element: an unsigned integer of that width moves
// any dtype bit for bit.
MPI_Datatype copy_type(DType dtype) {
  switch (element_size(dtype)) {
    case 1: return MPI_UINT8_T;
    case 2: return MPI_UINT16_T;
    case 4: return MPI_UINT32_T;
    default: return MPI_UINT64_T;
  }
}

// Called by exit(): finalises MPI when this library initialised it and no collective is
// left hanging. No lock: a thread still inside MPI at exit is a bug of the program, and
// waiting for it here could hang the exit.
void finalize_at_exit() {
  if (g_broken.load()) return;
  int finalized = 1;
  if (MPI_Finalized(&finalized) != MPI_SUCCESS || finalized) return;
  const int rc = MPI_Finalize();
  // Nothing can be thrown from an exit handler: say it and let the exit go on.
  if (rc != MPI_SUCCESS) std::fprintf(stderr, "mumoe: MPI_Finalize failed at exit (error code %d)\n", rc);
}

class Request final : public MpiRequest {
 public:
  Request(const char* call, int rank, int size) : call_(call), rank_(rank), size_(size) {}
  // No MPI_Request_free on an unfinished request: the standard forbids it for collectives.
  bool test() override {
    std::lock_guard<std::mutex> g(mpi_lock());
    int flag = 0;
    check(MPI_Test(&req, &flag, MPI_STATUS_IGNORE), "MPI_Test", call_, rank_, size_);
    return flag != 0;
  }
  MPI_Request req = MPI_REQUEST_NULL;

 private:
  const char* call_;
  int rank_, size_;
};

class WorldComm final : public MpiComm {
 public:
  WorldComm() {
    std::lock_guard<std::mutex> g(mpi_lock());
    const char* call = "ProcessGroup::world";
    int initialized = 0, finalized = 0;
    check(MPI_Initialized(&initialized), "MPI_Initialized", call, -1, 0);
    check(MPI_Finalized(&finalized), "MPI_Finalized", call, -1, 0);
    MU_CHECK(!finalized, call, ": MPI was already finalised in this process; the group must be created before "
             "MPI_Finalize");
    int provided = 0;
    if (!initialized) {
      // Not launched by mpirun, this is MPI's singleton init: a group of one.
      check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread", call, -1, 0);
      std::atexit(finalize_at_exit);
      // Ours to configure: failures on it come back as codes (MPI_Comm_dup below is on it).
      check(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler", call, -1, 0);
    } else {
      // The program initialised MPI itself (and will finalise it): take it as it is.
      check(MPI_Query_thread(&provided), "MPI_Query_thread", call, -1, 0);
    }
    MU_CHECK(provided >= MPI_THREAD_SERIALIZED, call, ": MPI provides thread level ", provided,
             " but the group needs MPI_THREAD_SERIALIZED (", MPI_THREAD_SERIALIZED, "); initialise MPI with "
             "MPI_Init_thread(..., MPI_THREAD_SERIALIZED, ...) or let the group do it");
    // A communicator of the group's own, so that a program's own MPI traffic on
    // MPI_COMM_WORLD never matches a collective of the group's.
    check(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), "MPI_Comm_dup", call, -1, 0);
    check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler", call, -1, 0);
    check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank", call, -1, 0);
    check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size", call, rank_, 0);
    // The ranks that share this machine's memory: the ones that share its GPUs.
    MPI_Comm local = MPI_COMM_NULL;
    check(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local), "MPI_Comm_split_type",
          call, rank_, size_);
    check(MPI_Comm_set_errhandler(local, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler", call, rank_, size_);
    check(MPI_Comm_rank(local, &local_rank_), "MPI_Comm_rank", call, rank_, size_);
    check(MPI_Comm_size(local, &local_size_), "MPI_Comm_size", call, rank_, size_);
    check(MPI_Comm_free(&local), "MPI_Comm_free", call, rank_, size_);
    check(MPI_Op_create(&bf16_sum, /*commute=*/1, &bf16_sum_), "MPI_Op_create", call, rank_, size_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }

  std::unique_ptr<MpiRequest> all_reduce(const char* call, void* buf, int64_t count, DType dtype) override {
    auto r = std::make_unique<Request>(call, rank_, size_);
    const int n = mpi_count(count, call);
    const MPI_Datatype type = reduce_type(dtype, call);
    std::lock_guard<std::mutex> g(mpi_lock());
    check(MPI_Iallreduce(MPI_IN_PLACE, buf, n, type, sum_op(dtype), comm_, &r->req), "MPI_Iallreduce", call, rank_,
          size_);
    return r;
  }

  std::unique_ptr<MpiRequest> broadcast(const char* call, void* buf, int64_t count, DType dtype, int root) override {
    auto r = std::make_unique<Request>(call, rank_, size_);
    const int n = mpi_count(count, call);
    std::lock_guard<std::mutex> g(mpi_lock());
    check(MPI_Ibcast(buf, n, copy_type(dtype), root, comm_, &r->req), "MPI_Ibcast", call, rank_, size_);
    return r;
  }

  std::unique_ptr<MpiRequest> all_gather(const char* call, const void* send, void* recv, int64_t count,
                                         DType dtype) override {
    auto r = std::make_unique<Request>(call, rank_, size_);
    const int n = mpi_count(count, call);
    const MPI_Datatype type = copy_type(dtype);
    std::lock_guard<std::mutex> g(mpi_lock());
    check(MPI_Iallgather(send, n, type, recv, n, type, comm_, &r->req), "MPI_Iallgather", call, rank_, size_);
    return r;
  }

  std::unique_ptr<MpiRequest> reduce_scatter(const char* call, const void* send, void* recv, int64_t count,
                                             DType dtype) override {
    auto r = std::make_unique<Request>(call, rank_, size_);
    const int n = mpi_count(count, call);
    const MPI_Datatype type = reduce_type(dtype, call);
    std::lock_guard<std::mutex> g(mpi_lock());
    check(MPI_Ireduce_scatter_block(send, recv, n, type, sum_op(dtype), comm_, &r->req), "MPI_Ireduce_scatter_block",
          call, rank_, size_);
    return r;
  }

  std::unique_ptr<MpiRequest> barrier(const char* call) override {
    auto r = std::make_unique<Request>(call, rank_, size_);
    std::lock_guard<std::mutex> g(mpi_lock());
    check(MPI_Ibarrier(comm_, &r->req), "MPI_Ibarrier", call, rank_, size_);
    return r;
  }

  void mark_broken() override { g_broken.store(true); }

 private:
  MPI_Op sum_op(DType dtype) const { return dtype == DType::BFloat16 ? bf16_sum_ : MPI_SUM; }

  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Op bf16_sum_ = MPI_OP_NULL;
  int rank_ = -1, size_ = 0, local_rank_ = 0, local_size_ = 1;
};

}  // namespace

std::unique_ptr<MpiComm> open_mpi_world() { return std::make_unique<WorldComm>(); }

#else  // no MPI in this build

std::unique_ptr<MpiComm> open_mpi_world() {
  // A launcher that started several copies of this program would get several groups of
  // one, each training alone: refuse instead.
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}) {
    const char* v = std::getenv(var);
    MU_CHECK(!(v && std::atoi(v) > 1), "ProcessGroup::world: ", var, "=", v, " says a launcher started ", v,
             " processes, but this build has no MPI: install libopenmpi-dev and reconfigure");
  }
  return nullptr;
}

#endif

}  // namespace mu::dist::detail
