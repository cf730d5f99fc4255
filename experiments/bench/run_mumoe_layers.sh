#!/usr/bin/env bash
# cpmumoe-layer and trmumoe-layer: the PyTorch reference and mumoe measured in one run,
# then mumoe's median time as a ratio of PyTorch's (below 1 is faster). Builds nothing:
#
#   experiments/bench/run_mumoe_layers.sh [BUILD_DIR]     (default: build)
# THREADS and REPS may be set in the environment (default 2 and 10).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${1:-build}"
case "$build" in /*) ;; *) build="$repo/$build" ;; esac
threads="${THREADS:-2}"
reps="${REPS:-10}"
reference="$repo/../shared/reference/torch_reference.py"
bench="$build/experiments/bench_mumoe_layers"
[ -f "$reference" ] || { echo "run_mumoe_layers.sh: reference script not found at $reference" >&2; exit 1; }
[ -x "$bench" ] || { echo "run_mumoe_layers.sh: $bench not built (cmake --build $build --target bench_mumoe_layers)" >&2; exit 1; }

torch_lines="$(/usr/bin/python3 "$reference" bench --workload cpmumoe-layer,trmumoe-layer --threads "$threads" --reps "$reps")"
mumoe_lines="$(OMP_NUM_THREADS="$threads" "$bench" --reps "$reps")"
echo "$torch_lines"
echo "$mumoe_lines"
/usr/bin/python3 - "$torch_lines" "$mumoe_lines" <<'PY'
import json, sys
ref = {j["workload"]: j for j in map(json.loads, sys.argv[1].splitlines())}
for line in sys.argv[2].splitlines():
    m = json.loads(line)
    r = ref[m["workload"]]
    print(f"{m['workload']}: mumoe {m['median_ms']} ms, pytorch {r['median_ms']} ms, ratio {m['median_ms'] / r['median_ms']:.2f} "
          f"(params {m['params']} vs {r['params']})")
PY
