#!/usr/bin/env bash
# --graphs on the CPU (issue 36): what replaying a recorded step gains or
# costs against running it eagerly, on both CPU devices, alternating in
# one run, one worker pinned to core 0, one kernel thread.
#
#   cpu          --device cpu, eager (its own table: the default path)
#   cpu-graphs   --device cpu --graphs (the kernels-only table, no memory
#                protection; the strategy takes the copies a device that
#                the host may not read needs where a recording needs them:
#                the batch copied in, bf16 activations converted again;
#                a step recorded once and replayed from a flat list)
#   strict       --device cpu-strict eager on its kernels-only table
#                (HPU_STRICT_KERNELS=1)
#   strict-graphs --device cpu-strict --graphs
#
# cpu-strict is a test device: each kernel call of an eager step opens and
# closes its memory's protection (mprotect), which a replay pays once a
# step; the user's comparison is cpu-graphs against cpu.
#
#   hpulaunch -q --devices 1 --device D --precision P --max-steps S
#             --batch-size B --no-eval [--graphs] MODEL.so [-- MODEL ARGS]
#
# for the MLP at batch 256 (fp32, bf16-mixed), the CNN at 256 (fp32), and
# a host-bound step: the MLP with 8-wide hidden layers at batch 1 (about
# 44 us of host work a step, bench/RESULTS.md), more steps. cpu and
# cpu-graphs also save their parameters, compared with cmp (a difference
# fails the script). Prints every run, then per configuration the median
# samples/s of each and the ratios. The first 3 steps run eagerly under
# --graphs too (--graphs-warmup), and hpulaunch leaves the first step out
# of samples/s. MODES (space-separated) picks the columns; by default all
# four. CONFIGS picks the rows, MODEL-BATCH:PRECISION each (by default
# "mlp-256:fp32 mlp-256:bf16-mixed cnn-256:fp32 tiny-1:fp32"; fp8 too:
# "mlp-256:fp8 tiny-1:fp8").
#
#   bash bench/graphs_cpu.sh BUILD [ROUNDS]
set -euo pipefail
bd=${1:?usage: graphs_cpu.sh BUILD [ROUNDS]}
rounds=${2:-3}
steps=${STEPS:-65}
tiny_steps=${TINY_STEPS:-20000}
modes=${MODES:-cpu cpu-graphs strict strict-graphs}
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
tmp=$(mktemp -d /tmp/hpu-graphs.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
echo "machine: $(nproc --all) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); load before: $(cut -d' ' -f1-3 /proc/loadavg)"
sps() { sed -n 's/.*final loss [0-9.]*, \([0-9.]*\) samples\/s.*/\1/p' "$1" | tail -1; }
for ((r = 1; r <= rounds; r++)); do
  for cfg in ${CONFIGS:-mlp-256:fp32 mlp-256:bf16-mixed cnn-256:fp32 tiny-1:fp32}; do
    set -- ${cfg/:/ }
    name=$1 p=$2 b=${1#*-} m=${1%-*} n=$steps margs=()
    [ $m = tiny ] && m=mlp n=$tiny_steps margs=(-- --hidden 8 --depth 2)
    for mode in $modes; do
      extra=() env=() dev=cpu
      case $mode in
      cpu-graphs) extra=(--graphs --save-params "$tmp/g.bin") ;;
      cpu) extra=(--save-params "$tmp/e.bin") ;;
      strict) env=(HPU_STRICT_KERNELS=1) dev=cpu-strict ;;
      strict-graphs) extra=(--graphs) dev=cpu-strict ;;
      esac
      env "${env[@]}" taskset -c 0 "$bd/bin/hpulaunch" -q --devices 1 --device $dev \
        --precision $p --max-steps "$n" --batch-size "$b" --no-eval "${extra[@]}" \
        "$bd/lib/fmnist_$m.so" "${margs[@]}" >"$tmp/r.log" 2>&1 ||
        { echo "run failed: $mode $name $p" >&2; cat "$tmp/r.log" >&2; exit 1; }
      echo "run $r $name $p $mode $(sps "$tmp/r.log")"
    done
    if [ -f "$tmp/e.bin" ] && [ -f "$tmp/g.bin" ]; then
      cmp "$tmp/e.bin" "$tmp/g.bin" >&2 || { echo "cpu and cpu-graphs differ: $name $p" >&2; exit 1; }
      rm -f "$tmp/e.bin" "$tmp/g.bin"
    fi
  done
done | tee "$tmp/all.txt"
echo
echo "median samples/s:"
python3 - "$tmp/all.txt" <<'PY'
import sys, statistics, collections
v = collections.defaultdict(list)
for line in open(sys.argv[1]):
    w = line.split()
    if len(w) == 6 and w[0] == "run":
        v[(w[2], w[3], w[4])].append(float(w[5]))
def med(k):
    return statistics.median(v[k]) if v.get(k) else None
for (m, p) in sorted({(k[0], k[1]) for k in v}):
    c, cg = med((m, p, "cpu")), med((m, p, "cpu-graphs"))
    s, sg = med((m, p, "strict")), med((m, p, "strict-graphs"))
    out = f"  {m:8s} {p:10s}"
    if c and cg:
        out += f" cpu {c:9.1f}  cpu-graphs {cg:9.1f}  {cg / c:5.3f}x ({(1 / cg - 1 / c) * 1e6 * int(m.split('-')[1]):+.1f} us/step)"
    if s and sg:
        out += f";  cpu-strict {s:9.1f}  strict-graphs {sg:9.1f}  {sg / s:5.2f}x"
    print(out)
PY
