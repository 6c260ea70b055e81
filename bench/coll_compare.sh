#!/usr/bin/env bash
# All-reduce (float sum, in place) with 2 ranks on this node, side by side
# in one run: hpucoll-bench over shared memory (--transport auto) and over
# TCP, Open MPI 4.1 with its default (ob1 + vader shared memory) and with
# --mca btl tcp,self, torch.distributed gloo, and single-thread memcpy (the
# ceiling). Prints each system's own output, then one merged markdown table
# and the targets of issue 3, met or not.
#
#   bash bench/coll_compare.sh [BUILD_DIR]
#
# Sizes 8 B .. 128 MB by FACTOR (2). Iterations (timed/warm-up) shrink with
# the size so that each system runs for about a minute at most:
# 8 B-64 KiB 500/50, 128 KiB-4 MiB 100/10, 8-128 MiB 10/3. The systems take
# turns within each size range. In-place figures are compared, because
# torch.distributed.all_reduce works only in place. hpucoll-bench reports
# the maximum over ranks (-a 3), as mpi-allreduce and gloo_allreduce.py do.
set -uo pipefail
build=${1:-build}
factor=${FACTOR:-2}
here=$(cd "$(dirname "$0")" && pwd)
py=/usr/bin/python3
ranks=2
out=$(mktemp -d /tmp/coll-compare.XXXXXX)
trap 'rm -rf "$out"' EXIT

# min max iters warmup
ranges=("8 64K 500 50" "128K 4M 100 10" "8M 128M 10 3")

launch_flag=
# (the help read whole first: under pipefail grep -q's early exit made
# hpulaunch's next write fail, exit 3, and the flag look absent)
help_text=$("$build/bin/hpulaunch" --help 2>&1)
if grep -q -- '--transport' <<<"$help_text"; then
  launch_flag=yes
fi

hpucoll() { # transport min max iters warmup
  local t=$1; shift
  if [ -n "$launch_flag" ]; then
    "$build/bin/hpulaunch" -q --devices $ranks --transport "$t" \
      --exec "$build/bin/hpucoll-bench" --coll all_reduce -d float -o sum -c 1 -a 3 \
      -b "$1" -e "$2" -f "$factor" -n "$3" -w "$4"
  else
    HPUCOLL_TRANSPORT=$t "$build/bin/hpulaunch" -q --devices $ranks \
      --exec "$build/bin/hpucoll-bench" --coll all_reduce -d float -o sum -c 1 -a 3 \
      -b "$1" -e "$2" -f "$factor" -n "$3" -w "$4"
  fi
}

mpi() { # extra-mca-args... -- min max iters warmup
  local mca=()
  while [ "$1" != -- ]; do mca+=("$1"); shift; done
  shift
  mpirun --allow-run-as-root --oversubscribe -np $ranks "${mca[@]}" \
    "$build/bin/mpi-allreduce" -c 1 -b "$1" -e "$2" -f "$factor" -n "$3" -w "$4"
}

gloo() {
  "$py" "$here/gloo_allreduce.py" --procs $ranks -c 1 \
    -b "$1" -e "$2" -f "$factor" -n "$3" -w "$4"
}

memcpy_bw() {
  "$build/bin/memcpy-bw" -b "$1" -e "$2" -f "$factor" -n "$3" -w "$4"
}

have_mpi=; have_gloo=
[ -x "$build/bin/mpi-allreduce" ] && command -v mpirun >/dev/null && have_mpi=yes
"$py" -c 'import torch.distributed' 2>/dev/null && have_gloo=yes

systems=(hpu_shm hpu_tcp mpi_shm mpi_tcp gloo memcpy)
run_system() { # system min max iters warmup
  local s=$1; shift
  case $s in
  hpu_shm) hpucoll auto "$@" ;;
  hpu_tcp) hpucoll tcp "$@" ;;
  mpi_shm) [ -n "$have_mpi" ] && mpi -- "$@" ;;
  mpi_tcp) [ -n "$have_mpi" ] && mpi --mca btl tcp,self -- "$@" ;;
  gloo) [ -n "$have_gloo" ] && gloo "$@" ;;
  memcpy) memcpy_bw "$@" ;;
  esac
}

echo "# coll_compare: $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc --all) cores," \
  "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(uname -r)"
echo "# all_reduce float sum, $ranks ranks on this node; hpulaunch --transport flag: ${launch_flag:-no (HPUCOLL_TRANSPORT)}"
echo "# load average before: $(cut -d' ' -f1-3 /proc/loadavg) (other jobs on the machine skew every figure)"
for r in "${ranges[@]}"; do
  for s in "${systems[@]}"; do
    echo "## $s $r ($(date +%T))"
    # shellcheck disable=SC2086
    run_system "$s" $r 2>&1 | tee -a "$out/$s.log"
    echo "## $s exit ${PIPESTATUS[0]}"
  done
done

echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

# Per system, "size time(us) busbw" of the in-place group (memcpy: "size
# time GB/s"); a system that failed or is missing has no lines.
for s in "${systems[@]}"; do
  awk -v s="$s" '
    { sub(/^\[rank [0-9]+\] /, "") } # hpulaunch prefixes worker output
    /^#/ || NF == 0 || $1 !~ /^[0-9]+$/ { next }
    s == "memcpy" && NF == 3 { print $1, $2, $3; next }
    s == "gloo" && NF == 9 { print $1, $6, $8; next }
    NF == 13 { print $1, $10, $12 }
  ' "$out/$s.log" 2>/dev/null > "$out/$s.dat" || true
