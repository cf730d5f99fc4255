#!/usr/bin/env bash
# Runs a mumoe benchmark and the PyTorch reference (../shared/reference/torch_reference.py)
# for the same workloads in one run, then prints each mumoe line's median time as a
# ratio of PyTorch's (below 1: mumoe is faster), and GFLOP/s where the line has them.
# Builds nothing:
#
#   experiments/bench/compare.sh sgemm [BUILD_DIR]     sgemm-1024: native GEMM and OpenBLAS
#   experiments/bench/compare.sh layers [BUILD_DIR]    cpmumoe-layer, trmumoe-layer
#   experiments/bench/compare.sh layer_norm [BUILD_DIR]   layer-norm-1024x768: fused and
#       composed, against F.layer_norm from experiments/bench/torch_layer_norm.py
#   experiments/bench/compare.sh cross_entropy [BUILD_DIR]
#                         cross-entropy-fwd, cross-entropy-fwd-bwd (N = 1024, C = 50257), against
#                         experiments/bench/torch_cross_entropy.py rather than the reference
#   experiments/bench/compare.sh softmax [BUILD_DIR]
#                         softmax-1024x50257, log-softmax-1024x50257 (forward + backward over a
#                         language model's logits), against experiments/bench/torch_softmax.py
#   experiments/bench/compare.sh gelu [BUILD_DIR]
#                         gelu-6272x512, gelu-tanh-6272x512, each also -fwd-bwd (exact and tanh GELU
#                         over the Fashion-MNIST Mixer's channel-MLP activations), against
#                         experiments/bench/torch_gelu.py
#   experiments/bench/compare.sh lm_head [BUILD_DIR]   lm-head-loss: gpt2-mini's head and loss
#                         (1024 x 256 by 50257), unfused and linear_cross_entropy in chunks, against
#                         F.cross_entropy(F.linear(x, W), t) of experiments/bench/torch_lm_head.py
#   experiments/bench/compare.sh generate [BUILD_DIR]  generate-mini-{whole-context,kv-cache}: 64
#                         greedy tokens after a 64-token prompt from gpt2-mini, nanoGPT's loop and
#                         a key-value cache, against the same two loops of torch_generate.py;
#                         BATCH=8 in the environment samples 8 sequences side by side, DTYPE=bf16
#                         runs both sides under autocast (the workloads then named ...-bf16)
#   experiments/bench/compare.sh attention [BUILD_DIR]
#                         causal attention forward+backward at (8, 4, 128, 64) and (1, 12, 1024, 64),
#                         against the composed softmax(q kᵀ/√D + mask) v of torch_attention.py
#   experiments/bench/compare.sh mixer [BUILD_DIR]    mixer-fmnist, mixer-fmnist-cpmumoe: a training
#                         step (forward, backward, AdamW) of the Fashion-MNIST-sized MLP-Mixer
#   experiments/bench/compare.sh gpt2 [BUILD_DIR]       gpt2-mini, gpt2-mini-cpmumoe, gpt2-mini-trmumoe
#                         (forward + backward + AdamW step of the whole model); DTYPE=bf16 runs
#                         gpt2-mini's step under autocast on both sides (torch_gpt2_autocast.py,
#                         gpt2-mini-bf16; the reference's μMoE blocks fail under torch.autocast)
#
#   experiments/bench/compare.sh all [BUILD_DIR]        every workload of the reference, each
#                         run as its own process, the two sides alternating (ROUNDS rounds,
#                         default 3, the order flipped every round): per workload both medians
#                         (the median of the rounds' medians), the ratio and both peak
#                         resident memories (the largest of the rounds); then the FLOPs of
#                         each step's products, the floor they imply at the run's GEMM
#                         rate and the share of that floor the step reaches; and the share
#                         at the GEMM rate measured right after each of our runs (sgemm-1024
#                         runs again after every workload), the median over the rounds
#
# BUILD_DIR defaults to build. THREADS and REPS may be set in the environment.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
which="${1:?usage: compare.sh all|sgemm|layers|layer_norm|cross_entropy|softmax|gelu|lm_head|generate|attention|mixer|gpt2 [BUILD_DIR]}"
build="${2:-build}"
case "$build" in /*) ;; *) build="$repo/$build" ;; esac
threads="${THREADS:-2}"
if [ "$which" = all ]; then
  reference="$repo/../shared/reference/torch_reference.py"
  [ -f "$reference" ] || { echo "compare.sh: reference script not found at $reference" >&2; exit 1; }
  for b in bench_gpt2 bench_mumoe_layers bench_mixer bench_sgemm; do
    [ -x "$build/experiments/$b" ] || { echo "compare.sh: $build/experiments/$b not built" >&2; exit 1; }
  done
  exec /usr/bin/python3 - "$reference" "$build/experiments" "$threads" "${REPS:-}" "${ROUNDS:-3}" <<'PY'
import json, os, resource, statistics, subprocess, sys
reference, bench_dir, threads, reps, rounds = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
# Every workload of the reference, with the program that is its twin here.
ours = {"gpt2-mini": "bench_gpt2", "gpt2-mini-cpmumoe": "bench_gpt2", "gpt2-mini-trmumoe": "bench_gpt2",
        "cpmumoe-layer": "bench_mumoe_layers", "trmumoe-layer": "bench_mumoe_layers",
        "mixer-fmnist": "bench_mixer", "mixer-fmnist-cpmumoe": "bench_mixer", "sgemm-1024": "bench_sgemm"}
listed = subprocess.run(["/usr/bin/python3", reference, "list"], check=True, capture_output=True, text=True).stdout.split()
missing = [w for w in listed if w not in ours]
if missing:
    sys.exit(f"compare.sh all: no twin here for reference workloads {missing}")
env = dict(os.environ, OMP_NUM_THREADS=threads)

def run(cmd):
    """Runs cmd as a child of a fresh interpreter that reports the child's peak RSS."""
    probe = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
             "sys.stderr.write(r.stderr); print(r.stdout, end=''); "
             "print('PEAK_KB', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(r.returncode)")
    p = subprocess.run(["/usr/bin/python3", "-c", probe] + cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"compare.sh all: {' '.join(cmd)} failed ({p.returncode}): {p.stderr[-2000:]}")
    lines = p.stdout.splitlines()
    peak = int(lines[-1].split()[1]) / 1024.0
    return [json.loads(l) for l in lines[:-1] if l.startswith("{")], peak

rep_args = ["--reps", reps] if reps else []
results = {}  # (workload, impl) -> {"medians": [...], "peak": MiB}
# This machine's speed drifts by 10-20% within minutes, so a GEMM rate measured once
# can flatter or wrong a step timed minutes apart. sgemm-1024 also runs right after each
# of our workload runs; that adjacent rate gives each round's floor share.
adjacent = {}  # workload -> [(our median that round, adjacent GEMM rate)]
def gemm_rate_now():
    lines, _ = run([os.path.join(bench_dir, "bench_sgemm")])
    return max(2 * 1024**3 / (j["median_ms"] * 1e-3) for j in lines if j["workload"] == "sgemm-1024")
for r in range(rounds):
    for w in listed:
        sides = [("torch", ["/usr/bin/python3", reference, "bench", "--workload", w, "--threads", threads] + rep_args),
                 ("mumoe", [os.path.join(bench_dir, ours[w]), "--workload", w] + rep_args if ours[w] != "bench_sgemm"
                  else [os.path.join(bench_dir, ours[w])] + rep_args)]
        if r % 2 == 1:
            sides.reverse()
        for side, cmd in sides:
            lines, peak = run(cmd)
            for j in lines:
                if j["workload"] != w:
                    continue
                key = (w, "torch" if side == "torch" else j["impl"])
                e = results.setdefault(key, {"medians": [], "peak": 0.0, "impl": j["impl"]})
                e["medians"].append(j["median_ms"])
                e["peak"] = max(e["peak"], peak)
                if side == "mumoe" and w != "sgemm-1024" and j["impl"] == "mumoe":
                    adjacent.setdefault(w, []).append((j["median_ms"], gemm_rate_now()))
        print(f"round {r + 1}/{rounds}: {w} done", file=sys.stderr, flush=True)

print(f"{'workload':<22} {'impl':<16} {'ours ms':>9} {'torch ms':>9} {'ratio':>6} {'ours MiB':>9} {'torch MiB':>9}")
for w in listed:
    t = results[(w, "torch")]
    tm = statistics.median(t["medians"])
    for (wk, impl), e in results.items():
        if wk != w or impl == "torch":
            continue
        m = statistics.median(e["medians"])
        print(f"{w:<22} {impl:<16} {m:>9.3f} {tm:>9.3f} {m / tm:>6.2f} {e['peak']:>9.1f} {t['peak']:>9.1f}")
print(f"threads {threads}; {rounds} rounds alternating; torch {t['impl']}")

# Counts first: the multiply-adds of each step's products (2 flops each; a backward pass
# costs twice its forward, one product for the input's gradient and one for the weight's),
# from the reference's shapes, and the floor they imply at this run's GEMM rate (the
# faster sgemm-1024 median of the native kernel and OpenBLAS). Elementwise work,
# reductions and the optimiser are not counted: the share is the floor over the step.
def gpt2_flops(mlp):
    B, T, d, L, V = 8, 128, 256, 4, 50257
    BT = B * T
    attn = 2 * BT * d * 3 * d + 2 * BT * d * d + 2 * 2 * B * T * T * d  # qkv, proj, q kᵀ and p v
    if mlp == "mlp":
        m = 2 * 2 * BT * d * 4 * d
    elif mlp == "cp":  # a @ U1, z @ U2, (.) @ U3ᵀ per layer, plus the gate x @ G
        N, R = 64, int(0.78 * d)
        m = 2 * BT * R * ((d + 1) + N + 4 * d) + 2 * BT * R * ((4 * d + 1) + N + d) + 2 * BT * d * N
    else:  # tensor ring (4, 4, R3): the four einsums of TRMuMoE.forward per layer
        N, R3 = 64, int(0.2 * d)
        lay = lambda i, o: 2 * BT * ((i + 1) * 4 * R3 + R3 * o * 4 + N * 16 + 16 * R3)
        m = lay(d, 4 * d) + lay(4 * d, d) + 2 * BT * d * N
    return 3 * (L * (attn + m) + 2 * BT * d * V)
def layer_flops(kind):
    T, I, O, N = 2048, 768, 768, 256
    if kind == "cp":
        return 3 * 2 * T * 512 * ((I + 1) + N + O)
    R3 = 149
    return 3 * 2 * T * ((I + 1) * 4 * R3 + R3 * O * 4 + N * 16 + 16 * R3)
def mixer_flops(mlp):
    B, tok, pd, d, L, dt, dc, C = 128, 49, 16, 128, 4, 64, 512, 10
    token = 2 * B * d * (tok * dt + dt * tok)
    if mlp == "mlp":
        ch = 2 * B * tok * (d * dc + dc * d)
    else:
        N, R = 64, int(0.75 * d)
        ch = 2 * B * tok * R * ((d + 1) + N + dc) + 2 * B * tok * R * ((dc + 1) + N + d) + 2 * B * tok * d * N
    return 3 * (2 * B * tok * pd * d + L * (token + ch) + 2 * B * d * C)
flops = {"gpt2-mini": gpt2_flops("mlp"), "gpt2-mini-cpmumoe": gpt2_flops("cp"), "gpt2-mini-trmumoe": gpt2_flops("tr"),
         "cpmumoe-layer": layer_flops("cp"), "trmumoe-layer": layer_flops("tr"), "mixer-fmnist": mixer_flops("mlp"),
         "mixer-fmnist-cpmumoe": mixer_flops("cpmumoe")}
gemm_ms = [statistics.median(e["medians"]) for (w, impl), e in results.items() if w == "sgemm-1024" and impl != "torch"]
if gemm_ms:
    rate = 2 * 1024**3 / (min(gemm_ms) * 1e-3)
    print(f"\nGEMM rate {rate / 1e9:.1f} GFLOP/s (sgemm-1024, the faster of the native and OpenBLAS medians)")
    print(f"{'workload':<22} {'GFLOP/step':>10} {'floor ms':>9} {'ours ms':>9} {'share':>6} {'adjacent':>9}")
    for w, f in flops.items():
        if (w, "mumoe") not in results:
            continue
        m = statistics.median(results[(w, "mumoe")]["medians"])
        floor = f / rate * 1e3
        # adjacent: the median over rounds of the floor at the GEMM rate measured right
        # after that round's run, over that run's median.
        adj = statistics.median(f / r * 1e3 / ms for ms, r in adjacent.get(w, [])) if w in adjacent else float("nan")
        print(f"{w:<22} {f / 1e9:>10.1f} {floor:>9.1f} {m:>9.1f} {floor / m * 100:>5.0f}% {adj * 100:>8.0f}%")
    print("share: at the run's fastest sgemm-1024 median; adjacent: at the rate measured right after each run")
PY
fi
case "$which" in
  sgemm) bench=bench_sgemm; workloads=sgemm-1024; reps="${REPS:-20}" ;;
  layers) bench=bench_mumoe_layers; workloads=cpmumoe-layer,trmumoe-layer; reps="${REPS:-10}" ;;
  layer_norm) bench=bench_layer_norm; workloads=layer-norm-1024x768; reps="${REPS:-50}"
    reference="$repo/experiments/bench/torch_layer_norm.py" ;;
  cross_entropy) bench=bench_cross_entropy; torch_script="$repo/experiments/bench/torch_cross_entropy.py"; reps="${REPS:-20}" ;;
  softmax) bench=bench_softmax; torch_script="$repo/experiments/bench/torch_softmax.py"; reps="${REPS:-10}" ;;
  gelu) bench=bench_gelu; torch_script="$repo/experiments/bench/torch_gelu.py"; reps="${REPS:-20}" ;;
  gpt2) bench=bench_gpt2; workloads=gpt2-mini,gpt2-mini-cpmumoe,gpt2-mini-trmumoe; reps="${REPS:-10}"
    if [ "${DTYPE:-float32}" = bf16 ]; then
      torch_script="$repo/experiments/bench/torch_gpt2_autocast.py"; extra=(--dtype bf16 --workload gpt2-mini)
    fi ;;
  lm_head) bench=bench_lm_head; torch_script="$repo/experiments/bench/torch_lm_head.py"; reps="${REPS:-5}" ;;
  generate) bench=bench_generate; torch_script="$repo/experiments/bench/torch_generate.py"; reps="${REPS:-3}"
    extra=(--batch "${BATCH:-1}" --dtype "${DTYPE:-float32}") ;;
  attention) bench=bench_attention; torch_script="$repo/experiments/bench/torch_attention.py"; reps="${REPS:-20}" ;;
  mixer) bench=bench_mixer; workloads=mixer-fmnist,mixer-fmnist-cpmumoe; reps="${REPS:-10}" ;;
  *) echo "compare.sh: unknown benchmark '$which' (sgemm, layers, layer_norm, cross_entropy, softmax, gelu, lm_head, generate, attention, mixer or gpt2)" >&2; exit 2 ;;
esac
reference="${reference:-$repo/../shared/reference/torch_reference.py}"
[ -x "$build/experiments/$bench" ] || { echo "compare.sh: $build/experiments/$bench not built" >&2; exit 1; }

# Debian's interpreter has torch; a python3 earlier on PATH may not.
if [ -n "${torch_script:-}" ]; then
  torch_lines="$(/usr/bin/python3 "$torch_script" --threads "$threads" --reps "$reps" ${extra[@]+"${extra[@]}"})"
else
  [ -f "$reference" ] || { echo "compare.sh: reference script not found at $reference" >&2; exit 1; }
  torch_lines="$(/usr/bin/python3 "$reference" bench --workload "$workloads" --threads "$threads" --reps "$reps")"
fi
mumoe_lines="$(OMP_NUM_THREADS="$threads" "$build/experiments/$bench" --reps "$reps" ${extra[@]+"${extra[@]}"})"
echo "$torch_lines"
echo "$mumoe_lines"
/usr/bin/python3 - "$torch_lines" "$mumoe_lines" <<'PY'
import json, sys
ref = {j["workload"]: j for j in map(json.loads, sys.argv[1].splitlines())}
for m in map(json.loads, sys.argv[2].splitlines()):
    r = ref[m["workload"]]
    line = f"{m['workload']} {m['impl']}: {m['median_ms']} ms vs pytorch {r['median_ms']} ms, ratio {m['median_ms'] / r['median_ms']:.2f}"
    if "gflops" in m and m["workload"].startswith("sgemm-"):  # a square GEMM: 2 n^3 flops, n from the workload name
        n = int(m["workload"].split("-")[1])
        line += f"; {m['gflops']:.1f} vs {2 * n**3 / (r['median_ms'] * 1e-3) / 1e9:.1f} GFLOP/s"
    if "gbps" in m and "bytes" not in m:  # bytes a step must move, over the median time
        line += f"; {m['gbps']:.1f} vs {r['gbps']:.1f} GB/s"
    if "flops" in m:  # the work the kernel must do, at each side's median
        line += f"; {m['flops'] / (m['median_ms'] * 1e6):.1f} vs {m['flops'] / (r['median_ms'] * 1e6):.1f} GFLOP/s"
    if "vs_fused" in m:
        line += f"; {m['vs_fused']:.2f}x the fused op's time"
    if "bytes" in m:  # a memory-bound kernel: the rate its byte floor implies, both sides
        line += f"; {m['gbps']:.1f} vs {m['bytes'] / (r['median_ms'] * 1e-3) / 1e9:.1f} GB/s at the floor of {m['bytes'] / 1e6:.0f} MB"
    print(line)
PY
