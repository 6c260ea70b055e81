#!/bin/bash
# busbw of all_reduce over TCP, 2 ranks, per data-plane mode, alternating.
cd "$(dirname "$0")/.."
B=${1:-build}
for round in 1 2; do
for m in none auth encrypt; do
  echo "=== round $round mode $m"
  HPUCOLL_SECURITY=$m $B/bin/hpulaunch -q --devices 2 --transport tcp --exec $B/bin/hpucoll-bench -b 1K -e 64M -f 4 -n 20 -w 5 -c 0 2>&1 | grep -v "^#" | grep -E "^\[rank 0\]|^ *[0-9]" | head -40
done
done
