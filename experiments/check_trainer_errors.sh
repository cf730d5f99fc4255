#!/bin/sh
# Flag combinations the trainers cannot honour are refused before anything loads or
# trains: exit status 1 and a message naming the flags (not a C++ API, not silently
# ignored). Usage: check_trainer_errors.sh TRAIN_GPT2 TRAIN_MIXER SCRATCH_DIR
gpt2=$1 mixer=$2 dir=$3
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
for flag in --mixup --image-size --randaugment-ops --randaugment-magnitude; do
  # (--max-steps 0: were the flag ignored, the run would end at once, exit 0, and fail here)
  expect "$flag applies to --image-arrays datasets only" "$mixer" --out-dir "$dir/mixer" --max-steps 0 $flag 1
done
[ $fails -eq 0 ]
