#!/usr/bin/env bash
# Copies what scripts/gpu_check.sh runs out of a CUDA build folder into .gpu_bin/
# (libmumoe.so, the CUDA test suites, the GPU benchmarks; stripped), a folder small
# enough to carry to a GPU machine, with the hash of the sources they were built from
# (scripts/gpu_source_hash.sh; build first: the hash is of the tree as it is now):
#   bash scripts/gpu_stage.sh [BUILD_DIR]       (default build-gpu)
# The GPU machine has no OpenBLAS, MPI or this machine's instruction set, so configure the
# build folder without them; only the staged targets need building (45 MB staged, which
# loaded and ran on an H200 machine):
#   cmake -S . -B build-gpu -G Ninja -DMUMOE_CUDA=ON -DMUMOE_OPENBLAS=OFF -DMUMOE_MPI=OFF \
#     -DMUMOE_NATIVE=OFF -DCMAKE_CXX_FLAGS=-march=x86-64-v3
#   cmake --build build-gpu --target mumoe <the suites and programs below>
# .gpu_bin/ is listed in .gitignore.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-gpu}
out=.gpu_bin
rm -rf "$out.partial"
mkdir -p "$out.partial/tests" "$out.partial/experiments"
cp "$build"/libmumoe.so* "$out.partial/"
for name in $(grep -oP '^mu_device_test\(\K\w+' tests/CMakeLists.txt; grep -oP '^mu_test\(\K\w+(?= .*\bcuda\b)' tests/CMakeLists.txt); do
  cp "$build/tests/$name" "$out.partial/tests/"
done
for name in bench_gpu_layers bench_gpu_gpt2 bench_gpu_fused_mumoe bench_cuda_linalg bench_sparse_moe bench_generate train_gpt2 repro_table3_gpt2 train_mixer repro_table3_mixer; do
  cp "$build/experiments/$name" "$out.partial/experiments/"
done
# What they were built from: gpu_check.sh rebuilds rather than run binaries of other sources.
bash scripts/gpu_source_hash.sh >"$out.partial/source_hash"
strip --strip-unneeded "$out.partial"/libmumoe.so* "$out.partial"/tests/* "$out.partial"/experiments/* 2>/dev/null || true
rm -rf "$out"
mv "$out.partial" "$out"
du -sh "$out"
