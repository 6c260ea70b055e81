#!/usr/bin/env bash
# Each precision on 2 workers, the Fashion-MNIST MLP (one epoch, global
# batch 256) and CNN (one epoch, global batch 64, cosine schedule):
# samples/s, bytes each rank sends per step, MaxInUse of rank 0, test
# accuracy. One run each (REPEAT=N for the median of N). Then fp8
# inference: each model trained in fp32, evaluated from --load-params
# unquantized while measuring (QUANT_CONFIG mode MEASURE), then quantized
# (mode QUANTIZE): test accuracy of both.
#
#   bash bench/precision.sh [BUILD_DIR]
set -euo pipefail
build=${1:-build}
repeat=${REPEAT:-1}
py=/usr/bin/python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

one() { # MODEL PRECISION extra-args...
  local model=$1 prec=$2
  shift 2
  "$build/bin/hpulaunch" -q --devices 2 --precision "$prec" --log-every 0 \
    --metrics "$tmp/m.jsonl" "$@" "$build/lib/$model.so" >/dev/null 2>&1
  "$py" - "$tmp/m.jsonl" <<'PY'
import json, sys
r = [json.loads(l) for l in open(sys.argv[1])][-1]
d = r["device"][0]
print(r["samples_per_sec"], d["comm_bytes_per_step"], d["MaxInUse"], r.get("test_accuracy", 0))
PY
}

median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
col() { awk -v c="$2" '{print $c}' "$1" | median; }

for i in $(seq "$repeat"); do
  for p in fp32 bf16-mixed 16-mixed fp8; do
    one fmnist_mlp "$p" >>"$tmp/mlp-$p"
    one fmnist_cnn "$p" --batch-size 64 --scheduler cosine >>"$tmp/cnn-$p"
  done
done
echo "machine: $(nproc --all) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
printf '%-6s %-11s %10s %12s %13s %9s\n' model precision samples/s bytes/step "MaxInUse MiB" accuracy
for m in mlp cnn; do
  for p in fp32 bf16-mixed 16-mixed fp8; do
    f=$tmp/$m-$p
    awk -v m="$m" -v p="$p" -v a="$(col "$f" 1)" -v b="$(col "$f" 2)" -v c="$(col "$f" 3)" \
        -v d="$(col "$f" 4)" 'BEGIN { printf "%-6s %-11s %10.0f %12.0f %13.1f %9.4f\n", m, p, a, b, c / 1048576, d }'
  done
done

# fp8 inference (one run each)
acc() { sed -n 's/.*test accuracy \([0-9.]*\).*/\1/p'; }
printf '\n%-6s %-22s %-22s %s\n' model "unquantized (measure)" "fp8 quantized" "ops in fp8"
for m in mlp cnn; do
  model=fmnist_$m
  extra=()
  [ $m = cnn ] && extra=(--batch-size 64 --scheduler cosine)
  "$build/bin/hpulaunch" -q --devices 2 --log-every 0 --no-eval --save-params "$tmp/p.bin" \
    "${extra[@]}" "$build/lib/$model.so" >/dev/null 2>&1
  for mode in MEASURE QUANTIZE; do
    printf '{"mode": "%s", "observer": "maxabs", "dump_stats_path": "%s/stats"}\n' \
      "$mode" "$tmp" >"$tmp/$mode.json"
  done
  a=$(QUANT_CONFIG=$tmp/MEASURE.json "$build/bin/hpulaunch" -q --devices 2 --eval-only \
      --load-params "$tmp/p.bin" "$build/lib/$model.so" 2>&1 | acc)
  out=$(QUANT_CONFIG=$tmp/QUANTIZE.json "$build/bin/hpulaunch" -q --devices 2 --eval-only \
      --load-params "$tmp/p.bin" "$build/lib/$model.so" 2>&1)
  b=$(echo "$out" | acc)
  ops=$(echo "$out" | sed -n 's/.*fp8 quantization: \([0-9]* of [0-9]*\) measured ops.*/\1/p')
  printf '%-6s %-22s %-22s %s\n' "$m" "$a" "$b" "$ops"
done
