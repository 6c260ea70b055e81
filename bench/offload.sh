#!/usr/bin/env bash
# ZeRO-Offload and ZeRO-Infinity figures (issue 19), all in one run:
#
# 1. The disk under the swap directory, the peers: dd (1 MiB blocks,
#    oflag/iflag=direct) and fio (io_uring, O_DIRECT, 1 MiB blocks,
#    iodepth 8: our aio defaults), writing then reading DISK_GIB GiB.
# 2. A model larger than this machine's memory: fmnist_mlp --hidden
#    $BIG_HIDDEN --depth $BIG_DEPTH (2.69e9 parameters at 8192 x 41: 43 GB
#    of model states at 16 bytes each, 32.3 GB of them on disk) on 2
#    workers, bf16-mixed, zero3, --offload-optimizer nvme (master weights
#    and moments, 12Ψ bytes, in the swap files) and --offload-param nvme
#    (the 16-bit parameter shard, 2Ψ bytes), sub-groups of $BIG_SUB
#    elements; $BIG_STEPS steps of global batch
#    $BIG_BATCH at Adam lr $BIG_LR (at 1e-3 the loss of 41 layers of 8192
#    grew to 4.8e6 in 4 steps), the first untimed. Printed: step time, the workers' peak RSS
#    (their VmRSS summed, sampled every 0.5 s), bytes read and written per
#    step (the final metrics record's nvme entries, less the start's
#    write), the parameters' share, and the swap's throughput during the
#    steps.
# 3. A model that fits (--hidden $FIT_HIDDEN --depth $FIT_DEPTH), zero2
#    bf16-mixed on 2 workers, $FIT_STEPS steps of batch 256: samples/s
#    without offload, with the optimizer on cpu, on nvme with 4 buffers
#    (transfers overlapped) and with 1 (one sub-group at a time), sub-groups
#    of $FIT_SUB elements; then zero3 bf16-mixed without offload, with the
#    parameter shard on cpu and on nvme (the default 5 parameter buffers,
#    reads ahead of the gathers; and 2, which leaves none for reading
#    ahead).
#
#   bash bench/offload.sh [BUILD_DIR] [SWAP_DIR]
#
# SWAP_DIR (default /var/tmp/hpu-offload-bench) must be on a disk, not
# tmpfs, with room for the big model's 12Ψ bytes (32 GB at the defaults)
# plus DISK_GIB. QUICK=1: a small "big" model (a smoke test, figures not
# worth recording). ONLY_BIG=1: parts 1 and 2 only; ONLY_FIT=1: 1 and 3.
set -euo pipefail
build=${1:-build}
swap=${2:-/var/tmp/hpu-offload-bench}
launch="$build/bin/hpulaunch"
model="$build/lib/fmnist_mlp.so"
[ -x "$launch" ] && [ -f "$model" ] || { echo "build first: $launch, $model" >&2; exit 2; }
DISK_GIB=${DISK_GIB:-4}
BIG_HIDDEN=${BIG_HIDDEN:-8192} BIG_DEPTH=${BIG_DEPTH:-41} BIG_SUB=${BIG_SUB:-20000000}
BIG_STEPS=${BIG_STEPS:-4} BIG_BATCH=${BIG_BATCH:-32} BIG_LR=${BIG_LR:-1e-5}
FIT_HIDDEN=${FIT_HIDDEN:-1024} FIT_DEPTH=${FIT_DEPTH:-16} FIT_STEPS=${FIT_STEPS:-40}
FIT_SUB=${FIT_SUB:-1000000}
if [ "${QUICK:-0}" = 1 ]; then
	DISK_GIB=1 BIG_HIDDEN=1024 BIG_DEPTH=4 BIG_SUB=100000 FIT_STEPS=10
fi
mkdir -p "$swap"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"; rm -f "$swap"/hpu-bench-disk' EXIT

echo "machine: $(nproc --all) cores, $(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo);" \
     "swap directory $swap on $(df --output=source,fstype "$swap" | tail -1 | tr -s ' ')"

# ---- 1. the disk ----
echo "== disk: $DISK_GIB GiB, 1 MiB blocks, O_DIRECT =="
f="$swap/hpu-bench-disk"
gbs() { awk -v b="$1" -v s="$2" 'BEGIN {printf "%.2f GB/s", b / s / 1e9}'; }
bytes=$((DISK_GIB * 1024 * 1024 * 1024))
t0=$(date +%s.%N)
dd if=/dev/zero of="$f" bs=1M count=$((DISK_GIB * 1024)) oflag=direct conv=fsync status=none
t1=$(date +%s.%N)
dd if="$f" of=/dev/null bs=1M iflag=direct status=none
t2=$(date +%s.%N)
echo "dd   write $(gbs $bytes "$(echo "$t1 - $t0" | bc)")  read $(gbs $bytes "$(echo "$t2 - $t1" | bc)")"
rm -f "$f"
if command -v fio >/dev/null; then
	for rw in write read; do
		out=$(fio --name=bench --filename="$f" --rw=$rw --bs=1M --direct=1 --ioengine=io_uring \
			--iodepth=8 --size=${DISK_GIB}G --output-format=terse --terse-version=3 2>/dev/null)
		# terse v3: field 7 read bandwidth KiB/s, field 48 write bandwidth KiB/s
		kib=$(echo "$out" | awk -F';' -v rw=$rw '{print rw == "read" ? $7 : $48}')
		printf "fio  %-5s %s (io_uring, iodepth 8)\n" $rw "$(awk -v k="$kib" 'BEGIN {printf "%.2f GB/s", k * 1024 / 1e9}')"
	done
	rm -f "$f"
else
	echo "fio  not installed: skipped"
fi

