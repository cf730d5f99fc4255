#!/usr/bin/env bash
# On a GPU machine (CUDA toolkit, CMake, a compiler; the dependencies carried in
# .gpu_deps/ from scripts/gpu_deps.sh): build, run every CUDA test, then the GPU
# benchmarks beside PyTorch. Logs go to $OUT (default ./gpu_out); the end of the output
# is a short summary.
#   bash scripts/gpu_check.sh [build|test|bench|all]   (default all)
set -uo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
out=${OUT:-gpu_out}
mkdir -p "$out"
deps=$PWD/.gpu_deps
build=build-gpu
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"

if [[ $what == build || $what == all ]]; then
  # zlib: the machine's own library, the carried headers.
  zlib=$(ls /usr/lib/x86_64-linux-gnu/libz.so* /lib/x86_64-linux-gnu/libz.so* 2>/dev/null | head -1)
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMUMOE_CUDA=ON -DMUMOE_OPENBLAS=OFF \
    -DCMAKE_PREFIX_PATH="$deps" -Ddoctest_DIR="$deps/cmake" -Dnlohmann_json_DIR="$deps/cmake" \
    -DCLI11_DIR="$deps/cmake" -DZLIB_INCLUDE_DIR="$deps/include" -DZLIB_LIBRARY="$zlib" \
    >"$out/configure.log" 2>&1 || { tail -30 "$out/configure.log"; exit 1; }
  start=$(date +%s)
  cmake --build "$build" -j"$(nproc)" >"$out/build.log" 2>&1 || { grep -B2 -A8 "error" "$out/build.log" | head -60; exit 1; }
  echo "build: $(( $(date +%s) - start )) s"
fi

if [[ $what == test || $what == all ]]; then
  # Every suite with CUDA cases, run directly (its ctest twin NAME_cuda sets the same
  # variable); failures are listed, their output kept in $out/tests.log.
  : >"$out/tests.log"
  failed=()
  for t in "$build"/tests/test_*; do
    [[ -x $t && -f $t ]] || continue
    name=$(basename "$t")
    grep -q "test_devices()\|cuda::" "tests/$name.cpp" 2>/dev/null || continue
    s=$(date +%s)
    MUMOE_TEST_DEVICES=cuda MUMOE_SOURCE_DIR=$PWD OMP_NUM_THREADS=8 timeout 600 "$t" >>"$out/tests.log" 2>&1
    rc=$?
    echo "$name rc=$rc $(( $(date +%s) - s ))s" | tee -a "$out/tests_summary.txt"
    [[ $rc == 0 || $rc == 77 ]] || failed+=("$name")
  done
  echo "failed: ${failed[*]:-none}"
fi

if [[ $what == bench || $what == all ]]; then
  if [[ -x experiments/bench/compare_gpu.sh ]]; then
    bash experiments/bench/compare_gpu.sh "$build" 2>&1 | tee "$out/bench.txt" | tail -30
  else
    echo "experiments/bench/compare_gpu.sh not found"
  fi
  # The fused CPμMoE core against the einsum composition (einsum_over_fused > 1: fused
  # is faster; CPMuMoE's fused_cp option stays off unless it is).
  "$build"/experiments/bench_gpu_fused_mumoe 2>&1 | tee "$out/bench_fused.txt" | grep einsum_over_fused
fi
