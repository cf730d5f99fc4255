// Ctrl-C (SIGINT) and SIGTERM as a flag a training loop polls between steps, so that it
// can save a checkpoint and exit cleanly instead of dying mid-step.
//
//   train::InterruptGuard guard;              // handlers installed for its lifetime
//   while (...) { ...; if (train::interrupted()) { save(); break; } }
//
// A second Ctrl-C while the first is being handled ends the program at once (the default
// action), as a user pressing it twice expects.
#pragma once

namespace mu::train {

class InterruptGuard {
 public:
  InterruptGuard();   // installs the handlers and clears the flag
  ~InterruptGuard();  // puts the previous handlers back
  InterruptGuard(const InterruptGuard&) = delete;
  InterruptGuard& operator=(const InterruptGuard&) = delete;

 private:
  struct Saved;
  Saved* saved_;
};

// True once SIGINT or SIGTERM arrived while a guard was installed.
bool interrupted();
// Sets the flag as a signal would (tests, and programs that stop on their own condition).
void request_interrupt();

}  // namespace mu::train
