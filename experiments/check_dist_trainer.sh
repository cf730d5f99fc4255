#!/bin/sh
# The trainers under mpirun: train_gpt2 with 2 ranks (each half of every micro-batch), with
# and without ZeRO-1, with activation checkpointing (--recompute: the gradients' all-reduce
# starts inside a backward pass that recomputes the blocks), with the chunked head and loss
# (--chunked-loss: the head's gradients come from the forward pass), and a run resumed on 2 ranks
# from a 1-rank checkpoint, each against the same run in one process; the final
# validation losses must agree to 1e-6 (relative).
#
#   check_dist_trainer.sh MPIRUN TRAIN_GPT2 DATA_DIR WORK_DIR
set -eu
mpirun="$1"; train="$2"; data="$3"; work="$4"
rm -rf "$work"; mkdir -p "$work"
args="--data $data --n-layer 2 --n-embd 64 --n-head 4 --block-size 32 --batch-size 8 --grad-accum 2 --lr 3e-3
      --warmup 5 --eval-every 0 --checkpoint-every 0 --sample-tokens 0 --no-progress"
last_loss() { tail -n 1 "$1/metrics.jsonl" | sed 's/.*"val_loss":\([^,}]*\).*/\1/'; }
same() {  # same LABEL A B: |a - b| <= 1e-6 |a|
  awk -v a="$2" -v b="$3" -v what="$1" 'BEGIN { d = a - b; if (d < 0) d = -d; m = a < 0 ? -a : a;
    if (d > 1e-6 * m) { printf "FAIL %s: %s vs %s\n", what, a, b; exit 1 } printf "ok %s: %s vs %s\n", what, a, b }'
}
"$train" $args --max-steps 20 --out-dir "$work/one" > "$work/one.log" 2>&1
"$mpirun" -np 2 --oversubscribe "$train" $args --max-steps 20 --out-dir "$work/two" > "$work/two.log" 2>&1
"$mpirun" -np 2 --oversubscribe "$train" $args --max-steps 20 --zero 1 --out-dir "$work/zero" > "$work/zero.log" 2>&1
"$mpirun" -np 2 --oversubscribe "$train" $args --max-steps 20 --recompute --out-dir "$work/recompute" \
  > "$work/recompute.log" 2>&1
"$mpirun" -np 2 --oversubscribe "$train" $args --max-steps 20 --chunked-loss --out-dir "$work/chunked" \
  > "$work/chunked.log" 2>&1
# Only rank 0 speaks: one "final val_loss" line.
[ "$(grep -c 'final val_loss' "$work/two.log")" = 1 ] || { echo "FAIL: 2 ranks printed $(grep -c 'final val_loss' "$work/two.log") result lines"; exit 1; }
"$train" $args --max-steps 10 --out-dir "$work/resumed" > "$work/resumed.log" 2>&1
"$train" $args --max-steps 10 --out-dir "$work/ref" > /dev/null 2>&1
"$train" $args --max-steps 20 --resume --out-dir "$work/ref" > /dev/null 2>&1
"$mpirun" -np 2 --oversubscribe "$train" $args --max-steps 20 --resume --zero 1 --out-dir "$work/resumed" >> "$work/resumed.log" 2>&1
same "2 ranks vs 1" "$(last_loss "$work/one")" "$(last_loss "$work/two")"
same "2 ranks with ZeRO-1 vs 1" "$(last_loss "$work/one")" "$(last_loss "$work/zero")"
same "2 ranks with --recompute vs 1" "$(last_loss "$work/one")" "$(last_loss "$work/recompute")"
same "2 ranks with --chunked-loss vs 1" "$(last_loss "$work/one")" "$(last_loss "$work/chunked")"
same "1-rank checkpoint resumed on 2 ranks vs on 1" "$(last_loss "$work/ref")" "$(last_loss "$work/resumed")"
