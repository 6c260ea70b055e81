#!/usr/bin/env bash
# podman-cluster.sh: an hputrain cluster of N node containers on one
# machine, with podman: each node runs hpud from the image
# deploy/Dockerfile builds, on a private podman network with fixed
# addresses; jobs are submitted from a separate container with
# `hpulaunch --hostfile`. For people trying a cluster on one machine and for
# tests/integration/test_containers.c. Needs root, podman, and debootstrap
# (for the base image, when no registry can be reached).
#
#   podman-cluster.sh base              make the base image from Debian's
#                                       mirror with debootstrap (once)
#   podman-cluster.sh build             build the hputrain image from this
#                                       tree (the base image first)
#   podman-cluster.sh up N              start nodes 0..N-1 (after `down`)
#   podman-cluster.sh submit [ARG...]   run `hpulaunch --hostfile HOSTFILE
#                                       ARG...` in a submit container
#   podman-cluster.sh run CMD [ARG...]  run CMD in a new container on the
#                                       cluster's network (key, /shared)
#   podman-cluster.sh exec I CMD...     run CMD in node I's container
#   podman-cluster.sh kill I            podman kill node I's container
#   podman-cluster.sh start I           start it again; wait for its hpud
#   podman-cluster.sh disconnect I      take node I off the network
#   podman-cluster.sh connect I         put it back, at its address
#   podman-cluster.sh addr I            print node I's address
#   podman-cluster.sh status            the cluster's containers
#   podman-cluster.sh down              remove every container, network,
#                                       secret and volume of the cluster
#
# Options, before the command:
#   -n NAME     the cluster's name (default $HPU_CLUSTER, else hputrain):
#               containers NAME-node<I> and NAME-submit-*, network NAME-net,
#               secret NAME-key, volume NAME-shared. Clusters with different
#               names and subnets coexist.
#   -s SUBNET   the network's /24, given as A.B.C (default
#               $HPU_PODMAN_SUBNET, else 10.91.0); node I is A.B.C.(11+I).
#               Not 10.88.x: podman's default network lives there.
#   -e VAR=VAL  an environment variable for every container (repeatable),
#               e.g. -e HPUCOLL_TIMEOUT_MS=10000 for hpud and its workers.
#   -k FILE     the cluster key (64 hex digits); default: a new one, kept
#               in the cluster's state directory. A submitter outside the
#               containers signs with that file: `hpulaunch --key FILE`.
#
# The image: $HPU_IMAGE (default localhost/hputrain:latest), built from
# $HPU_BASE_IMAGE (default localhost/debian:bookworm, made by `base` from
# $HPU_DEBIAN_MIRROR, default this machine's apt mirror). Nothing is ever
# pulled from a registry (--pull=never).
#
# What every container gets, and why (the same as deploy/compose.yaml):
#   --runtime runc         crun refuses hosts with cgroups in hybrid mode;
#                          Debian's runc runs there (when runc is
#                          installed; $HPU_PODMAN_RUNTIME overrides)
#   --ulimit nofile=N:N, nproc=M:M
#                          podman's defaults (nofile 1048576, nproc
#                          32768 or more) can exceed the hard limits root
#                          has on a VM (runc then fails: "error setting
#                          rlimit type 7 (6): operation not permitted"):
#                          N = this shell's hard limit, at most nr_open;
#                          M = its hard process limit, at most pid_max
#   --shm-size 1g          the shared-memory rings of a node's workers
#   --cap-drop ALL --cap-add SETUID,SETGID,KILL, no-new-privileges:
#                          hpud switches the workers to the user hpu and
#                          signals them, nothing more
#   --secret NAME-key      mounted at /run/secrets/hpu_cluster_key, root
#                          0400; the entry point installs it as hpud's key
#   -v NAME-shared:/shared a volume every container shares, owned by hpu:
#                          checkpoints that survive a node's restart
#   --init                 a small pid 1 that reaps and forwards signals
#
# State: /run/hpu-podman/NAME/ (nodes, hostfile, secret.key).
set -uo pipefail

