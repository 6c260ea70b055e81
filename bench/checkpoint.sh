#!/usr/bin/env bash
# Checkpoint save and load speed per rank, 2 workers, against the disk's
# sequential write speed with fsync (dd conv=fsync) as the ceiling.
#
# Models: the Fashion-MNIST MLP (1.9 M parameters; AdamW, so a checkpoint
# is 12 bytes a parameter: weights and two moments), a wide one (--hidden
# 4096 --depth 6: 85 M parameters, 1 GB a checkpoint) and the largest that
# fits this 24 GiB machine with room to spare (--hidden 4096 --depth 16:
# 254 M parameters, 3 GB a checkpoint; ddp keeps 4 GB of state per rank). Each under ddp (every rank holds everything and
# writes half of it) and zero3 (each rank writes what it owns). A save is
# timed by the worker (open, write, SHA-256, fsync, rename, per rank); a
# load by the resuming worker (finding the checkpoint, verifying every
# file's SHA-256 shared out among the ranks, reading its ranges). The
# files were just written, so loads read from the page cache.
#
#   bash bench/checkpoint.sh [BUILD_DIR] [DIR]   (DIR: where to write; /tmp)
set -euo pipefail
build=${1:-build}
where=${2:-/tmp}
py=/usr/bin/python3
tmp=$(mktemp -d "$where/hpu-ckpt-bench.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

echo "machine: $(nproc --all) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(df -h "$where" | awk 'NR==2 {print $1}') under $where"
ceiling=$(dd if=/dev/zero of="$tmp/dd.bin" bs=4M count=256 conv=fsync 2>&1 | awk '/copied/ {print $(NF-1), $NF}')
rm -f "$tmp/dd.bin"
echo "dd if=/dev/zero bs=4M count=256 conv=fsync (1 GiB, one writer): $ceiling"
# two writers at once, as two ranks write: each one's speed
for i in 0 1; do
  dd if=/dev/zero of="$tmp/dd$i.bin" bs=4M count=128 conv=fsync 2>"$tmp/dd$i.log" &
done
wait
echo "the same, two writers at once (512 MiB each): $(awk '/copied/ {print $(NF-1), $NF}' "$tmp/dd0.log") and $(awk '/copied/ {print $(NF-1), $NF}' "$tmp/dd1.log")"
rm -f "$tmp"/dd*
echo
printf '%-22s %-8s %10s %14s %14s %14s %14s\n' model strategy "MB/rank" "save s/rank" "save MB/s" "load s/rank" "load MB/s"

one() { # NAME STRATEGY model-args...
  local name=$1 strat=$2
  shift 2
  rm -rf "$tmp/ck" "$tmp/m.jsonl"
  "$build/bin/hpulaunch" -q --devices 2 --strategy "$strat" --batch-size 64 --max-steps 2 \
    --no-eval --log-every 0 --checkpoint-dir "$tmp/ck" --metrics "$tmp/m.jsonl" \
    "$build/lib/fmnist_mlp.so" -- "$@" >/dev/null
  "$build/bin/hpulaunch" -q --devices 2 --strategy "$strat" --batch-size 64 --max-steps 2 \
    --no-eval --log-every 0 --resume "$tmp/ck" --metrics "$tmp/m.jsonl" \
    "$build/lib/fmnist_mlp.so" -- "$@" >/dev/null
  "$py" - "$tmp/m.jsonl" "$name" "$strat" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
save = [r for r in recs if r.get("checkpoint") == "saved"][-1]["ranks"]
load = [r for r in recs if r.get("checkpoint") == "loaded"][-1]["ranks"]
mb = max(r["bytes"] for r in save) / 1e6
ss = max(r["seconds"] for r in save)
lmb = max(r["bytes_read"] + r["bytes_verified"] for r in load) / 1e6
ls = max(r["seconds"] for r in load)
print(f"{sys.argv[2]:<22} {sys.argv[3]:<8} {mb:10.1f} {ss:14.3f} {mb / ss:14.0f} {ls:14.3f} {lmb / ls:14.0f}")
PY
}

for s in ddp zero3; do one "MLP 1.9M" "$s"; done
for s in ddp zero3; do one "MLP 85M (4096x6)" "$s" --hidden 4096 --depth 6; done
for s in ddp zero3; do one "MLP 254M (4096x16)" "$s" --hidden 4096 --depth 16; done
echo
echo "MB/rank: the shard one rank writes. load MB/s counts the bytes a rank verifies"
echo "(SHA-256 of its share of the files) plus the bytes it reads for its own layout."
