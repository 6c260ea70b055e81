#!/usr/bin/env bash
# Low-precision training throughput against PyTorch, one core and two.
#
# 1. One worker, one core: each example model (Fashion-MNIST MLP and CNN,
#    global batch 256; gpt_lm, batch $LM_BATCH, default 32 as RESULTS.md's
#    LM runs use, without dropout: -- --dropout 0 --gen 0) in fp32 and
#    bf16, ours (hpulaunch --devices 1 --precision fp32|bf16-mixed)
#    alternating with bench/torch_models.py (fp32, or
#    torch.autocast cpu bf16), both on core 0 (hpulaunch pins rank 0 there;
#    the torch peer pins itself), one BLAS/OpenMP thread each, AdamW lr 1e-3.
#    Ours also in 16-mixed (MLP) and fp8 (gpt_lm), which have no torch peer.
#    Both measure the same steps: WARMUP untimed steps, then STEPS timed
#    (ours: --max-steps WARMUP+STEPS --throughput-warmup-steps WARMUP, the
#    final record's samples_per_sec in the --metrics file; no evaluation).
# 2. Two workers, the MLP, one epoch: ours --devices 2 --strategy ddp in fp32
#    and bf16-mixed against bench/torch_fmnist_ddp.py --procs 2 --pin
#    [--bf16] (DDP gloo); samples/s after the first 10 steps on both sides.
# 3. The ceiling: build/bin/gemm-ceiling times every matrix product of the
#    three models (forward, dW, dx) alone in OpenBLAS sgemm and oneDNN (f32
#    and bf16 in / f32 out) on core 0 and prints, per model, the FLOPs per
#    sample and the GFLOP/s the products reach. Achieved GFLOP/s of a run =
#    samples/s x FLOPs per sample, where FLOPs per sample = the sum over the
#    model's products of 2*M*N*K / batch (a linear layer: 6*in*out; the first
#    layer 4*in*out, its input needing no gradient; convolutions as their
#    im2col GEMMs; attention's four T x T x hd products in full; see
#    gemm_ceiling.c). "% of ceiling" compares fp32 runs with the f32 ceiling
#    and bf16 runs with the bf16 one (the fastest of sgemm / oneDNN matmul /
#    oneDNN convolution for each product); elementwise work is not in it, so
#    no run can reach 100%.
#
#   bash bench/lowp.sh [BUILD_DIR]
#
# Environment: REPEAT=N the median of N runs of each (1); QUICK=1 few steps
# (a smoke test: figures not worth recording); WARMUP (10), STEPS_MLP (400),
# STEPS_CNN (80), STEPS_LM (200), LM_BATCH (32), CEILING_TIME (seconds per
# product and way, 0.3). Each single-core run takes about 10-30 s at the
# step counts given. Run it on a quiet machine: anything else on core 0
# (or core 1 for the DDP runs) lowers every figure.
set -euo pipefail
build=${1:-build}
here=$(cd "$(dirname "$0")" && pwd)
py=/usr/bin/python3
repeat=${REPEAT:-1}
lm_batch=${LM_BATCH:-32}
if [ "${QUICK:-0}" = 1 ]; then
  warm=${WARMUP:-2} s_mlp=${STEPS_MLP:-20} s_cnn=${STEPS_CNN:-4} s_lm=${STEPS_LM:-8}
  ctime=${CEILING_TIME:-0.03} ddp_steps=40
else
  warm=${WARMUP:-10} s_mlp=${STEPS_MLP:-400} s_cnn=${STEPS_CNN:-80} s_lm=${STEPS_LM:-200}
  ctime=${CEILING_TIME:-0.3} ddp_steps=0
fi
[ -x "$build/bin/hpulaunch" ] || { echo "lowp.sh: no $build/bin/hpulaunch (build first)" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

steps_of() { case $1 in mlp) echo "$s_mlp";; cnn) echo "$s_cnn";; gpt_lm) echo "$s_lm";; esac; }
so_of() { case $1 in mlp) echo fmnist_mlp;; cnn) echo fmnist_cnn;; gpt_lm) echo gpt_lm;; esac; }
batch_of() { case $1 in gpt_lm) echo "$lm_batch";; *) echo 256;; esac; }
# the model arguments: gpt_lm without dropout (the torch peer has none) and
# without the text generation after training
args_of() { case $1 in gpt_lm) echo "-- --dropout 0 --gen 0";; esac; }

# samples/s of the final record of a metrics file
final_sps() {
  "$py" - "$1" <<'PY'
import json, sys
r = [json.loads(l) for l in open(sys.argv[1]) if l.strip()][-1]
assert r.get("final"), "no final record"
print(r["samples_per_sec"])
PY
}

