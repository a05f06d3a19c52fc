#!/bin/sh
# A job's error printed once: runs COMMAND (a launch of several ranks: mpirun, torchrun) and
# passes when it exits non-zero (with --exit, exactly CODE) and exactly one line of its combined
# output (every rank's and the launcher's) contains TEXT (a fixed string); prints that output
# otherwise.
# Usage: expect_once.sh [--exit CODE] TEXT COMMAND [ARG...]
code=
if [ "$1" = --exit ]; then
  code="$2"
  shift 2
fi
text="$1"
shift
out=$("$@" 2>&1)
rc=$?
count=$(printf '%s\n' "$out" | grep -cF -- "$text")
if [ "$rc" -ne 0 ] && [ "${code:-$rc}" = "$rc" ] && [ "$count" -eq 1 ]; then
  echo "ok: exit $rc, printed once: $text"
  exit 0
fi
printf '%s\n' "$out"
echo "expect_once: FAIL: $*: expected exit ${code:-non-zero} and one line with '$text'; got exit $rc and $count lines"
exit 1
