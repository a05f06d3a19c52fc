#!/bin/bash
# A multi-host testbed on one machine: H network namespaces ("hosts"), each joined by a veth
# link to a bridge in a "switch" namespace, each link shaped with tc htb, each host with its own
# hostname (a UTS namespace per launched process tree), and Open MPI jobs across them over TCP.
# See docs/TESTBED.md.
#
#   scripts/testbed.sh up --hosts H --ranks-per-host R --rate RATE|none [--startup-us US]   (idempotent)
#   scripts/testbed.sh run [--mpirun-arg ARG]... -- CMD...
#   scripts/testbed.sh status
#   scripts/testbed.sh down                                               (safe to repeat)
#
# Environment: CUPCAKE_TESTBED_TCP_CC (the hosts' TCP congestion control, default cubic, Linux's
# default; this machine's own default, bbr, halves a shaped link's rate, docs/TESTBED.md),
# CUPCAKE_TESTBED_GSO_MAX_SIZE (e.g. 1514), CUPCAKE_TESTBED_BURST (htb burst and cburst, e.g. 15k; default tc's),
# CUPCAKE_TESTBED_DIR (state, default /run/cupcake-testbed), CUPCAKE_TESTBED_PREFIX
# (namespace names, default cupcake), CUPCAKE_TESTBED_NET (first three octets of the private
# /24 made only inside the namespaces, default 10.77.0).
# --startup-us US (default 0): every MPI collective of the jobs run here first sleeps US
# microseconds on every rank (CUPCAKE_EMULATED_STARTUP_US, libcomm's MpiWait::startup_us), to
# emulate a larger cluster's start-up on links that have next to none (docs/TESTBED.md).
# Exit codes: 0 success, 1 failure, 2 usage error, 77 the machine refuses namespaces or tc.
set -u -o pipefail

STATE=${CUPCAKE_TESTBED_DIR:-/run/cupcake-testbed}
PREFIX=${CUPCAKE_TESTBED_PREFIX:-cupcake}
NET=${CUPCAKE_TESTBED_NET:-10.77.0}
SWITCH_NS="$PREFIX-sw"
SWITCH_IP="$NET.254"
TCP_CC=${CUPCAKE_TESTBED_TCP_CC:-cubic}

die() { echo "testbed: $*" >&2; exit 1; }
usage() { sed -n '7,10p' "$0" | sed 's/^# *//' >&2; exit 2; }
host_ns() { echo "$PREFIX-h$1"; }
host_ip() { echo "$NET.$(($1 + 1))"; }

# Probe what `up` needs in a throwaway namespace; print the refusal and exit 77 if any.
probe() {
  local ns="$PREFIX-probe$$" why=""
  if [ "$(id -u)" != 0 ]; then why="not root (network namespaces need CAP_SYS_ADMIN)"
  elif ! command -v ip >/dev/null || ! command -v tc >/dev/null || ! command -v unshare >/dev/null; then
    why="missing ip, tc or unshare (iproute2, util-linux)"
  elif ! err=$(ip netns add "$ns" 2>&1); then why="ip netns add refused: $err"
  else
    if ! err=$(ip netns exec "$ns" unshare --uts hostname probe 2>&1); then why="UTS namespace refused: $err"
    elif ! err=$(ip -n "$ns" link add p0 type veth peer name p1 2>&1); then why="veth refused: $err"
    elif ! err=$(tc -n "$ns" qdisc add dev p0 root handle 1: htb default 1 2>&1); then why="tc htb refused: $err"
    elif ! err=$(ip -n "$ns" link add b0 type bridge 2>&1); then why="bridge refused: $err"
    fi
    ip netns del "$ns" 2>/dev/null
  fi
  if [ -n "$why" ]; then echo "testbed: this machine refuses the testbed: $why" >&2; exit 77; fi
}

cmd_down() {
  local ns
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}'); do
    case "$ns" in "$PREFIX"-h[0-9]*|"$SWITCH_NS") ;; *) continue ;; esac
    # Processes left in a namespace (a failed job) keep nothing alive once it is deleted, but
    # end them so that no rank outlives the testbed. Only PIDs inside our own namespaces.
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null
    ip netns del "$ns" 2>/dev/null || echo "testbed: could not delete namespace $ns" >&2
  done
  rm -rf "$STATE"
}

