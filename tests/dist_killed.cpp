// A rank killed by a signal must end the job promptly, not leave the others waiting in a
// collective. Run as two ranks (ctest's dist_killed, through dist_expect.sh): rank 1
// raises SIGKILL on itself before the all_reduce; mpirun notices and ends rank 0, and
// dist_expect.sh checks that mpirun exited nonzero within 30 s and said which rank died.
// Should rank 0 outlive that and its all_reduce fail on the timeout instead, it says so
// (DIST-KILLED-FAILED), which fails the test.
#include <csignal>
#include <cstdio>

#include "mumoe.h"

int main() {
  using mu::dist::ProcessGroup;
  ProcessGroup& pg = ProcessGroup::world();
  if (pg.rank() == 1) {
    std::fflush(stdout);
    std::raise(SIGKILL);
  }
  mu::Tensor t = mu::ones({16});
  try {
    pg.all_reduce(t);
    std::printf("DIST-KILLED-FAILED: all_reduce returned on rank %d although rank 1 was killed\n", pg.rank());
  } catch (const mu::Error& e) {
    std::printf("DIST-KILLED-FAILED: rank %d was not ended by mpirun; its all_reduce failed: %s\n", pg.rank(), e.what());
  }
  std::fflush(stdout);
  return 1;
}
