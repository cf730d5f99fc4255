// The process group (dist/process_group.h): each collective checks its arguments, then
// goes to MPI (CPU tensors), NCCL (CUDA tensors) or, in a group of one with neither, is
// computed here as the identity it is for one rank. Blocking calls are the nonblocking
// ones waited for with the group's timeout.
#include "dist/process_group.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "dist/mean.h"
#include "dist/mpi_comm.h"
#include "dist/nccl.h"  // declarations only; defined (dist/nccl.cu) and called only with MUMOE_NCCL
#include "dist/poll.h"
#include "tensor/cuda.h"

namespace mu::dist {

namespace detail {
struct GroupState {
  std::unique_ptr<MpiComm> mpi;  // null: one process, and no MPI in this build
  Health health;
  bool check_agreement = false;  // MUMOE_DIST_CHECK=1
#ifdef MUMOE_NCCL
  std::mutex nccl_mu;                                // guards nccl
  std::map<int, std::shared_ptr<NcclComm>> nccl;  // by CUDA device index, created on first use
#endif
};
}  // namespace detail

using detail::Caller;
using detail::GroupState;

namespace {

// ---------------------------------------------------------------- Works

// A collective that was complete when it started (a group of one).
class DoneWork final : public Work {
 public:
  bool done() override { return true; }
  void wait() override {}
};

// An MPI collective in flight. `finish` runs once, on completion (Mean's division).
class MpiWork final : public Work {
 public:
  MpiWork(const Caller& c, detail::MpiComm* mpi, std::unique_ptr<detail::MpiRequest> req, std::vector<Tensor> keep,
          std::function<void()> finish = {})
      : c_(c), mpi_(mpi), req_(std::move(req)), keep_(std::move(keep)), finish_(std::move(finish)) {}

  // MPI writes into the tensors until the collective completes: a Work dropped before
  // then waits for it (a collective cannot be cancelled), unless a wait already gave up
  // (this one's, or another's that left the group unusable: the peers may never come).
  ~MpiWork() override {
    if (finished_) return;
    if (!abandoned_ && !c_.health->broken()) {
      try {
        wait();
        return;
      } catch (...) {
        // nothing may be thrown from a destructor; the memory is kept below
      }
    }
    detail::keep_forever(std::move(keep_));
  }

  bool done() override {
    if (finished_) return true;
    if (!req_->test()) return false;
    finished_ = true;  // first: a finish that throws is not run again
    if (finish_) finish_();
    return true;
  }

  void wait() override {
    if (detail::poll_until([this] { return done(); }, c_.deadline())) return;
    abandoned_ = true;    // the destructor (often right after, as the error unwinds) must not wait again
    mpi_->mark_broken();  // the request stays pending: MPI_Finalize must not wait for it
    c_.fail_timeout();
  }

