#!/usr/bin/env bash
# The test job: install, build, run the unit tests under AddressSanitizer and
# UndefinedBehaviorSanitizer, then every ctest test of the Release build (unit,
# gradcheck, parity, cuda — skipped without a GPU — and slow), then, time allowing, the
# cuda tests on the emulated CUDA device.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh

echo "== sanitizer build (ASan + UBSan), unit tests"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DMUMOE_SANITIZE=ON -DMUMOE_CUDA=OFF -DMUMOE_OPENBLAS=OFF -DMUMOE_MPI=OFF -DMUMOE_EXPERIMENTS=OFF >/dev/null
cmake --build build-asan -j"$(nproc)"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-asan -L unit --output-on-failure

echo "== release build, all tests"
bash scripts/build.sh
ctest --test-dir build --output-on-failure

# The cuda tests once more, on the emulated CUDA device (experiments/cuda_emulation): a
# build of their own and about 6 minutes of tests (its work run at once, then deferred
# to each synchronisation), so only while the job has used less than 50 of its 90 minutes.
echo "== the cuda tests on the emulated CUDA device"
if [ "$SECONDS" -lt 3000 ] && [ -f /usr/local/cuda/include/cuda_runtime.h ]; then
  sh experiments/cuda_emulation/device_tests.sh build-emudev
else
  echo "skipped: $((SECONDS / 60)) minutes used so far, or no CUDA toolkit headers"
fi
