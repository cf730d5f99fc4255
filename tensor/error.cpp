// mu::Error's constructor: the message, plus the call stack when MUMOE_BACKTRACE asks.
#include "tensor/error.h"

#include <cxxabi.h>
#include <execinfo.h>

#include <cstdlib>
#include <cstring>
#include <memory>

namespace mu {

namespace {

bool backtrace_wanted() {
  static const bool wanted = [] {
    const char* v = std::getenv("MUMOE_BACKTRACE");
    return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
  }();
  return wanted;
}

// "lib.so(_ZN2mu3fooEv+0x12) [0x...]" -> "mu::foo()"; the raw line when it has no name.
std::string frame_name(const char* line) {
  std::string s(line);
  size_t open = s.find('('), plus = s.find('+', open == std::string::npos ? 0 : open);
  if (open == std::string::npos || plus == std::string::npos || plus == open + 1) return s;
  std::string mangled = s.substr(open + 1, plus - open - 1);
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> name(abi::__cxa_demangle(mangled.c_str(), nullptr, nullptr, &status),
                                              std::free);
  return status == 0 && name ? std::string(name.get()) : mangled;
}

std::string call_stack() {
  void* frames[64];
  int n = ::backtrace(frames, 64);
  std::unique_ptr<char*, void (*)(void*)> lines(::backtrace_symbols(frames, n), std::free);
  if (!lines) return "";
  std::string out = "\n  call stack (MUMOE_BACKTRACE):";
  for (int i = 2; i < n; ++i) out += "\n    " + frame_name(lines.get()[i]);  // 0, 1: here and Error()
  return out;
}

}  // namespace

Error::Error(const std::string& what) : std::runtime_error(backtrace_wanted() ? what + call_stack() : what) {}

}  // namespace mu
