# Sourced by bench/testbed/evaluate.sh and checkpoint.sh: the testbed, their log and stage
# helpers and the machine header of DIR/machine.txt. Not run alone.
#
# Contract: the caller has set repo (the repository) and me (the name its messages start with),
# runs under `set -euo pipefail`, and has set out (an absolute directory holding logs/) before
# it calls stage or machine_header.

# testbed ARGS...: scripts/testbed.sh (its CUPCAKE_TESTBED_* environment is the caller's).
testbed() { "$repo/scripts/testbed.sh" "$@"; }

# log TEXT...: a progress line on stdout, with the time.
log() { echo "$me: $(date -u +%H:%M:%S) $*"; }

# stage NAME COMMAND...: runs COMMAND with its output in $out/logs/NAME.log; on failure names
# the log, shows its tail and exits 1.
stage() {
  local name=$1; shift
  if ! "$@" >"$out/logs/$name.log" 2>&1; then
    echo "$me: FAILED: $name (log: $out/logs/$name.log)" >&2
    tail -n 20 "$out/logs/$name.log" >&2
    exit 1
  fi
}

# machine_header HOSTS RANKS_PER_HOST RATE: the first lines of $out/machine.txt (the date, the
# commit, the CPU, its cores, the load before the runs, the testbed and its TCP congestion
# control), to stdout. The caller adds its own lines and the command; machine_footer ends it.
machine_header() {
  echo "date=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit=$(git -C "$repo" describe --always --dirty 2>/dev/null || echo unknown)"
  echo "cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1)"
  echo "cores=$(nproc)"
  echo "load_before=$(cut -d' ' -f1-3 /proc/loadavg)"
  printf 'hosts=%s\nranks_per_host=%s\nrate=%s\n' "$1" "$2" "$3"
  testbed status | grep -E '^(startup_us|tcp_cc)=' || true
}

# machine_footer: appends the load after the runs to $out/machine.txt.
machine_footer() { echo "load_after=$(cut -d' ' -f1-3 /proc/loadavg)" >>"$out/machine.txt"; }
