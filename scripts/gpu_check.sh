#!/usr/bin/env bash
# On a GPU machine: run every CUDA test suite, then the GPU benchmarks beside PyTorch.
# The binaries come either from .gpu_bin/ (made on a build machine by
# scripts/gpu_stage.sh and carried along) or, when that folder is missing, its
# programs do not load there or were built from other sources, from a build on the spot (CUDA toolkit, CMake, a compiler,
# and the header dependencies carried in .gpu_deps/ from scripts/gpu_deps.sh).
# Logs go to $OUT (default ./gpu_out); the end of the output is a short summary.
#   bash scripts/gpu_check.sh [MODE...], MODE one of test|bench|sparse|gpt2|attention|shapes|generate|paper|profile|pad|all
#   (several run one after the other; default all; sparse:
#   the sparse-MoE scaling benchmark alone; gpt2: the bf16 comparison and a profiled step;
#   attention: each attention path of the framework beside PyTorch, and float32 GPT-2 with
#   each float32 path; shapes: one bf16 GPT-2 step's kernel table by argument signature;
#   generate: GPT-2 sampling's kernel table beside its wall time; paper: Table 3's GPT-2 recipe
#   at paper scale for 60 steps a model on random tokens, then its Mixer recipe for one epoch
#   of 1024 random 256 x 256 images, each interrupted and resumed; profile: a
#   bf16 GPT-2 step's time and kernel table on each side, the float32 attention backward
#   under Nsight Compute; pad: GPT-2 steps with and without the matmuls' padded buffers,
#   and with the Linear layers' bias added by a separate kernel instead of cuBLASLt's epilogue)
# Environment: SUITE_TIMEOUT (s, per test suite, default 240), TESTS_TIMEOUT (s, all
# suites, default 600), JOBS (suites at once, default 6), BENCH_TIMEOUT (s, the whole
# comparison with PyTorch, default 300), FUSED_TIMEOUT (s, default 150), PAPER_TIMEOUT (s,
# each resumed paper run, default 300), PAPER_INTERRUPT and MIXER_INTERRUPT (s before each
# paper run's Ctrl-C, defaults 25 and 20), NCU (0: profile without Nsight Compute),
# SANITIZE_FAILED (1: the first failing suite again under compute-sanitizer);
# MUMOE_CUDA_POISON=1 runs everything over poisoned blocks (README, Environment), which
# turns a read of unwritten memory into NaN.
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
# Several modes in one call (one device session): each in turn, the worst status last.
if (( $# > 1 )); then
  worst=0
  for mode in "$@"; do
    echo "=== gpu_check.sh $mode"
    bash "$repo/scripts/gpu_check.sh" "$mode"
    rc=$?
    (( rc > worst )) && worst=$rc
  done
  exit $worst
fi
what=${1:-all}
out=${OUT:-gpu_out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$out/gpu.txt"

# cuBLAS and cuDNN: the toolkit's, else the ones PyTorch's wheels bring along.
for d in /usr/local/cuda/lib64 $(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, q, "lib") for p in nvidia.__path__ for q in os.listdir(p)))' 2>/dev/null); do
  [[ -d $d ]] && LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d
done

bin=$repo/.gpu_bin
loads() { [[ -x $bin/tests/test_cuda ]] && ! LD_LIBRARY_PATH=$bin:$LD_LIBRARY_PATH ldd "$bin/tests/test_cuda" | grep -q "not found"; }
# Binaries staged from other sources than these would test the wrong code.
current() { [[ -f $bin/source_hash && $(cat "$bin/source_hash") == $(bash scripts/gpu_source_hash.sh) ]]; }
if ! loads || ! current; then
  if [[ -d $bin ]]; then
    if ! loads; then echo "carried binaries do not load here:"; LD_LIBRARY_PATH=$bin:$LD_LIBRARY_PATH ldd "$bin/tests/test_cuda" | grep "not found"
    else echo "carried binaries were built from other sources (scripts/gpu_source_hash.sh): building here"; fi
  fi
  deps=$repo/.gpu_deps
  zlib=$(ls /usr/lib/x86_64-linux-gnu/libz.so* /lib/x86_64-linux-gnu/libz.so* 2>/dev/null | head -1)
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DMUMOE_CUDA=ON -DMUMOE_OPENBLAS=OFF \
    -DCMAKE_PREFIX_PATH="$deps" -Ddoctest_DIR="$deps/cmake" -Dnlohmann_json_DIR="$deps/cmake" \
    -DCLI11_DIR="$deps/cmake" -DZLIB_INCLUDE_DIR="$deps/include" -DZLIB_LIBRARY="$zlib" \
    >"$out/configure.log" 2>&1 || { tail -30 "$out/configure.log"; exit 1; }
  start=$(date +%s)
  cmake --build build-gpu -j"$(nproc)" >"$out/build.log" 2>&1 || { grep -B2 -A8 "error" "$out/build.log" | head -60; exit 1; }
  echo "build: $(( $(date +%s) - start )) s"
  bash scripts/gpu_stage.sh build-gpu
fi
export LD_LIBRARY_PATH=$bin:$LD_LIBRARY_PATH

if [[ $what == test || $what == all ]]; then
  # The suites labelled cuda in tests/CMakeLists.txt (mu_device_test ones run with
  # MUMOE_TEST_DEVICES=cuda, as their ctest twins NAME_cuda do), several at once.
  suites=$(grep -oP '^mu_device_test\(\K\w+' tests/CMakeLists.txt; grep -oP '^mu_test\(\K\w+(?= .*\bcuda\b)' tests/CMakeLists.txt)
  : >"$out/tests.log"; : >"$out/tests_summary.txt"
  one_suite() {
    local name=$1 log s rc
    log=$(mktemp); s=$(date +%s)
    MUMOE_TEST_DEVICES=cuda MUMOE_SOURCE_DIR=$repo MUMOE_PYTHON=python3 MUMOE_BACKTRACE=1 OMP_NUM_THREADS=2 timeout "${SUITE_TIMEOUT:-240}" \
      "$bin/tests/$name" >"$log" 2>&1
    rc=$?
    {
      flock 9
      echo "$name rc=$rc $(( $(date +%s) - s ))s" | tee -a "$out/tests_summary.txt"
      # Whole output of a failing suite; the doctest summary line of a passing one.
      if [[ $rc == 0 || $rc == 77 ]]; then grep -E "^\[doctest\] (test cases|Status)|skip" "$log" | sed "s/^/$name: /" >>"$out/tests.log"
      else echo "===== $name rc=$rc" >>"$out/tests.log"; cat "$log" >>"$out/tests.log"; fi
    } 9>"$out/.lock"
    rm -f "$log"
  }
  export -f one_suite; export bin repo out
  start=$(date +%s)
  printf '%s\n' $suites | timeout "${TESTS_TIMEOUT:-600}" xargs -P "${JOBS:-6}" -I{} bash -c 'one_suite {}'
  rm -f "$out/.lock"
  failed=$(grep -v " rc=0 \| rc=77 " "$out/tests_summary.txt" | awk '{print $1}' | tr '\n' ' ')
  unfinished=$(for s in $suites; do grep -q "^$s " "$out/tests_summary.txt" || printf '%s ' "$s"; done)
  echo "tests: $(( $(date +%s) - start )) s; failed: ${failed:-none}; unfinished: ${unfinished:-none}"
  # SANITIZE_FAILED=1: the first failing suite again under compute-sanitizer's memcheck
  # (an out-of-bounds or misaligned access named by kernel and address), appended to tests.log.
  if [[ ${SANITIZE_FAILED:-0} == 1 && -n ${failed:-} ]] && command -v compute-sanitizer >/dev/null; then
    for name in $(printf '%s\n' $failed | head -1); do
      echo "===== compute-sanitizer $name" >>"$out/tests.log"
      MUMOE_TEST_DEVICES=cuda MUMOE_SOURCE_DIR=$repo MUMOE_PYTHON=python3 OMP_NUM_THREADS=2 timeout 90 \
        compute-sanitizer --tool memcheck --print-limit 20 "$bin/tests/$name" 2>&1 | tail -80 >>"$out/tests.log"
    done
  fi
fi

if [[ $what == bench || $what == all ]]; then
  # Each side's JSON lines are kept in $out/bench_lines.txt as they come (a timeout
  # still leaves them); the table of ratios is printed last.
  BENCH_LOG=$out/bench_lines.txt timeout "${BENCH_TIMEOUT:-300}" bash experiments/bench/compare_gpu.sh "$bin" >"$out/bench.txt" 2>&1
  echo "compare_gpu.sh rc=$?"
  # The fused CPμMoE and TRμMoE paths against their compositions (einsum_over_fused > 1:
  # fused is faster; the fused_cp and fused_tr options stay off unless it is).
  timeout "${FUSED_TIMEOUT:-150}" "$bin/experiments/bench_gpu_fused_mumoe" >"$out/bench_fused.txt" 2>&1
  echo "bench_gpu_fused_mumoe rc=$?"
  cat "$out/bench_fused.txt" >>"$out/bench.txt" && rm "$out/bench_fused.txt"
  # GPT-2 124M with every block recomputed (activation checkpointing): its peak memory and
  # step time beside the plain line of compare_gpu.sh above.
  timeout 60 "$bin/experiments/bench_gpu_gpt2" --workload gpt2-124m --dtype bf16 --reps 3 --warmup 2 --recompute 1 \
    2>&1 | sed "s/^/recompute: /" >>"$out/bench.txt"
  # The same with the lm_head and loss in chunks (linear_cross_entropy) and the GELU
  # recomputed (gelu_linear), the two cheap memory savers together: peak and time.
  timeout 60 "$bin/experiments/bench_gpu_gpt2" --workload gpt2-124m --dtype bf16 --reps 3 --warmup 2 --chunked-loss 1 \
    --gelu-recompute 1 2>&1 | sed "s/^/chunked: /" >>"$out/bench.txt"
  # Sampling from GPT-2 124M (float32, greedy) with and without generate's key-value cache.
  timeout 60 "$bin/experiments/bench_generate" --model 124m --device cuda --prompt 128 --new 128 --reps 3 \
    --warmup 1 2>&1 | sed "s/^/generate: /" >>"$out/bench.txt"
  timeout 90 python3 experiments/bench/torch_generate.py --model 124m --device cuda --prompt 128 --new 128 --reps 3 \
    --warmup 1 2>&1 | sed "s/^/generate: /" >>"$out/bench.txt"
  # The same under autocast (bfloat16): decoding steps must not reach cuDNN's per-shape plans.
  timeout 60 "$bin/experiments/bench_generate" --model 124m --device cuda --prompt 128 --new 128 --dtype bf16 \
    --reps 3 --warmup 1 2>&1 | sed "s/^/generate: /" >>"$out/bench.txt"
  timeout 90 python3 experiments/bench/torch_generate.py --model 124m --device cuda --prompt 128 --new 128 \
    --dtype bf16 --reps 3 --warmup 1 2>&1 | sed "s/^/generate: /" >>"$out/bench.txt"
  # Attention through each of the framework's own paths, beside the default choice above
  # (float32: the tensor-core kernels; bfloat16: cuDNN).
  for path in tiled gemm flash; do
    MUMOE_ATTENTION=$path timeout 60 "$bin/experiments/bench_gpu_layers" --reps 20 --dtype fp32,bf16 \
      --workload attention-b8-h12-t1024-fwd,attention-b8-h12-t1024-fwd-bwd 2>&1 |
      grep attention | sed "s/^/$path: /" >>"$out/bench.txt"
  done
  # Why cuDNN does or does not take the bfloat16 graphs: its own log of one call.
  if [[ ${CUDNN_DIAG:-0} == 1 ]]; then
    CUDNN_LOGLEVEL_DBG=3 CUDNN_LOGDEST_DBG=/tmp/cudnn.log timeout 60 \
      "$bin/experiments/bench_gpu_layers" --reps 1 --warmup 0 --dtype bf16 >/dev/null 2>&1
    head -c 2000000 /tmp/cudnn.log >"$out/cudnn.log"
  fi
  # One bf16 GPT-2 step under each side's kernel profiler (ops/profile.h, torch.profiler).
  if [[ ${PROFILE:-0} == 1 ]]; then
    timeout 90 "$bin/experiments/bench_gpu_gpt2" --workload gpt2-124m --dtype bf16 --reps 2 --warmup 2 --profile 1 \
      >/dev/null 2>"$out/profile.txt"
    timeout 90 python3 experiments/bench/torch_gpu.py gpt2 --workload gpt2-124m --dtype bf16 --reps 2 --warmup 2 \
      --profile 1 >/dev/null 2>>"$out/profile.txt"
    head -45 "$out/profile.txt"
  fi
  grep -v "^{\|^tiled\|^gemm\|^flash\|^recompute\|^chunked\|^\[mumoe\]" "$out/bench.txt" | tail -18
  grep "^tiled\|^gemm\|^flash\|^recompute\|^chunked\|einsum_over_fused" "$out/bench.txt" | sed 's/"impl".*"median_ms"/.../'
  grep "cuDNN" "$out/bench.txt" | sort | uniq -c
fi

if [[ $what == sparse ]]; then
  # σ-MoE forward + backward as N_E grows at fixed K and G, beside the dense MLP of the
  # same d_ff: the paper-like size, then a small one (64 tokens per expert at N_E = 128).
  timeout 120 "$bin/experiments/bench_sparse_moe" --device cuda --reps 10 --warmup 3 >"$out/sparse.txt" 2>&1
  timeout 60 "$bin/experiments/bench_sparse_moe" --device cuda --reps 10 --warmup 3 --d-model 256 --tokens 2048 \
    >>"$out/sparse.txt" 2>&1
  timeout 60 "$bin/experiments/bench_sparse_moe" --device cuda --reps 3 --warmup 2 --experts 16,128 --profile 1 \
    2>"$out/sparse_profile.txt" >/dev/null
  cat "$out/sparse.txt"
  grep -A14 "kernel profile" "$out/sparse_profile.txt"
fi

if [[ $what == attention ]]; then
  # One line per (path, workload, dtype): median ms of ours and torch's in the same run.
  att=attention-b8-h12-t1024-fwd,attention-b8-h12-t1024-fwd-bwd
  : >"$out/attention.txt"
  timeout 60 python3 experiments/bench/torch_gpu.py layers --workload $att --dtype fp32,bf16 --reps 20 |
    sed 's/^/torch: /' >>"$out/attention.txt"
  # default: float32 on the tensor cores (attention_flash.cu), bfloat16 through cuDNN;
  # tiled: the tiled kernels, dQ from the dK/dV blocks; separate: the tiled backward with
  # its own dQ blocks (MUMOE_ATTENTION_DQ); flash: bfloat16 on the framework's tensor-core
  # kernels instead of cuDNN's.
  for path in default tiled gemm separate flash; do
    case $path in
      default) env= ;;
      separate) env="MUMOE_ATTENTION=tiled MUMOE_ATTENTION_DQ=separate" ;;
      *) env=MUMOE_ATTENTION=$path ;;
    esac
    env $env timeout 60 "$bin/experiments/bench_gpu_layers" \
      --workload $att --dtype fp32,bf16 --reps 20 2>&1 | sed "s/^/$path: /" >>"$out/attention.txt"
  done
  timeout 60 python3 experiments/bench/torch_gpu.py gpt2 --workload gpt2-124m --dtype fp32 --reps 5 |
    sed 's/^/torch: /' >>"$out/attention.txt"
  for path in default tiled; do
    env $([[ $path != default ]] && echo MUMOE_ATTENTION=$path) timeout 60 "$bin/experiments/bench_gpu_gpt2" \
      --workload gpt2-124m --dtype fp32 --reps 5 2>&1 | sed "s/^/$path: /" >>"$out/attention.txt"
  done
  # Where a float32 GPT-2 step goes, each side's kernel table (in $out/profile_fp32.txt).
  timeout 60 "$bin/experiments/bench_gpu_gpt2" --workload gpt2-124m --dtype fp32 --reps 2 --warmup 2 --profile 1 \
    >/dev/null 2>"$out/profile_fp32.txt"
  timeout 60 python3 experiments/bench/torch_gpu.py gpt2 --workload gpt2-124m --dtype fp32 --reps 2 --warmup 2 \
    --profile 1 >/dev/null 2>>"$out/profile_fp32.txt"
  python3 - "$out/attention.txt" <<'PY'
