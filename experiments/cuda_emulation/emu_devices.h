// The emulated devices as every stand-in reports them: one, or $MUMOE_EMULATED_DEVICES of
// them (all host memory), so that the ranks of a distributed test on one machine each
// take their own, as on a machine with a GPU each; and each process's own UUIDs.
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

// The 16 bytes of device d's UUID in this process: the process id and d.
inline void emu_device_uuid(char (&bytes)[16], int d) {
  const uint64_t pid = uint64_t(getpid()), dev = uint64_t(d);
  std::memcpy(bytes, &pid, 8);
  std::memcpy(bytes + 8, &dev, 8);
}
