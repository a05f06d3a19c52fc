#!/bin/bash
# A/B of pattern (8 MiB allreduce + 90 ms gaps, 25 iterations) under MPI settings, interleaved.
cd /work/main
m() { for a in "$@"; do printf -- '--mpirun-arg\n%s\n' "$a"; done; }
mapfile -t links < <(m --mca btl_tcp_links 2)
mapfile -t bufs < <(m --mca btl_tcp_sndbuf 4194304 --mca btl_tcp_rcvbuf 4194304)
for r in 1 2; do
  echo "base: $(nice -n -15 scripts/testbed.sh run -- /tmp/stall4/pattern 0 90 25 2>&1 | tail -1 | grep -o 'smalls.*')"
  echo "links2: $(nice -n -15 scripts/testbed.sh run "${links[@]}" -- /tmp/stall4/pattern 0 90 25 2>&1 | tail -1 | grep -o 'smalls.*')"
  echo "bufs4M: $(nice -n -15 scripts/testbed.sh run "${bufs[@]}" -- /tmp/stall4/pattern 0 90 25 2>&1 | tail -1 | grep -o 'smalls.*')"
done
