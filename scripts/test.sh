#!/usr/bin/env bash
# The test job (CI's .ci/run, which has 90 minutes on 2 cores): install, then
#  1. the unit and distributed tests under AddressSanitizer and UndefinedBehaviorSanitizer,
#     in a Debug build of their own;
#  2. the default run: the Release build and every ctest test but the slow ones (unit,
#     gradcheck, parity, cuda (skipped without a GPU, saying why), distributed, emulation,
#     repro, example). Its closing line is the one CI reads;
#  3. time allowing, the cuda tests on the emulated CUDA device (a build of their own,
#     then the tests twice: experiments/cuda_emulation/device_tests.sh);
#  4. time allowing, the slow tests (shortened training runs that must reach a stated loss
#     or accuracy).
# Steps 3 and 4 print each test's result and the failures' output and fail the job when a
# test fails, but print no closing line of their own (scripts/ctest_quiet.sh). Each starts
# only when the time it needs here fits in what is left of the 90 minutes; MUMOE_TEST_ALL=1
# runs them whatever the time.
#
# The whole job on a fresh clone, 2 cores (Zen 5), no compiler cache: 65 minutes. The
# sanitizer step 16.7 (build 10, unit tests 6.7; the distributed tests, added since, about
# 10 s more), the Release build 15.1, the default run 5.4, the emulated device 18 (build
# 12.6, runs 5.4), the slow tests 9.8 (FetchContent's build of the library is most of it). A step's need here is its time there scaled by how long
# steps 1 and 2 took here against there (37 minutes), plus a fifth and 3 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
limit_seconds=$((90 * 60))
reference_steps_1_2=2230  # seconds steps 1 and 2 took on the machine above

minutes() { echo "$((SECONDS / 60)) min $((SECONDS % 60)) s"; }
# Whether a step that took $1 seconds on the machine above ends here before the limit;
# says why not when it does not.
time_allows() {
  [ "${MUMOE_TEST_ALL:-0}" = 1 ] && return 0
  local need=$(($1 * steps_1_2 / reference_steps_1_2))
  [ $((SECONDS + need * 6 / 5 + 180)) -le $limit_seconds ] && return 0
  echo "skipped: it would need about $((need / 60)) minutes here (plus a margin), $(((limit_seconds - SECONDS) / 60)) are left"
  return 1
}

bash scripts/setup.sh
setup_done=$SECONDS

echo "== sanitizer build (ASan + UBSan), unit and distributed tests ($(minutes) so far)"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DMUMOE_SANITIZE=ON -DMUMOE_CUDA=OFF -DMUMOE_OPENBLAS=OFF -DMUMOE_MPI=AUTO -DMUMOE_EXPERIMENTS=OFF >/dev/null
cmake --build build-asan -j"$(nproc)"
echo "built ($(minutes) so far)"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-asan -L unit -j"$(nproc)" --output-on-failure
# The collectives, DDP, ZeRO-1 and a stalled and a killed rank, as two processes under
# mpirun (about 10 s). Leak checking is off for them: OpenMPI's plugins, loaded and
# unloaded at run time, leave allocations that LeakSanitizer reports without a symbol.
ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-asan -L distributed -j"$(nproc)" --output-on-failure

echo "== release build, every test but the slow ones ($(minutes) so far)"
bash scripts/build.sh
echo "built ($(minutes) so far)"
ctest --test-dir build -LE slow -j"$(nproc)" --output-on-failure
steps_1_2=$((SECONDS - setup_done))

echo "== the cuda tests on the emulated CUDA device ($(minutes) so far)"
if [ ! -f /usr/local/cuda/include/cuda_runtime.h ]; then
  echo "skipped: no CUDA toolkit headers under /usr/local/cuda"
elif time_allows 1080; then
  sh experiments/cuda_emulation/device_tests.sh build-emudev
fi

echo "== the slow tests ($(minutes) so far)"
if time_allows 590; then
  sh scripts/ctest_quiet.sh "$PWD/build" "$PWD/build/slow_tests.log" "slow tests" -L slow -j"$(nproc)"
fi
echo "== done ($(minutes))"