write_agent() {
  # Open MPI's rsh launcher calls AGENT HOST CMD...; map HOST (an address) to its namespace and
  # give the launched daemon (and so its ranks) the host's own hostname in a fresh UTS namespace.
  cat >"$STATE/agent.sh" <<AGENT
#!/bin/sh
host="\$1"; shift
while read -r ip ns name; do
  if [ "\$ip" = "\$host" ]; then
    exec ip netns exec "\$ns" unshare --uts /bin/sh -c 'hostname "\$0"; exec /bin/sh -c "\$1"' "\$name" "\$*"
  fi
done <"$STATE/hosts.map"
echo "testbed agent: unknown host \$host (not in $STATE/hosts.map)" >&2
exit 1
AGENT
  chmod +x "$STATE/agent.sh"
}

# Shape egress of DEV in NS to RATE with one htb class (htb meters accurately; see docs/TESTBED.md).
shape() {
  local ns=$1 dev=$2 rate=$3
  [ "$rate" = none ] && return 0
  tc -n "$ns" qdisc add dev "$dev" root handle 1: htb default 1 &&
    tc -n "$ns" class add dev "$dev" parent 1: classid 1:1 htb rate "$rate" ceil "$rate" quantum 60000 ${CUPCAKE_TESTBED_BURST:+burst $CUPCAKE_TESTBED_BURST cburst $CUPCAKE_TESTBED_BURST}
}

# CUPCAKE_TESTBED_GSO_MAX_SIZE=1514: no 64 KiB segments, which htb lets through at once (so
# messages up to 64 KiB pass above the shaped rate), at a per-packet CPU cost (docs/TESTBED.md).
set_gso() {
  [ -z "${CUPCAKE_TESTBED_GSO_MAX_SIZE:-}" ] && return 0
  ip -n "$1" link set "$2" gso_max_size "$CUPCAKE_TESTBED_GSO_MAX_SIZE"
}

# The host's TCP congestion control. A namespace may only pick an algorithm on the kernel-wide
# allowed list; if it is not there, add it (the list only gates what may be chosen).
set_tcp_cc() {
  local ns=$1 allowed
  ip netns exec "$ns" sysctl -qw net.ipv4.tcp_congestion_control="$TCP_CC" 2>/dev/null && return 0
  allowed=$(sysctl -n net.ipv4.tcp_allowed_congestion_control 2>/dev/null)
  if ! grep -qw -- "$TCP_CC" <<<"$allowed" &&
    sysctl -qw net.ipv4.tcp_allowed_congestion_control="$allowed $TCP_CC" 2>/dev/null; then
    echo "testbed: added $TCP_CC to net.ipv4.tcp_allowed_congestion_control (was: $allowed)" >&2
    ip netns exec "$ns" sysctl -qw net.ipv4.tcp_congestion_control="$TCP_CC" 2>/dev/null && return 0
  fi
  echo "testbed: cannot set TCP congestion control $TCP_CC in $ns (available:" \
    "$(sysctl -n net.ipv4.tcp_available_congestion_control 2>/dev/null)); set CUPCAKE_TESTBED_TCP_CC" >&2
  return 1
}

config() {
  printf 'hosts=%s\nranks_per_host=%s\nrate=%s\nstartup_us=%s\ntcp_cc=%s\nprefix=%s\nnet=%s\n' "$1" "$2" "$3" "$4" \
    "$TCP_CC" "$PREFIX" "$NET"
}

build() {
  local hosts=$1 rate=$3 i ns
  mkdir -p "$STATE" || return 1
  ip netns add "$SWITCH_NS" || return 1
  ip -n "$SWITCH_NS" link set lo up && set_tcp_cc "$SWITCH_NS" &&
    ip -n "$SWITCH_NS" link add br0 type bridge &&
    ip -n "$SWITCH_NS" addr add "$SWITCH_IP/24" dev br0 &&
    ip -n "$SWITCH_NS" link set br0 up || return 1
  : >"$STATE/hosts.map"; : >"$STATE/hostfile"
  for ((i = 0; i < hosts; i++)); do
    ns=$(host_ns "$i")
    ip netns add "$ns" &&
      ip -n "$ns" link set lo up &&
      set_tcp_cc "$ns" &&
      ip -n "$ns" link add eth0 type veth peer name p$i netns "$SWITCH_NS" &&
      ip -n "$ns" addr add "$(host_ip "$i")/24" dev eth0 &&
      ip -n "$ns" link set eth0 up &&
      set_gso "$ns" eth0 && set_gso "$SWITCH_NS" p$i &&
      ip -n "$SWITCH_NS" link set p$i master br0 &&
      ip -n "$SWITCH_NS" link set p$i up &&
      shape "$ns" eth0 "$rate" && shape "$SWITCH_NS" p$i "$rate" || return 1
    echo "$(host_ip "$i") $ns $PREFIX-host$i" >>"$STATE/hosts.map"
    echo "$(host_ip "$i") slots=$2" >>"$STATE/hostfile"
  done
  write_agent
  config "$hosts" "$2" "$rate" "$4" >"$STATE/config"
}

