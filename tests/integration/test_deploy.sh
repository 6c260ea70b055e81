#!/usr/bin/env bash
# test_deploy: the files under deploy/.
#
#  (a) deploy/hpud.service passes `systemd-analyze verify` -- the file as it
#      is, in a scratch root (--root) where /usr/local/bin/hpud is a stub,
#      because verify insists that ExecStart's program exists -- with no
#      warning at all (verify exits 0 on unknown keys and bad values, so
#      its output is checked too; a misspelled copy must be caught, which
#      shows the check can fail), and its offline exposure score stays at
#      or below $HPU_TEST_MAX_EXPOSURE (tenths; 40 = 4.0, "OK");
#      deploy/hpud.conf names every key of daemon/conf.h and no other, and
#      where hpud is built (BUILD_DIR, the first argument, else
#      $HPU_BUILD_DIR, else ./build) `hpud --check` accepts it with only
#      key and user replaced.
#  (b) deploy/netns-cluster.sh makes a 3-node cluster; a stub "hpud" (a
#      TCP listener that reads listen/port from its config) is started in
#      each node with start-hpud; every node reaches every other over TCP;
#      with node 2's link down, nodes 0 and 1 cannot reach it nor it them
#      while 0 <-> 1 still work; with the link up again all pairs work;
#      stop-hpud closes a port; `down` removes every namespace, veth,
#      bridge, process and state file (checked independently of the
#      script), also when a check failed (trap).
#
# Usage: test_deploy.sh [BUILD_DIR]
# Exit 0: passed; 1: failed (the first failing check says why); 77:
# skipped (not root, no `ip netns`, no python3 or no systemd-analyze).
# Uses netns cluster index $HPU_TEST_NETNS_PREFIX (default 9): subnet
# 10.77.9.0/24, bridge hpubr9, namespaces hpu9-n0..2; anything already
# there under that index is torn down first.
# shellcheck disable=SC2015,SC2016,SC2317
# (a && b || fail is meant; $ in single quotes is literal on purpose; the
# EXIT trap handler is reached)
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CLUSTER=$ROOT/deploy/netns-cluster.sh
UNIT=$ROOT/deploy/hpud.service
CONF=$ROOT/deploy/hpud.conf
CONF_H=$ROOT/daemon/conf.h
BUILD=${1:-${HPU_BUILD_DIR:-$ROOT/build}}
PREFIX=${HPU_TEST_NETNS_PREFIX:-9}
MAX_EXPOSURE=${HPU_TEST_MAX_EXPOSURE:-40}
PORT=29400
NODES=3

pass=0
skipped=()
ok() { echo "ok   - $*"; pass=$((pass + 1)); }
fail() { echo "FAIL - $*" >&2; exit 1; }
skip() { echo "SKIP - $*" >&2; exit 77; }

[ "$(id -u)" -eq 0 ] || skip "needs root (network namespaces, links)"
ip netns list >/dev/null 2>&1 || skip "'ip netns' is unavailable"
PY=/usr/bin/python3
[ -x "$PY" ] || PY=$(command -v python3) || skip "needs python3 (the stub hpud listener)"
[ -x "$CLUSTER" ] || fail "$CLUSTER is missing or not executable"

TMP=$(mktemp -d /tmp/test_deploy.XXXXXX) || fail "mktemp"

# ---- (a) the unit and the config -----------------------------------------

# systemd-analyze verify prints a diagnostic and still exits 0 for an
# unknown key or a bad value; any output, or a non-zero status, fails.
verify_quiet() { # ROOTDIR UNITPATH-INSIDE-ROOT
	local out rc
	out=$(systemd-analyze verify --root="$1" "$2" 2>&1)
	rc=$?
	[ $rc -eq 0 ] && [ -z "$out" ] && return 0
	printf '%s\n' "$out" | sed 's/^/    /' >&2
	return 1
}

