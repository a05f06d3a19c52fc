#!/bin/sh
# A command refused as expected: runs COMMAND and passes when it exits CODE and the first line of
# its stderr is TEXT exactly; prints what it got otherwise. Its stdout is discarded, its stderr
# kept in ERR_FILE (for checks of later lines).
# Usage: expect_exit.sh CODE TEXT ERR_FILE COMMAND [ARG...]
code="$1" text="$2" err="$3"
shift 3
"$@" >/dev/null 2>"$err"
rc=$?
first=$(head -n 1 "$err")
if [ "$rc" = "$code" ] && [ "$first" = "$text" ]; then
  echo "ok: $* -> exit $rc: $first"
  exit 0
fi
echo "FAIL: $*: expected exit $code and '$text'; got exit $rc and '$first'"
exit 1
