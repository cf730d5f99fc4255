// The emulated devices as every stand-in reports them: one, or $MUMOE_EMULATED_DEVICES of
// them (all host memory), so that the ranks of a distributed test on one machine each
// take their own, as on a machine with a GPU each; and their UUIDs.
#pragma once
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

inline int emu_device_count() {
  const char* e = std::getenv("MUMOE_EMULATED_DEVICES");
  const int n = e ? std::atoi(e) : 1;
  return n >= 1 && n <= 64 ? n : 1;
}

// The 16 bytes of device d's UUID: a hash of this machine's host name, then d. The same
// in every process, as a GPU's UUID is the same for every process that sees it, so that
// two ranks on one machine that both take cuda:0 are seen to share a device.
inline void emu_device_uuid(char (&bytes)[16], int d) {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (const char* c = host; *c; ++c) h = (h ^ uint64_t(static_cast<unsigned char>(*c))) * 1099511628211ull;
  const uint64_t dev = uint64_t(d);
  std::memcpy(bytes, &h, 8);
  std::memcpy(bytes + 8, &dev, 8);
}