# A scratch root holding what verify looks at: the unit, a stub hpud at
# ExecStart's path, /bin/kill for ExecReload, and the host's unit files for
# the targets named in After=/Wants=/WantedBy=.
make_root() { # DIR UNITFILE
	local d=$1 u
	mkdir -p "$d/usr/local/bin" "$d/bin" "$d/etc/systemd/system" "$d/usr/lib/systemd" || return 1
	printf '#!/bin/sh\nexit 0\n' >"$d/usr/local/bin/hpud" && chmod 0755 "$d/usr/local/bin/hpud" || return 1
	cp "$(readlink -f /bin/kill)" "$d/bin/kill" || return 1
	for u in /usr/lib/systemd/system /lib/systemd/system; do
		[ -d "$u" ] && [ ! -e "$d/usr/lib/systemd/system" ] && cp -a "$u" "$d/usr/lib/systemd/system"
	done
	cp "$2" "$d/etc/systemd/system/hpud.service"
}

unit_checks() {
	local out line exp key keys_h keys_c
	if ! command -v systemd-analyze >/dev/null 2>&1; then
		skipped+=("systemd-analyze is missing: hpud.service not verified")
		return 0
	fi
	make_root "$TMP/root" "$UNIT" || fail "could not build the scratch root for verify"
	if systemd-analyze verify --help 2>&1 | grep -q -- '--root'; then
		verify_quiet "$TMP/root" /etc/systemd/system/hpud.service ||
			fail "systemd-analyze verify deploy/hpud.service (in a scratch root with a stub /usr/local/bin/hpud)"
		ok "systemd-analyze verify: deploy/hpud.service as it is, clean (scratch root, stub /usr/local/bin/hpud)"
		# The check must be able to fail: a misspelled key is caught.
		make_root "$TMP/bad" "$UNIT"
		sed -i 's/^LockPersonality=yes/LockPersonalty=yes/' "$TMP/bad/etc/systemd/system/hpud.service"
		if verify_quiet "$TMP/bad" /etc/systemd/system/hpud.service 2>/dev/null; then
			fail "verify did not flag a misspelled key (LockPersonalty=): the check is blind"
		fi
		ok "negative control: a copy with a misspelled key is flagged"
	else
		# Older systemd-analyze without --root: a copy whose ExecStart
		# names an existing program, everything else unchanged.
		mkdir -p "$TMP/copy"
		sed 's#^ExecStart=/usr/local/bin/hpud #ExecStart=/bin/true #' "$UNIT" >"$TMP/copy/hpud.service"
		if ! out=$(systemd-analyze verify "$TMP/copy/hpud.service" 2>&1) || [ -n "$out" ]; then
			fail "systemd-analyze verify (copy, ExecStart=/bin/true): $out"
		fi
		ok "systemd-analyze verify: a copy of deploy/hpud.service with ExecStart=/bin/true, clean"
	fi
	# Where hpud is really installed, the file must verify in place too.
	if [ -x /usr/local/bin/hpud ]; then
		if ! out=$(systemd-analyze verify "$UNIT" 2>&1) || [ -n "$out" ]; then
			fail "systemd-analyze verify deploy/hpud.service against the installed /usr/local/bin/hpud: $out"
		fi
		ok "systemd-analyze verify against the installed /usr/local/bin/hpud, clean"
	fi
	if systemd-analyze security --help 2>&1 | grep -q -- '--offline'; then
		out=$(systemd-analyze security --offline=true --root="$TMP/root" \
			--threshold="$MAX_EXPOSURE" /etc/systemd/system/hpud.service 2>&1)
		exp=$?
		line=$(printf '%s\n' "$out" | grep 'Overall exposure level')
		[ $exp -eq 0 ] || fail "systemd-analyze security: ${line:-$out} (threshold $MAX_EXPOSURE tenths)"
		ok "systemd-analyze security --offline: ${line#*→ } (threshold $MAX_EXPOSURE tenths)"
	fi

	# What the brief for the unit fixes, so that an edit cannot lose it.
	for line in 'Type=notify' 'NotifyAccess=main' 'ExecStart=/usr/local/bin/hpud -c /etc/hpud/hpud.conf' \
		'ExecReload=/bin/kill -HUP $MAINPID' 'Restart=on-failure' 'NoNewPrivileges=yes' \
		'CapabilityBoundingSet=CAP_SETUID CAP_SETGID CAP_KILL' 'ProtectSystem=strict' \
		'ProtectHome=read-only' 'PrivateTmp=yes' 'After=network-online.target' \
		'Wants=network-online.target'; do
		grep -qxF -- "$line" "$UNIT" || fail "deploy/hpud.service lacks the line '$line'"
	done
	grep -q '^ReadWritePaths=.*/dev/shm' "$UNIT" || fail "deploy/hpud.service: /dev/shm is not in ReadWritePaths"
	! grep -q '^PrivateDevices=' "$UNIT" || fail "deploy/hpud.service sets PrivateDevices= (see its comment)"
	ok "deploy/hpud.service has the required settings"

	# Keys: daemon/conf.h documents them as " *     key = value" lines.
	keys_h=$(sed -n 's/^ \*  *\([a-z_]*\) = .*/\1/p' "$CONF_H" | sort -u)
	keys_c=$(sed -n 's/^#\{0,1\}\([a-z_]*\) *= .*/\1/p' "$CONF" | sort -u)
	[ -n "$keys_h" ] || fail "found no keys in $CONF_H"
	for key in $keys_h; do
		grep -qx "$key" <<<"$keys_c" || fail "deploy/hpud.conf lacks the key '$key' of daemon/conf.h"
	done
	for key in $keys_c; do
		grep -qx "$key" <<<"$keys_h" || fail "deploy/hpud.conf has '$key', unknown to daemon/conf.h"
	done
	ok "deploy/hpud.conf names every key of daemon/conf.h ($(tr '\n' ' ' <<<"$keys_h" | sed 's/ $//')) and no other"

	# The real parser, when hpud is built: the example with only `key`
	# (a fresh key) and `user` (nobody: hpu need not exist here) changed.
	if [ -x "$BUILD/bin/hpud" ]; then
		"$BUILD/bin/hpud" --gen-key "$TMP/secret.key" >/dev/null 2>&1 ||
			fail "$BUILD/bin/hpud --gen-key $TMP/secret.key"
		sed -e "s#^key = .*#key = $TMP/secret.key#" -e 's#^user = .*#user = nobody#' \
			"$CONF" >"$TMP/hpud.conf"
		[ "$(diff "$CONF" "$TMP/hpud.conf" | grep -c '^>')" -eq 2 ] ||
			fail "could not make the copy of deploy/hpud.conf for --check"
		out=$("$BUILD/bin/hpud" -c "$TMP/hpud.conf" --check 2>&1) ||
			fail "hpud --check rejects deploy/hpud.conf (key and user replaced): $out"
		ok "$BUILD/bin/hpud --check accepts deploy/hpud.conf (key and user replaced)"
	else
		echo "note - no $BUILD/bin/hpud: deploy/hpud.conf not checked by the real parser"
	fi
}

