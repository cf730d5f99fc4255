#!/bin/sh
# Runs ctest in BUILD_DIR with its output in LOG, then prints one line per test (its
# result and time) and, when a test failed, the failures' output, and exits non-zero.
# It prints no closing line of its own: the closing line CI reads is the one of the
# test job's default run (scripts/test.sh). The environment passes through to the tests.
# Usage: scripts/ctest_quiet.sh BUILD_DIR LOG TITLE [ctest args...]
#   TITLE names the run in the last line: "TITLE: every test passed in N s" or "TITLE FAILED".
set -e
[ $# -ge 3 ] || { echo "usage: scripts/ctest_quiet.sh BUILD_DIR LOG TITLE [ctest args...]" >&2; exit 2; }
dir=$1 log=$2 title=$3
shift 3
start=$(date +%s)
rc=0
(cd "$dir" && ctest -Q --output-on-failure --output-log "$log" "$@") || rc=$?
grep -E '^ *[0-9]+/[0-9]+ Test' "$log" | sed 's/^ */  /' || true
if [ "$rc" -ne 0 ]; then
  # The failures' output: everything but the per-test lines already printed and the summary.
  grep -v -E '^ *[0-9]+/[0-9]+ Test|tests passed|Total Test time' "$log" | tail -200
  echo "$title FAILED (ctest exit status $rc; the whole log: $log)"
  exit 1
fi
echo "$title: every test passed in $(( $(date +%s) - start )) s"