ours() { # MODEL PRECISION
  local m=$1 p=$2 n margs
  n=$(steps_of "$m")
  read -ra margs <<<"$(args_of "$m")"
  rm -f "$tmp/m.jsonl"
  if ! "$build/bin/hpulaunch" -q --devices 1 --precision "$p" --log-every 0 --no-eval \
      --batch-size "$(batch_of "$m")" --max-steps $((warm + n)) \
      --throughput-warmup-steps "$warm" --metrics "$tmp/m.jsonl" \
      "$build/lib/$(so_of "$m").so" "${margs[@]}" >"$tmp/ours.log" 2>&1; then
    echo "lowp.sh: ours $m $p failed:" >&2
    tail -5 "$tmp/ours.log" >&2
    exit 1
  fi
  final_sps "$tmp/m.jsonl"
}

torch1() { # MODEL fp32|bf16
  local m=$1 p=$2
  "$py" "$here/torch_models.py" --model "$m" --precision "$p" --batch "$(batch_of "$m")" \
    --warmup "$warm" --steps "$(steps_of "$m")" --core 0 >"$tmp/torch.log" 2>&1 || {
    echo "lowp.sh: torch $m $p failed:" >&2
    tail -5 "$tmp/torch.log" >&2
    exit 1
  }
  sed -n 's/^torch model=.* samples_per_sec=\([0-9.]*\).*/\1/p' "$tmp/torch.log"
}

ours_ddp() { # PRECISION
  local extra=()
  [ "$ddp_steps" -gt 0 ] && extra=(--max-steps "$ddp_steps")
  rm -f "$tmp/m.jsonl"
  if ! "$build/bin/hpulaunch" -q --devices 2 --strategy ddp --precision "$1" --log-every 0 \
      --no-eval --throughput-warmup-steps 10 --metrics "$tmp/m.jsonl" "${extra[@]}" \
      "$build/lib/fmnist_mlp.so" >"$tmp/ours.log" 2>&1; then
    echo "lowp.sh: ours ddp $1 failed:" >&2
    tail -5 "$tmp/ours.log" >&2
    exit 1
  fi
  final_sps "$tmp/m.jsonl"
}

torch_ddp() { # fp32|bf16
  local extra=()
  [ "$1" = bf16 ] && extra=(--bf16)
  "$py" "$here/torch_fmnist_ddp.py" --procs 2 --pin "${extra[@]}" >"$tmp/torch.log" 2>&1 || {
    echo "lowp.sh: torch ddp $1 failed:" >&2
    tail -5 "$tmp/torch.log" >&2
    exit 1
  }
  sed -n 's/^torch-ddp .*samples_per_sec_after_warmup=\([0-9.]*\).*/\1/p' "$tmp/torch.log"
}