 private:
  Caller c_;
  detail::MpiComm* mpi_;  // the group's, which lives as long as the process
  std::unique_ptr<detail::MpiRequest> req_;
  std::vector<Tensor> keep_;
  std::function<void()> finish_;
  bool finished_ = false;
  bool abandoned_ = false;  // a wait gave up at its deadline
};

// Starts nothing: waits for an MPI request the group needs before it can go on.
void run_mpi(const Caller& c, GroupState& st, std::unique_ptr<detail::MpiRequest> req, std::vector<Tensor> keep = {}) {
  MpiWork(c, st.mpi.get(), std::move(req), std::move(keep)).wait();
}

// ---------------------------------------------------------------- argument checks

void require_defined(const Tensor& t, const char* call) { MU_CHECK(t.defined(), call, ": the tensor is undefined"); }

void require_contiguous(const Tensor& t, const char* call) {
  MU_CHECK(t.is_contiguous(), call, ": ", t.describe(), " is not contiguous (strides ", shape_str(t.strides()),
           "); the collective writes its memory in place: pass t.contiguous() and copy the result back");
}

void require_reducible(const Tensor& t, const char* call) {
  const DType d = t.dtype();
  MU_CHECK(d == kFloat32 || d == kFloat64 || d == kBFloat16 || d == kInt64, call, ": ", t.describe(), " has dtype ",
           dtype_name(d), ", which cannot be reduced (float32, float64, bfloat16, int64)");
}

// ---------------------------------------------------------------- agreement across ranks

// What a rank is about to do, as numbers every rank can compare: the collective, the
// tensor's dtype, device kind, element count and dims (the first kCheckedDims), the
// ReduceOp and the root, and for a CUDA tensor whether this rank already has an NCCL
// communicator for its device (a rank whose first collective on a device meets ranks that
// reuse theirs would wait in MPI while they wait in NCCL). -1 where a field does not apply.
enum class Kind : int64_t { AllReduce = 1, Broadcast, AllGather, ReduceScatter, Barrier };
constexpr int kCheckedDims = 8;
constexpr int kSignatureLength = 8 + kCheckedDims;
using Signature = std::array<int64_t, kSignatureLength>;

Signature signature_of(Kind kind, const Tensor* t, int op, int root, int has_comm) {
  Signature s;
  s.fill(-1);
  s[0] = int64_t(kind);
  s[1] = op;
  s[2] = root;
  if (t != nullptr) {
    s[3] = int64_t(t->dtype());
    s[4] = int64_t(t->device().type);  // the kind only: each rank has its own device index
    s[5] = t->dim();
    s[6] = t->numel();
    s[7] = has_comm;
    for (int d = 0; d < kCheckedDims && d < t->dim(); ++d) s[8 + d] = t->size(d);
  }
  return s;
}

// 1 when this rank has an NCCL communicator for t's device, 0 when its next collective on
// it makes one, -1 for a CPU tensor (or no tensor).
int has_comm_for(GroupState& st, const Tensor* t) {
  if (t == nullptr || !t->device().is_cuda()) return -1;
#ifdef MUMOE_NCCL
  std::lock_guard<std::mutex> g(st.nccl_mu);
  return st.nccl.count(t->device().index) ? 1 : 0;
#else
  (void)st;
  return 0;
#endif
}

std::string describe(const int64_t* s) {
  static const char* kinds[] = {"?", "all_reduce", "broadcast", "all_gather", "reduce_scatter", "barrier"};
  std::string out = s[0] >= 1 && s[0] <= 5 ? kinds[s[0]] : "?";
  if (s[3] >= 0) {
    out += ::mu::detail::str(" of ", dtype_name(DType(s[3])), " [");
    for (int64_t d = 0; d < s[5] && d < kCheckedDims; ++d) out += (d > 0 ? ", " : "") + std::to_string(s[8 + d]);
    if (s[5] > kCheckedDims) out += ", ...";
    out += ::mu::detail::str("] (", s[6], " elements) on ", s[4] == int64_t(DeviceType::CPU) ? "cpu" : "cuda");
    if (s[7] == 0) out += " (its first collective on that device)";
    if (s[7] == 1) out += " (a device it has used before)";
  }
  if (s[1] >= 0) out += s[1] == int64_t(ReduceOp::Mean) ? ", ReduceOp::Mean" : ", ReduceOp::Sum";
  if (s[2] >= 0) out += ::mu::detail::str(", root ", s[2]);
  return out;
}

// With MUMOE_DIST_CHECK=1: every rank's signature gathered, and a mismatch a mu::Error on
// every rank (all see the same table, so all name the same culprit, and none is left
// waiting in a collective the others never start).
void check_agreement(GroupState& st, const Caller& c, Kind kind, const Tensor* t, int op, int root) {
  if (!st.check_agreement || !st.mpi) return;
  const Signature mine = signature_of(kind, t, op, root, has_comm_for(st, t));
  std::vector<int64_t> all(size_t(kSignatureLength) * size_t(c.size));
  run_mpi(c, st, st.mpi->all_gather(c.call, mine.data(), all.data(), kSignatureLength, kInt64));
  for (int r = 1; r < c.size; ++r) {
    const int64_t* theirs = all.data() + size_t(r) * kSignatureLength;
    if (std::equal(theirs, theirs + kSignatureLength, all.data())) continue;
    MU_FAIL(c.call, ": the ranks disagree (MUMOE_DIST_CHECK=1): rank 0 called ", describe(all.data()), " but rank ", r,
            " called ", describe(theirs), "; every rank must call the same collectives in the same order, with "
            "tensors of the same dtype and shape on the same kind of device (for CUDA, each rank on one device "
            "throughout)");
  }
}

// ---------------------------------------------------------------- routes

enum class Route { Local, Mpi, Nccl };

// How t's collective travels: CPU tensors through MPI, CUDA tensors through NCCL; in a
// group of one without the transport, nothing travels.
Route route_of(const GroupState& st, const Tensor& t, const Caller& c) {
  if (t.device().is_cpu()) return st.mpi ? Route::Mpi : Route::Local;
#ifdef MUMOE_NCCL
  return Route::Nccl;
#else
  if (c.size == 1) return Route::Local;
  MU_FAIL(c.call, ": ", t.describe(), " is a CUDA tensor, but NCCL was not found at build time (libnccl in the CUDA "
          "toolkit's lib directory when CMake configured the build), and CUDA tensors are not staged through the host: "
          "install NCCL and reconfigure, or move the tensor to the CPU");
#endif
}

#ifdef MUMOE_NCCL
// The communicator of `device`, created by the first collective on it: every rank gets
// there in the same collective, so the MPI exchanges below pair up.
detail::NcclComm& nccl_for(GroupState& st, const Caller& c, int device) {
  std::lock_guard<std::mutex> g(st.nccl_mu);
  auto it = st.nccl.find(device);
  if (it != st.nccl.end()) return *it->second;
  // Two ranks on one GPU would make NCCL fail with a terse message (or hang): find them
  // by device UUID, which also tells apart the cuda:0 of ranks with different
  // CUDA_VISIBLE_DEVICES.
  const detail::DeviceUuid mine = detail::device_uuid(device);
  std::vector<unsigned char> all(mine.size() * size_t(c.size));
  run_mpi(c, st, st.mpi->all_gather(c.call, mine.data(), all.data(), int64_t(mine.size()), kUInt8));
  // The remedy: with fewer GPUs than ranks on a machine, default_device() cannot help.
  auto remedy = [&st] {
    const int n = cuda::device_count(), ranks = st.mpi->local_size();
    if (n >= ranks) return std::string("put each rank's tensors on ProcessGroup::default_device()");
    return ::mu::detail::str("this machine has ", n, " CUDA device(s) for its ", ranks, " ranks: start at most ", n,
                             " process(es) per machine (mpirun -npernode ", n, "), or keep the tensors on the CPU (MPI)");
  };
  for (int a = 0; a < c.size; ++a) {
    for (int b = a + 1; b < c.size; ++b) {
      MU_CHECK(std::memcmp(&all[a * mine.size()], &all[b * mine.size()], mine.size()) != 0, c.call, ": ranks ", a,
               " and ", b, " would share one GPU (the same device UUID; this rank's tensor is on cuda:", device,
               "); NCCL needs a device of its own per rank: ", remedy());
    }
  }
  detail::NcclId id{};
  if (c.rank == 0) id = detail::nccl_unique_id(c);
  run_mpi(c, st, st.mpi->broadcast(c.call, id.data(), int64_t(id.size()), kUInt8, 0));
  auto comm = detail::nccl_comm_create(c, device, id);
  st.nccl[device] = comm;
  return *comm;
}
#endif

// The wait of a CUDA collective, or a mu::Error in a build without NCCL (route_of has
// already refused; this keeps the call sites free of #ifdefs).
template <class F>
std::shared_ptr<Work> on_nccl(GroupState& st, const Caller& c, const Tensor& t, F f) {
#ifdef MUMOE_NCCL
  return f(nccl_for(st, c, t.device().index));
#else
  MU_FAIL(c.call, ": ", t.describe(), " needs NCCL, which this build does not have");
#endif
}

double timeout_from_env() {
  const char* v = std::getenv("MUMOE_DIST_TIMEOUT");
  if (v == nullptr || v[0] == '\0') return 300.0;
  char* end = nullptr;
  const double s = std::strtod(v, &end);
  MU_CHECK(end != v && *end == '\0' && std::isfinite(s) && s > 0, "ProcessGroup::world: MUMOE_DIST_TIMEOUT=\"", v,
           "\" is not a positive number of seconds");
  return s;
}

}  // namespace

// ---------------------------------------------------------------- the group

ProcessGroup& ProcessGroup::world() {
  // Never destroyed: Works may outlive statics, and MPI is finalised by its own exit handler.
  static ProcessGroup* group = new ProcessGroup();
  return *group;
}

ProcessGroup::ProcessGroup() : state_(std::make_unique<GroupState>()) {
  timeout_s_.store(timeout_from_env());
  const char* check = std::getenv("MUMOE_DIST_CHECK");
  state_->check_agreement = check != nullptr && std::string(check) == "1";
  state_->mpi = detail::open_mpi_world();
  if (state_->mpi) {
    rank_ = state_->mpi->rank();
    size_ = state_->mpi->size();
    local_rank_ = state_->mpi->local_rank();
    local_size_ = state_->mpi->local_size();
  }
}

ProcessGroup::~ProcessGroup() = default;

Device ProcessGroup::default_device() const {
  const int n = cuda::device_count();
  return n > 0 ? Device::cuda(local_rank_ % n) : Device::cpu();
}

void ProcessGroup::set_timeout_seconds(double s) {
  MU_CHECK(std::isfinite(s) && s > 0, "ProcessGroup::set_timeout_seconds: ", s, " is not a positive number of seconds");
  timeout_s_.store(s);
}

namespace {

std::shared_ptr<Work> start_all_reduce(ProcessGroup& pg, GroupState& st, const char* call, const Tensor& t,
                                       ReduceOp op) {
  require_defined(t, call);
  st.health.check(call);
  const Caller c{call, pg.rank(), pg.size(), pg.timeout_seconds(), &st.health};
  require_contiguous(t, call);
  require_reducible(t, call);
  check_inplace(t, call);
  const Route route = route_of(st, t, c);
  check_agreement(st, c, Kind::AllReduce, &t, int(op), -1);
  t.bump_version();  // written in place
  switch (route) {
    case Route::Local:
      return std::make_shared<DoneWork>();  // the sum, and the mean, over one rank is t itself
    case Route::Mpi: {
      std::function<void()> finish;
      if (op == ReduceOp::Mean) finish = [t, n = c.size] { detail::divide_in_place_cpu(t, n); };
      return std::make_shared<MpiWork>(c, st.mpi.get(), st.mpi->all_reduce(call, t.raw_data(), t.numel(), t.dtype()),
                                       std::vector<Tensor>{t}, std::move(finish));
    }
    case Route::Nccl:
      break;
  }
  return on_nccl(st, c, t, [&](detail::NcclComm& comm) { return comm.all_reduce(c, t, op); });
}

}  // namespace

void ProcessGroup::all_reduce(Tensor& t, ReduceOp op) { start_all_reduce(*this, *state_, "all_reduce", t, op)->wait(); }

std::shared_ptr<Work> ProcessGroup::all_reduce_async(const Tensor& t, ReduceOp op) {
  return start_all_reduce(*this, *state_, "all_reduce_async", t, op);
}

void ProcessGroup::broadcast(Tensor& t, int root) {
  const char* call = "broadcast";
  GroupState& st = *state_;
  require_defined(t, call);
  st.health.check(call);
  const Caller c{call, rank_, size_, timeout_seconds(), &st.health};
  MU_CHECK(root >= 0 && root < size_, call, ": root ", root, " is out of range for a group of ", size_,
           " (ranks 0 to ", size_ - 1, ")");
  require_contiguous(t, call);
  check_inplace(t, call);
  const Route route = route_of(st, t, c);
  check_agreement(st, c, Kind::Broadcast, &t, -1, root);
  t.bump_version();
  switch (route) {
    case Route::Local:
      return;  // root is 0, this process: t already holds root's values
    case Route::Mpi:
      return run_mpi(c, st, st.mpi->broadcast(call, t.raw_data(), t.numel(), t.dtype(), root), {t});
    case Route::Nccl:
      break;
  }
  on_nccl(st, c, t, [&](detail::NcclComm& comm) { return comm.broadcast(c, t, root); })->wait();
}

Tensor ProcessGroup::all_gather(const Tensor& t) {
  const char* call = "all_gather";
  GroupState& st = *state_;
  require_defined(t, call);
  st.health.check(call);
  const Caller c{call, rank_, size_, timeout_seconds(), &st.health};
  const Route route = route_of(st, t, c);
  check_agreement(st, c, Kind::AllGather, &t, -1, -1);
  // Read through a contiguous copy when t is strided; detached, since the result carries
  // no gradient (collectives are not differentiable here).
  const Tensor in = t.detach().contiguous();
  Shape shape = t.shape();
  shape.insert(shape.begin(), size_);
  Tensor out = empty(shape, TensorOptions(t.dtype()).device(t.device()));
  switch (route) {
    case Route::Local:
      out.select(0, 0).copy_(in);
      return out;
    case Route::Mpi:
      run_mpi(c, st, st.mpi->all_gather(call, in.raw_data(), out.raw_data(), in.numel(), in.dtype()), {in, out});
      return out;
    case Route::Nccl:
      break;
  }
  on_nccl(st, c, t, [&](detail::NcclComm& comm) { return comm.all_gather(c, in, out); })->wait();
  return out;
}

Tensor ProcessGroup::reduce_scatter(const Tensor& t, ReduceOp op) {
  const char* call = "reduce_scatter";
  GroupState& st = *state_;
  require_defined(t, call);
  st.health.check(call);
  const Caller c{call, rank_, size_, timeout_seconds(), &st.health};
  require_reducible(t, call);
  MU_CHECK(t.dim() >= 1, call, ": ", t.describe(), " has no dim 0 to scatter; it needs a leading dim of size() * n "
           "(size() = ", size_, ")");
  MU_CHECK(t.size(0) % size_ == 0, call, ": dim 0 of ", t.describe(), " is ", t.size(0),
           ", which is not divisible by the group's size ", size_, "; each rank receives dim 0 / size() rows");
  const Route route = route_of(st, t, c);
  check_agreement(st, c, Kind::ReduceScatter, &t, int(op), -1);
  const Tensor in = t.detach().contiguous();  // as in all_gather
  Shape shape = t.shape();
  shape[0] /= size_;
  Tensor out = empty(shape, TensorOptions(t.dtype()).device(t.device()));
  switch (route) {
    case Route::Local:
      out.copy_(in);  // one rank: its block is all of t, the sum and the mean t itself
      return out;
    case Route::Mpi: {
      std::function<void()> finish;
      if (op == ReduceOp::Mean) finish = [out, n = size_] { detail::divide_in_place_cpu(out, n); };
      MpiWork(c, st.mpi.get(), st.mpi->reduce_scatter(call, in.raw_data(), out.raw_data(), out.numel(), in.dtype()),
              {in, out}, std::move(finish))
          .wait();
      return out;
    }
    case Route::Nccl:
      break;
  }
  on_nccl(st, c, t, [&](detail::NcclComm& comm) { return comm.reduce_scatter(c, in, out, op); })->wait();
  return out;
}

void ProcessGroup::barrier() {
  const char* call = "barrier";
  GroupState& st = *state_;
  st.health.check(call);
  const Caller c{call, rank_, size_, timeout_seconds(), &st.health};
  check_agreement(st, c, Kind::Barrier, nullptr, -1, -1);
  if (st.mpi) run_mpi(c, st, st.mpi->barrier(call));
}

}  // namespace mu::dist
