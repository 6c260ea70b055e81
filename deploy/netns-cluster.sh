#!/usr/bin/env bash
# netns-cluster.sh: N cluster "nodes" on one Linux machine, as network
# namespaces on a private bridge, for multi-node tests of hpulaunch/hpud.
# Needs root and iproute2 (`ip netns`).
#
#   netns-cluster.sh up N [PREFIX]         make nodes 0..N-1 (after `down`)
#   netns-cluster.sh down [PREFIX]         remove everything of the cluster
#   netns-cluster.sh exec I CMD [ARG...]   run CMD in node I's namespace
#   netns-cluster.sh link I down|up        cut / restore node I's cable
#   netns-cluster.sh addr I                print node I's IPv4 address
#   netns-cluster.sh ns I                  print node I's namespace name
#   netns-cluster.sh start-hpud I HPUD_BIN CONF [ARG...]
#                                          start `HPUD_BIN -c CONF ARG...`
#                                          in node I, in the background
#   netns-cluster.sh stop-hpud I [SIGNAL]  signal it (TERM: and wait)
#   netns-cluster.sh hpud-pid I            print its pid (exit 1: none)
#   netns-cluster.sh status                nodes, addresses, links, hpuds
#
# PREFIX, the cluster index, an integer 0..255, lets several clusters
# (several tests) coexist. It is taken from, in this order: the positional
# argument of up/down, `-p PREFIX` before the command, $HPU_NETNS_PREFIX,
# else 0. From cluster index C and node I:
#
#   bridge      hpubr<C>, address 10.77.<C>.254/24 (the host's side)
#   namespace   hpu-n<I> when C is 0, hpu<C>-n<I> otherwise
#   node addr   10.77.<C>.<I+1>/24 on eth0 inside the namespace (N <= 200)
#   veth        hpu<C>v<I> on the bridge  <->  eth0 in the namespace
#   state       /run/hpu-netns/<C>/ : nodes (N), hpud-<I>.pid, hpud-<I>.log
#
# Every namespace has lo up and one interface, eth0, in the cluster subnet;
# no default route. Nodes reach each other, and the host at 10.77.<C>.254,
# at layer 2 through the bridge: no IP forwarding is involved, so
# net.ipv4.ip_forward may stay 0. One caveat: if br_netfilter is loaded
# (net.bridge.bridge-nf-call-iptables = 1) bridged IPv4 also passes
# iptables' FORWARD chain, and a host whose FORWARD policy is DROP (Docker
# sets that) drops it; `up` warns when it can see that.
#
# Only the network is private: processes in a node see the host's file
# systems, /tmp and /dev/shm included. That is fine for hputrain:
# shared-memory segments are named per job and node (/hpucoll-<job>-n<node>)
# and ipc:// endpoints per job and rank (/tmp/hpucoll-<job>-r<rank>), so the
# nodes of one job never collide. (A node cleaning up a job that died while
# attaching removes that job's segments of every node -- harmless, the job
# is failing everywhere.)
#
# `up` always runs `down` first for the same PREFIX: two users of one
# PREFIX destroy each other's cluster; give each test its own.
set -uo pipefail

