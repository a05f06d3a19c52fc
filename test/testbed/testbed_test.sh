#!/bin/bash
# ctest `testbed_np2` (label testbed): brings up a 2-host testbed (scripts/testbed.sh) shaped to
# 1 Gbit/s, runs `cupcake-profile comm --quick` and the runtime's MPI tests across it, checks
# that the ranks agree and the DB holds 2 hosts with intra and inter curves, and brings it
# down (also on failure). Exits 77 (skipped) where the machine refuses namespaces or tc.
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
echo "testbed_np2: OK"
