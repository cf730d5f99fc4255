// The collectives of data-parallel training: the processes mpirun started form one
// group, and each collective combines a tensor across all of them. CPU tensors travel
// through MPI, CUDA tensors through NCCL (on a stream of their own that waits for the
// kernels queued before each collective, so that an asynchronous one overlaps the
// kernels queued after it).
//
//   auto& pg = mu::dist::ProcessGroup::world();
//   model.to(pg.default_device());
//   for (auto& p : model.parameters()) { NoGradGuard g; pg.broadcast(p, 0); }   // same start
//   ... backward ...
//   for (auto& p : model.parameters()) { Tensor g = p.grad(); pg.all_reduce(g, ReduceOp::Mean); }
//
// Every rank must call the same collectives in the same order with tensors of the same
// dtype and shape, a rank's CUDA tensors on one device throughout (set MUMOE_DIST_CHECK=1
// to have every call verify that across ranks, at the price of one extra small exchange
// per call). A rank that stalls or dies shows as
// a mu::Error on the others after timeout_seconds(), not as a hang.
//
// Built without MPI (libopenmpi-dev absent when CMake configured), world() is a single
// process on which every collective is the exact identity it is for one rank.
//
// Compiled by g++ (C++20) and nvcc (C++17, dist/nccl.cu): keep it C++17.
#pragma once
#include <atomic>
#include <memory>

#include "tensor/device.h"
#include "tensor/tensor.h"

namespace mu::dist {

namespace detail {
struct GroupState;  // the MPI and NCCL communicators (dist/process_group.cpp)
}

// Mean = Sum / size(), computed in the tensor's dtype after the sum (for int64, C++'s
// truncating division).
enum class ReduceOp { Sum, Mean };

// A collective started without waiting: wait() blocks until it completes (or the
// timeout, then a mu::Error), done() polls. The tensor handed to the collective must stay
// alive and unmodified until then (Work keeps a reference to it); for a CUDA tensor, a
// kernel queued before wait() may see it before or after the collective. Destroying the
// Work of an unfinished CPU collective waits for it first (MPI still writes into the
// tensor); for a CUDA one, the device's stream is made to wait for it instead, so that
// kernels queued later see its result, without blocking the host.
class Work {
 public:
  virtual ~Work() = default;
  virtual bool done() = 0;
  virtual void wait() = 0;
};

class ProcessGroup {
 public:
  // The processes mpirun started (all of MPI_COMM_WORLD), created once per process (MPI
  // initialised on first use with MPI_Init_thread(MPI_THREAD_SERIALIZED), finalised at
  // exit); a single process of size 1 when the program was not launched by mpirun (MPI's
  // singleton init).
  static ProcessGroup& world();

  int rank() const { return rank_; }
  int size() const { return size_; }
  // Rank among the processes of this machine (MPI_Comm_split_type SHARED), and their number.
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  // cuda:(local_rank % cuda::device_count()) when this machine has CUDA devices, else cpu:
  // the device this process should train on.
  Device default_device() const;

  // In place on t (any device; contiguous, else a mu::Error; float32, float64, bfloat16 or
  // int64). CPU tensors through MPI, CUDA tensors through NCCL (a communicator per
  // device, created by the first collective on it, in which every rank must take part
  // with its own GPU: ranks whose tensors share one are refused then, with a mu::Error
  // saying what to do; a rank's later CUDA collectives stay on that device).
  void all_reduce(Tensor& t, ReduceOp op = ReduceOp::Sum);
  std::shared_ptr<Work> all_reduce_async(const Tensor& t, ReduceOp op = ReduceOp::Sum);
  // root's t copied into every rank's t, in place (contiguous; any dtype).
  void broadcast(Tensor& t, int root);
  // Every rank's t stacked along a new leading dim: (size(), *t.shape()). Shapes must
  // agree on all ranks. Any dtype and layout (a strided t is read through a copy).
  Tensor all_gather(const Tensor& t);
  // t has leading dim size() * n: the reduction over ranks of t, this rank's block
  // [rank*n, (rank+1)*n) of dim 0 (float32, float64, bfloat16 or int64; any layout).
  Tensor reduce_scatter(const Tensor& t, ReduceOp op = ReduceOp::Sum);
  // Returns once every rank has entered it.
  void barrier();

  // Every blocking collective and Work::wait gives up after this many seconds (default
  // 300, or $MUMOE_DIST_TIMEOUT) with a mu::Error: "<call> on rank R of N did not complete
  // within S s; another rank may have died or stalled". After such a timeout the group is
  // unusable (the operation is still pending on the others): later collectives are
  // refused, and the process should exit.
  double timeout_seconds() const { return timeout_s_.load(); }
  void set_timeout_seconds(double s);

  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

 private:
  ProcessGroup();

  std::unique_ptr<detail::GroupState> state_;
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  std::atomic<double> timeout_s_{300.0};
};

}  // namespace mu::dist
