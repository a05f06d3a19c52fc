#!/bin/bash
# ctest `testbed_np2` (label testbed): brings up a 2-host testbed (scripts/testbed.sh) shaped to
# 1 Gbit/s, runs `cupcake-profile comm --quick` and the runtime's MPI tests across it, checks
# that the ranks agree and the DB holds 2 hosts with intra and inter curves, and brings it
# down (also on failure); then, brought up again with --startup-us 2000, checks that the
# profile's allreduce curve carries the emulated start-up and its meta says so. Exits 77 (skipped) where the machine refuses namespaces or tc.
# Usage: testbed_test.sh SOURCE_DIR BUILD_DIR
set -u -o pipefail
src=$1 build=$2
tb="$src/scripts/testbed.sh"
# A state dir and namespace prefix of our own, so that a concurrent testbed is untouched.
export CUPCAKE_TESTBED_DIR="${TMPDIR:-/tmp}/cupcake-testbed-test.$$"
export CUPCAKE_TESTBED_PREFIX="cptt$$"
export CUPCAKE_TESTBED_NET="10.78.$(($$ % 250))"
work=$(mktemp -d)
cd "$work" || exit 1   # runtime_mpi_test writes its files into the working directory
cleanup() { "$tb" down >/dev/null 2>&1; rm -rf "$work"; }
trap cleanup EXIT
trap 'exit 1' INT TERM

"$tb" probe || exit $?   # 77: refused, with the reason on stderr
"$tb" up --hosts 2 --ranks-per-host 1 --rate 1gbit || { echo "FAIL: up" >&2; exit 1; }

db="$work/testbed.db"
timeout 300 "$tb" run -- "$build/tools/cupcake-profile" comm --db "$db" --quick >"$work/comm.log" 2>&1
rc=$?
cat "$work/comm.log"
[ $rc = 0 ] || { echo "FAIL: cupcake-profile comm on the testbed exited $rc" >&2; exit 1; }
grep -q '2 ranks on 2 hosts' "$work/comm.log" ||
  { echo "FAIL: expected '2 ranks on 2 hosts' (a hostname per namespace)" >&2; exit 1; }

"$build/tools/cupcake-profile" inspect --db "$db" >"$work/inspect.log" 2>&1 ||
  { cat "$work/inspect.log"; echo "FAIL: inspect" >&2; exit 1; }
cat "$work/inspect.log"
grep -Eq 'meta.hosts: +cptt[0-9]+-host0,cptt[0-9]+-host1' "$work/inspect.log" ||
  { echo "FAIL: the DB does not name the testbed's 2 hosts" >&2; exit 1; }
for scope in intra inter; do
  grep -Eq "comm allreduce $scope " "$work/inspect.log" ||
    { echo "FAIL: no $scope allreduce curve in the DB" >&2; exit 1; }
done

if [ -x "$build/test/runtime/runtime_mpi_test" ]; then
  timeout 300 "$tb" run -- "$build/test/runtime/runtime_mpi_test" >"$work/rt.log" 2>&1
  rc=$?
  tail -n 20 "$work/rt.log"
  [ $rc = 0 ] || { echo "FAIL: runtime_mpi_test on the testbed exited $rc" >&2; exit 1; }
fi
# The emulated start-up: refused when malformed; carried into every rank's collectives.
"$tb" up --hosts 2 --ranks-per-host 1 --rate 1gbit --startup-us 2ms 2>"$work/bad.log"
rc=$?
[ $rc = 2 ] && grep -q "^testbed: --startup-us: got '2ms', expected whole microseconds 0..1000000$" "$work/bad.log" ||
  { cat "$work/bad.log"; echo "FAIL: --startup-us 2ms: expected exit 2 and the flag's message, got $rc" >&2; exit 1; }
"$tb" up --hosts 2 --ranks-per-host 1 --rate 1gbit --startup-us 2000 || { echo "FAIL: up --startup-us" >&2; exit 1; }
slow="$work/startup.db"
timeout 300 "$tb" run -- "$build/tools/cupcake-profile" comm --db "$slow" --quick --ops allreduce \
  --max-bytes 4096 >"$work/startup.log" 2>&1 || { cat "$work/startup.log"; echo "FAIL: comm with a start-up" >&2; exit 1; }
python3 - "$slow" <<'PY' || { echo "FAIL: the emulated start-up is not in the profile" >&2; exit 1; }
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
lib = db.execute("SELECT value FROM cluster_meta WHERE key = 'comm.library'").fetchone()[0]
assert lib.endswith(" (emulated start-up 2000 us per collective)"), lib
points = db.execute("SELECT p.size, p.us FROM points p JOIN curves c ON c.id = p.curve_id "
                    "WHERE c.kind = 'comm' AND c.op = 'allreduce' AND c.scope = 'global'").fetchall()
assert points and all(us >= 2000 for _, us in points), points
print("start-up in the profile:", lib, points)
PY
echo "testbed_np2: OK"
