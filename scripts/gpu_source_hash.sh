#!/usr/bin/env bash
# Prints one hash of the sources the staged GPU binaries are built from (every C++, CUDA
# and CMake file of the library, tests and experiments), so that scripts/gpu_check.sh can
# tell binaries staged from this tree (scripts/gpu_stage.sh records the hash) from stale
# ones. Needs no git: the GPU machine gets a copy of the files alone.
set -euo pipefail
cd "$(dirname "$0")/.."
find autograd data dist models nn ops optim tensor train tests experiments cmake mumoe.h CMakeLists.txt \
  -type f \( -name '*.h' -o -name '*.hpp' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh' -o -name '*.txt' \
  -o -name '*.cmake' -o -name '*.in' \) 2>/dev/null | LC_ALL=C sort | xargs sha1sum | sha1sum | cut -d' ' -f1
