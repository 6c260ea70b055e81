#!/usr/bin/env bash
# test_slurm_real: hpulaunch inside a job step of a real, single-node Slurm
# (Debian's slurm-wlm), not a faked SLURM_* environment.
#
# Everything lives in a private directory under /tmp; nothing under /etc,
# /run, /var or the system's munge/Slurm is read for configuration or
# written:
#   - munged with a fresh random key, its own socket, pid, log and seed file;
#   - a generated slurm.conf (passed with -f and SLURM_CONF): one node named
#     after `hostname -s` at 127.0.0.1 with the CPU layout `slurmd -C`
#     reports, proctrack/linuxproc, task/none, select/cons_tres, auth/munge
#     through the private socket, SlurmUser=root, ReturnToService=2, no
#     accounting, free ports for slurmctld and slurmd (picked again, up to 3
#     times, if a daemon finds its port taken), state, spool, pid and log
#     files in the private directory;
#   - slurmctld -D and slurmd -D in the background; the test waits (bounded)
#     until the controller answers and `sinfo` shows the node idle.
# Then, in the job step
#     srun -N1 --ntasks-per-node=1 hpulaunch --devices 2 --max-steps 5 \
#          --log-every 1 --no-eval fmnist_mlp.so -- --hidden 64
# must exit 0, print "[rank 0] trained 5 steps on 2 workers", and
# hpulaunch's start-up line must name the job "slurm-<id>" with <id> the
# Slurm job id (as `scontrol show job` reports it) and "node 0 of 1".
#
# Teardown (a trap, also after a failure, SIGINT, SIGTERM or SIGHUP): a
# running srun is stopped, jobs are cancelled, then slurmd, slurmctld and
# munged are stopped by pid (SIGTERM, SIGKILL after a bounded wait); any
# process left whose environment has our SLURM_CONF (slurmstepd,
# slurmscriptd, job tasks) is killed by pid and fails the test; the
# directory is removed. On a failure srun's output and the daemons' logs
# are printed. Run time here: about 3 s (2 CPUs).
#
# Usage: test_slurm_real.sh [BUILD_DIR]   (else $HPU_BUILD_DIR, else ./build)
# Exit 0: passed; 1: failed (the message says why); 77: skipped (not root,
# or slurmctld/slurmd/srun/sinfo/scontrol/squeue/scancel/munged missing:
# `apt-get install slurm-wlm`, or just `apt-get install
# --no-install-recommends slurmctld slurmd slurm-client munge`).
# Needs the Fashion-MNIST data set that hpulaunch's model reads, as the
# other training tests do.
# shellcheck disable=SC2015,SC2317
# (a && b || fail is meant; the trap handler is reached)
set -uo pipefail