median() { sort -g | awk '{a[NR]=$1} END {if (NR) print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
med() { if [ -s "$tmp/r-$1" ]; then median <"$tmp/r-$1"; else echo 0; fi; }

# How busy cores 0 and 1 were over one second, from /proc/stat (before
# and after the runs, to tell a quiet machine from a busy one).
busy() {
  "$py" - <<'PY'
import time
def read():
    r = {}
    for l in open("/proc/stat"):
        f = l.split()
        if f[0] in ("cpu0", "cpu1"):
            v = list(map(int, f[1:]))
            r[f[0]] = (sum(v[:8]), v[3] + v[4])  # total, idle + iowait
    return r
a = read(); time.sleep(1); b = read()
print(" ".join("%s %.0f%%" % (c, 100 * (1 - (b[c][1] - a[c][1]) / max(1, b[c][0] - a[c][0])))
               for c in sorted(b)))
PY
}

busy0=$(busy)
echo "machine: $(nproc --all) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); busy before the runs: $busy0"
echo "commit: $(git -C "$here/.." rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C "$here/.." diff --quiet HEAD 2>/dev/null || echo ' (modified)')"
echo "steps: $warm warm-up + mlp $s_mlp / cnn $s_cnn / gpt_lm $s_lm timed; batch 256 (gpt_lm $lm_batch); median of $repeat"
echo "$busy0" | awk '{ if ($2 + 0 > 10 || $4 + 0 > 10) print "warning: something else is running (" $0 "): the figures will be low" }'

vocab=""
for i in $(seq "$repeat"); do
  for m in mlp cnn gpt_lm; do
    for p in fp32 bf16; do
      ours "$m" "$([ $p = bf16 ] && echo bf16-mixed || echo fp32)" >>"$tmp/r-ours-$m-$p"
      [ "$m" = gpt_lm ] && [ -z "$vocab" ] &&
        vocab=$(sed -n 's/.*vocabulary \([0-9]*\).*/\1/p' "$tmp/ours.log" | head -1)
      torch1 "$m" "$p" >>"$tmp/r-torch-$m-$p"
    done
  done
  ours mlp 16-mixed >>"$tmp/r-ours-mlp-fp16"
  ours gpt_lm fp8 >>"$tmp/r-ours-gpt_lm-fp8"
  for p in fp32 bf16; do
    ours_ddp "$([ $p = bf16 ] && echo bf16-mixed || echo fp32)" >>"$tmp/r-ddp-ours-$p"
    torch_ddp "$p" >>"$tmp/r-ddp-torch-$p"
  done
done

# the ceiling, after the runs (it needs gpt_lm's vocabulary)
have_ceiling=0
if [ -x "$build/bin/gemm-ceiling" ]; then
  "$build/bin/gemm-ceiling" -b 256 -B "$lm_batch" -v "${vocab:-86}" -t "$ctime" -c 0 >"$tmp/ceiling.txt"
  have_ceiling=1
else
  echo "(no $build/bin/gemm-ceiling: build it with cmake --build $build --target gemm-ceiling; needs libdnnl-dev)"
fi
cfield() { # MODEL FIELD
  sed -n "s/^ceiling model=$1 .*$2=\([0-9.]*\).*/\1/p" "$tmp/ceiling.txt" 2>/dev/null | head -1
}

echo
echo "## One core: samples/s (gpt_lm: tokens/s = samples/s x 64)"
echo
printf '%-8s %-10s %10s %10s %8s %8s %8s %9s %8s\n' model precision ours torch ours/pt \
  "ours GF/s" "pt GF/s" "ceil GF/s" "ours %"
for m in mlp cnn gpt_lm; do
  fl=0
  [ $have_ceiling = 1 ] && fl=$(cfield "$m" flops_per_sample)
  for p in fp32 bf16 fp16 fp8; do
    [ -s "$tmp/r-ours-$m-$p" ] || continue
    o=$(med "ours-$m-$p") t=$(med "torch-$m-$p") c=0
    if [ $have_ceiling = 1 ]; then
      case $p in fp32) c=$(cfield "$m" f32_gflops);; bf16) c=$(cfield "$m" bf16_gflops);; esac
    fi
    name=$p
    case $p in bf16) name=bf16-mixed;; fp16) name=16-mixed;; esac
    awk -v m="$m" -v p="$name" -v o="$o" -v t="$t" -v f="${fl:-0}" -v c="${c:-0}" 'BEGIN {
      og = o * f / 1e9; tg = t * f / 1e9
      ts = "-"; r = "-"; ogs = "-"; tgs = "-"; cs = "-"; pc = "-"
      if (t > 0) { ts = sprintf("%.0f", t); r = sprintf("%.2f", o / t) }
      if (f > 0) ogs = sprintf("%.1f", og)
      if (f > 0 && t > 0) tgs = sprintf("%.1f", tg)
      if (c > 0) { cs = sprintf("%.1f", c); pc = sprintf("%.0f%%", 100 * og / c) }
      printf "%-8s %-10s %10.0f %10s %8s %9s %8s %9s %8s\n", m, p, o, ts, r, ogs, tgs, cs, pc }'
  done
done
awk -v o="$(med ours-gpt_lm-fp32)" -v t="$(med torch-gpt_lm-fp32)" \
    -v ob="$(med ours-gpt_lm-bf16)" -v tb="$(med torch-gpt_lm-bf16)" -v o8="$(med ours-gpt_lm-fp8)" 'BEGIN {
  printf "gpt_lm tokens/s: fp32 ours %.0f, torch %.0f; bf16 ours %.0f, torch %.0f; fp8 ours %.0f\n",
    64 * o, 64 * t, 64 * ob, 64 * tb, 64 * o8 }'

echo
echo "## bf16 over fp32, one core"
echo
printf '%-8s %8s %8s\n' model ours torch
for m in mlp cnn gpt_lm; do
  awk -v m="$m" -v of="$(med ours-$m-fp32)" -v ob="$(med ours-$m-bf16)" \
      -v tf="$(med torch-$m-fp32)" -v tb="$(med torch-$m-bf16)" \
      'BEGIN { printf "%-8s %8.2f %8.2f\n", m, ob / of, tb / tf }'
done

echo
echo "## Two workers, MLP, DDP: samples/s after the first 10 steps$([ "$ddp_steps" -gt 0 ] && echo " (ours: $ddp_steps steps; torch: one epoch)" || echo ", one epoch")"
echo
printf '%-10s %10s %10s %8s\n' precision ours torch ours/pt
for p in fp32 bf16; do
  awk -v p="$([ $p = bf16 ] && echo bf16-mixed || echo fp32)" -v o="$(med ddp-ours-$p)" \
      -v t="$(med ddp-torch-$p)" 'BEGIN { printf "%-10s %10.0f %10.0f %8.2f\n", p, o, t, o / t }'
done

if [ $have_ceiling = 1 ]; then
  echo
  echo "## The ceiling: each product alone on core 0 (bench/gemm_ceiling.c)"
  echo
  cat "$tmp/ceiling.txt"
fi
echo
echo "busy after the runs: $(busy)"
