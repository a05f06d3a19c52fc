#!/bin/sh
# cupcake-profile kernels on a disk that fills up (a 200 KiB tmpfs in a private mount
# namespace): it must exit 1 saying "disk full", and the DB must keep the points measured
# before, readable by inspect. Skips (exit 77) where the machine refuses mount namespaces.
# Usage: disk_full_test.sh CUPCAKE_PROFILE_BINARY
set -u
bin="$1"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
if ! unshare -m sh -c "mount -t tmpfs -o size=4k tmpfs '$dir'" 2>"$dir/why"; then
  echo "SKIP: cannot mount a tmpfs in a private mount namespace (needs root and unshare): $(cat "$dir/why")"
  exit 77
fi
unshare -m sh -c "
  mount -t tmpfs -o size=200k tmpfs '$dir' || exit 3
  '$bin' kernels --db '$dir/p.db' --device cpu --quick >/dev/null 2>'$dir/err'; echo \$? >'$dir/rc'
  '$bin' inspect --db '$dir/p.db' >'$dir/inspect' 2>&1; echo \$? >'$dir/inspect-rc'
  ls -A '$dir' >'$dir/files'
  mkdir -p '$dir.out' && cp '$dir'/err '$dir'/rc '$dir'/inspect '$dir'/inspect-rc '$dir'/files '$dir.out'/
"
out="$dir.out"
trap 'rm -rf "$dir" "$out"' EXIT
fail() { echo "FAIL: $*"; echo "--- stderr:"; cat "$out/err"; echo "--- inspect:"; cat "$out/inspect"; exit 1; }
[ "$(cat "$out/rc")" = 1 ] || fail "kernels exited $(cat "$out/rc"), expected 1"
grep -q "p.db: disk full (" "$out/err" || fail "stderr does not say disk full"
[ "$(cat "$out/inspect-rc")" = 0 ] || fail "inspect of the kept DB exited $(cat "$out/inspect-rc")"
grep -Eq "encode fp32 cpu +[1-9][0-9]* points?" "$out/inspect" || fail "the points measured before are not kept"
grep -q "new-" "$out/files" && fail "a temporary DB was left behind: $(cat "$out/files")"
echo "PASS: disk full reported, $(grep -c ' points\? ' "$out/inspect") curves kept"