import json, sys
for raw in open(sys.argv[1]):
    who, _, rest = raw.partition(': ')
    if rest.startswith('{'):
        j = json.loads(rest)
        print(f"{who:8s} {j['workload']:42s} {j['dtype']:5s} {j['median_ms']:9.3f} ms")
    elif rest.strip():
        print(raw.rstrip())
PY
fi

if [[ $what == paper ]]; then
  # Table 3 (GPT-2) at paper scale on this GPU: repro_table3_gpt2 --scale paper (GPT-2 124M
  # and its CPμMoE/TRμMoE twins, N = 256, Table 7's recipe, bfloat16) on random token files
  # laid out as nanoGPT's OpenWebText (train.bin, val.bin: uint16), cut to 60 steps a model.
  # The first run is interrupted part way (SIGINT, as Ctrl-C: a checkpoint is saved); the
  # same command then continues it ("resuming" in its output), and check_repro.py checks
  # the results. Random tokens keep the loss near ln 50257 = 10.8: a check of the recipe's
  # machinery and speed on a GPU, not of the paper's numbers.
  data=$out/owt_random runs=$out/paper_gpt2
  rm -rf "$runs"
  python3 - "$data" <<'PY'
import array, os, sys
d = sys.argv[1]
os.makedirs(d, exist_ok=True)
for name, n in (("train.bin", 4_000_000), ("val.bin", 400_000)):
    ids = array.array("H", (t % 50257 for t in array.array("H", os.urandom(2 * n))))
    with open(os.path.join(d, name), "wb") as f:
        f.write(ids.tobytes())
