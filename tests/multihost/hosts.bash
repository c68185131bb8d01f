# Simulated hosts on one machine (issue 40; sourced by tests/multihost/*.sh): each host is a
# network namespace with its own UTS namespace (hostname) and temporary directory, joined to the
# test's own bridge by a veth pair, with an address of the benchmarking range 198.18.0.0/15
# (RFC 2544) on a /24 of its own. Open MPI launches its daemons there as it would over ssh: a
# hostfile of the hosts' addresses and an rsh agent (plm_rsh_agent) that enters the host's
# namespaces instead of logging in. The processes of different hosts then share nothing but the
# filesystem (as nodes sharing NFS do): their MPI traffic goes over TCP through the bridge; the
# ranks of one host use shared memory among themselves.
#
#   hosts_supported           prints why not and returns 1 unless root with netns, bridges, unshare
#   hosts_up N [RATE]          makes N hosts (RATE: e.g. 1gbit, each host's link shaped by a tc
#                              token bucket in both directions); sets HOSTFILE (SLOTS ranks per
#                              host, default 2) and MPIRUN_HOSTS (mpirun arguments)
#   hosts_down                 removes everything hosts_up made (also run on EXIT, INT, TERM)
#   host_link HOST up|down     takes a host's link down or up (a cable pulled)
#   host_bind HOST SRC DST     on host HOST (from its next launch) DST shows SRC's contents (a bind
#                              mount in a mount namespace of the host's own): another binary or
#                              recipe at the same path, as on a machine without a shared filesystem
#   host_unbind HOST           drops HOST's bindings
#   hosts_link_bytes           bytes through all hosts' links so far (sent + received)
#
# Names carry the shell's PID (fdt<pid>...), so two test runs at once do not meet; the /24 is
# chosen from the PID as well. Traffic stays on the bridge: it has no route out and forwards
# nothing else.

HOSTS_TAG="fdt$$"
HOSTS_DIR=""
HOSTS_N=0
HOSTS_NET=""

hosts_supported() {
  if [ "$(id -u)" != 0 ]; then echo "not root (network namespaces need CAP_NET_ADMIN)"; return 1; fi
  for tool in ip unshare mpirun; do
    command -v "$tool" >/dev/null || { echo "no $tool"; return 1; }
  done
  local probe="${HOSTS_TAG}p"
  if ! ip netns add "$probe" 2>/dev/null; then echo "ip netns add fails here"; return 1; fi
  ip netns del "$probe"
  if ! ip link add "${HOSTS_TAG}pb" type bridge 2>/dev/null; then echo "cannot make a bridge"; return 1; fi
  ip link del "${HOSTS_TAG}pb"
  if ! unshare --uts true 2>/dev/null; then echo "unshare --uts fails here"; return 1; fi
  return 0
}

# The bytes all hosts' links carried so far: each host's veth (its bridge side), sent and
# received. A byte between two hosts counts twice (one host's link out, the other's in).
hosts_link_bytes() {
  local i sum=0
  for ((i = 1; i <= HOSTS_N; i++)); do
    sum=$((sum + $(cat "/sys/class/net/${HOSTS_TAG}v$i/statistics/tx_bytes") +
                 $(cat "/sys/class/net/${HOSTS_TAG}v$i/statistics/rx_bytes")))
  done
  echo "$sum"
}

hosts_down() {
  local i
  for ((i = 1; i <= HOSTS_N; i++)); do
    # What still runs there (a daemon, ranks of an interrupted run) would keep the namespace
    # alive, unnamed, after `ip netns del`: killed first.
    kill -9 $(ip netns pids "${HOSTS_TAG}h$i" 2>/dev/null) 2>/dev/null
    ip netns del "${HOSTS_TAG}h$i" 2>/dev/null  # takes its end of the veth pair with it
    ip link del "${HOSTS_TAG}v$i" 2>/dev/null
  done
  ip link del "${HOSTS_TAG}br" 2>/dev/null
  [ -n "$HOSTS_DIR" ] && rm -rf "$HOSTS_DIR"
  HOSTS_N=0
}

# The address of host I (1-based); the bridge (this namespace: mpirun) is .1.
host_addr() { echo "$HOSTS_NET.$(($1 + 1))"; }

