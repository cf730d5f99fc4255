// A stalled rank must show as an error on the others, not as a hang. Run as two ranks
// with MUMOE_DIST_TIMEOUT=3 (ctest's dist_stall, through dist_expect.sh): rank 1 sleeps
// for 60 s instead of joining the all_reduce; rank 0's all_reduce must fail with the
// group's timeout message after about 3 s. Rank 0 prints what it caught and a verdict
// line (DIST-STALL-OK or DIST-STALL-FAILED), then ends the job with MPI_Abort, since rank 1
// will not come back on its own; dist_expect.sh looks for the verdict in mpirun's output
// and checks that the whole run was short.
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "mumoe.h"

int main() {
  using mu::dist::ProcessGroup;
  ProcessGroup& pg = ProcessGroup::world();
  if (pg.size() != 2) {
    std::printf("DIST-STALL-FAILED: run as 2 ranks under mpirun, got %d\n", pg.size());
    return 1;
  }
  if (pg.rank() == 1) {
    std::this_thread::sleep_for(std::chrono::seconds(60));  // stalled: never joins the all_reduce
    return 0;
  }
  mu::Tensor t = mu::ones({16});
  const auto start = std::chrono::steady_clock::now();
  std::string verdict = "DIST-STALL-FAILED: all_reduce returned although rank 1 never joined";
  try {
    pg.all_reduce(t);
  } catch (const mu::Error& e) {
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const std::string msg = e.what();
    std::printf("rank 0 caught after %.2f s: %s\n", waited, msg.c_str());
    std::string missing;
    for (const char* part : {"all_reduce", "rank 0 of 2", "did not complete within"})
      if (msg.find(part) == std::string::npos) missing += std::string(" \"") + part + "\"";
    if (!missing.empty()) verdict = "DIST-STALL-FAILED: the message lacks" + missing;
    else if (waited < 2.5 || waited > 15) verdict = "DIST-STALL-FAILED: gave up after " + std::to_string(waited) + " s, not about 3 s";
    else verdict = "DIST-STALL-OK";
  }
  std::printf("%s\n", verdict.c_str());
  std::fflush(stdout);
  // Ends rank 1 too (mpirun kills the job); the status is nonzero whatever the verdict.
  MPI_Abort(MPI_COMM_WORLD, verdict == "DIST-STALL-OK" ? 3 : 4);
  return 1;
}