cmd_up() {
  local hosts="" rph=1 rate="" startup=0
  while [ $# -gt 0 ]; do
    case "$1" in
      --hosts) hosts=${2:-}; shift 2 ;;
      --ranks-per-host) rph=${2:-}; shift 2 ;;
      --rate) rate=${2:-}; shift 2 ;;
      --startup-us) startup=${2:-}; shift 2 ;;
      *) echo "testbed: up: unknown flag $1" >&2; usage ;;
    esac
  done
  [[ "$hosts" =~ ^[0-9]+$ ]] && [ "$hosts" -ge 1 ] && [ "$hosts" -le 200 ] ||
    { echo "testbed: --hosts: got '$hosts', expected 1..200" >&2; exit 2; }
  [[ "$rph" =~ ^[0-9]+$ ]] && [ "$rph" -ge 1 ] ||
    { echo "testbed: --ranks-per-host: got '$rph', expected >= 1" >&2; exit 2; }
  [[ "$rate" =~ ^(none|[0-9]+(bit|kbit|mbit|gbit))$ ]] ||
    { echo "testbed: --rate: got '$rate', expected none or a tc rate such as 200mbit, 1gbit" >&2; exit 2; }
  [[ "$startup" =~ ^[0-9]+$ ]] && [ "$startup" -le 1000000 ] ||
    { echo "testbed: --startup-us: got '$startup', expected whole microseconds 0..1000000" >&2; exit 2; }
  local want
  want=$(config "$hosts" "$rph" "$rate" "$startup")
  if [ -f "$STATE/config" ] && [ "$(cat "$STATE/config")" = "$want" ] && cmd_status >/dev/null 2>&1; then
    echo "testbed: already up ($hosts hosts x $rph ranks, rate $rate, start-up $startup us)"; return 0
  fi
  probe
  cmd_down
  if ! build "$hosts" "$rph" "$rate" "$startup"; then
    echo "testbed: up failed; removing what was made" >&2; cmd_down; exit 1
  fi
  echo "testbed: up: $hosts hosts x $rph ranks, rate $rate, start-up $startup us, TCP $TCP_CC, subnet $NET.0/24, state $STATE"
}

cmd_status() {
  [ -f "$STATE/config" ] || { echo "testbed: down (no $STATE/config)"; return 1; }
  cat "$STATE/config"
  local ip ns name ok=0
  while read -r ip ns name; do
    if ip netns list | awk '{print $1}' | grep -qx "$ns"; then echo "$ns $ip $name up"
    else echo "$ns $ip $name MISSING"; ok=1; fi
  done <"$STATE/hosts.map"
  return $ok
}

cmd_run() {
  local extra=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do
    case "$1" in
      --mpirun-arg) extra+=("$2"); shift 2 ;;
      *) echo "testbed: run: unknown flag $1 (the command follows --)" >&2; usage ;;
    esac
  done
  [ "${1:-}" = -- ] && shift
  [ $# -gt 0 ] || { echo "testbed: run: missing the command after --" >&2; exit 2; }
  [ -f "$STATE/config" ] || die "run: the testbed is down (no $STATE/config); run 'up' first"
  local hosts rph startup
  hosts=$(sed -n 's/^hosts=//p' "$STATE/config"); rph=$(sed -n 's/^ranks_per_host=//p' "$STATE/config")
  startup=$(sed -n 's/^startup_us=//p' "$STATE/config")
  if [ "${startup:-0}" != 0 ]; then extra+=(-x "CUPCAKE_EMULATED_STARTUP_US=$startup"); fi
  # mpirun runs in the switch namespace (address $SWITCH_IP), so every host is remote and every
  # rank is launched by the agent; --bind-to none: each host's daemon believes it owns the whole
  # machine and would bind every host's first rank to core 0.
  ip netns exec "$SWITCH_NS" mpirun --allow-run-as-root --bind-to none \
    --hostfile "$STATE/hostfile" -np $((hosts * rph)) \
    --mca plm_rsh_agent "$STATE/agent.sh" --mca plm_rsh_no_tree_spawn 1 \
    --mca btl tcp,self --mca btl_tcp_if_include "$NET.0/24" --mca oob_tcp_if_include "$NET.0/24" \
    "${extra[@]}" "$@"
}

case "${1:-}" in
  up) shift; cmd_up "$@" ;;
  down) shift; cmd_down; echo "testbed: down" ;;
  status) shift; cmd_status ;;
  run) shift; cmd_run "$@" ;;
  probe) probe; echo "testbed: namespaces, veth, bridge, UTS and tc htb work here" ;;
  *) usage ;;
esac