PROG=${0##*/}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
NAME=${HPU_CLUSTER:-hputrain}
SUBNET=${HPU_PODMAN_SUBNET:-10.91.0}
IMAGE=${HPU_IMAGE:-localhost/hputrain:latest}
BASE=${HPU_BASE_IMAGE:-localhost/debian:bookworm}
SUITE=${HPU_DEBIAN_SUITE:-bookworm}
KEY_FILE=
ENVS=()
PORT=29400
LABEL=io.hputrain.cluster

die() { echo "$PROG: $*" >&2; exit 1; }
usage() {
	echo "usage: $PROG [-n NAME] [-s A.B.C] [-e VAR=VAL]... [-k KEYFILE] COMMAND ..." >&2
	sed -n '9,28p' "$0" | sed 's/^# \{0,1\}//' >&2
	echo "options and what each container gets: see the header of $0" >&2
	exit 2
}

while getopts "n:s:e:k:h" opt; do
	case $opt in
	n) NAME=$OPTARG ;;
	s) SUBNET=$OPTARG ;;
	e) ENVS+=(-e "$OPTARG") ;;
	k) KEY_FILE=$OPTARG ;;
	*) usage ;;
	esac
done
shift $((OPTIND - 1))
[ $# -ge 1 ] || usage
cmd=$1
shift

[[ $NAME =~ ^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,40}$ ]] || die "bad cluster name '$NAME' (letters, digits, _ . -)"
[[ $SUBNET =~ ^([0-9]{1,3})\.([0-9]{1,3})\.([0-9]{1,3})$ ]] ||
	die "bad subnet '$SUBNET': give the first three parts of a /24, e.g. 10.91.0"
[ "${BASH_REMATCH[1]}.${BASH_REMATCH[2]}" != 10.88 ] ||
	die "subnet $SUBNET.0/24 is inside podman's default network 10.88.0.0/16: pick another (-s)"
STATE=${HPU_PODMAN_STATE:-/run/hpu-podman}/$NAME
NET=$NAME-net
SECRET=$NAME-key
VOLUME=$NAME-shared

need_podman() {
	[ "$(id -u)" -eq 0 ] || die "needs root (rootful podman: fixed addresses, a shared network)"
	command -v podman >/dev/null || die "podman is not installed (apt-get install podman runc)"
}

# The smaller of a hard limit ("unlimited" too) and a ceiling.
limit() {
	if [ "$1" = unlimited ] || [ "$1" -gt "$2" ]; then echo "$2"; else echo "$1"; fi
}

# The options every container of the cluster shares. --init runs
# catatonit, which podman only recommends: say so before podman does.
common_opts() {
	local nofile nproc rt why
	why=$(bash "$ROOT/deploy/install-deps.sh" --check containers 2>&1) ||
		die "cannot start containers here: ${why//$'\n'/; } (deploy/install-deps.sh installs them)"
	nofile=$(limit "$(ulimit -Hn)" "$(cat /proc/sys/fs/nr_open)")
	nproc=$(limit "$(ulimit -Hu)" "$(cat /proc/sys/kernel/pid_max)")
	ULIMITS=(--ulimit "nofile=$nofile:$nofile" --ulimit "nproc=$nproc:$nproc")
	rt=${HPU_PODMAN_RUNTIME:-}
	[ -n "$rt" ] || ! command -v runc >/dev/null || rt=runc
	RUNTIME=()
	[ -z "$rt" ] || RUNTIME=(--runtime "$rt")
	COMMON=("${RUNTIME[@]}" --pull=never "${ULIMITS[@]}"
		--network "$NET" --label "$LABEL=$NAME"
		--secret "$SECRET,target=hpu_cluster_key,mode=0400"
		-v "$VOLUME:/shared" --shm-size 1g --init
		--cap-drop ALL --cap-add SETUID,SETGID,KILL
		--security-opt no-new-privileges "${ENVS[@]}")
}

