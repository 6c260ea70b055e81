#!/usr/bin/env bash
# What --profile costs: training throughput with and without it, in the
# same run, alternating (A B A B ...) so that drift on a shared machine
# hits both alike. 2 workers of the Fashion-MNIST MLP on this node.
#
# Configurations: fast_ddp (the default; a few dozen events a step) and
# zero3 with every layer sharded (--param-persistence-threshold 0: a
# gather and a release per layer and pass, the most events a step of any
# strategy). samples/s is the worker's own figure after its warm-up step.
# Also printed: the trace's events and bytes per step, and what the trace
# says recording cost (its "profiler" event: time inside the recording and
# flushing calls, over the steps' time) -- a figure that the machine's
# noise does not blur, unlike the A/B difference.
#
#   bash bench/profile.sh [BUILD_DIR] [REPEATS]
set -euo pipefail
build=${1:-build}
reps=${2:-5}
tmp=$(mktemp -d /tmp/hpu-prof-bench.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
py=/usr/bin/python3

echo "machine: $(nproc --all) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
printf '%-10s %5s %14s %14s %9s %12s %12s %10s\n' strategy steps "off samples/s" "on samples/s" overhead "events/step" "bytes/step" "self cost"

sps() { sed -n 's/.*final loss [0-9.]*, \([0-9.]*\) samples\/s.*/\1/p' "$1"; }

one() { # STRATEGY STEPS extra-args...
  local strat=$1 steps=$2
  shift 2
  local off=() on=()
  for ((i = 0; i < reps; i++)); do
    "$build/bin/hpulaunch" -q --devices 2 --no-eval --log-every 0 --strategy "$strat" \
      --max-steps "$steps" "$@" "$build/lib/fmnist_mlp.so" >"$tmp/off.log" 2>&1
    off+=("$(sps "$tmp/off.log")")
    rm -rf "$tmp/tr"
    "$build/bin/hpulaunch" -q --devices 2 --no-eval --log-every 0 --strategy "$strat" \
      --max-steps "$steps" --profile "$tmp/tr" "$@" "$build/lib/fmnist_mlp.so" >"$tmp/on.log" 2>&1
    on+=("$(sps "$tmp/on.log")")
  done
  "$py" - "$strat" "$steps" "$tmp/tr/perf-logs-rank0.json" "${off[*]}" "${on[*]}" <<'PY'
import json, os, statistics, sys
strat, steps, trace, off, on = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
off = [float(x) for x in off.split()]
on = [float(x) for x in on.split()]
allev = json.load(open(trace))["traceEvents"]
ev = [e for e in allev if e.get("ph") == "X"]
cost = [e["args"] for e in allev if e.get("name") == "profiler"][0]
step_ms = sum(e["dur"] for e in ev if e["name"] == "step") / 1e3
mo, mn = statistics.median(off), statistics.median(on)
print("%-10s %5d %14.1f %14.1f %8.1f%% %12.1f %12.0f %9.2f%%" % (
    strat, steps, mo, mn, 100 * (mo - mn) / mo, len(ev) / steps, os.path.getsize(trace) / steps,
    100 * (cost["record_ms"] + cost["flush_ms"]) / step_ms))
print("           runs off: %s" % " ".join("%.0f" % x for x in off))
print("           runs on:  %s" % " ".join("%.0f" % x for x in on))
PY
}

one fast_ddp 200
one zero3 100 --param-persistence-threshold 0