# ---- (b) the netns cluster -------------------------------------------------

ns_of() { if [ "$PREFIX" -eq 0 ]; then echo "hpu-n$1"; else echo "hpu$PREFIX-n$1"; fi; }

# What is left of the cluster, found without the script's help.
leftovers() {
	local nsre
	if [ "$PREFIX" -eq 0 ]; then nsre='^hpu-n[0-9]+$'; else nsre="^hpu$PREFIX-n[0-9]+\$"; fi
	ip netns list | awk '{print $1}' | grep -E "$nsre"
	ip -o link show | awk -F': ' '{print $2}' | sed 's/@.*//' | grep -E "^(hpu${PREFIX}v[0-9]+|hpubr$PREFIX)\$"
	[ -e "/run/hpu-netns/$PREFIX" ] && echo "/run/hpu-netns/$PREFIX"
	for p in "${STUB_PIDS[@]}"; do running "$p" && echo "pid $p"; done
	return 0
}

# Whether a pid runs (a zombie waiting for its new parent to reap it does not).
running() {
	local st
	st=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
	st=${st##*) }
	[ "${st%% *}" != Z ]
}

STUB_PIDS=()
teardown() {
	local left
	"$CLUSTER" down "$PREFIX" || echo "netns-cluster.sh down failed" >&2
	left=$(leftovers | tr '\n' ' ')
	[ -z "$left" ] || { echo "left behind after down: $left" >&2; return 1; }
	return 0
}
on_exit() {
	local rc=$?
	trap - EXIT
	if [ -n "${CLUSTER_UP:-}" ]; then
		teardown || rc=1
		[ "$rc" -eq 0 ] || echo "(cluster $PREFIX torn down after the failure)" >&2
	fi
	rm -rf "$TMP"
	exit "$rc"
}
trap on_exit EXIT
trap 'exit 130' INT TERM

# probe FROM ADDR: connect from node FROM to ADDR:PORT within 2 s and read
# the stub's greeting.
probe() {
	"$CLUSTER" -p "$PREFIX" exec "$1" timeout 2 bash -c \
		'exec 3<>"/dev/tcp/$1/$2" && read -r -t 2 line <&3 && [ "$line" = hpud-stub ]' \
		_ "$2" "$PORT" 2>/dev/null
}
# The same, retried for up to 5 s (a port just opened, a link just up).
probe_soon() {
	local i
	for ((i = 0; i < 10; i++)); do
		probe "$1" "$2" && return 0
		sleep 0.5
	done
	return 1
}

write_stub() {
	cat >"$TMP/stub-hpud" <<EOF
#!/bin/bash
# A stand-in for hpud: "-c CONF", listens on CONF's listen:port and greets.
[ "\$1" = -c ] && [ -r "\$2" ] || { echo "usage: \$0 -c CONF" >&2; exit 2; }
listen=\$(sed -n 's/^listen *= *\([0-9.]*\).*/\1/p' "\$2")
port=\$(sed -n 's/^port *= *\([0-9]*\).*/\1/p' "\$2")
echo "stub hpud listening on \$listen:\$port"
exec "$PY" -c '
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen(64)
while True:
    c, _ = s.accept()
    c.sendall(b"hpud-stub\n")
    c.close()
' "\$listen" "\$port"
EOF
	chmod 0755 "$TMP/stub-hpud"
}

netns_checks() {
	local i j a out pid fwd addrs=()
	fwd=$(cat /proc/sys/net/ipv4/ip_forward 2>/dev/null || echo '?')
	CLUSTER_UP=1
	out=$("$CLUSTER" up "$NODES" "$PREFIX" 2>&1) || fail "netns-cluster.sh up $NODES $PREFIX: $out"
	ok "up $NODES $PREFIX: $out"
	for ((i = 0; i < NODES; i++)); do
		a=$("$CLUSTER" -p "$PREFIX" addr "$i") || fail "addr $i"
		[ "$a" = "10.77.$PREFIX.$((i + 1))" ] || fail "addr $i printed '$a', expected 10.77.$PREFIX.$((i + 1))"
		out=$("$CLUSTER" -p "$PREFIX" exec "$i" ip -o -4 addr show dev eth0) || fail "exec $i ip addr"
		grep -q " inet $a/24 " <<<"$out" || fail "node $i's eth0 lacks $a/24: $out"
		addrs+=("$a")
	done
	ok "addresses ${addrs[*]} on eth0 in $(ns_of 0)..$(ns_of $((NODES - 1)))"

	write_stub
	for ((i = 0; i < NODES; i++)); do
		printf 'listen = %s\nport = %s\n' "${addrs[$i]}" "$PORT" >"$TMP/hpud-$i.conf"
		pid=$("$CLUSTER" -p "$PREFIX" start-hpud "$i" "$TMP/stub-hpud" "$TMP/hpud-$i.conf") ||
			fail "start-hpud $i"
		STUB_PIDS+=("$pid")
		[ "$(ip netns identify "$pid")" = "$(ns_of "$i")" ] ||
			fail "start-hpud $i: pid $pid is not in namespace $(ns_of "$i")"
		[ "$("$CLUSTER" -p "$PREFIX" hpud-pid "$i")" = "$pid" ] || fail "hpud-pid $i does not print $pid"
		probe_soon "$i" "${addrs[$i]}" ||
			fail "node $i's stub hpud does not answer on ${addrs[$i]}:$PORT; log: $(cat "/run/hpu-netns/$PREFIX/hpud-$i.log")"
	done
	ok "start-hpud: a stub hpud in each node (pids ${STUB_PIDS[*]}, each in its namespace)"

	for ((i = 0; i < NODES; i++)); do
		for ((j = 0; j < NODES; j++)); do
			((i == j)) && continue
			probe "$i" "${addrs[$j]}" || fail "node $i cannot reach node $j (${addrs[$j]}:$PORT) over TCP"
		done
	done
	ok "TCP: every node reaches every other ($((NODES * (NODES - 1))) ordered pairs; ip_forward=$fwd)"

	"$CLUSTER" -p "$PREFIX" link 2 down || fail "link 2 down"
	for i in 0 1; do
		! probe "$i" "${addrs[2]}" || fail "node $i still reaches node 2 with node 2's link down"
		! probe 2 "${addrs[$i]}" || fail "node 2 still reaches node $i with its link down"
	done
	if ! probe 0 "${addrs[1]}" || ! probe 1 "${addrs[0]}"; then
		fail "nodes 0 and 1 lost each other when node 2's link went down"
	fi
	out=$("$CLUSTER" -p "$PREFIX" exec 2 ip -o link show dev eth0)
	grep -q NO-CARRIER <<<"$out" || fail "node 2's eth0 should see NO-CARRIER: $out"
	ok "link 2 down: node 2 unreachable both ways, 0 <-> 1 fine, node 2's eth0 NO-CARRIER"

	"$CLUSTER" -p "$PREFIX" link 2 up || fail "link 2 up"
	for ((i = 0; i < NODES; i++)); do
		for ((j = 0; j < NODES; j++)); do
			((i == j)) && continue
			probe_soon "$i" "${addrs[$j]}" || fail "node $i cannot reach node $j after link 2 up"
		done
	done
	for pid in "${STUB_PIDS[@]}"; do running "$pid" || fail "stub hpud $pid died"; done
	ok "link 2 up: all pairs reach each other again (same stub hpuds)"

	"$CLUSTER" -p "$PREFIX" stop-hpud 0 || fail "stop-hpud 0"
	! running "${STUB_PIDS[0]}" || fail "stop-hpud 0: pid ${STUB_PIDS[0]} still runs"
	! probe 1 "${addrs[0]}" || fail "node 0's port still answers after stop-hpud 0"
	! "$CLUSTER" -p "$PREFIX" hpud-pid 0 >/dev/null || fail "hpud-pid 0 still prints a pid after stop-hpud"
	ok "stop-hpud 0: its port is closed"

	teardown || fail "down $PREFIX left things behind"
	CLUSTER_UP=
	ok "down $PREFIX: no namespace, veth, bridge, state directory or stub hpud left"
	out=$("$CLUSTER" down "$PREFIX" 2>&1) || fail "a second down failed: $out"
	ok "down again: idempotent"
}

unit_checks
netns_checks
echo "test_deploy: $pass checks passed"
if [ ${#skipped[@]} -gt 0 ]; then
	printf 'SKIP - %s\n' "${skipped[@]}" >&2
	exit 77
fi
exit 0
