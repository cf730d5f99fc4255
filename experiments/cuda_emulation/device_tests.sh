#!/bin/sh
# The `cuda` tests on the emulated CUDA device: configures BUILD_DIR (default
# build-emudev/ at the root) with MUMOE_CUDA_EMULATED (the CUDA sources run on the host, a
# fiber per CUDA thread; see emu_library.h), builds it and runs `ctest -L cuda` there, so
# that every per-device suite compares cuda:0 with the CPU, and the CUDA runtime and
# training-step suites run, on a machine without a GPU, and the distributed tests, whose
# CUDA cases (collectives, DDP) then go through the NCCL side over emu_nccl.h (about 3
# minutes per mode, below, on 2 cores, after a build of the library and the tests). ctest
# runs quietly into BUILD_DIR/emulated_cuda_MODE.log (scripts/ctest_quiet.sh): each test's
# result is printed, and the failures' output, but not ctest's closing line (the test
# job's default run is the one whose closing line CI reads).
# Usage: experiments/cuda_emulation/device_tests.sh [BUILD_DIR] [ctest args...]
set -e
root=$(cd "$(dirname "$0")/../.." && pwd)
dir=${1:-$root/build-emudev}
[ $# -gt 0 ] && shift
case $dir in /*) ;; *) dir=$PWD/$dir ;; esac  # ctest runs from inside it
if [ ! -f "$dir/CMakeCache.txt" ]; then
  cmake -S "$root" -B "$dir" -DCMAKE_BUILD_TYPE=Release -DMUMOE_CUDA=OFF -DMUMOE_CUDA_EMULATED=ON \
    -DMUMOE_EXPERIMENTS=OFF >/dev/null
fi
cmake --build "$dir" -j"$(nproc)" >/dev/null
# Twice: with the device's work run as it is issued (a device infinitely fast), then
# deferred to the host's next synchronisation (infinitely slow; emu_queue.h), where a
# result read or a pinned buffer reused before the work on it has run shows as wrong data.
# The deferred run also schedules blocks and threads in reverse order (emu.h), where a
# kernel relying on an order the GPU does not promise shows; MUMOE_EMULATED_ORDER set by
# the caller applies to both runs instead.
# The immediate run also turns the caching allocator off (MUMOE_NO_CACHING=1): every
# tensor is then a fresh block, which the emulator fills with all-ones bytes (NaN, or -1),
# so that a kernel reading memory nobody wrote shows; the deferred run keeps the cache (its
# frees would otherwise wait for the device's work at once and defer nothing).
# MUMOE_EMULATED_MODES=immediate or =deferred runs one of them.
for mode in ${MUMOE_EMULATED_MODES:-immediate deferred}; do
  case $mode in
    immediate) deferred=0 order=${MUMOE_EMULATED_ORDER:-forward} no_caching=1 ;;
    deferred) deferred=1 order=${MUMOE_EMULATED_ORDER:-reverse} no_caching=0 ;;
    *) echo "device_tests.sh: unknown mode '$mode' in MUMOE_EMULATED_MODES (immediate, deferred)" >&2; exit 2 ;;
  esac
  # Two emulated devices, so that the distributed tests' two ranks each have one and their
  # CUDA collectives (and DDP on CUDA) go through dist/nccl.cu.
  echo "emulated CUDA device, work run $mode, blocks and threads in $order order, caching allocator $([ $no_caching = 1 ] && echo off || echo on):"
  MUMOE_EMULATED_DEVICES=2 MUMOE_EMULATED_DEFERRED=$deferred MUMOE_EMULATED_ORDER=$order MUMOE_NO_CACHING=$no_caching \
    sh "$root/scripts/ctest_quiet.sh" "$dir" "$dir/emulated_cuda_$mode.log" "emulated CUDA device ($mode): cuda tests" \
    -L 'cuda|distributed' -j"$(nproc)" --timeout 1800 "$@"
done
