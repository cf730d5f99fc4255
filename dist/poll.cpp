// Deadline polling for the collectives (dist/poll.h).
#include "dist/poll.h"

#include <algorithm>
#include <thread>

#include "tensor/error.h"

namespace mu::dist::detail {

void Health::mark(const std::string& why) {
  std::lock_guard<std::mutex> g(mu_);
  if (!broken_.load()) why_ = why;  // the first failure is the cause; later ones follow from it
  broken_.store(true);
}

void Health::check(const char* call) {
  if (!broken_.load()) return;  // the common case, without the lock
  std::lock_guard<std::mutex> g(mu_);
  MU_FAIL(call, ": the process group is unusable after an earlier failure (", why_,
          "); the other ranks may still be waiting in that collective: exit the process");
}

Clock::time_point Caller::deadline() const {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
}

bool poll_until(const std::function<bool()>& done, Clock::time_point deadline) {
  using std::chrono::microseconds;
  const Clock::time_point start = Clock::now();
  // A small all-reduce between processes of one machine completes in microseconds:
  // yielding (not sleeping) for the first 50 us keeps its latency at that.
  const auto spin_for = microseconds(50);
  // Then sleeps that double from 10 us up to 200 us: an idle wait costs little CPU, and
  // MPI still gets a call often enough to move a large transfer along.
  auto nap = microseconds(10);
  const auto longest_nap = microseconds(200);
  while (true) {
    if (done()) return true;
    const Clock::time_point now = Clock::now();
    if (now >= deadline) return false;
    if (now - start < spin_for) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(nap);
      nap = std::min(nap * 2, longest_nap);
    }
  }
}

void Caller::fail_timeout() const {
  const std::string msg = timeout_message(*this);
  health->mark(msg);
  throw Error(msg);
}

std::string timeout_message(const Caller& c) {
  return ::mu::detail::str(c.call, " on rank ", c.rank, " of ", c.size, " did not complete within ", c.timeout_s,
                     " s; another rank may have died or stalled");
}

void keep_forever(std::vector<Tensor> tensors) {
  static std::mutex mu;
  static auto* kept = new std::vector<Tensor>;  // never destroyed, on purpose
  std::lock_guard<std::mutex> g(mu);
  for (Tensor& t : tensors) kept->push_back(std::move(t));
}

}  // namespace mu::dist::detail