PY
  # run_interrupted LOG SECONDS PROGRAM RUNS RESULTS COMMAND...: the command stopped by
  # SIGINT after SECONDS, run again to the end, its RESULTS file in RUNS checked.
  run_interrupted() {
    local log=$1 after=$2 program=$3 runs=$4 results=$5 start
    shift 5
    start=$(date +%s)
    timeout -s INT "$after" "$@" >"$log" 2>&1
    echo "$program, first run (interrupted after $after s): rc=$?" | tee -a "$log"
    timeout "${PAPER_TIMEOUT:-300}" "$@" >>"$log" 2>&1
    echo "$program, second run: rc=$? ($(( $(date +%s) - start )) s both)" | tee -a "$log"
    python3 experiments/check_repro.py --scale paper "$runs" "$program" "$results" 2>&1 | tail -5
    grep -E "^(running|resuming)|interrupt|Table 3|^\|" "$log" | head -30
  }
  run_interrupted "$out/paper.txt" "${PAPER_INTERRUPT:-25}" repro_table3_gpt2 "$runs" table3_gpt2.json \
    "$bin/experiments/repro_table3_gpt2" --scale paper --data "$data" --out-dir "$runs" --device cuda \
    --paper-steps 60 --micro-batch 8 --grad-accum 2 --eval-batches 4 --eval-every 20 --checkpoint-every 20
  for f in "$runs"/runs/*.log; do echo "$f:"; tr "\r" "\n" <"$f" | grep -E "tok/s|^step [0-9]+:" | tail -3; done
  # Table 3 (MLP-Mixer) the same way: repro_table3_mixer --scale paper (Mixer S-16 and its
  # twins at 224 x 224, Table 7's recipe, bfloat16) on random images in the image-array
  # layout (data/image_arrays.h; 1024 training and 256 validation images of 256 x 256, 1000
  # classes), one epoch of 64-image steps a model, interrupted and resumed.
  mdata=$out/imagenet_random mruns=$out/paper_mixer
  rm -rf "$mruns"
  python3 - "$mdata" <<'PY'
import array, json, os, sys
d = sys.argv[1]
os.makedirs(d, exist_ok=True)
H = W = 256
splits = {"train": 1024, "val": 256}
for name, n in splits.items():
    with open(os.path.join(d, name + ".images"), "wb") as f:
        f.write(os.urandom(n * H * W * 3))
    labels = array.array("H", (v % 1000 for v in array.array("H", os.urandom(2 * n))))
    with open(os.path.join(d, name + ".labels"), "wb") as f:
        f.write(labels.tobytes())  # little-endian on x86-64, as the layout says
with open(os.path.join(d, "meta.json"), "w") as f:
    json.dump({"format": "mumoe-image-arrays", "version": 1, "height": H, "width": W, "channels": 3,
               "classes": 1000, "splits": splits}, f)
PY
  run_interrupted "$out/paper_mixer.txt" "${MIXER_INTERRUPT:-20}" repro_table3_mixer "$mruns" table3_mixer.json \
    "$bin/experiments/repro_table3_mixer" --scale paper --data "$mdata" --out-dir "$mruns" --device cuda \
    --micro-batch 64 --grad-accum 1 --paper-epochs 1 --eval-every 0 --checkpoint-every 4
fi

if [[ $what == profile ]]; then
  # A bfloat16 GPT-2 step on each side: times in one run, then each side's kernel table
  # (in $out/profile_bf16.txt); and the float32 attention backward's kernels, ours and
  # torch's, under Nsight Compute where the machine has it (occupancy, stall reasons,
  # throughputs: $out/ncu.txt).
  timeout 60 "$bin/experiments/bench_gpu_gpt2" --workload gpt2-124m --dtype bf16 --reps 10 --warmup 3 2>&1 |
    sed 's/^/mumoe: /' | tee "$out/gpt2_bf16.txt"
  timeout 90 python3 experiments/bench/torch_gpu.py gpt2 --workload gpt2-124m --dtype bf16 --reps 10 --warmup 3 2>&1 |
    sed 's/^/torch: /' | tee -a "$out/gpt2_bf16.txt"
  timeout 60 "$bin/experiments/bench_gpu_gpt2" --workload gpt2-124m --dtype bf16 --reps 2 --warmup 2 --profile 1 \
    >/dev/null 2>"$out/profile_bf16.txt"
  timeout 90 python3 experiments/bench/torch_gpu.py gpt2 --workload gpt2-124m --dtype bf16 --reps 2 --warmup 2 \
    --profile 1 >/dev/null 2>>"$out/profile_bf16.txt"
  ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  if [[ ${NCU:-1} == 0 ]]; then
    echo "NCU=0: no Nsight Compute run"
  elif [[ -n $ncu ]]; then
    sections=(--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats
              --section SchedulerStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis)
    timeout 90 "$ncu" --kernel-name regex:flash_backward_kernel --launch-count 1 "${sections[@]}" \
      "$bin/experiments/bench_gpu_layers" --workload attention-b8-h12-t1024-fwd-bwd --dtype fp32 --reps 1 --warmup 0 \
      >"$out/ncu.txt" 2>&1
    timeout 90 "$ncu" --kernel-name regex:fmha --launch-skip 1 --launch-count 1 "${sections[@]}" \
      python3 experiments/bench/torch_gpu.py layers --workload attention-b8-h12-t1024-fwd-bwd --dtype fp32 --reps 1 \
      --warmup 0 >>"$out/ncu.txt" 2>&1
    grep -E "^  [a-z_]+.*\(|Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|Block Limit|Stall|Compute \(SM\) Throughput|Memory Throughput|Issue Slots Busy|No Eligible|Warp Cycles Per Issued" "$out/ncu.txt" | head -60
  else
    echo "no ncu on this machine"
  fi
  head -25 "$out/profile_bf16.txt"
fi

if [[ $what == pad ]]; then
  # GPT-2 124M steps (bf16, fp32) with the matmuls' padded buffers as by default, with
  # padded sizes too (MUMOE_MATMUL_PAD=extents: the logits' product and the features'
  # gradient), and without (=never); then with the Linear layers' bias added by a kernel of
  # its own after the GEMM (MUMOE_CUBLASLT=off) instead of in cuBLASLt's epilogue; beside
  # torch, in one run.
  : >"$out/pad.txt"
  for dt in bf16 fp32; do
    reps=$([[ $dt == bf16 ]] && echo 10 || echo 4)
    for mode in default extents never lt-off; do
      case $mode in
        default) setting= ;;
        lt-off) setting=MUMOE_CUBLASLT=off ;;
        *) setting=MUMOE_MATMUL_PAD=$mode ;;
      esac
      env $setting timeout 60 "$bin/experiments/bench_gpu_gpt2" \
        --workload gpt2-124m --dtype $dt --reps $reps --warmup 2 2>&1 | grep '^{' | sed "s/^/$mode: /" >>"$out/pad.txt"
    done
    timeout 90 python3 experiments/bench/torch_gpu.py gpt2 --workload gpt2-124m --dtype $dt --reps $reps --warmup 2 \
      2>&1 | grep '^{' | sed 's/^/torch: /' >>"$out/pad.txt"
  done
  python3 - "$out/pad.txt" <<'PY'
import json, sys
for raw in open(sys.argv[1]):
    who, _, rest = raw.partition(': ')
    j = json.loads(rest)
    print(f"{who:8s} {j['workload']:22s} {j['median_ms']:9.3f} ms  peak {j.get('peak_memory_mb', 0):8.1f} MiB")
PY
fi

if [[ $what == generate ]]; then
  # Where a decoding step goes (GPT-2 124M, float32, 128 tokens after 128, both loops): the
  # kernel table beside the wall time. Kernels summing to far less than the wall time put
  # the bound on the host (launches, synchronisations, host loops), not the GPU.
  MUMOE_PROFILE=1 timeout 120 "$bin/experiments/bench_generate" --model 124m --device cuda --prompt 128 --new 128 \
    --reps 1 --warmup 1 >"$out/generate.txt" 2>"$out/generate_profile.txt"
  echo "bench_generate rc=$?"
  cat "$out/generate.txt"
  head -30 "$out/generate_profile.txt"
fi

if [[ $what == shapes ]]; then
  timeout 90 "$bin/experiments/bench_gpu_gpt2" --workload gpt2-124m --dtype bf16 --reps 1 --warmup 2 \
    --profile shapes >/dev/null 2>"$out/profile_shapes.txt"
  echo "bench_gpu_gpt2 rc=$?"
  head -60 "$out/profile_shapes.txt" | cut -c1-150
fi

if [[ $what == gpt2 ]]; then
  # The bf16 comparison alone (layers and GPT-2, both sides), then one profiled step each.
  LAYER_DTYPE=bf16 GPT2_DTYPE=bf16 REPS=10 timeout 150 bash experiments/bench/compare_gpu.sh "$bin" >"$out/bench.txt" 2>&1
  echo "compare_gpu.sh rc=$?"
  timeout 60 "$bin/experiments/bench_gpu_gpt2" --workload gpt2-124m --dtype bf16 --reps 2 --warmup 2 --profile 1 \
    >/dev/null 2>"$out/profile.txt"
  # The bf16 attention without cuDNN (the framework's own kernels), beside the default above.
  MUMOE_ATTENTION=flash timeout 60 "$bin/experiments/bench_gpu_layers" --reps 20 --dtype bf16 \
    --workload attention-b8-h12-t1024-fwd,attention-b8-h12-t1024-fwd-bwd 2>&1 |
    grep attention | sed 's/^/flash: /' >>"$out/bench.txt"
  grep -v "^{\|^flash\|^\[mumoe\]" "$out/bench.txt" | tail -9
  grep "^flash" "$out/bench.txt"
  grep "cuDNN" "$out/bench.txt" | sort | uniq -c
  head -16 "$out/profile.txt"
fi
