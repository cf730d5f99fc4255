#!/usr/bin/env bash
# Runs the GPU benchmarks and their PyTorch twins (experiments/bench/torch_gpu.py, PyTorch
# eager on the same GPU) in one session, then prints a table of ratios per workload:
# ours / torch of the median step time (below 1: mumoe is faster), with each side's
# tokens/s, MFU and peak memory for GPT-2 and TFLOP/s for the layers. Builds nothing:
#
#   experiments/bench/compare_gpu.sh [BUILD_DIR]        layers, then GPT-2 124M
#
# Workloads: bench_gpu_layers (cpmumoe-layer, trmumoe-layer, causal attention at
# B 8, H 12, T 1024, D 64 forward and forward+backward; fp32 and bf16) and bench_gpu_gpt2
# (GPT-2 124M, dense and CPμMoE N = 256, B 8, T 1024; bf16 autocast and fp32).
# Environment: REPS (step count of both sides; defaults: 20 layers, 10 GPT-2), GPT2_DTYPE
# (default bf16,fp32), LAYER_DTYPE (default fp32,bf16), TF32 (0 or 1, default 0: float32
# matmuls in full float32 on both sides), BENCH_LOG (a file each side's JSON lines are
# appended to as they come), PYTHON (an interpreter with a CUDA build of
# PyTorch 2; default: python3 if it imports torch, else /usr/bin/python3).
# Without a GPU it says so and exits with status 1 before running anything.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${1:-build}"
case "$build" in /*) ;; *) build="$repo/$build" ;; esac
here="$repo/experiments/bench"
for b in bench_gpu_layers bench_gpu_gpt2; do
  [ -x "$build/experiments/$b" ] || { echo "compare_gpu.sh: $build/experiments/$b not built (configure with -DMUMOE_CUDA=ON -DMUMOE_EXPERIMENTS=ON)" >&2; exit 1; }
done
if [ -z "${PYTHON:-}" ]; then
  if python3 -c 'import torch' 2>/dev/null; then PYTHON=python3; else PYTHON=/usr/bin/python3; fi
fi
tf32="${TF32:-0}"

# No GPU: stop here, with the reasons both sides give.
if ! gpu_check="$("$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 3)' 2>&1)"; then
  echo "compare_gpu.sh: PyTorch ($PYTHON) sees no CUDA device; nothing to compare ${gpu_check:+($gpu_check)}" >&2
  exit 1
fi

# Runs one side; a failure (no CUDA device for the framework: status 3) ends the script.
run() {
  local out rc=0
  out="$("$@")" || rc=$?
  if [ "$rc" -ne 0 ]; then
    [ "$rc" -eq 3 ] && echo "compare_gpu.sh: no CUDA device for $1; nothing to compare" >&2
    echo "compare_gpu.sh: '$*' failed with status $rc" >&2
    exit 1
  fi
  [ -n "${BENCH_LOG:-}" ] && printf '%s\n' "$out" >>"$BENCH_LOG"
  printf '%s\n' "$out"
}

layer_reps="${REPS:-20}" gpt2_reps="${REPS:-10}"
layer_dtype="${LAYER_DTYPE:-fp32,bf16}" gpt2_dtype="${GPT2_DTYPE:-bf16,fp32}"
ours="$(run "$build/experiments/bench_gpu_layers" --reps "$layer_reps" --dtype "$layer_dtype" --tf32 "$tf32")"
torch_lines="$(run "$PYTHON" "$here/torch_gpu.py" layers --reps "$layer_reps" --dtype "$layer_dtype" --tf32 "$tf32")"
ours+=$'\n'"$(run "$build/experiments/bench_gpu_gpt2" --reps "$gpt2_reps" --dtype "$gpt2_dtype" --tf32 "$tf32")"
torch_lines+=$'\n'"$(run "$PYTHON" "$here/torch_gpu.py" gpt2 --reps "$gpt2_reps" --dtype "$gpt2_dtype" --tf32 "$tf32")"
echo "$torch_lines"
echo "$ours"
"$PYTHON" - "$torch_lines" "$ours" <<'PY'
import json, sys
ref = {j["workload"]: j for j in map(json.loads, sys.argv[1].splitlines())}
print(f"\n{'workload':36} {'mumoe ms':>10} {'torch ms':>10} {'ratio':>6}  details (mumoe vs torch)")
for m in map(json.loads, sys.argv[2].splitlines()):
    r = ref.get(m["workload"])
    if r is None:
        print(f"{m['workload']:36} {m['median_ms']:10.3f} {'-':>10} {'-':>6}  no torch line"); continue
    extra = ""
    if "mfu" in m:
        extra = (f"{m['tokens_per_s']:.0f} vs {r['tokens_per_s']:.0f} tok/s, MFU {m['mfu']:.3f} vs {r['mfu']:.3f}, "
                 f"peak {m['peak_memory_mb']:.0f} vs {r['peak_memory_mb']:.0f} MiB")
        if abs(m["flops_per_token"] - r["flops_per_token"]) > 0.5:  # both sides must count the same work
            extra += f"; FLOPs/token differ: {m['flops_per_token']:.0f} vs {r['flops_per_token']:.0f}"
    elif "tflops" in m:
        extra = f"{m['tflops']:.1f} vs {r['tflops']:.1f} TFLOP/s"
    elif "gb_per_s" in m:
        extra = f"{m['gb_per_s']:.1f} vs {r['gb_per_s']:.1f} GB/s of the input read once"
    print(f"{m['workload']:36} {m['median_ms']:10.3f} {r['median_ms']:10.3f} {m['median_ms'] / r['median_ms']:6.2f}  {extra}")
print(f"\ndevice: {next(iter(ref.values()))['device']}; impl: {next(iter(ref.values()))['impl']}")
PY
