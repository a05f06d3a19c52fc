#!/bin/sh
# cupcake-profile kernels on a disk that fills up (a 200 KiB tmpfs in a private mount
# namespace): it must exit 1 saying "disk full", and the DB must keep the points measured
# before, readable by inspect. Then an import of PROFILE_JSON into a new DB on disks of 16, 160
# and 192 KiB (the full disk hits the write, the WAL, and the final checkpoint): each must exit
# 1 saying "disk full" and leave no file (16 KiB said "disk I/O error"; 160 and 192 linked a
# short DB into place). Skips (exit 77) where the machine refuses mount namespaces.
# Usage: disk_full_test.sh CUPCAKE_PROFILE_BINARY PROFILE_JSON
set -u
bin="$1" profile="$2"
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
for kib in 16 160 192; do
  unshare -m sh -c "
    mount -t tmpfs -o size=${kib}k tmpfs '$dir' || exit 3
    '$bin' import --db '$dir/q.db' '$profile' >/dev/null 2>'$out/import-err'; echo \$? >'$out/import-rc'
    ls -A '$dir' >'$out/import-files'
  "
  [ "$(cat "$out/import-rc")" = 1 ] || fail "import on a ${kib} KiB disk exited $(cat "$out/import-rc"), expected 1"
  grep -q "q.db: disk full (" "$out/import-err" || fail "import on a ${kib} KiB disk: $(cat "$out/import-err")"
  [ -s "$out/import-files" ] && fail "import on a ${kib} KiB disk left: $(cat "$out/import-files")"
done
echo "PASS: disk full reported, $(grep -c ' points\? ' "$out/inspect") curves kept; imports into a new DB on full disks say so and leave nothing"
