#!/usr/bin/env bash
# The test job: install, build, run the unit tests under AddressSanitizer and
# UndefinedBehaviorSanitizer, then every ctest test of the Release build (unit,
# gradcheck, parity, cuda — skipped without a GPU — and slow).
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
