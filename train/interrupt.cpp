#include "train/interrupt.h"

#include <signal.h>

#include <atomic>

namespace mu::train {

namespace {

// Written from a signal handler: a lock-free atomic is async-signal-safe.
std::atomic<bool> g_interrupted{false};
static_assert(std::atomic<bool>::is_always_lock_free);

extern "C" void on_signal(int sig) {
  g_interrupted.store(true);
  // The next one of the same signal takes the default action (ends the program).
  ::signal(sig, SIG_DFL);
}

}  // namespace

struct InterruptGuard::Saved {
  struct sigaction old_int, old_term;
};

InterruptGuard::InterruptGuard() : saved_(new Saved) {
  g_interrupted.store(false);
  struct sigaction sa = {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // a read() or write() under way goes on rather than failing with EINTR
  sigaction(SIGINT, &sa, &saved_->old_int);
  sigaction(SIGTERM, &sa, &saved_->old_term);
}

InterruptGuard::~InterruptGuard() {
  sigaction(SIGINT, &saved_->old_int, nullptr);
  sigaction(SIGTERM, &saved_->old_term, nullptr);
  delete saved_;
}

bool interrupted() { return g_interrupted.load(); }

void request_interrupt() { g_interrupted.store(true); }

}  // namespace mu::train
