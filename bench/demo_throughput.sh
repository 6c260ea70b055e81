#!/usr/bin/env bash
# Throughput of the demo (Fashion-MNIST MLP, one epoch, global batch 256,
# AdamW lr 1e-3) with 1 and 2 workers, against PyTorch 1.13 DDP (gloo) on the
# same model, batch, optimizer and data, in the same run. Each configuration
# runs REPEAT times (default 3), alternating systems; the median is printed.
#
#   bash bench/demo_throughput.sh [BUILD_DIR]
set -euo pipefail
build=${1:-build}
repeat=${REPEAT:-3}
here=$(cd "$(dirname "$0")" && pwd)
model=$build/lib/fmnist_mlp.so
py=/usr/bin/python3

median() { sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

ours() {
  "$build/bin/hpulaunch" -q --devices "$1" --log-every 0 --metrics /tmp/hpu-bench-$$.jsonl "$model" >/dev/null 2>&1
  tail -1 /tmp/hpu-bench-$$.jsonl | sed -E 's/.*"samples_per_sec":([0-9.]+).*"test_accuracy":([0-9.]+).*/\1 \2/'
}

torch() {
  "$py" "$here/torch_fmnist_ddp.py" --procs "$1" | tail -1 |
    sed -E 's/.* samples_per_sec=([0-9.]+) .*test_accuracy=([0-9.]+).*/\1 \2/'
}

declare -A runs
for i in $(seq "$repeat"); do
  for n in 1 2; do
    runs[ours$n]+="$(ours $n)"$'\n'
    runs[torch$n]+="$(torch $n)"$'\n'
  done
done

echo "machine: $(nproc --all) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
echo "median of $repeat runs (samples/s over the epoch after its first step; test accuracy)"
printf '%-28s %12s %10s\n' system samples/s accuracy
for key in ours1 ours2 torch1 torch2; do
  sps=$(printf '%s' "${runs[$key]}" | awk 'NF{print $1}' | median)
  acc=$(printf '%s' "${runs[$key]}" | awk 'NF{print $2}' | median)
  case $key in
    ours*) name="hputrain fast_ddp, ${key#ours} worker(s)";;
    *) name="torch 1.13 DDP gloo, ${key#torch} proc(s)";;
  esac
  printf '%-28s %12.0f %10.4f\n' "$name" "$sps" "$acc"
done
rm -f /tmp/hpu-bench-$$.jsonl
