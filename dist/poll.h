// Waiting for a collective with a deadline (internal to dist/): every blocking call is a
// nonblocking one polled until it completes or its time is up, so that a rank that died
// or stalled shows as an error on the others instead of a hang.
//
// Compiled by g++ (C++20) and nvcc (C++17): keep it C++17.
#pragma once
#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace mu::dist::detail {

using Clock = std::chrono::steady_clock;

// Whether the group can still be used. After a timeout the operation is still pending on
// the other ranks (and an aborted NCCL communicator is gone): any later collective would
// pair with the wrong one, so every later call is refused with the first failure's text.
class Health {
 public:
  void mark(const std::string& why);
  bool broken() const { return broken_.load(); }
  // A mu::Error naming `call` and the earlier failure, once the group is marked.
  void check(const char* call);

 private:
  std::atomic<bool> broken_{false};
  std::mutex mu_;    // guards why_
  std::string why_;  // the first failure's message
};

// Who is waiting: the call's name as the user wrote it ("all_reduce"), this process's
// place in the group, and the limit in seconds.
struct Caller {
  const char* call;
  int rank;
  int size;
  double timeout_s;
  Health* health;  // the group's, which lives as long as the process
  Clock::time_point deadline() const;  // now + timeout_s
  // Marks the group unusable and throws timeout_message().
  [[noreturn]] void fail_timeout() const;
};

// Calls done() until it returns true (then true) or `deadline` passes (then false).
// Spins briefly for short collectives, then sleeps between polls, never longer than a
// fraction of a millisecond (MPI progresses a nonblocking collective only inside MPI
// calls, so long sleeps would slow large transfers down).
bool poll_until(const std::function<bool()>& done, Clock::time_point deadline);

// "<call> on rank R of N did not complete within S s; another rank may have died or
// stalled".
std::string timeout_message(const Caller& c);

// Memory a collective may still write into (or read) after a wait gave up or its
// communicator failed: never handed back, since a new tensor there would be overwritten
// behind the program's back.
void keep_forever(std::vector<Tensor> tensors);

}  // namespace mu::dist::detail
