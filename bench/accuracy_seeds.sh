#!/usr/bin/env bash
# Test accuracy of the demo setup (one epoch, 2 workers, global batch 256,
# AdamW lr 1e-3) over several seeds, for hputrain and for PyTorch 1.13 DDP in
# the same run: one epoch's accuracy depends on the seed by about +-0.01.
#
#   bash bench/accuracy_seeds.sh [BUILD_DIR]     (SEEDS="0 1 2 ..." to choose)
set -euo pipefail
build=${1:-build}
seeds=${SEEDS:-0 1 2 3 4 5 6 7}
here=$(cd "$(dirname "$0")" && pwd)
printf '%-6s %10s %10s\n' seed hputrain torch
for s in $seeds; do
  ours=$("$build/bin/hpulaunch" -q --devices 2 --seed "$s" --log-every 0 "$build/lib/fmnist_mlp.so" 2>&1 |
         sed -nE 's/.*test accuracy ([0-9.]+).*/\1/p')
  theirs=$(/usr/bin/python3 "$here/torch_fmnist_ddp.py" --procs 2 --seed "$s" | tail -1 |
           sed -E 's/.*test_accuracy=([0-9.]+).*/\1/')
  printf '%-6s %10s %10s\n' "$s" "$ours" "$theirs"
done | tee /tmp/hpu-acc-$$.txt
awk 'NR>0 {o+=$2; t+=$3; n++; if (!mo || $2<mo) mo=$2; if ($2>Mo) Mo=$2; if (!mt || $3<mt) mt=$3; if ($3>Mt) Mt=$3}
     END {printf "mean   %10.4f %10.4f\nmin    %10.4f %10.4f\nmax    %10.4f %10.4f\n", o/n, t/n, mo, mt, Mo, Mt}' /tmp/hpu-acc-$$.txt
rm -f /tmp/hpu-acc-$$.txt
