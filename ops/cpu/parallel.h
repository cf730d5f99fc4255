// The parallel loops of the CPU kernels, entering OpenMP only when they run on more than
// one thread. libgomp's `#pragma omp parallel if (false)` still calls into the runtime,
// which, once its thread pool exists, costs a futex system call and about 350 ns a region
// (GCC 12): more than the whole work of a small op, and a quarter of an add of two small
// tensors. On one thread these are plain loops, in the same order as the team's loop with
// one thread, so a result does not depend on which path ran.
#pragma once
#include <omp.h>

#include <cstdint>

namespace mu::cpu {

// How a parallel loop hands out its iterations: in equal contiguous blocks, or one at a
// time to whichever thread is free (for iterations of unequal cost).
enum class Schedule { Static, Dynamic };

// for (i = 0; i < n; ++i) body(i) on `nt` threads (one when nt <= 1).
template <class Body>
inline void parallel_for(int64_t n, int nt, Body&& body, Schedule schedule = Schedule::Static) {
  if (nt <= 1 || n <= 1) {
    for (int64_t i = 0; i < n; ++i) body(i);
  } else if (schedule == Schedule::Static) {
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t i = 0; i < n; ++i) body(i);
  } else {
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
    for (int64_t i = 0; i < n; ++i) body(i);
  }
}

// The same on the default number of threads when `par`, else on the calling thread.
template <class Body>
inline void parallel_for_if(int64_t n, bool par, Body&& body, Schedule schedule = Schedule::Static) {
  parallel_for(n, par ? omp_get_max_threads() : 1, body, schedule);
}

// body(tid, team_size) once on each thread of a team of `nt` (the calling thread alone,
// body(0, 1), when nt <= 1): for work split by thread number.
template <class Body>
inline void parallel_team(int nt, Body&& body) {
  if (nt <= 1) {
    body(0, 1);
    return;
  }
#pragma omp parallel num_threads(nt)
  body(omp_get_thread_num(), omp_get_num_threads());
}

// Per-thread state made once per thread, then for (i < n) body(state, i): a scratch
// buffer per thread over a loop of work items. make() builds a thread's state.
template <class Make, class Body>
inline void parallel_for_with(int64_t n, int nt, Make&& make, Body&& body, Schedule schedule = Schedule::Static) {
  if (nt <= 1 || n <= 1) {
    auto state = make();
    for (int64_t i = 0; i < n; ++i) body(state, i);
    return;
  }
#pragma omp parallel num_threads(nt)
  {
    auto state = make();
    if (schedule == Schedule::Static) {
#pragma omp for schedule(static)
      for (int64_t i = 0; i < n; ++i) body(state, i);
    } else {
#pragma omp for schedule(dynamic, 1)
      for (int64_t i = 0; i < n; ++i) body(state, i);
    }
  }
}

}  // namespace mu::cpu