HERE=${BASH_SOURCE[0]%/*}
[ "$HERE" = "${BASH_SOURCE[0]}" ] && HERE=.
ROOT=$(cd "$HERE/../.." && pwd)
BUILD=${1:-${HPU_BUILD_DIR:-$ROOT/build}}
HPULAUNCH=$BUILD/bin/hpulaunch
MODEL=$BUILD/lib/fmnist_mlp.so

# Bounded waits, in seconds (the environment may override the first three).
CTLD_WAIT=${HPU_TEST_SLURM_CTLD_WAIT:-30}  # slurmctld answers
NODE_WAIT=${HPU_TEST_SLURM_NODE_WAIT:-60}  # the node is idle
SRUN_WAIT=${HPU_TEST_SLURM_SRUN_WAIT:-180} # the whole srun
STOP_WAIT=10                               # a daemon stops after SIGTERM
JOB_WAIT=15                                # cancelled jobs are gone

export LC_ALL=C
PATH=$PATH:/usr/sbin:/sbin

skip() { echo "SKIP - $*" >&2; exit 77; }
fail() { echo "FAIL - $*" >&2; exit 1; }
T0=${EPOCHREALTIME:-}
elapsed() { # seconds since the start, e.g. "2.4s" (bash 5), else nothing
	local now=${EPOCHREALTIME:-}
	[ -n "$T0" ] && [ -n "$now" ] || return 0
	now=${now/[.,]/}
	local t0=${T0/[.,]/}
	local ms=$(((now - t0) / 1000))
	printf '%d.%ds' $((ms / 1000)) $((ms % 1000 / 100))
}
ok() { echo "ok   - $* [$(elapsed)]"; }
note() { echo "#      $*"; }

[ "${EUID:-$(id -u)}" -eq 0 ] || skip "needs root (runs slurmctld, slurmd and munged)"
# deploy/install-deps.sh knows the optional group's programs: skipped, with
# its answer, where it could not install them; failed where they are there
# and do not work.
why=$(bash "$ROOT/deploy/install-deps.sh" --check slurm 2>&1) ||
	skip "${why//$'\n'/; }"
[ -x "$HPULAUNCH" ] || fail "$HPULAUNCH is missing: build first (BUILD_DIR is the first argument)"
[ -f "$MODEL" ] || fail "$MODEL is missing: build first"
# The job step runs in the private directory: absolute paths only.
BUILD=$(cd "$BUILD" && pwd) || fail "cannot enter $BUILD"
HPULAUNCH=$BUILD/bin/hpulaunch
MODEL=$BUILD/lib/fmnist_mlp.so

# Nothing from a surrounding Slurm job or an earlier launch may leak in:
# the step's SLURM_* and hpulaunch's own variables must come from our srun.
while read -r v; do
	case $v in
	SLURM_* | SLURMD_* | SALLOC_* | SBATCH_* | SQUEUE_* | SINFO_* | SCONTROL_* | SCANCEL_*) unset "$v" ;;
	esac
done < <(compgen -e)
unset NODE_RANK NNODES MASTER_ADDR MASTER_PORT WORLD_SIZE RANK LOCAL_RANK \
	HPU_JOB_ID HPU_JOB_TOKEN HPU_WORKER HPUCOLL_TRANSPORT

T=$(mktemp -d /tmp/test_slurm_real.XXXXXX) || fail "mktemp -d failed"
CONF=$T/slurm.conf
LOG=$T/log
CTLD_PID='' SLURMD_PID='' MUNGED_PID='' SRUN_PID=''

# A live (not zombie) process?
running() {
	local line s
	[ -n "$1" ] || return 1
	read -r line 2>/dev/null <"/proc/$1/stat" || return 1
	s=${line##*) }
	s=${s%% *}
	[ "$s" != Z ]
}

# Client commands talk to our controller only, and never hang.
sl() { SLURM_CONF=$CONF timeout -k 2 10 "$@"; }

# PIDs of live processes of ours: every one has SLURM_CONF=$CONF in its
# environment (the daemons are started with it; slurmscriptd, slurmstepd and
# the job's tasks inherit it). The script itself does not export it, so
# neither it nor the grep (whose command line names $CONF) match.
ours() {
	local f p
	grep -lsF -- "SLURM_CONF=$CONF" /proc/[0-9]*/environ 2>/dev/null |
		while read -r f; do
			p=${f#/proc/}
			p=${p%%/*}
			[ "$p" != $$ ] && [ "$p" != "$BASHPID" ] && running "$p" && echo "$p"
		done | sort -un
}

describe() { # PID...: one line each, for those still there
	local p c
	for p; do
		c=$(tr '\0' ' ' 2>/dev/null <"/proc/$p/cmdline") || continue
		printf '%s %s\n' "$p" "$c"
	done
}

# stop NAME PID: SIGTERM, wait up to STOP_WAIT s, then SIGKILL; reaps our
# children. Returns 1 if SIGKILL was needed.
stop() {
	local name=$1 pid=$2 i
	running "$pid" || { wait "$pid" 2>/dev/null; return 0; }
	kill -TERM "$pid" 2>/dev/null
	for ((i = 0; i < STOP_WAIT * 10; i++)); do
		running "$pid" || { wait "$pid" 2>/dev/null; return 0; }
		sleep 0.1
	done
	echo "#      $name (pid $pid) ignored SIGTERM for ${STOP_WAIT}s: SIGKILL" >&2
	kill -KILL "$pid" 2>/dev/null
	wait "$pid" 2>/dev/null
	return 1
}

# The job's output first, then each daemon's log file; a daemon's stdout
# (which repeats its log under -D) only when the log file is empty, as when
# it died before opening it.
show_logs() {
	local f d
	for f in srun.stdout srun.stderr slurmctld.log slurmd.log munged.log; do
		d=${f%.*}
		[ -s "$LOG/$f" ] || f=$d.stdout
		[ -s "$LOG/$f" ] || continue
		echo "----- $f (last 80 lines) -----" >&2
		tail -n 80 "$LOG/$f" >&2
	done
	for f in "$LOG"/*.attempt*; do
		[ -s "$f" ] || continue
		echo "----- ${f##*/} (last 20 lines) -----" >&2
		tail -n 20 "$f" >&2
	done
	echo "----- end of logs -----" >&2
}

# stop_slurm: cancel our jobs, let their steps end, stop slurmd and
# slurmctld. Returns 1 if a daemon had to be killed.
stop_slurm() {
	local bad=0 jobs i p steps end
	if running "$CTLD_PID"; then
		jobs=$(sl squeue -h -o %i 2>/dev/null)
		if [ -n "$jobs" ]; then
			# shellcheck disable=SC2086
			sl scancel $jobs 2>/dev/null
			end=$((SECONDS + JOB_WAIT))
			while [ $SECONDS -lt $end ] && [ -n "$(sl squeue -h -o %i 2>/dev/null)" ]; do
				sleep 0.2
			done
		fi
	fi
	# A step's slurmstepd outlives slurmd: let finishing steps end first.
	for ((i = 0; i < 25; i++)); do
		steps=0
		for p in $(ours); do
			grep -qs slurmstepd "/proc/$p/cmdline" && steps=1
		done
		[ $steps -eq 0 ] && break
		sleep 0.2
	done
	[ -n "$SLURMD_PID" ] && { stop slurmd "$SLURMD_PID" || bad=1; }
	[ -n "$CTLD_PID" ] && { stop slurmctld "$CTLD_PID" || bad=1; }
	CTLD_PID='' SLURMD_PID=''
	return $bad
}

cleanup() {
	local rc=$? i
	local -a left
	trap - EXIT INT TERM HUP
	set +e
	if [ -n "${T:-}" ] && [ -d "$T" ]; then
		# An srun still running (after a signal): timeout passes SIGTERM on
		# to srun, which cancels the step.
		if running "$SRUN_PID"; then
			kill -TERM "$SRUN_PID" 2>/dev/null
			for ((i = 0; i < 150; i++)); do
				running "$SRUN_PID" || break
				sleep 0.1
			done
			running "$SRUN_PID" && kill -KILL "$SRUN_PID" 2>/dev/null
			wait "$SRUN_PID" 2>/dev/null
		fi
		if ! stop_slurm; then
			echo "FAIL - slurmd or slurmctld did not stop on SIGTERM within ${STOP_WAIT}s" >&2
			[ "$rc" -eq 0 ] && rc=1
		fi
		if [ -n "$MUNGED_PID" ] && ! stop munged "$MUNGED_PID"; then
			echo "FAIL - munged did not stop on SIGTERM within ${STOP_WAIT}s" >&2
			[ "$rc" -eq 0 ] && rc=1
		fi
		# Children of a stopped daemon (slurmctld's slurmscriptd, a step's
		# last slurmstepd) may take a moment to exit by themselves.
		for ((i = 0; i < 50; i++)); do
			mapfile -t left < <(ours)
			[ ${#left[@]} -eq 0 ] && break
			sleep 0.1
		done
		if [ ${#left[@]} -gt 0 ]; then
			echo "FAIL - processes of this test left behind after teardown (killing them):" >&2
			describe "${left[@]}" | sed 's/^/#      /' >&2
			kill -TERM "${left[@]}" 2>/dev/null
			for ((i = 0; i < 30; i++)); do
				[ -z "$(ours)" ] && break
				sleep 0.1
			done
			mapfile -t left < <(ours)
			if [ ${#left[@]} -gt 0 ]; then
				kill -KILL "${left[@]}" 2>/dev/null
				sleep 0.5
				mapfile -t left < <(ours)
				if [ ${#left[@]} -gt 0 ]; then
					echo "#      still there after SIGKILL:" >&2
					describe "${left[@]}" | sed 's/^/#      /' >&2
				fi
			fi
			[ "$rc" -eq 0 ] && rc=1
		fi
		if [ "$rc" -ne 0 ] && [ "$rc" -ne 77 ]; then
			show_logs
		fi
		rm -rf "$T"
	fi
	if [ "$rc" -eq 0 ]; then
		echo "# all daemons stopped, no process of ours left [$(elapsed)]"
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'echo "FAIL - interrupted by SIGINT" >&2; exit 130' INT
trap 'echo "FAIL - interrupted by SIGTERM" >&2; exit 143' TERM
trap 'echo "FAIL - interrupted by SIGHUP" >&2; exit 129' HUP

# ---- the private munge ----------------------------------------------------

# munged insists that everyone may traverse to its socket, and that nobody
# else may write the key's, log's or seed's directory.
chmod 0711 "$T" && mkdir -m 0755 "$T/run" && mkdir -m 0700 "$T/munge" "$T/state" "$T/spool" "$LOG" ||
	fail "cannot make directories under $T"
head -c 1024 /dev/urandom >"$T/munge/munge.key" && chmod 0600 "$T/munge/munge.key" ||
	fail "cannot write a munge key"
MUNGE_SOCKET=$T/run/munge.socket
SLURM_CONF=$CONF munged -F --key-file="$T/munge/munge.key" --socket="$MUNGE_SOCKET" \
	--pid-file="$T/run/munged.pid" --log-file="$LOG/munged.log" \
	--seed-file="$T/munge/munged.seed" >"$LOG/munged.stdout" 2>&1 </dev/null &
MUNGED_PID=$!
for ((i = 0; i < 100; i++)); do
	[ -S "$MUNGE_SOCKET" ] && break
	running "$MUNGED_PID" || fail "munged exited at start"
	sleep 0.1
done
[ -S "$MUNGE_SOCKET" ] || fail "munged did not create $MUNGE_SOCKET within 10 s"
if command -v munge >/dev/null && command -v unmunge >/dev/null; then
	timeout 10 munge -n -S "$MUNGE_SOCKET" | timeout 10 unmunge -S "$MUNGE_SOCKET" >/dev/null ||
		fail "munge/unmunge through the private munged failed"
fi
ok "munged (pid $MUNGED_PID) on $MUNGE_SOCKET with a fresh key"

# ---- slurm.conf -----------------------------------------------------------

NODE=$(hostname -s 2>/dev/null) || NODE=
[ -n "$NODE" ] || NODE=$(uname -n)
NODE=${NODE%%.*}
# The CPU layout as slurmd itself sees it, so that the node is not drained
# for having less than configured; RealMemory is left at its default (1 MB).
HW=$(SLURM_CONF=$T/none timeout 20 slurmd -C 2>/dev/null | head -n 1)
CPULINE=
for kv in $HW; do
	case $kv in
	CPUs=* | Boards=* | SocketsPerBoard=* | CoresPerSocket=* | ThreadsPerCore=*) CPULINE+=" $kv" ;;
	esac
done
case $CPULINE in *CPUs=*) ;; *) CPULINE=" CPUs=$(nproc)" ;; esac

# A TCP port nobody has bound, outside the ephemeral range (32768-60999).
declare -A taken=()
used_ports() {
	local f n addr rest
	for f in /proc/net/tcp /proc/net/tcp6; do
		[ -r "$f" ] || continue
		while read -r n addr rest; do
			[ "$n" = sl ] && continue
			echo $((16#${addr##*:}))
		done <"$f"
	done
}
free_port() { # VAR: sets VAR to the port (not in a subshell: `taken` must stick)
	local p i
	local -A busy=()
	for p in $(used_ports); do busy[$p]=1; done
	for ((i = 0; i < 200; i++)); do
		p=$((10000 + RANDOM % 20000))
		if [ -z "${busy[$p]:-}" ] && [ -z "${taken[$p]:-}" ]; then
			taken[$p]=1
			printf -v "$1" %s "$p"
			return 0
		fi
	done
	return 1
}

write_conf() {
	cat >"$CONF" <<EOF
# generated by test_slurm_real.sh
ClusterName=hputest
SlurmctldHost=$NODE(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCKET
StateSaveLocation=$T/state
SlurmdSpoolDir=$T/spool
SlurmctldPidFile=$T/run/slurmctld.pid
SlurmdPidFile=$T/run/slurmd.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig=$T/plugstack.conf
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
MpiDefault=none
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
ReturnToService=2
SlurmdParameters=config_overrides
KillWait=3
FirstJobId=$FIRST_JOB
NodeName=$NODE NodeAddr=127.0.0.1 NodeHostname=$NODE$CPULINE State=UNKNOWN
PartitionName=hputest Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
EOF
	: >"$T/plugstack.conf"
}

# ---- slurmctld and slurmd -------------------------------------------------

port_clash() { grep -qs 'Address already in use' "$@"; }

ctld_up() { SLURM_CONF=$CONF timeout -k 1 3 scontrol ping 2>/dev/null | grep -q 'is UP'; }

# start_cluster: 0 up, 2 a port was taken (try again), else fail.
start_cluster() {
	local end state
	write_conf || fail "cannot write $CONF"
	SLURM_CONF=$CONF slurmctld -D -f "$CONF" >"$LOG/slurmctld.stdout" 2>&1 </dev/null &
	CTLD_PID=$!
	end=$((SECONDS + CTLD_WAIT))
	while :; do
		sleep 0.2
		if ! running "$CTLD_PID"; then
			port_clash "$LOG/slurmctld.log" "$LOG/slurmctld.stdout" && return 2
			wait "$CTLD_PID"
			fail "slurmctld exited (status $?) at start"
		fi
		ctld_up && break
		[ $SECONDS -lt $end ] ||
			fail "slurmctld (pid $CTLD_PID) did not answer 'scontrol ping' within ${CTLD_WAIT}s"
	done

	SLURM_CONF=$CONF slurmd -D -f "$CONF" -N "$NODE" >"$LOG/slurmd.stdout" 2>&1 </dev/null &
	SLURMD_PID=$!
	end=$((SECONDS + NODE_WAIT))
	while :; do
		sleep 0.2
		if ! running "$SLURMD_PID"; then
			port_clash "$LOG/slurmd.log" "$LOG/slurmd.stdout" && return 2
			wait "$SLURMD_PID"
			fail "slurmd exited (status $?) at start"
		fi
		running "$CTLD_PID" || fail "slurmctld exited while slurmd registered"
		state=$(sl sinfo -h -N -n "$NODE" -o %t 2>/dev/null)
		[ "$state" = idle ] && return 0
		[ $SECONDS -lt $end ] ||
			fail "node $NODE is not idle after ${NODE_WAIT}s: sinfo says '$(sl sinfo -h -N -n "$NODE" -o '%t %E' 2>&1)'"
	done
}

FIRST_JOB=$((1000 + RANDOM % 9000))
up=0
for attempt in 1 2 3; do
	free_port CTLD_PORT && free_port SLURMD_PORT || fail "no free TCP port found"
	start_cluster
	case $? in
	0) up=1; break ;;
	2)
		note "attempt $attempt: a port ($CTLD_PORT/$SLURMD_PORT) was taken; trying others"
		stop_slurm >/dev/null 2>&1
		for f in slurmctld.log slurmctld.stdout slurmd.log slurmd.stdout; do
			[ -e "$LOG/$f" ] && mv -f "$LOG/$f" "$LOG/$f.attempt$attempt"
		done
		rm -rf "$T/state" "$T/spool" && mkdir -m 0700 "$T/state" "$T/spool" ||
			fail "cannot reset $T/state and $T/spool"
		;;
	esac
done
[ $up -eq 1 ] || fail "slurmctld/slurmd found their ports taken 3 times"
ok "slurmctld (pid $CTLD_PID, port $CTLD_PORT) and slurmd (pid $SLURMD_PID, port $SLURMD_PORT) up; node $NODE (${CPULINE# }) idle"

# ---- hpulaunch in a job step ----------------------------------------------

# In the background, so that a signal to this script is handled at once
# (bash runs traps only between commands, and `wait` is one).
(cd "$T" && SLURM_CONF=$CONF exec timeout -k 10 "$SRUN_WAIT" \
	srun -N1 --ntasks-per-node=1 "$HPULAUNCH" --devices 2 --max-steps 5 \
	--log-every 1 --no-eval "$MODEL" -- --hidden 64) \
	>"$LOG/srun.stdout" 2>"$LOG/srun.stderr" </dev/null &
SRUN_PID=$!
wait "$SRUN_PID"
rc=$?
SRUN_PID=''
[ $rc -ne 124 ] && [ $rc -ne 137 ] || fail "srun did not finish within ${SRUN_WAIT}s"
[ $rc -eq 0 ] || fail "srun ... hpulaunch exited $rc"
ok "srun -N1 --ntasks-per-node=1 hpulaunch --devices 2 ... exited 0"

grep -qF '[rank 0] trained 5 steps on 2 workers' "$LOG/srun.stdout" "$LOG/srun.stderr" ||
	fail "no '[rank 0] trained 5 steps on 2 workers' in the output"
ok "[rank 0] trained 5 steps on 2 workers"

# The job's id, from the controller: exactly one job, named after hpulaunch.
jobs=$(sl scontrol -o show jobs 2>&1) || fail "scontrol show jobs failed: $jobs"
lines=$(printf '%s\n' "$jobs" | grep -c 'JobName=hpulaunch ')
[ "$lines" -eq 1 ] || fail "expected one hpulaunch job in 'scontrol show jobs', found $lines: $jobs"
JOBID=$(printf '%s\n' "$jobs" | grep 'JobName=hpulaunch ' | sed -n 's/^JobId=\([0-9][0-9]*\) .*/\1/p')
[ -n "$JOBID" ] || fail "no JobId in 'scontrol show jobs': $jobs"
startline=$(grep -h '^hpulaunch: job ' "$LOG/srun.stderr" "$LOG/srun.stdout" | head -n 1)
[ -n "$startline" ] || fail "no 'hpulaunch: job ...' start-up line in the output"
case $startline in
"hpulaunch: job slurm-$JOBID: node 0 of 1,"*) ;;
*) fail "start-up line '$startline' does not name job slurm-$JOBID, node 0 of 1" ;;
esac
ok "start-up line names the Slurm job: $startline"

exit 0
