#!/usr/bin/env bash
# --graphs on the CPU (issue 36): what replaying a recorded step gains or
# costs against running it eagerly, on the CPU's twin of a CUDA graph.
# Both on --device cpu-strict's kernels-only table (HPU_STRICT_KERNELS=1
# for the eager runs; --graphs switches it on itself), and beside them
# the default device's eager step (--device cpu, which cannot record: a
# layer's C loops read its memory directly), alternating, one worker
# pinned to core 0, one kernel thread. cpu-strict is a test device: each
# kernel call of an eager step opens and closes its memory's protection
# (mprotect), which a replay pays once a step; the user's comparison is
# with --device cpu.
#
#   hpulaunch -q --devices 1 --device cpu-strict --precision P --max-steps 65
#             --batch-size B --no-eval [--graphs] MODEL.so
#
# for the MLP at batch 256 and 32 (where the host's share of a step is
# larger) and the CNN at 256, fp32 and bf16-mixed. Prints every run, then
# per configuration the median samples/s of each, graphs / eager and graphs / cpu. The
# first 3 steps run eagerly under --graphs too (--graphs-warmup), and
# hpulaunch leaves the first step out of samples/s.
#
#   bash bench/graphs_cpu.sh BUILD [ROUNDS]
set -euo pipefail
bd=${1:?usage: graphs_cpu.sh BUILD [ROUNDS]}
rounds=${2:-3}
steps=${STEPS:-65}
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
tmp=$(mktemp -d /tmp/hpu-graphs.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); load before: $(cut -d' ' -f1-3 /proc/loadavg)"
sps() { sed -n 's/.*final loss [0-9.]*, \([0-9.]*\) samples\/s.*/\1/p' "$1" | tail -1; }
for ((r = 1; r <= rounds; r++)); do
  for cfg in "mlp 256" "mlp 32" "cnn 256"; do
    set -- $cfg
    m=$1 b=$2
    for p in fp32 bf16-mixed; do
      for mode in eager graphs cpu; do
        extra=() env=(HPU_STRICT_KERNELS=1) dev=cpu-strict
        [ $mode = graphs ] && extra=(--graphs) env=()
        [ $mode = cpu ] && env=() dev=cpu
        env "${env[@]}" "$bd/bin/hpulaunch" -q --devices 1 --device $dev --precision $p \
          --max-steps "$steps" --batch-size "$b" --no-eval "${extra[@]}" "$bd/lib/fmnist_$m.so" \
          >"$tmp/r.log" 2>&1 || { echo "run failed: $mode $m $b $p" >&2; cat "$tmp/r.log" >&2; exit 1; }
        echo "run $r $m-$b $p $mode $(sps "$tmp/r.log")"
      done
    done
  done
done | tee "$tmp/all.txt"
echo
echo "median samples/s (graphs / eager):"
python3 - "$tmp/all.txt" <<'PY'
import sys, statistics, collections
v = collections.defaultdict(list)
for line in open(sys.argv[1]):
    w = line.split()
    if len(w) == 6 and w[0] == "run":
        v[(w[2], w[3], w[4])].append(float(w[5]))
for (m, p) in sorted({(k[0], k[1]) for k in v}):
    e = statistics.median(v[(m, p, "eager")]); g = statistics.median(v[(m, p, "graphs")])
    c = statistics.median(v[(m, p, "cpu")])
    print(f"  {m:8s} {p:10s} cpu-strict eager {e:9.1f}  graphs {g:9.1f}  {g / e:5.2f}x;"
          f"  --device cpu eager {c:9.1f}: graphs / cpu {g / c:5.2f}x")
PY
