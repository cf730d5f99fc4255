// The emulated device's streams: where its work waits until the host must see it.
//
// By default every stream-ordered operation (a kernel launch, an asynchronous copy or
// set, a cuBLAS, cub or cuDNN call) runs when it is issued: a device infinitely fast.
// With MUMOE_EMULATED_DEFERRED=1 they are queued instead and run only when CUDA
// guarantees the host sees their effects: a stream, event or device synchronisation, a
// copy to pageable host memory, cudaFree, a host read that polls an event, an NCCL call.
// That is the other legal extreme, a device infinitely slow, and it makes a missing
// synchronisation show: a host that reads a result, or reuses a pinned buffer, before the
// work that writes or reads it has run now sees stale data. Arguments are taken when the
// operation is issued (a kernel's by value, as a launch copies them; a copy's pageable
// source is staged at once, as the driver stages it), memory is read when it runs.
//
// Streams: the framework's stream per device (every cudaStreamCreateWithFlags here, and
// stream 0) is one queue; each cudaStreamCreateWithPriority (the NCCL side's
// communication stream) makes another. Work on different streams has no order but the
// waits the program asks for: an event marks its stream's work issued before the
// record, and cudaStreamWaitEvent holds a stream's later work until that mark is
// reached. A stream's or event's synchronisation runs that stream's work and only the
// other streams' work it waits for, so that a missing wait between streams shows too.
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <utility>
#include <vector>

#include <cuda_runtime.h>

inline bool emu_deferred() {
  static const bool on = [] {
    const char* v = std::getenv("MUMOE_EMULATED_DEFERRED");
    return v != nullptr && v[0] == '1';
  }();
  return on;
}

// What an event knows: the stream it was last recorded on, how many records it has had,
// and the latest of them its stream has reached. Shared with the queued operations that
// name it, so that destroying the event (allowed while work on it is pending) leaves
// them valid.
struct EmuEventState {
  CUstream_st* stream = nullptr;
  uint64_t recorded = 0;
  uint64_t completed = 0;
};
// The types the runtime's header leaves incomplete (cudaEvent_t, cudaStream_t).
struct CUevent_st {
  std::shared_ptr<EmuEventState> state = std::make_shared<EmuEventState>();
};
struct EmuOp {
  uint64_t seq = 0;                     // issue order over every stream
  std::function<void()> run;            // empty for a wait
  std::shared_ptr<EmuEventState> wait;  // runs once this event has reached record wait_gen
  uint64_t wait_gen = 0;
  bool ready() const { return !wait || wait->completed >= wait_gen; }
};
struct CUstream_st {
  std::deque<EmuOp> ops;
};

inline CUstream_st emu_device_stream;                                  // stream 0 and the framework's
inline std::vector<CUstream_st*> emu_streams = {&emu_device_stream};  // every stream made, never freed
inline uint64_t emu_issued = 0;
inline bool emu_in_device = false;  // a queued operation is running: what it issues runs at once
inline std::recursive_mutex emu_queue_mutex;

inline CUstream_st* emu_stream_of(cudaStream_t s) { return s != nullptr ? s : &emu_device_stream; }

// cudaStreamCreateWithPriority: a stream with a queue of its own.
inline cudaStream_t emu_stream_create() {
  std::lock_guard<std::recursive_mutex> g(emu_queue_mutex);
  emu_streams.push_back(new CUstream_st);
  return emu_streams.back();
}

// The device stops for good: a GPU would hang here, the emulation says so and aborts.
[[noreturn]] inline void emu_stuck(const char* where) {
  std::fprintf(stderr, "emulated device: %s waits for an event that never completes (a hang on a GPU)\n", where);
  std::abort();
}

// Runs one operation towards emptying st: its first, or, when that one waits for an
// event, the first of the operations the event's stream owes it (and so on down the
// chain of waits, which cannot loop: a wait names a record issued before it). False
// when nothing can run (the event will never complete).
inline bool emu_step(CUstream_st* st) {
  std::lock_guard<std::recursive_mutex> g(emu_queue_mutex);
  while (true) {
    if (st->ops.empty()) return false;
    const EmuOp& head = st->ops.front();
    if (head.ready()) break;
    if (head.wait->stream == nullptr || head.wait->stream == st) return false;
    st = head.wait->stream;
  }
  EmuOp op = std::move(st->ops.front());
  st->ops.pop_front();
  struct InDevice {
    InDevice() { emu_in_device = true; }
    ~InDevice() { emu_in_device = false; }
  } in_device;
  if (op.run) op.run();
  return true;
}

// In immediate mode, every operation that can run runs as it is issued: the streams'
// heads in issue order until each is empty or waits.
inline void emu_run_ready() {
  while (true) {
    CUstream_st* first = nullptr;
    for (CUstream_st* st : emu_streams)
      if (!st->ops.empty() && st->ops.front().ready() && (first == nullptr || st->ops.front().seq < first->ops.front().seq))
        first = st;
    if (first == nullptr) return;
    emu_step(first);
  }
}

// Issues an operation on stream s: run now (immediate mode with s free, or from inside a
// running operation) or queued.
inline void emu_issue(cudaStream_t s, EmuOp op) {
  std::lock_guard<std::recursive_mutex> g(emu_queue_mutex);
  CUstream_st* st = emu_stream_of(s);
  if (emu_in_device || (!emu_deferred() && st->ops.empty() && op.ready())) {
    if (op.run) op.run();
    return;
  }
  op.seq = ++emu_issued;
  st->ops.push_back(std::move(op));
  if (!emu_deferred()) emu_run_ready();
}

