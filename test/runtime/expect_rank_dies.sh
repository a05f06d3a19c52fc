#!/bin/sh
# runtime_mpi_rank_dies: runs the job given as arguments (mpirun -np 2 runtime_mpi_test DIR
# --die) and passes only on the outcome mpi_test.cc's DieTest is for: both ranks set up their
# session, rank 1 exited on purpose, and the job exited non-zero (ctest's TIMEOUT bounds the
# time). A rank failing in setup, or a zero exit, fails.
out=$("$@" 2>&1)
rc=$?
printf '%s\n' "$out"
fail() {
  echo "expect_rank_dies: FAIL: $1"
  exit 1
}
printf '%s\n' "$out" | grep -q "runtime_mpi_test: FAIL" && fail "a rank failed before rank 1 died"
for r in 0 1; do
  printf '%s\n' "$out" | grep -q "runtime_mpi_test: rank $r: session set up" || fail "rank $r did not set up its session"
done
printf '%s\n' "$out" | grep -q "runtime_mpi_test: rank 1: exiting with 3" || fail "rank 1 did not exit as planned"
[ "$rc" -ne 0 ] || fail "the job exited 0 after rank 1 died"
echo "expect_rank_dies: ok: the job exited $rc after rank 1 died"