done

echo
echo "## Merged: busbw GB/s and time µs per all-reduce (in place), 2 ranks"
echo
awk -v files="${systems[*]}" -v dir="$out" '
  BEGIN {
    n = split(files, sys, " ")
    name["hpu_shm"] = "hpucoll auto (shm)"; name["hpu_tcp"] = "hpucoll tcp"
    name["mpi_shm"] = "Open MPI (vader)"; name["mpi_tcp"] = "Open MPI tcp,self"
    name["gloo"] = "gloo"; name["memcpy"] = "memcpy"
    for (i = 1; i <= n; i++) {
      f = dir "/" sys[i] ".dat"
      while ((getline line < f) > 0) {
        split(line, a, " ")
        t[sys[i], a[1]] = a[2]; bw[sys[i], a[1]] = a[3]; sizes[a[1]] = 1
      }
    }
    hdr = "| bytes |"; sep = "|---:|"
    for (i = 1; i <= n; i++) {
      if (sys[i] == "memcpy") { hdr = hdr " memcpy GB/s |"; sep = sep "---:|"; continue }
      hdr = hdr " " name[sys[i]] " GB/s | µs |"; sep = sep "---:|---:|"
    }
    print hdr; print sep
    m = 0; for (s in sizes) list[++m] = s + 0
    for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++)
      if (list[j] < list[i]) { x = list[i]; list[i] = list[j]; list[j] = x }
    for (k = 1; k <= m; k++) {
      s = list[k]; row = "| " s " |"
      for (i = 1; i <= n; i++) {
        have = ((sys[i], s) in t)
        if (sys[i] == "memcpy") { row = row " " (have ? sprintf("%.2f", bw[sys[i], s]) : "-") " |"; continue }
        row = row (have ? sprintf(" %.3f | %.2f |", bw[sys[i], s], t[sys[i], s]) : " - | - |")
      }
      print row
    }
  }'

# Targets of issue 3 (ratios of times: for one size, busbw ratios are the
# inverse time ratios, and they do not round to 0 at small sizes).
echo
echo "## Targets (issue 3), all-reduce, 2 ranks on one node"
awk -v dir="$out" '
  function load(s,   f, line, a) {
    f = dir "/" s ".dat"
    while ((getline line < f) > 0) { split(line, a, " "); T[s, a[1] + 0] = a[2] }
  }
  # Over the sizes in [lo, hi] measured by both: the lowest T[peer]/T[ours]
  # (worst, at), how many sizes (cnt) and, in size order, those below need.
  function ratio(ours, peer, lo, hi, need,   k, s, r, i, j, x, n, list) {
    worst = ""; at = ""; cnt = 0; below = ""; n = 0
    for (k in T) {
      split(k, p, SUBSEP); if (p[1] != ours) continue
      s = p[2] + 0; if (s < lo || s > hi || !((peer, s) in T)) continue
      if (T[ours, s] <= 0) continue
      r = T[peer, s] / T[ours, s]; cnt++
      if (worst == "" || r < worst) { worst = r; at = s }
      if (r < need) list[++n] = s
    }
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++)
      if (list[j] < list[i]) { x = list[i]; list[i] = list[j]; list[j] = x }
    for (i = 1; i <= n; i++)
      below = below sprintf(" %d (%.2fx)", list[i], T[peer, list[i]] / T[ours, list[i]])
  }
  function report(what, ours, peer, lo, hi, need) {
    ratio(ours, peer, lo, hi, need)
    if (cnt == 0) { printf "- %s: not measured (%s or %s missing)\n", what, ours, peer; return }
    printf "- %s: %s (lowest %.2fx at %d B, need %.1fx; %d sizes)\n", what,
      (worst >= need ? "MET" : "NOT MET"), worst, at, need, cnt
    if (below != "") printf "  below target at:%s\n", below
  }
  BEGIN {
    load("hpu_shm"); load("hpu_tcp"); load("mpi_shm"); load("mpi_tcp"); load("gloo")
    report("busbw >= 2x Open MPI, 1 MB to 128 MB", "hpu_shm", "mpi_shm", 1048576, 134217728, 2)
    if (("hpu_shm", 8) in T && ("mpi_shm", 8) in T)
      printf "- 8-byte latency <= 2x Open MPI: %s (%.2f us vs %.2f us: %.2fx)\n",
        (T["hpu_shm", 8] <= 2 * T["mpi_shm", 8] ? "MET" : "NOT MET"),
        T["hpu_shm", 8], T["mpi_shm", 8], T["hpu_shm", 8] / T["mpi_shm", 8]
    else
      print "- 8-byte latency <= 2x Open MPI: not measured"
    report(">= 3x gloo at every size", "hpu_shm", "gloo", 0, 1e18, 3)
    report("--transport tcp >= 1.5x Open MPI tcp,self from 8 MB", "hpu_tcp", "mpi_tcp", 8388608, 1e18, 1.5)
  }'