inline void emu_defer_on(cudaStream_t s, std::function<void()> run) {
  EmuOp op;
  op.run = std::move(run);
  emu_issue(s, std::move(op));
}
// On the device's stream (cuBLAS, cub and cuDNN are bound to it).
inline void emu_defer(std::function<void()> run) { emu_defer_on(nullptr, std::move(run)); }

// Runs everything stream s holds (cudaStreamSynchronize).
inline void emu_flush_stream(cudaStream_t s) {
  std::lock_guard<std::recursive_mutex> g(emu_queue_mutex);
  if (emu_in_device) return;
  CUstream_st* st = emu_stream_of(s);
  while (!st->ops.empty())
    if (!emu_step(st)) emu_stuck("a stream synchronisation");
}

// Runs everything every stream holds, in issue order where they do not wait for one
// another (cudaDeviceSynchronize, cudaFree).
inline void emu_flush() {
  std::lock_guard<std::recursive_mutex> g(emu_queue_mutex);
  if (emu_in_device) return;
  while (true) {
    CUstream_st* first = nullptr;
    for (CUstream_st* st : emu_streams)
      if (!st->ops.empty() && (first == nullptr || st->ops.front().seq < first->ops.front().seq)) first = st;
    if (first == nullptr) return;
    if (!emu_step(first)) emu_stuck("the device's synchronisation");
  }
}

// cudaEventRecord: a mark behind the work issued on s so far. A stuck record never
// completes (emu_nccl.h's fault: a collective that hangs).
inline void emu_event_record(cudaEvent_t e, cudaStream_t s, bool stuck = false) {
  std::lock_guard<std::recursive_mutex> g(emu_queue_mutex);
  std::shared_ptr<EmuEventState> st = e->state;
  st->stream = emu_stream_of(s);
  const uint64_t gen = ++st->recorded;
  emu_defer_on(s, [st, gen, stuck] {
    if (!stuck && st->completed < gen) st->completed = gen;
  });
}

// cudaStreamWaitEvent: s's later work waits for the event's latest record (none: no wait).
inline void emu_stream_wait_event(cudaStream_t s, cudaEvent_t e) {
  std::lock_guard<std::recursive_mutex> g(emu_queue_mutex);
  if (e->state->recorded == 0) return;
  EmuOp op;
  op.wait = e->state;
  op.wait_gen = e->state->recorded;
  emu_issue(s, std::move(op));
}

// cudaEventQuery: one more operation towards the event run, then whether it has completed.
inline bool emu_event_progress(cudaEvent_t e) {
  std::lock_guard<std::recursive_mutex> g(emu_queue_mutex);
  EmuEventState& st = *e->state;
  if (st.completed >= st.recorded) return true;
  if (!emu_in_device && st.stream != nullptr) emu_step(st.stream);
  return st.completed >= st.recorded;
}

// cudaEventSynchronize.
inline void emu_event_synchronize(cudaEvent_t e) {
  std::lock_guard<std::recursive_mutex> g(emu_queue_mutex);
  if (emu_in_device) return;
  EmuEventState& st = *e->state;
  while (st.completed < st.recorded)
    if (st.stream == nullptr || !emu_step(st.stream)) emu_stuck("an event synchronisation");
}

// A kernel body with its arguments taken now, by value (what a launch does).
template <class K, class... A>
auto emu_bind(K kernel, A... args) {
  return [kernel, tup = std::make_tuple(args...)]() mutable { std::apply(kernel, tup); };
}

// Page-locked host blocks (cudaMallocHost): copies to and from them are truly
// asynchronous; any other host memory is pageable.
inline std::map<const char*, size_t> emu_pinned_blocks;
inline void emu_pinned_add(const void* p, size_t n) {
  std::lock_guard<std::recursive_mutex> g(emu_queue_mutex);
  emu_pinned_blocks[static_cast<const char*>(p)] = n;
}
inline bool emu_is_pinned(const void* p) {
  std::lock_guard<std::recursive_mutex> g(emu_queue_mutex);
  const char* c = static_cast<const char*>(p);
  auto it = emu_pinned_blocks.upper_bound(c);
  if (it == emu_pinned_blocks.begin()) return false;
  --it;
  return c < it->first + it->second;
}

// cudaMemcpyAsync as CUDA orders it. Host to device from pageable memory: the source is
// staged now, the write queued. Device to pageable host (or host to host): synchronous,
// the stream catches up first. Device to device, or to and from pinned memory: queued.
inline cudaError_t emu_memcpy_async(void* dst, const void* src, size_t n, cudaMemcpyKind kind, cudaStream_t s = nullptr) {
  if (n == 0) return cudaSuccess;
  const bool to_host = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyHostToHost;
  const bool from_host = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyHostToHost;
  if ((to_host && !emu_is_pinned(dst)) || kind == cudaMemcpyHostToHost || kind == cudaMemcpyDefault) {
    emu_flush_stream(s);
    std::memcpy(dst, src, n);
    return cudaSuccess;
  }
  if (from_host && !emu_is_pinned(src)) {
    auto staged = std::make_shared<std::vector<char>>(static_cast<const char*>(src), static_cast<const char*>(src) + n);
    emu_defer_on(s, [dst, staged] { std::memcpy(dst, staged->data(), staged->size()); });
    return cudaSuccess;
  }
  emu_defer_on(s, [dst, src, n] { std::memcpy(dst, src, n); });
  return cudaSuccess;
}

inline cudaError_t emu_memset_async(void* p, int v, size_t n, cudaStream_t s = nullptr) {
  emu_defer_on(s, [p, v, n] { std::memset(p, v, n); });
  return cudaSuccess;
}

// cudaDeviceSynchronize.
inline cudaError_t emu_synchronize() {
  emu_flush();
  return cudaSuccess;
}
inline cudaError_t emu_stream_synchronize(cudaStream_t s) {
  emu_flush_stream(s);
  return cudaSuccess;
}
