#!/bin/sh
# Runs a program as two ranks under mpirun and checks what happened, for the tests whose
# processes are meant to fail (tests/dist_stall.cpp, tests/dist_killed.cpp):
#   dist_expect.sh MAX_SECONDS MPIRUN PROGRAM PATTERN...
# Passes when mpirun exits nonzero in under MAX_SECONDS and its output (both ranks' and
# its own, stdout and stderr) contains every PATTERN and none of the !PATTERNs. mpirun
# runs under `timeout 60`, so a hang fails the test instead of blocking it.
max=$1
mpirun=$2
program=$3
shift 3
start=$(date +%s)
out=$(timeout 60 "$mpirun" -np 2 --oversubscribe "$program" 2>&1)
rc=$?
elapsed=$(($(date +%s) - start))
printf '%s\n' "$out"
echo "dist_expect: mpirun exited with status $rc after $elapsed s"
fail=0
if [ "$rc" -eq 124 ]; then
  echo "FAIL: mpirun was still running after 60 s"
  fail=1
elif [ "$rc" -eq 0 ]; then
  echo "FAIL: mpirun exited with status 0; the job was meant to fail"
  fail=1
fi
if [ "$elapsed" -ge "$max" ]; then
  echo "FAIL: the run took $elapsed s, the limit is $max s"
  fail=1
fi
for p in "$@"; do
  case "$p" in
    !*)
      case "$out" in *"${p#!}"*) echo "FAIL: the output contains \"${p#!}\""; fail=1 ;; esac ;;
    *)
      case "$out" in *"$p"*) ;; *) echo "FAIL: the output lacks \"$p\""; fail=1 ;; esac ;;
  esac
done
exit $fail
