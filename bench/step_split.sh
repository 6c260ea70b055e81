#!/usr/bin/env bash
# Where a training step's time goes, beyond the matrix products (issue 38).
#
# One run of `hpulaunch -q --devices D --precision P --max-steps S
# --batch-size 256 --no-eval MODEL.so` under `perf record -e cpu-clock`
# (CPU time, sampled: a share of the process's own CPU time, which load
# from other processes blurs far less than wall-clock figures), then a
# second run with --profile for the waits (perf does not sample a blocked
# thread). The samples of the workers' threads are sorted by symbol into
#   gemm/conv  oneDNN's JIT kernels and libdnnl, OpenBLAS
#   casts      fp32 <-> bf16/fp16 conversions and roundings
#   optimizer  the update, the non-finite checks, gradient norms
#   other ops  relu, pooling, softmax/xent, bias, im2col, reference kernels
#   comm       libhpucoll (reductions, copies into shared memory)
#   loader     the loader thread's batch copies
#   rest       everything else in the steps (memset, malloc, the runtime,
#              the kernel's page faults and scheduling)
# start-up (the dataset's gunzip and parsing, dynamic linking, model
# init) is left out of the shares. From the trace (hpu-trace): the
# `data_loading` (the training thread waiting for a batch) and, for D > 1,
# the `all_reduce` time (the collectives, asynchronous: wait included) per
# step and rank (all its calls in a step, however many), in ms, and the
# step's mean (each action's total over the steps; hpu-trace's mean_ms is
# per call).
#
#   bash bench/step_split.sh BUILD_DIR MODEL PRECISION [DEVICES] [STEPS] [HPULAUNCH ARGS...]
#
# BASE_STEPS=N (environment; default 0, off): also record a run of N steps
# and take its samples, symbol by symbol, from the long run's, so that
# start-up and teardown drop out whole, the kernel's page faults of loading
# the data set included (without it they count in `rest`, and weigh twice
# as much at 2 workers, whose steps take half the CPU); the shares and the
# CPU per step are then of the STEPS - N steps between. With 2 workers on
# 2 cores, `__memmove_avx512_unaligned_erms` in `rest` is libhpucoll's
# shared-memory copies (perf record --call-graph dwarf shows the callers).
#
# MODEL: fmnist_mlp, fmnist_cnn or gpt_lm (gpt_lm: batch 32, -- --dropout 0
# --gen 0, as bench/lowp.sh). Prints one line of shares (% of the steps'
# CPU samples), the CPU time per step and rank those samples make (start-up
# excluded by symbol only: its page faults count in `rest`), and the top
# symbols of each class (% of the samples).
set -euo pipefail
build=${1:?usage: step_split.sh BUILD_DIR MODEL PRECISION [DEVICES] [STEPS]}
model=${2:?model}
prec=${3:?precision}
dev=${4:-1}
steps=${5:-65}
shift $(($# < 5 ? $# : 5))
extra=("$@") # e.g. --strategy zero1
batch=256 margs=()
[ "$model" = gpt_lm ] && batch=32 margs=(-- --dropout 0 --gen 0)
command -v perf >/dev/null || { echo "step_split.sh: needs perf" >&2; exit 2; }
tmp=$(mktemp -d /tmp/hpu-split.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
run() {
  "$build/bin/hpulaunch" -q --devices "$dev" --precision "$prec" --max-steps "$steps" \
    --batch-size "$batch" --no-eval "${extra[@]}" "$@" "$build/lib/$model.so" "${margs[@]}"
}
perf record -q -e cpu-clock -F 2000 -o "$tmp/perf.data" -- \
  "$build/bin/hpulaunch" -q --devices "$dev" --precision "$prec" --max-steps "$steps" \
  --batch-size "$batch" --no-eval "${extra[@]}" "$build/lib/$model.so" "${margs[@]}" >"$tmp/run.log" 2>&1
base=${BASE_STEPS:-0}
: >"$tmp/base.txt"
if [ "$base" -gt 0 ]; then
  perf record -q -e cpu-clock -F 2000 -o "$tmp/base.data" -- \
    "$build/bin/hpulaunch" -q --devices "$dev" --precision "$prec" --max-steps "$base" \
    --batch-size "$batch" --no-eval "${extra[@]}" "$build/lib/$model.so" "${margs[@]}" >"$tmp/base.log" 2>&1
  perf report -i "$tmp/base.data" -n --no-children --sort comm,dso,sym -g none \
    --field-separator $'\t' --percent-limit 0 >"$tmp/base.txt" 2>/dev/null
fi
run --profile "$tmp/prof" >"$tmp/prof.log" 2>&1
"$build/bin/hpu-trace" --no-merge "$tmp/prof" >"$tmp/trace.txt" 2>&1
perf report -i "$tmp/perf.data" -n --no-children --sort comm,dso,sym -g none \
  --field-separator $'\t' --percent-limit 0 >"$tmp/rep.txt" 2>/dev/null
/usr/bin/python3 - "$tmp/rep.txt" "$tmp/trace.txt" "$model $prec ${dev}w" "$steps" "$dev" "$tmp/base.txt" "$base" <<'PY'
import collections, re, sys
rep, trace, label = sys.argv[1:4]
steps, dev = int(sys.argv[4]), int(sys.argv[5])
basefile, base = sys.argv[6], int(sys.argv[7])
def cls(dso, s):
    if "[JIT]" in dso or "dnnl" in dso or "openblas" in dso: return "gemm/conv"
    if re.search(r"libz|inflate|crc32|_dl_|do_lookup|hpu__model_init|hpu_init_|data_read|parse_|idx_|relocate", dso + " " + s): return "startup"
    if re.search(r"adam|sgd|optim|nonfinite|sumsq|clip", s): return "optimizer"
    if re.search(r"to16|from16|to_bf16|bf16_exact|bf16_expand|round_bf16|round_fp16|acc16|f16c|param_f32|make_f32|fp8|quant", s): return "casts"
    if "hpucoll" in dso or re.search(r"hpucoll|shm_|reduce_sum|ring_", s): return "comm"
    if re.search(r"relu|gelu|softmax|xent|bias_grad|pool|im2col|col2im|eltwise|hpu__ref|layernorm|layer_norm|embedding|dropout|attn|attention|_heads|mask_scores|count_correct", s): return "other ops"
    if re.search(r"^fetch|loader|hpu__batch", s): return "loader"
    return "rest"
cat = collections.Counter(); top = collections.defaultdict(collections.Counter)
def add(path, sign):
    for line in open(path):
        if not line.strip() or line.startswith("#"): continue
        f = line.rstrip("\n").split("\t")
        if len(f) < 5 or not f[2].strip().startswith("hpu-worker"): continue
        n = sign * float(f[1].strip()); dso = f[3].strip(); sym = f[4].strip().replace("[.] ", "").replace("[k] ", "")
        c = cls(dso, sym); cat[c] += n; top[c][sym[:40]] += n
add(rep, 1)
if base > 0:  # the short run's samples out: what is left is steps base+1 .. steps
    add(basefile, -1)
    cat = collections.Counter({k: max(v, 0) for k, v in cat.items()})
    steps -= base
steady = sum(v for k, v in cat.items() if k != "startup") or 1
cpu_ms = steady / 2.0 / steps / dev  # samples at 2000 Hz: CPU ms per step and rank
order = ["gemm/conv", "other ops", "casts", "optimizer", "comm", "loader", "rest"]
waits = {}; nsteps = 0
for line in open(trace):  # action count total_ms mean_ms ...: ms per step and rank
    f = line.split()
    if len(f) >= 5 and f[0] in ("step", "data_loading", "all_reduce", "reduce_scatter", "all_gather", "optimizer_step", "backward", "forward"):
        waits[f[0]] = float(f[2])
        if f[0] == "step":
            nsteps = int(f[1])
waits = {k: v / max(nsteps, 1) for k, v in waits.items()}
print("split %s: cpu %.2f ms/step/rank: " % (label, cpu_ms) + "  ".join("%s %.1f%%" % (k, 100 * cat[k] / steady) for k in order)
      + "  | trace ms/step: " + "  ".join("%s %.2f" % (k, v) for k, v in waits.items()))
for k in order:
    if cat[k]:
        print("   %-10s %s" % (k, ", ".join("%s %.1f" % (s, 100 * p / steady) for s, p in top[k].most_common(5))))
PY