nodes() { cat "$STATE/nodes" 2>/dev/null || echo 0; }
addr() { echo "$SUBNET.$((11 + $1))"; }
# A fixed, locally administered MAC address from the node's IPv4 address:
# a node container started again keeps it, as a rebooted host keeps its
# NIC, so its peers' ARP caches stay right (a new MAC would leave them
# sending to the old one until their entries expire, ~30 s).
mac() { printf '02:00:%02x:%02x:%02x:%02x\n' ${1//./ }; }
node_name() { echo "$NAME-node$1"; }

check_node() {
	[[ $1 =~ ^[0-9]+$ ]] && [ "$1" -lt "$(nodes)" ] ||
		die "no node '$1' in cluster $NAME (nodes 0..$(($(nodes) - 1)))"
}

# Waits until node I's hpud accepts connections (30 s).
wait_ready() {
	local c i
	c=$(node_name "$1")
	for i in $(seq 1 300); do
		if podman exec "$c" bash -c "exec 3<>/dev/tcp/127.0.0.1/$PORT" 2>/dev/null; then
			return 0
		fi
		if [ "$(podman inspect -f '{{.State.Running}}' "$c" 2>/dev/null)" != true ]; then
			podman logs "$c" 2>&1 | tail -20 >&2
			die "node $1 ($c) stopped before its hpud listened; its log is above"
		fi
		sleep 0.1
	done
	podman logs "$c" 2>&1 | tail -20 >&2
	die "node $1's hpud does not accept connections on $(addr "$1"):$PORT after 30 s"
}

default_mirror() {
	local m
	m=$(sed -n 's/^URIs: *\([^ ]*\).*/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)
	[ -n "$m" ] || m=$(sed -n 's/^deb \(\[[^]]*\] \)\{0,1\}\([^ ]*\) .*/\2/p' /etc/apt/sources.list 2>/dev/null | head -1)
	echo "${m:-http://deb.debian.org/debian}"
}

cmd_base() {
	need_podman
	if podman image exists "$BASE"; then
		echo "$PROG: base image $BASE is there"
		return 0
	fi
	command -v debootstrap >/dev/null ||
		die "no base image $BASE and no debootstrap to make one (apt-get install debootstrap, or podman load one)"
	local mirror=${HPU_DEBIAN_MIRROR:-$(default_mirror)} tmp
	tmp=$(mktemp -d) || exit 1
	echo "$PROG: debootstrap --variant=minbase $SUITE from $mirror"
	if ! debootstrap --variant=minbase "$SUITE" "$tmp/rootfs" "$mirror" >"$tmp/log" 2>&1; then
		tail -20 "$tmp/log" >&2
		rm -rf "$tmp"
		die "debootstrap failed (its log's end is above)"
	fi
	rm -rf "$tmp"/rootfs/var/cache/apt/archives/*.deb
	tar -C "$tmp/rootfs" -c . | podman import -q - "$BASE" >/dev/null
	local rc=$?
	rm -rf "$tmp"
	[ $rc -eq 0 ] || die "podman import of the base image failed"
	echo "$PROG: base image $BASE made"
}

cmd_build() {
	cmd_base || exit 1
	common_opts
	echo "$PROG: building $IMAGE from $ROOT"
	podman build "${RUNTIME[@]}" --pull=never "${ULIMITS[@]}" \
		--build-arg "DEBIAN=$BASE" -f "$ROOT/deploy/Dockerfile" \
		--ignorefile "$ROOT/deploy/Dockerfile.dockerignore" -t "$IMAGE" "$ROOT" ||
		die "podman build of $IMAGE failed"
	# Older builds' images, untagged now, would pile up (1 GB each). The
	# newest build stage stays: it is the compile's cache for the next build.
	podman image prune -f --filter label=io.hputrain.stage=runtime >/dev/null
	podman images -q --filter dangling=true --filter label=io.hputrain.stage=build |
		tail -n +2 | xargs -r podman rmi -f >/dev/null 2>&1
	return 0
}

cmd_down() {
	need_podman
	local c
	for c in $(podman ps -aq --filter "label=$LABEL=$NAME"); do
		podman rm -f -t 0 "$c" >/dev/null 2>&1
	done
	podman network exists "$NET" 2>/dev/null && podman network rm -f "$NET" >/dev/null
	podman secret inspect "$SECRET" >/dev/null 2>&1 && podman secret rm "$SECRET" >/dev/null
	podman volume exists "$VOLUME" 2>/dev/null && podman volume rm -f "$VOLUME" >/dev/null
	rm -rf "$STATE"
	return 0
}

cmd_up() {
	local n=${1:-}
	[[ $n =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 200 ] || die "up N: N is 1..200, not '$n'"
	need_podman
	podman image exists "$IMAGE" || die "no image $IMAGE: run '$PROG build' first"
	cmd_down
	mkdir -p "$STATE" && chmod 0700 "$STATE" || die "cannot make $STATE"
	if [ -n "$KEY_FILE" ]; then
		grep -Eqx '[0-9a-fA-F]{64}' "$KEY_FILE" 2>/dev/null ||
			die "$KEY_FILE is not a cluster key (64 hex digits)"
		(umask 077 && cp "$KEY_FILE" "$STATE/secret.key")
	else
		(umask 077 && od -An -tx1 -N32 /dev/urandom | tr -d ' \n' >"$STATE/secret.key" &&
			echo >>"$STATE/secret.key")
	fi
	podman network create --subnet "$SUBNET.0/24" --label "$LABEL=$NAME" "$NET" >/dev/null ||
		die "cannot create network $NET ($SUBNET.0/24): is the subnet taken? (-s)"
	podman secret create "$SECRET" "$STATE/secret.key" >/dev/null || die "cannot create secret $SECRET"
	podman volume create --label "$LABEL=$NAME" "$VOLUME" >/dev/null || die "cannot create volume $VOLUME"
	echo "$n" >"$STATE/nodes"
	: >"$STATE/hostfile"
	for i in $(seq 0 $((n - 1))); do
		echo "$(addr "$i"):$PORT slots=2" >>"$STATE/hostfile"
	done
	common_opts
	# /shared belongs to the workers' user, sticky and open to all like
	# /tmp: jobs started by hpulaunch alone (no hpud) run as root, and root
	# here lacks CAP_DAC_OVERRIDE. One short container with CAP_CHOWN; the
	# nodes themselves have no such capability.
	podman run --rm "${COMMON[@]}" --cap-add CHOWN --name "$NAME-init" "$IMAGE" \
		sh -c 'chmod 1777 /shared && chown hpu:hpu /shared' >/dev/null ||
		die "cannot prepare volume $VOLUME"
	for i in $(seq 0 $((n - 1))); do
		podman run -d "${COMMON[@]}" --name "$(node_name "$i")" --hostname "node$i" \
			--ip "$(addr "$i")" --mac-address "$(mac "$(addr "$i")")" "$IMAGE" >/dev/null ||
			die "cannot start node $i"
	done
	for i in $(seq 0 $((n - 1))); do
		wait_ready "$i"
	done
	echo "$PROG: $n nodes up on $NET ($SUBNET.0/24); hostfile $STATE/hostfile"
}

cmd_submit() {
	need_podman
	[ "$(nodes)" -ge 1 ] || die "cluster $NAME is not up"
	common_opts
	exec podman run --rm "${COMMON[@]}" --name "$NAME-submit-$$" \
		-v "$STATE/hostfile:/etc/hpu/hostfile:ro" "$IMAGE" \
		hpulaunch --hostfile /etc/hpu/hostfile "$@"
}

cmd_run() {
	need_podman
	[ $# -ge 1 ] || die "run CMD [ARG...]"
	podman network exists "$NET" 2>/dev/null || die "cluster $NAME is not up"
	common_opts
	exec podman run --rm "${COMMON[@]}" --name "$NAME-run-$$" "$IMAGE" "$@"
}

case $cmd in
base) cmd_base ;;
build) cmd_build ;;
up) cmd_up "$@" ;;
down) cmd_down ;;
submit) cmd_submit "$@" ;;
run) cmd_run "$@" ;;
exec)
	[ $# -ge 2 ] || usage
	check_node "$1"
	c=$(node_name "$1")
	shift
	exec podman exec "$c" "$@"
	;;
kill)
	[ $# -eq 1 ] || usage
	check_node "$1"
	podman kill "$(node_name "$1")" >/dev/null
	;;
start)
	[ $# -eq 1 ] || usage
	check_node "$1"
	podman start "$(node_name "$1")" >/dev/null || die "cannot start node $1"
	wait_ready "$1"
	;;
disconnect)
	[ $# -eq 1 ] || usage
	check_node "$1"
	podman network disconnect "$NET" "$(node_name "$1")"
	;;
connect)
	[ $# -eq 1 ] || usage
	check_node "$1"
	podman network connect --ip "$(addr "$1")" --mac-address "$(mac "$(addr "$1")")" \
		"$NET" "$(node_name "$1")"
	;;
addr)
	[ $# -eq 1 ] || usage
	check_node "$1"
	addr "$1"
	;;
status)
	need_podman
	echo "cluster $NAME: $(nodes) nodes, network $NET ($SUBNET.0/24), image $IMAGE"
	podman ps -a --filter "label=$LABEL=$NAME" --format '{{.Names}}\t{{.Status}}'
	;;
-h | --help | help) usage ;;
*) echo "$PROG: unknown command '$cmd'" >&2; usage ;;
esac
