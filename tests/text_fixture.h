// GPT-2 ids computed by npm package gpt-3-encoder's JavaScript encoder, kept in
// tests/fixtures/gpt2_fixture.json (made by tests/fixtures/make_gpt2_fixture.js).
#pragma once
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "doctest/doctest.h"

inline std::string source_dir() {
  const char* src = std::getenv("MUMOE_SOURCE_DIR");
  // ctest sets it; run by hand, the tests use the tree they were built from.
  if (src != nullptr && src[0] != '\0') return src;
  return MUMOE_TEST_SOURCE_DIR;
}

inline const nlohmann::json& gpt2_fixture() {
  static const nlohmann::json j = [] {
    std::ifstream f(source_dir() + "/tests/fixtures/gpt2_fixture.json");
    REQUIRE_MESSAGE(f.good(), "cannot open tests/fixtures/gpt2_fixture.json under ", source_dir());
    return nlohmann::json::parse(f);
  }();
  return j;
}
