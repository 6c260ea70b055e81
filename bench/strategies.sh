#!/usr/bin/env bash
# Every strategy on the Fashion-MNIST MLP (784-1024-1024-10, global batch
# 256, AdamW lr 1e-3), 1 and 2 workers: samples/s, bytes each rank sends per
# optimizer step (libhpucoll's own counters) and device memory per rank (the
# runtime's accounting: MaxInUse, and the peak of parameters + gradients +
# optimizer state). Peer in the same run: PyTorch 1.13 DDP with gloo on the
# same model, data, batch and optimizer (bench/torch_fmnist_ddp.py). Each
# configuration runs REPEAT times (default 3), interleaved; medians printed.
#
#   bash bench/strategies.sh [BUILD_DIR]
set -euo pipefail
build=${1:-build}
repeat=${REPEAT:-3}
steps=${STEPS:-200}
here=$(cd "$(dirname "$0")" && pwd)
model=$build/lib/fmnist_mlp.so
py=/usr/bin/python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# ours "STRATEGY [flags]" N: prints "samples/s bytes/step MaxInUse states_max Ψ"
ours() {
  # shellcheck disable=SC2086 # $1 is the strategy and its flags
  "$build/bin/hpulaunch" -q --devices "$2" --strategy $1 --max-steps "$steps" \
    --log-every 0 --no-eval --metrics "$tmp/m.jsonl" "$model" >/dev/null 2>&1
  "$py" - "$tmp/m.jsonl" <<'PY'
import json, sys
rec = [json.loads(l) for l in open(sys.argv[1])][-1]
d = rec["device"][0]
print(rec["samples_per_sec"], d["comm_bytes_per_step"], d["MaxInUse"],
      d["max_model_states"], rec["parameters"])
PY
}

torch() {
  "$py" "$here/torch_fmnist_ddp.py" --procs "$1" | tail -1 |
    sed -E 's/.* samples_per_sec=([0-9.]+) .*/\1/'
}

median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

# Each strategy with its defaults, plus DDP without overlap and fast_ddp
# with bf16 gradients.
strategies=(ddp "ddp --no-overlap-comm" fast_ddp "fast_ddp --grad-comm-dtype bf16" zero1 zero2 zero3)
key() { echo "$1" | tr ' ' '_'; }
for i in $(seq "$repeat"); do
  for n in 1 2; do
    for s in "${strategies[@]}"; do ours "$s" "$n" >>"$tmp/$(key "$s")-$n"; done
    torch "$n" >>"$tmp/torch-$n"
  done
done

col() { awk -v c="$2" '{print $c}' "$1" | median; }
echo "machine: $(nproc --all) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
psi=$(col "$tmp/ddp-1" 5)
echo "MLP 784-1024-1024-10 (Ψ = $psi parameters), global batch 256, AdamW; $steps steps;"
echo "median of $repeat runs; samples/s after the first step; memory and bytes of rank 0"
printf '%-44s %7s %10s %12s %12s %10s %9s\n' system workers samples/s "bytes/step" "MaxInUse MiB" "states MiB" "states/Ψ"
for s in "${strategies[@]}"; do
  for n in 1 2; do
    f=$tmp/$(key "$s")-$n
    awk -v name="hputrain $s" -v n="$n" -v psi="$psi" -v a="$(col "$f" 1)" -v b="$(col "$f" 2)" \
        -v c="$(col "$f" 3)" -v d="$(col "$f" 4)" 'BEGIN {
      printf "%-44s %7d %10.0f %12.0f %12.1f %10.1f %9.2f\n", name, n, a, b, c / 1048576, d / 1048576, d / psi }'
  done
done
for n in 1 2; do
  printf '%-44s %7d %10.0f %12s %12s %10s %9s\n' "torch 1.13 DDP gloo" "$n" \
    "$(median <"$tmp/torch-$n")" "-" "-" "-" "-"
done
