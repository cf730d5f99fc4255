#!/bin/sh
# Flags the trainers and the Table 3 programs cannot honour are refused before anything
# loads or trains: exit status 1 and a message naming the flag (not a C++ API, not
# silently ignored). Usage:
#   check_flag_errors.sh TRAIN_GPT2 TRAIN_MIXER REPRO_TABLE3_GPT2 REPRO_TABLE3_MIXER SCRATCH_DIR
gpt2=$1 mixer=$2 repro_gpt2=$3 repro_mixer=$4 dir=$5
fails=0
expect() {  # expect "message fragment" command...
  want=$1; shift
  out=$("$@" 2>&1); rc=$?
  if [ $rc -ne 1 ] || ! printf '%s' "$out" | grep -qF -- "$want"; then
    echo "FAIL: $* (exit $rc) should fail naming: $want"; printf '%s\n' "$out" | tail -3; fails=$((fails + 1))
  else
    echo "ok: $want"
  fi
}
mkdir -p "$dir"
expect "--rank 0 takes the paper's rule, which is defined for --experts 64 or 256 only; got --experts 3" \
  "$gpt2" --data "$dir/no_data" --out-dir "$dir/gpt2" --mlp cp --experts 3
expect "pass the TR last rank with --rank" "$gpt2" --data "$dir/no_data" --out-dir "$dir/gpt2" --mlp tr --experts 8
expect "--gelu-recompute applies to --mlp dense only, got --mlp cp" \
  "$gpt2" --data "$dir/no_data" --out-dir "$dir/gpt2" --mlp cp --gelu-recompute
# (--max-steps 0: were a flag ignored, the run would end at once, exit 0, and fail here)
for flag in --mixup --image-size --randaugment-ops --randaugment-magnitude; do
  expect "$flag applies to --image-arrays datasets only" "$mixer" --out-dir "$dir/mixer" --max-steps 0 $flag 1
done
expect "--cp-rank-ratio applies to --mlp cp only, got --mlp tr" \
  "$mixer" --out-dir "$dir/mixer" --max-steps 0 --mlp tr --cp-rank-ratio 1
expect "--tr-rank-ratio applies to --mlp tr only, got --mlp dense" \
  "$mixer" --out-dir "$dir/mixer" --max-steps 0 --tr-rank-ratio 1
expect "--gelu-recompute applies to --mlp dense only (plain channel MLPs), got --mlp cp" \
  "$mixer" --out-dir "$dir/mixer" --max-steps 0 --mlp cp --gelu-recompute
# (were one ignored, a local or paper run would start: the test's timeout ends it)
expect "--device applies to --scale paper only" "$repro_gpt2" --scale local --device cuda --out-dir "$dir/repro"
expect "--data applies to --scale paper only" "$repro_mixer" --scale smoke --data "$dir" --out-dir "$dir/repro"
expect "--recompute applies to --scale paper only" "$repro_mixer" --scale local --recompute --out-dir "$dir/repro"
expect "--chunked-loss applies to --scale paper only" "$repro_gpt2" --scale smoke --chunked-loss --out-dir "$dir/repro"
expect "--epochs applies to --scale smoke and local only" "$repro_mixer" --scale paper --epochs 2 --out-dir "$dir/repro"
expect "--steps applies to --scale smoke and local only" "$repro_gpt2" --scale paper --steps 2 --out-dir "$dir/repro"
[ $fails -eq 0 ]
