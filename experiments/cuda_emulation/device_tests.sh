#!/bin/sh
# The `cuda` tests on the emulated CUDA device: configures BUILD_DIR (default
# build-emudev/ at the root) with MUMOE_CUDA_EMULATED (the CUDA sources run on the host, a
# fiber per CUDA thread; see emu_library.h), builds it and runs `ctest -L cuda` there, so
# that every per-device suite compares cuda:0 with the CPU, and the CUDA runtime and
# training-step suites run, on a machine without a GPU. Slow (the emulator runs every
# GPU thread as a fiber); extra arguments go to ctest (e.g. -R test_linalg).
# Usage: experiments/cuda_emulation/device_tests.sh [BUILD_DIR] [ctest args...]
set -e
root=$(cd "$(dirname "$0")/../.." && pwd)
dir=${1:-$root/build-emudev}
[ $# -gt 0 ] && shift
if [ ! -f "$dir/CMakeCache.txt" ]; then
  cmake -S "$root" -B "$dir" -DCMAKE_BUILD_TYPE=Release -DMUMOE_CUDA=OFF -DMUMOE_CUDA_EMULATED=ON -DMUMOE_EXPERIMENTS=OFF
fi
cmake --build "$dir" -j"$(nproc)"
cd "$dir"
ctest -L cuda -j"$(nproc)" --timeout 1800 --output-on-failure "$@"