# Runs hpulaunch with the given flags; prints nothing; leaves the metrics
# in $tmp/m.jsonl and the peak summed worker RSS (bytes) in $tmp/rss.
run() {
	rm -f "$tmp/m.jsonl"
	"$launch" -q --devices 2 --no-eval --log-every 0 --metrics "$tmp/m.jsonl" "$@" \
		>"$tmp/out" 2>&1 &
	local pid=$! peak=0
	while kill -0 $pid 2>/dev/null; do
		local sum=0
		# this run's workers only (hpulaunch's children; every
		# hpu-worker of the machine counted other jobs' too)
		for p in $(pgrep -P $pid -f hpu-worker || true); do
			# a worker exiting meanwhile has no VmRSS (zombie) or no file
			local kb
			kb=$(awk '/VmRSS/ {print $2}' /proc/$p/status 2>/dev/null || true)
			sum=$((sum + ${kb:-0}))
		done
		[ $sum -gt $peak ] && peak=$sum
		sleep 0.5
	done
	echo $((peak * 1024)) >"$tmp/rss"
	wait $pid || { cat "$tmp/out" >&2; return 1; }
}

# final.<python expression over the final record `f`>
final() {
	python3 -c "
import json, sys
f = [json.loads(l) for l in open('$tmp/m.jsonl') if '\"final\"' in l][-1]
print($1)"
}

# ---- 2. larger than the machine ----
if [ "${ONLY_FIT:-0}" != 1 ]; then
echo "== model larger than memory: fmnist_mlp --hidden $BIG_HIDDEN --depth $BIG_DEPTH, 2 workers, bf16-mixed zero3, optimizer and parameters nvme =="
run --strategy zero3 --precision bf16-mixed --batch-size $BIG_BATCH --max-steps $BIG_STEPS --lr $BIG_LR \
	--throughput-warmup-steps 1 --offload-optimizer nvme --nvme-path "$swap" \
	--sub-group-size $BIG_SUB --offload-param nvme \
	"$model" -- --hidden $BIG_HIDDEN --depth $BIG_DEPTH
final "'parameters %.3e; model states at 16 B/parameter %.1f GB; in the swap files %.1f GB (both ranks)' % (f['parameters'], 16 * f['parameters'] / 1e9, sum(d['nvme']['written_bytes'] for d in f['device']) / ($BIG_STEPS + 1) / 1e9)"
final "'trained %d steps, final loss %.4f' % (f['steps'], f['loss'])"
final "'step time %.2f s (batch %d, %d steps after the first)' % ($BIG_BATCH / f['samples_per_sec'], $BIG_BATCH, $BIG_STEPS - 1)"
echo "peak RSS of the 2 workers together: $(awk '{printf "%.2f GiB", $1 / 2^30}' "$tmp/rss")"
final "'per step and rank: read %.2f GB, written %.2f GB (of which parameters: read %.2f GB, written %.2f GB); waited for the disk %.1f s a step' % (f['device'][0]['nvme']['read_bytes'] / $BIG_STEPS / 1e9, f['device'][0]['nvme']['written_bytes'] / ($BIG_STEPS + 1) / 1e9, f['device'][0]['nvme']['param_read_bytes'] / $BIG_STEPS / 1e9, f['device'][0]['nvme']['param_written_bytes'] / ($BIG_STEPS + 1) / 1e9, f['device'][0]['nvme']['wait_s'] / $BIG_STEPS)"
final "'swap throughput during the steps, both ranks: %.2f GB/s' % (sum(d['nvme']['read_bytes'] / $BIG_STEPS + d['nvme']['written_bytes'] / ($BIG_STEPS + 1) for d in f['device']) * f['samples_per_sec'] / $BIG_BATCH / 1e9)"
final "'host tier per rank: MaxInUse %.2f GiB (gradient shard, %d-element sub-group buffers, parameter buffers)' % (f['device'][0]['host']['MaxInUse'] / 2**30, $BIG_SUB)"

fi
[ "${ONLY_BIG:-0}" = 1 ] && exit 0

# ---- 3. a model that fits: the overhead ----
echo "== a model that fits: fmnist_mlp --hidden $FIT_HIDDEN --depth $FIT_DEPTH, 2 workers, bf16-mixed zero2, $FIT_STEPS steps of batch 256 =="
fit() {
	local name=$1 stage=$2
	shift 2
	run --strategy $stage --precision bf16-mixed --batch-size 256 --max-steps $FIT_STEPS \
		--throughput-warmup-steps 2 "$@" "$model" -- --hidden $FIT_HIDDEN --depth $FIT_DEPTH
	final "'%-34s %8.1f samples/s   swap read+written %6.1f MB/step, waited %.3f s/step' % ('$name', f['samples_per_sec'], (f['device'][0]['nvme']['read_bytes'] + f['device'][0]['nvme']['written_bytes']) / $FIT_STEPS / 1e6, f['device'][0]['nvme']['wait_s'] / $FIT_STEPS)"
}
fit "no offload" zero2
fit "offload-optimizer cpu" zero2 --offload-optimizer cpu
fit "offload-optimizer nvme, 4 buffers" zero2 --offload-optimizer nvme --nvme-path "$swap" --sub-group-size $FIT_SUB
fit "offload-optimizer nvme, 1 buffer" zero2 --offload-optimizer nvme --nvme-path "$swap" --sub-group-size $FIT_SUB --offload-buffer-count 1
echo "== the same, zero3 =="
fit "zero3, no offload" zero3
fit "offload-param cpu" zero3 --offload-param cpu
fit "offload-param nvme, 5 buffers" zero3 --offload-param nvme --nvme-path "$swap"
fit "offload-param nvme, 2 buffers" zero3 --offload-param nvme --nvme-path "$swap" --param-buffer-count 2
