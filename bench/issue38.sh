#!/usr/bin/env bash
# Issue 38's figures: two builds (before / after) and the ceiling tool,
# alternating in one run. For each model (the Fashion-MNIST MLP and CNN)
# and round: gemm-ceiling on core 0, then for fp32 and bf16-mixed, 1 and 2
# workers, each build's
#
#   hpulaunch -q --devices D --precision P --max-steps 65 --batch-size 256 --no-eval MODEL.so
#
# (samples/s of its final line; hpulaunch pins rank r to core r), the
# builds taking turns. One kernel thread everywhere (OPENBLAS_NUM_THREADS=1
# OMP_NUM_THREADS=1). Also the after build's 2 workers under --strategy
# zero1 (each rank updates its half of the parameters). Prints every run, then per configuration the median
# samples/s of each build, its share of the ceiling (1 worker: fp32 against
# the f32 ceiling, bf16-mixed against the bf16 one) and 2 workers / 1.
#
# And gpt_lm (batch 32, -- --dropout 0 --gen 0), 1 worker, both precisions.
#
#   bash bench/issue38.sh BEFORE_BUILD AFTER_BUILD [ROUNDS]
#
# MODELS="mlp cnn gpt_lm" (the default) chooses which of the three run.
set -euo pipefail
before=${1:?usage: issue38.sh BEFORE_BUILD AFTER_BUILD [ROUNDS]}
after=${2:?after build}
rounds=${3:-3}
steps=${STEPS:-65}
models=" ${MODELS:-mlp cnn gpt_lm} "
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
tmp=$(mktemp -d /tmp/hpu-i38.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
echo "machine: $(nproc --all) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); load before: $(cut -d' ' -f1-3 /proc/loadavg)"
# a build's programs with its own libraries first (a copied build's
# RUNPATH names the directory it was built in)
with() { local bd=$1; shift; LD_LIBRARY_PATH="$bd/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$@"; }
sps() { sed -n 's/.*final loss [0-9.]*, \([0-9.]*\) samples\/s.*/\1/p' "$1" | tail -1; }
for ((r = 1; r <= rounds; r++)); do
  for m in mlp cnn; do
    [[ $models == *" $m "* ]] || continue
    "$after/bin/gemm-ceiling" -m "$m" -c 0 >"$tmp/c.txt" 2>&1
    line=$(grep '^ceiling' "$tmp/c.txt")
    f=$(sed -n 's/.* f32_samples_per_sec=\([0-9.]*\).*/\1/p' <<<"$line")
    b=$(sed -n 's/.* bf16_samples_per_sec=\([0-9.]*\).*/\1/p' <<<"$line")
    echo "run $r $m ceiling fp32 $f"
    echo "run $r $m ceiling bf16-mixed $b"
    for p in fp32 bf16-mixed; do
      for d in 1 2; do
        for which in before after; do
          bd=$before; [ $which = after ] && bd=$after
          with "$bd" "$bd/bin/hpulaunch" -q --devices $d --precision $p --max-steps "$steps" --batch-size 256 \
            --no-eval "$bd/lib/fmnist_$m.so" >"$tmp/r.log" 2>&1 || { echo "run failed: $which $m $p $d" >&2; cat "$tmp/r.log" >&2; exit 1; }
          echo "run $r $m $which-${d}w $p $(sps "$tmp/r.log")"
        done
      done
      # the after build, 2 workers under zero1: each rank updates half the parameters
      "$after/bin/hpulaunch" -q --devices 2 --strategy zero1 --precision $p --max-steps "$steps" \
        --batch-size 256 --no-eval "$after/lib/fmnist_$m.so" >"$tmp/r.log" 2>&1 || { echo "run failed: zero1 $m $p" >&2; exit 1; }
      echo "run $r $m zero1-2w $p $(sps "$tmp/r.log")"
    done
  done
  # gpt_lm, batch 32, no dropout, no generation (as bench/lowp.sh): 1 worker
  [[ $models == *" gpt_lm "* ]] || continue
  "$after/bin/gemm-ceiling" -m gpt_lm -c 0 >"$tmp/c.txt" 2>&1
  line=$(grep '^ceiling' "$tmp/c.txt")
  echo "run $r gpt_lm ceiling fp32 $(sed -n 's/.* f32_samples_per_sec=\([0-9.]*\).*/\1/p' <<<"$line")"
  echo "run $r gpt_lm ceiling bf16-mixed $(sed -n 's/.* bf16_samples_per_sec=\([0-9.]*\).*/\1/p' <<<"$line")"
  for p in fp32 bf16-mixed; do
    for which in before after; do
      bd=$before; [ $which = after ] && bd=$after
      with "$bd" "$bd/bin/hpulaunch" -q --devices 1 --precision $p --max-steps "$steps" --batch-size 32 \
        --no-eval "$bd/lib/gpt_lm.so" -- --dropout 0 --gen 0 >"$tmp/r.log" 2>&1 || { echo "run failed: $which gpt_lm $p" >&2; exit 1; }
      echo "run $r gpt_lm $which-1w $p $(sps "$tmp/r.log")"
    done
  done
done | tee "$tmp/all.txt"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
/usr/bin/python3 - "$tmp/all.txt" <<'PY'
import collections, statistics, sys
v = collections.defaultdict(list)
for l in open(sys.argv[1]):
    f = l.split()
    if f and f[0] == "run":
        v[(f[2], f[3], f[4])].append(float(f[5]))
med = {k: statistics.median(x) for k, x in v.items()}
print("| model | precision | ceiling | before 1w | after 1w | before % of ceiling | after % of ceiling | before 2w/1w | after 2w/1w | after zero1 2w/1w |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
ran = sorted({k[0] for k in med}, key=("mlp", "cnn", "gpt_lm").index)
for m in (x for x in ("mlp", "cnn") if x in ran):
    for p in ("fp32", "bf16-mixed"):
        c = med[(m, "ceiling", p)]
        b1, a1 = med[(m, "before-1w", p)], med[(m, "after-1w", p)]
        b2, a2 = med[(m, "before-2w", p)], med[(m, "after-2w", p)]
        z2 = med[(m, "zero1-2w", p)]
        print(f"| {m} | {p} | {c:,.0f} | {b1:,.0f} | {a1:,.0f} | {100*b1/c:.0f}% | {100*a1/c:.0f}% | {b2/b1:.2f}x ({b2:,.0f}) | {a2/a1:.2f}x ({a2:,.0f}) | {z2/a1:.2f}x ({z2:,.0f}) |")
for p in ("fp32", "bf16-mixed") if "gpt_lm" in ran else ():
    c, b1, a1 = med[("gpt_lm", "ceiling", p)], med[("gpt_lm", "before-1w", p)], med[("gpt_lm", "after-1w", p)]
    print(f"| gpt_lm (batch 32) | {p} | {c:,.0f} | {b1:,.0f} | {a1:,.0f} | {100*b1/c:.0f}% | {100*a1/c:.0f}% | | | |")
for w in ("before", "after"):
    print("bf16-mixed / fp32, %s, 1 worker: " % w + ", ".join(
        "%s %.2fx" % (m, med[(m, w + "-1w", "bf16-mixed")] / med[(m, w + "-1w", "fp32")]) for m in ran))
PY
