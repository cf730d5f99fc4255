#!/usr/bin/env bash
# sgemm-1024: the PyTorch reference and mumoe's bench_sgemm (native kernel and OpenBLAS)
# measured in one run, then mumoe's GFLOP/s as a ratio of PyTorch's. Builds nothing:
#
#   experiments/bench/run_sgemm.sh [BUILD_DIR]     (default: build)
#
# Run from anywhere; paths are resolved from this script's location. THREADS and REPS
# may be set in the environment (default 2 and 20).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${1:-build}"
case "$build" in /*) ;; *) build="$repo/$build" ;; esac
threads="${THREADS:-2}"
reps="${REPS:-20}"
reference="$repo/../shared/reference/torch_reference.py"
bench="$build/experiments/bench_sgemm"

[ -f "$reference" ] || { echo "run_sgemm.sh: reference script not found at $reference" >&2; exit 1; }
[ -x "$bench" ] || { echo "run_sgemm.sh: $bench not built (cmake --build $build --target bench_sgemm)" >&2; exit 1; }

# Debian's interpreter has torch; a python3 earlier on PATH may not.
torch_line="$(/usr/bin/python3 "$reference" bench --workload sgemm-1024 --threads "$threads" --reps "$reps")"
mumoe_lines="$(OMP_NUM_THREADS="$threads" "$bench" --reps "$reps")"

echo "$torch_line"
echo "$mumoe_lines"

# GFLOP/s of the reference from its median time (2 n^3 flops), and each mumoe line's ratio.
/usr/bin/python3 - "$torch_line" "$mumoe_lines" <<'EOF'
import json, sys
ref = json.loads(sys.argv[1])
ref_gflops = 2 * 1024**3 / (ref["median_ms"] * 1e-3) / 1e9
print(f"pytorch: {ref_gflops:.1f} GFLOP/s ({ref['median_ms']} ms, {ref['threads']} threads)")
for line in sys.argv[2].splitlines():
    m = json.loads(line)
    print(f"{m['impl']}: {m['gflops']:.1f} GFLOP/s ({m['median_ms']} ms) = {m['gflops'] / ref_gflops:.2f}x pytorch")
EOF
