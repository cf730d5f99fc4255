// doctest checks of a piece of code run in a forked child (tests/isolated.h): that it
// raised a mu::Error whose message holds a substring, or that it returned a given text.
#pragma once
#include <functional>
#include <string>

#include <doctest/doctest.h>

#include "isolated.h"

inline void expect_error(const std::string& what, const std::function<std::string()>& body,
                         const std::string& substring) {
  isolated::Outcome o = isolated::run(body);
  INFO(what << ": " << o.describe());
  CHECK(o.kind == isolated::Outcome::MuError);
  CHECK(o.text.find(substring) != std::string::npos);
}

inline void expect_result(const std::string& what, const std::function<std::string()>& body, const std::string& want) {
  isolated::Outcome o = isolated::run(body);
  INFO(what << ": " << o.describe() << "; expected \"" << want << "\"");
  CHECK(o.kind == isolated::Outcome::Returned);
  CHECK(o.text == want);
}
