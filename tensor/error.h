// mu::Error and the MU_CHECK macro: every user-facing failure in the library is a
// mu::Error whose message names the problem and the values involved.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace mu {

class Error : public std::runtime_error {
 public:
  // With MUMOE_BACKTRACE=1 in the environment the message ends with the call stack where
  // the error was raised (function names of libmumoe.so), for failures seen far away
  // from a debugger (a GPU machine reached through a batch job).
  explicit Error(const std::string& what);
};

namespace detail {
// Streams any number of values into one string: str("dim ", d, " out of range").
template <class... Args>
std::string str(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

}  // namespace mu

// MU_CHECK(cond, parts...) throws mu::Error built from parts when cond is false.
#define MU_CHECK(cond, ...)                                 \
  do {                                                      \
    if (!(cond)) throw ::mu::Error(::mu::detail::str(__VA_ARGS__)); \
  } while (0)

#define MU_FAIL(...) throw ::mu::Error(::mu::detail::str(__VA_ARGS__))