PROG=${0##*/}
STATE_ROOT=${HPU_NETNS_STATE:-/run/hpu-netns}
MAX_NODES=200

die() { echo "$PROG: $*" >&2; exit 1; }
usage() {
	echo "usage: $PROG [-p PREFIX] COMMAND ..." >&2
	sed -n '6,17p' "$0" | sed 's/^# \{0,1\}//' >&2
	echo "PREFIX: cluster index 0..255 (default \$HPU_NETNS_PREFIX, else 0); see the header of $0" >&2
	exit 2
}

# ---- Names -------------------------------------------------------------

check_prefix() {
	if ! [[ $1 =~ ^[0-9]{1,3}$ ]] || ((10#$1 > 255)); then
		die "PREFIX must be a cluster index 0..255, not '$1'"
	fi
}
set_prefix() {
	check_prefix "$1"
	C=$((10#$1))
	BR=hpubr$C
	SUBNET=10.77.$C
	STATE=$STATE_ROOT/$C
	if ((C == 0)); then NSPFX=hpu-n; else NSPFX=hpu$C-n; fi
	VPFX=hpu${C}v
}
ns_name() { echo "$NSPFX$1"; }
veth_name() { echo "$VPFX$1"; }
node_addr() { echo "$SUBNET.$(($1 + 1))"; }

check_node() {
	[[ $1 =~ ^[0-9]+$ ]] || die "node index must be a number, not '$1'"
	ip netns list 2>/dev/null | awk '{print $1}' | grep -qx "$(ns_name "$1")" ||
		die "no node $1 in cluster $C (namespace $(ns_name "$1") does not exist; run '$PROG up N $C')"
}

# The cluster's namespaces / host-side veths that exist now, whatever made them.
list_ns() {
	ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${NSPFX}[0-9]+\$" | sort -V || true
}
list_veth() {
	ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' |
		grep -E "^${VPFX}[0-9]+\$" | sort -V || true
}
bridge_exists() { ip link show "$BR" >/dev/null 2>&1; }

# ---- Processes ---------------------------------------------------------

# Start time of a live pid (field 22 of /proc/PID/stat), to tell it from a
# reused pid; fails for a pid that is gone or a zombie.
starttime() {
	local s
	local -a f
	s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
	s=${s##*) }
	read -r -a f <<<"$s"
	case ${f[0]} in Z | X | x) return 1 ;; esac
	echo "${f[19]}"
}
alive() { starttime "$1" >/dev/null; }
# Whether the pid recorded in a pid file ("PID STARTTIME") is still that
# process; prints the pid.
pidfile_alive() {
	local pid st
	[ -r "$1" ] || return 1
	read -r pid st <"$1" || return 1
	[[ $pid =~ ^[0-9]+$ && $st =~ ^[0-9]+$ ]] || return 1
	[ "$(starttime "$pid")" = "$st" ] || return 1
	echo "$pid"
}
# Signals the pids, and with TERM waits up to 5 s, then sends KILL.
stop_pids() {
	local sig=$1 p left i
	shift
	[ $# -gt 0 ] || return 0
	kill -"$sig" "$@" 2>/dev/null
	[ "$sig" = TERM ] || [ "$sig" = KILL ] || return 0
	for ((i = 0; i < 50; i++)); do
		left=()
		for p in "$@"; do alive "$p" && left+=("$p"); done
		[ ${#left[@]} -eq 0 ] && return 0
		sleep 0.1
	done
	[ "$sig" = KILL ] && return 1
	kill -KILL "${left[@]}" 2>/dev/null
	for ((i = 0; i < 20; i++)); do
		left=()
		for p in "$@"; do alive "$p" && left+=("$p"); done
		[ ${#left[@]} -eq 0 ] && return 0
		sleep 0.1
	done
	return 1
}

# ---- Commands ----------------------------------------------------------

cmd_down() {
	local f pid ns v pids=() left
	# 1. The hpuds this script started (pid files checked against reuse).
	for f in "$STATE"/hpud-*.pid; do
		[ -e "$f" ] || continue
		pid=$(pidfile_alive "$f") && pids+=("$pid")
	done
	stop_pids TERM "${pids[@]}"
	# 2. Whatever else still runs in the cluster's namespaces (workers,
	#    test servers): a namespace with a process in it outlives
	#    `ip netns del`, and its veth stays too.
	for ns in $(list_ns); do
		mapfile -t pids < <(ip netns pids "$ns" 2>/dev/null)
		stop_pids TERM "${pids[@]}"
	done
	# 3. Links (deleting one end of a veth deletes both), namespaces, bridge.
	for v in $(list_veth); do ip link del "$v" 2>/dev/null; done
	for ns in $(list_ns); do ip netns del "$ns" 2>/dev/null; done
	bridge_exists && ip link del "$BR" 2>/dev/null
	rm -rf "$STATE"
	left=$( (list_ns; list_veth; bridge_exists && echo "$BR") | tr '\n' ' ')
	[ -z "$left" ] || die "down: could not remove: $left"
	return 0
}

warn_br_netfilter() {
	local v
	v=$(cat /proc/sys/net/bridge/bridge-nf-call-iptables 2>/dev/null) || return 0
	[ "$v" = 1 ] || return 0
	command -v iptables >/dev/null 2>&1 || return 0
	if iptables -S FORWARD 2>/dev/null | grep -q -- '-P FORWARD DROP'; then
		echo "$PROG: warning: bridge-nf-call-iptables=1 and the iptables FORWARD policy is DROP:" \
			"traffic between nodes may be dropped; allow it with" \
			"'iptables -I FORWARD -i $BR -o $BR -j ACCEPT'" >&2
	fi
}

cmd_up() {
	local n=$1 i ns v a
	if ! [[ $n =~ ^[0-9]+$ ]] || ((10#$n < 1 || 10#$n > MAX_NODES)); then
		die "up: N must be 1..$MAX_NODES, not '$n'"
	fi
	n=$((10#$n))
	cmd_down || exit 1
	# Refuse a subnet that something else on the host already uses.
	if ip -o -4 addr show 2>/dev/null | grep -q " inet $SUBNET\."; then
		die "up: $SUBNET.0/24 is already used on this host: $(ip -o -4 addr show | grep " inet $SUBNET\." | awk '{print $2}' | tr '\n' ' ')"
	fi
	trap 'echo "$PROG: up failed; removing the half-made cluster $C" >&2; trap - ERR; cmd_down; exit 1' ERR
	set -E
	mkdir -p "$STATE"
	ip link add "$BR" type bridge stp_state 0
	ip addr add "$SUBNET.254/24" dev "$BR"
	ip link set "$BR" up
	for ((i = 0; i < n; i++)); do
		ns=$(ns_name "$i")
		v=$(veth_name "$i")
		a=$(node_addr "$i")
		ip netns add "$ns"
		# The peer is created directly inside the namespace, so it can be
		# called eth0 without clashing with the host's eth0.
		ip link add "$v" type veth peer name eth0 netns "$ns"
		ip link set "$v" master "$BR"
		ip link set "$v" up
		ip -n "$ns" link set lo up
		ip -n "$ns" addr add "$a/24" dev eth0
		ip -n "$ns" link set eth0 up
	done
	echo "$n" >"$STATE/nodes"
	trap - ERR
	set +E
	warn_br_netfilter
	echo "$PROG: cluster $C up: $n nodes $(ns_name 0)..$(ns_name $((n - 1))), $SUBNET.1-$SUBNET.$n on bridge $BR ($SUBNET.254)"
}

# Cut cable = the bridge-side end goes down. The node keeps its address and
# route, sees its carrier go (eth0: NO-CARRIER), and packets to and from it
# vanish: connects and sends time out, exactly as with a pulled cable or a
# dead switch port. Taking eth0 down inside the namespace instead would
# delete the node's connected route, so its own sends would fail at once
# with "network unreachable" -- an administrative ifdown, not a cut cable.
cmd_link() {
	local i=$1 how=$2
	check_node "$i"
	case $how in
	down | up) ip link set "$(veth_name "$i")" "$how" ;;
	*) die "link: say down or up, not '$how'" ;;
	esac
}

cmd_start_hpud() {
	local i=$1 bin=$2 conf=$3 pid pidf log
	shift 3
	check_node "$i"
	if ! [ -f "$bin" ] || ! [ -x "$bin" ]; then
		die "start-hpud: $bin is not an executable file"
	fi
	[ -r "$conf" ] || die "start-hpud: cannot read $conf"
	mkdir -p "$STATE"
	pidf=$STATE/hpud-$i.pid
	log=$STATE/hpud-$i.log
	if pid=$(pidfile_alive "$pidf"); then
		die "start-hpud: node $i already runs hpud (pid $pid)"
	fi
	# ip and setsid exec in place (the subshell is not a process-group
	# leader, so setsid does not fork): $! is hpud's own pid. setsid: its
	# own session, so that a Ctrl-C meant for the caller does not reach it.
	(exec ip netns exec "$(ns_name "$i")" setsid "$bin" -c "$conf" "$@" \
		</dev/null >>"$log" 2>&1) &
	pid=$!
	echo "$pid $(starttime "$pid" || echo gone)" >"$pidf"
	sleep 0.3
	if ! pidfile_alive "$pidf" >/dev/null; then
		wait "$pid" 2>/dev/null
		echo "$PROG: start-hpud: hpud on node $i exited at once (status $?); its log $log ends:" >&2
		tail -n 20 "$log" >&2
		rm -f "$pidf"
		exit 1
	fi
	echo "$pid"
}

cmd_stop_hpud() {
	local i=$1 sig=${2:-TERM} pid pidf
	pidf=$STATE/hpud-$i.pid
	pid=$(pidfile_alive "$pidf") || die "stop-hpud: node $i runs no hpud started by $PROG"
	sig=${sig#SIG}
	stop_pids "$sig" "$pid" || die "stop-hpud: pid $pid did not exit"
	alive "$pid" || rm -f "$pidf"
	return 0
}

cmd_status() {
	local n ns i v st pid
	if ! bridge_exists && [ -z "$(list_ns)" ]; then
		echo "cluster $C: down"
		return 0
	fi
	n=$(cat "$STATE/nodes" 2>/dev/null || echo '?')
	echo "cluster $C: bridge $BR ($SUBNET.254/24), $n nodes, state $STATE"
	for ns in $(list_ns); do
		i=${ns#"$NSPFX"}
		v=$(veth_name "$i")
		st=$(ip -o link show "$v" 2>/dev/null | grep -q '[<,]UP[,>]' && echo up || echo DOWN)
		pid=$(pidfile_alive "$STATE/hpud-$i.pid") || pid=-
		printf '  node %-3s %-12s %-15s link %-4s hpud %s\n' "$i" "$ns" "$(node_addr "$i")" "$st" "$pid"
	done
}

# ---- Main --------------------------------------------------------------

prefix=${HPU_NETNS_PREFIX:-0}
while [ $# -gt 0 ]; do
	case $1 in
	-p | --prefix) [ $# -ge 2 ] || usage; prefix=$2; shift 2 ;;
	-h | --help) usage ;;
	*) break ;;
	esac
done
[ $# -ge 1 ] || usage
cmd=$1
shift

[ "$(id -u)" -eq 0 ] || die "must run as root (it creates namespaces and links)"
ip netns list >/dev/null 2>&1 || die "'ip netns' is not available (iproute2 with namespace support is needed)"

case $cmd in
up)
	{ [ $# -ge 1 ] && [ $# -le 2 ]; } || usage
	set_prefix "${2:-$prefix}"
	cmd_up "$1"
	;;
down)
	[ $# -le 1 ] || usage
	set_prefix "${1:-$prefix}"
	cmd_down
	;;
exec)
	[ $# -ge 2 ] || usage
	set_prefix "$prefix"
	check_node "$1"
	ns=$(ns_name "$1")
	shift
	exec ip netns exec "$ns" "$@"
	;;
link)
	[ $# -eq 2 ] || usage
	set_prefix "$prefix"
	cmd_link "$1" "$2"
	;;
addr)
	[ $# -eq 1 ] || usage
	set_prefix "$prefix"
	check_node "$1"
	node_addr "$1"
	;;
ns)
	[ $# -eq 1 ] || usage
	set_prefix "$prefix"
	check_node "$1"
	ns_name "$1"
	;;
start-hpud)
	[ $# -ge 3 ] || usage
	set_prefix "$prefix"
	cmd_start_hpud "$@"
	;;
stop-hpud)
	{ [ $# -ge 1 ] && [ $# -le 2 ]; } || usage
	set_prefix "$prefix"
	cmd_stop_hpud "$@"
	;;
hpud-pid)
	[ $# -eq 1 ] || usage
	set_prefix "$prefix"
	pidfile_alive "$STATE/hpud-$1.pid" || exit 1
	;;
status)
	[ $# -eq 0 ] || usage
	set_prefix "$prefix"
	cmd_status
	;;
*) usage ;;
esac