hosts_up() {
  local n=$1 rate=${2:-} slots=${SLOTS:-2} i ns veth
  trap 'hosts_down' EXIT
  trap 'hosts_down; exit 130' INT
  trap 'hosts_down; exit 143' TERM
  HOSTS_DIR=$(mktemp -d)
  # A /24 of 198.18.0.0/15 no route uses yet, chosen and taken under a lock (two test runs at
  # once get different ones).
  local lock k net
  exec {lock}>/tmp/fdtrain-multihost.lock
  flock "$lock"
  HOSTS_NET=""
  for ((k = 0; k < 250; k++)); do
    net="198.18.$((($$ + k) % 250 + 2))"
    if [ -z "$(ip -4 route show "$net.0/24")" ]; then HOSTS_NET=$net; break; fi
  done
  if [ -z "$HOSTS_NET" ] || ! ip link add "${HOSTS_TAG}br" type bridge ||
     ! ip addr add "$HOSTS_NET.1/24" dev "${HOSTS_TAG}br"; then
    flock -u "$lock"
    return 1
  fi
  flock -u "$lock"
  exec {lock}>&-
  ip link set "${HOSTS_TAG}br" up || return 1
  : >"$HOSTS_DIR/hostfile"
  : >"$HOSTS_DIR/map"
  for ((i = 1; i <= n; i++)); do
    ns="${HOSTS_TAG}h$i" veth="${HOSTS_TAG}v$i"
    HOSTS_N=$i
    ip netns add "$ns" || return 1
    ip link add "$veth" type veth peer name eth0 netns "$ns" || return 1
    ip link set "$veth" master "${HOSTS_TAG}br" up || return 1
    ip -n "$ns" addr add "$(host_addr "$i")/24" dev eth0 || return 1
    ip -n "$ns" link set eth0 up || return 1
    ip -n "$ns" link set lo up || return 1
    if [ -n "$rate" ]; then  # both directions: the host's egress, and the bridge's egress to it
      tc -n "$ns" qdisc add dev eth0 root tbf rate "$rate" burst 256kb latency 100ms || return 1
      tc qdisc add dev "$veth" root tbf rate "$rate" burst 256kb latency 100ms || return 1
    fi
    mkdir -p "$HOSTS_DIR/$ns"
    echo "$(host_addr "$i") slots=$slots" >>"$HOSTS_DIR/hostfile"
    echo "$(host_addr "$i") $ns" >>"$HOSTS_DIR/map"
  done
  # The rsh agent: "agent HOST COMMAND..." as Open MPI calls ssh; it runs the command in the
  # host's namespaces with the host's name and its own temporary directory (Open MPI's session
  # directory is keyed by the hostname: two hosts must not share one).
  cat >"$HOSTS_DIR/agent" <<AGENT
#!/bin/sh
host=\$1; shift
ns=\$(awk -v h="\$host" '\$1 == h { print \$2 }' "$HOSTS_DIR/map")
if [ -z "\$ns" ]; then
  echo "ssh: connect to host \$host port 22: No route to host (simulated hosts: $HOSTS_DIR/map)" >&2
  exit 255
fi
binds=""
if [ -s "$HOSTS_DIR/\$ns.binds" ]; then
  binds=\$(awk '{ printf "mount --bind %s %s && ", \$1, \$2 }' "$HOSTS_DIR/\$ns.binds")
fi
exec ip netns exec "\$ns" unshare --uts --mount sh -c "\$binds hostname \$ns; export TMPDIR=$HOSTS_DIR/\$ns OMPI_MCA_orte_tmpdir_base=$HOSTS_DIR/\$ns; \$*"
AGENT
  chmod +x "$HOSTS_DIR/agent"
  HOSTFILE="$HOSTS_DIR/hostfile"
  MPIRUN_HOSTS=(--hostfile "$HOSTFILE" --mca plm_rsh_agent "$HOSTS_DIR/agent"
                --mca oob_tcp_if_include "$HOSTS_NET.0/24" --mca btl_tcp_if_include "$HOSTS_NET.0/24"
                --mca btl self,vader,tcp)
}

host_link() {  # host_link I up|down
  ip link set "${HOSTS_TAG}v$1" "$2"
}

host_bind() {  # host_bind I SRC DST (paths without spaces)
  echo "$2 $3" >>"$HOSTS_DIR/${HOSTS_TAG}h$1.binds"
}

host_unbind() {  # host_unbind I
  rm -f "$HOSTS_DIR/${HOSTS_TAG}h$1.binds"
}
