// Runs a piece of test code in a forked child, so that a crash, a hang or an exception
// that is not a mu::Error becomes a reported failure of that one case (with the case's
// name as its reproducer) instead of ending the whole suite.
//
// The parent only forks and waits: the library's worker threads (OpenMP) are never
// started in it, so each child begins with a fresh thread pool.
#pragma once
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <string>

#include "tensor/error.h"

namespace isolated {

struct Outcome {
  enum Kind { Returned, MuError, OtherException, Crashed, TimedOut } kind = Crashed;
  std::string text;  // the error's message, or the value the body returned
  int signal = 0;

  std::string describe() const {
    switch (kind) {
      case Returned: return "returned \"" + text + "\"";
      case MuError: return "mu::Error: " + text;
      case OtherException: return "an exception that is not a mu::Error: " + text;
      case Crashed: return "crashed with signal " + std::to_string(signal) + " (" + strsignal(signal) + ")";
      case TimedOut: return "did not finish within its time limit";
    }
    return "?";
  }
};

// Runs body() in a child; its return value (a short description of the result) comes
// back as the outcome's text. A child that runs past `seconds` is killed (TimedOut).
inline Outcome run(const std::function<std::string()>& body, unsigned seconds = 30) {
  int fds[2];
  if (pipe(fds) != 0) return {Outcome::Crashed, "pipe failed", 0};
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    // The test framework's crash handlers would report the crash as the parent's: the
    // child dies by the signal instead, and the parent reports it.
    for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) signal(sig, SIG_DFL);
    alarm(seconds);  // SIGALRM ends a hung child
    std::string msg;
    char tag = 'X';
    try {
      msg = body();
      tag = 'R';
    } catch (const mu::Error& e) {
      msg = e.what();
      tag = 'E';
    } catch (const std::exception& e) {
      msg = e.what();
    } catch (...) {
      msg = "unknown exception";
    }
    std::string out = tag + msg;
    const char* p = out.data();
    size_t n = out.size();
    while (n > 0) {
      ssize_t k = write(fds[1], p, n);
      if (k <= 0) break;
      p += k;
      n -= size_t(k);
    }
    _exit(0);  // no static destructors, no doctest teardown in the child
  }
  close(fds[1]);
  std::string got;
  char buf[4096];
  ssize_t k;
  while ((k = read(fds[0], buf, sizeof buf)) > 0) got.append(buf, size_t(k));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  Outcome o;
  if (WIFSIGNALED(status)) {
    o.signal = WTERMSIG(status);
    o.kind = o.signal == SIGALRM ? Outcome::TimedOut : Outcome::Crashed;
    return o;
  }
  if (got.empty()) return {Outcome::Crashed, "the child exited without a report", 0};
  o.kind = got[0] == 'R' ? Outcome::Returned : got[0] == 'E' ? Outcome::MuError : Outcome::OtherException;
  o.text = got.substr(1);
  return o;
}

}  // namespace isolated
