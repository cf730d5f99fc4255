// The one doctest main of every suite. A suite run as its `cuda` twin
// (MUMOE_TEST_DEVICES=cuda, see tests/CMakeLists.txt) on a machine without a CUDA device
// is skipped before any case runs: test_devices() prints why and exits 77.
#define DOCTEST_CONFIG_IMPLEMENT
#include <cstdlib>
#include <string>

#include "helpers.h"

int main(int argc, char** argv) {
  const char* env = std::getenv("MUMOE_TEST_DEVICES");
  if (env && std::string(env) == "cuda") test_devices();
  doctest::Context context(argc, argv);
  return context.run();
}
