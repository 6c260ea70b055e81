#!/usr/bin/env bash
# The GPU machine's one script (issue 35): the GPU test programs, then the
# issue's figures beside the PyTorch peer in the same call, ours and
# theirs in turn, model by model; one table at the end.
#
#   bash bench/gpu.sh BUILD
#   on the GPU machine, from the repository root, after
#   bash ../shared/device/bundle.sh build here:
#     bash .device/run.sh 'bash bench/gpu.sh build'
#
# What it does, each step under its own timeout and all of them within
# BUDGET seconds (450; the script stays under 8 minutes), a failing step
# recording its error and the next one running:
#   - nvidia-smi, and hpu-worker --count-gpus (what --devices auto counts);
#   - the GPU test programs run directly (ctest's files hold the build
#     machine's paths): test_cuda_elem, test_cuda_device, test_cuda_ops,
#     test_cuda_ops_more, test_cuda_graphs, test_cuda_ipc, test_cuda_train
#     where built; exit
#     77 is a skip, with the program's reason;
#   - MLP and CNN at batch 256 in fp32 and bf16-mixed, eager and with
#     --graphs (issue 36: the step recorded as a CUDA graph; the log's
#     "graphs:" lines say what was recorded or why not) (hpulaunch --device
#     cuda --devices 1, AdamW lr 1e-3, STEPS (200) steps, the first 10 left
#     out of samples/s) on Fashion-MNIST where it is installed, else on
#     synthetic IDX files; the CNN again with HPU_CUDNN_FIND=1 (cuDNN's
#     candidates and choices printed under the table: HPU_CUDNN_LOG); the MLP in
#     fp8, eager and with --graphs (its scaling state on the device); then
#     the peer (torch_gpu.py mlp / cnn);
#   - the all_reduce of 64 MiB between 2 workers sharing the GPU on device
#     memory (test_cuda_ipc --bench, beside the device-to-device copy rate
#     in the same run) and PyTorch's device-to-device copy of 1 GiB;
#   - fused attention's kernels at a GPT-2 layer's shape, the bf16 tiles
#     and the fp32 rows (test_cuda_ops_more --bench: ms and TFLOP/s);
#   - the device's refusal of more memory than the GPU has, --nproc-per-node
#     gpu with --allow-tf32, hpud's GPU count, 2 workers' gradient path;
#   - GPT-2 124M (gpt_lm --dim 768 --heads 12 --layers 12 --ctx 1024
#     --vocab 50304, B=16, 15 steps, 5 left out) in bf16-mixed and fp8 on
#     synthetic tokens (an llm.c token file), fp8 again on the bf16 kernels
#     (HPU_FP8_NATIVE=0), bf16-mixed again with the
#     fused attention (HPU_FUSED_ATTENTION=1, GPT_FUSED_LIMIT) and with
#     --clip-grad-norm 1, then the peer (torch_gpu.py gpt2); what held the
#     device memory at the peak of the bf16 and fused runs
#     (HPU_MEMORY_PEAK), printed under the table;
#   - profiler traces (--profile) of the MLP (eager and --graphs), the
#     CNN and GPT-2 on the GPU (GPT-2's with HPU_PROFILE_SYNC=1: a layer's
#     range is the GPU's time for it), summarised by hpu-trace, each with
#     the GPU's time by kernel (HPU_PROFILE_KERNELS: CUPTI, found in the
#     toolkit or a Python package unless HPU_CUPTI_LIB names it; the
#     traces' host ranges then carry CUPTI's small cost a launch, unlike
#     traces taken before 11-30's second session);
#   - last, test_cuda_accuracy (the examples' accuracy on the GPU).
# Without a GPU (nvidia-smi lists none) the figures are not taken and the
# table says why (DEVICE=cpu with a stand-in nvidia-smi in PATH runs our
# side on the CPU instead: the script's own check, no figure). Logs and
# metrics go to OUT (./gpu-out); the table is
# also OUT/table.txt. TFLOP/s: 6 x parameters' multiply-adds per sample
# for the MLP and CNN (2 per multiply-add, forward and two backward), and
# 6N + 12 L T d per token for GPT-2 (N its 124M parameters). The peer is
# PEERS/torch_gpu.py: PEERS, else peers/ beside BUILD (the bundle's), else
# /opt/hpu/peers, else ../shared/device/peers.
set -uo pipefail
build=${1:?usage: bench/gpu.sh BUILD}
[ -d "$build/bin" ] || { echo "bench/gpu.sh: $build/bin is not a build's bin directory" >&2; exit 2; }
build=$(cd "$build" && pwd)
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-./gpu-out}
mkdir -p "$out" && out=$(cd "$out" && pwd)
py=${PYTHON:-python3}
device=${DEVICE:-cuda} # DEVICE=cpu: the script's own check on a machine without a GPU
budget=${BUDGET:-450}
t0=$SECONDS
table=$out/table.tsv
: >"$table"

# One row: step, ours, theirs, note (tabs apart).
row() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >>"$table"; }

# What went wrong, from a log: the time-out, else the first line that
# says (error, failed, skipped, ...: a worker's reason comes before
# hpulaunch's "rank 0 exited"), else the last line; 110 characters.
why() {
  local l
  l=$(grep -a '^timed out after' "$1" 2>/dev/null)
  [ -n "$l" ] || l=$(grep -aiE 'error|fail|cannot|not built|skipped|no gpu|killed' "$1" 2>/dev/null | head -1)
  [ -n "$l" ] || l=$(tail -1 "$1" 2>/dev/null)
  l=$(printf '%s' "$l" | sed -E 's/^\[rank [0-9]+\] (hpu-worker: rank [0-9]+: )?//')
  printf '%s' "${l:0:110}"
}

# step NAME SECONDS CMD...: runs CMD with its output in OUT/NAME.log,
# under SECONDS or what is left of the budget; sets rc (124: timed out;
# 125: not run, out of time).
step() {
  local name=$1 limit=$2 left
  shift 2
  left=$((budget - (SECONDS - t0) - 5))
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -lt 10 ]; then
    echo "not run: the script's budget of ${budget}s is spent" >"$out/$name.log"
    rc=125
    return
  fi
  printf '%-28s' "$name" >&2
  local s=$SECONDS
  timeout -k 5 "$limit" "$@" >"$out/$name.log" 2>&1
  rc=$?
  [ "$rc" = 124 ] && echo "timed out after ${limit}s" >>"$out/$name.log"
  echo " rc=$rc $((SECONDS - s))s" >&2
}

# ---- the machine ----
echo "bench/gpu.sh $(date -u '+%F %T') UTC, $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?'), build $build"
ngpu=0
if command -v nvidia-smi >/dev/null; then
  timeout 20 nvidia-smi 2>&1 | tee "$out/nvidia-smi.log"
  ngpu=$(timeout 20 nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
  nogpu="no GPU visible: nvidia-smi lists none"
else
  echo "nvidia-smi: not found"
  nogpu="no GPU visible: no nvidia-smi here"
fi
step count-gpus 30 "$build/bin/hpu-worker" --count-gpus
if [ "$rc" = 0 ]; then
  row "GPUs: hpu-worker --count-gpus" "$(head -1 "$out/count-gpus.log")" "" "nvidia-smi -L: $ngpu; --devices auto --device cuda starts that many workers"
else
  row "GPUs: hpu-worker --count-gpus" none "" "nvidia-smi -L: $ngpu; $(why "$out/count-gpus.log")"
fi

# CUPTI for HPU_PROFILE_KERNELS (test_cuda_ops_more's test_kernel_times,
# the traces' kernel tables): the toolkit's, else a Python package's.
site=$("$py" -c 'import site; print(site.getsitepackages()[0])' 2>/dev/null)
if [ -z "${HPU_CUPTI_LIB:-}" ]; then
  for c in /usr/local/cuda/lib64/libcupti.so.13 /usr/local/cuda/extras/CUPTI/lib64/libcupti.so.13 \
    $(find /usr/local/cuda* /opt ${site:+"$site"} -name 'libcupti.so.13*' 2>/dev/null | head -3); do
    [ -f "$c" ] && { export HPU_CUPTI_LIB=$c; break; }
  done
fi
echo "CUPTI: ${HPU_CUPTI_LIB:-none found, libcupti.so.13 is looked for on the library path}"
# NCCL for --collectives nccl (test_cuda_ipc's NCCL checks): the toolkit's,
# else a Python package's (nvidia-nccl-cu13).
if [ -z "${HPU_NCCL_LIB:-}" ]; then
  for c in /usr/local/cuda/lib64/libnccl.so.2 /usr/local/cuda/lib/libnccl.so.2 \
    $(find /usr/local/cuda* /opt ${site:+"$site"} -name 'libnccl.so.2*' 2>/dev/null | head -3); do
    [ -f "$c" ] && { export HPU_NCCL_LIB=$c; break; }
  done
fi
echo "NCCL: ${HPU_NCCL_LIB:-none found, libnccl.so.2 is looked for on the library path}"

# ---- the GPU test programs ----
for t in test_cuda_elem test_cuda_device test_cuda_ops test_cuda_ops_more test_cuda_graphs test_cuda_ipc test_cuda_train; do
  if [ ! -x "$build/bin/$t" ]; then
    row "$t" "not built" "" "not in $build/bin"
    continue
  fi
  lim=${TEST_LIMIT:-75}; [ "$t" = test_cuda_train ] && lim=${TRAIN_LIMIT:-150}
  step "$t" "$lim" env HPU_BUILD_DIR="$build" HPU_SOURCE_DIR="$root" "$build/bin/$t"
  case $rc in
    0) row "$t" passed "" "$(tail -1 "$out/$t.log" | head -c 90)";;
    77) row "$t" skipped "" "$(why "$out/$t.log")";;
    *) row "$t" "FAILED rc=$rc" "" "$(why "$out/$t.log")";;
  esac
done

# ---- the figures ----
figures=("mlp fp32 samples/s" "mlp bf16 samples/s" "cnn fp32 samples/s" "cnn bf16 samples/s"
         "gpt2 bf16 tokens/s" "gpt2 fp8 tokens/s" "d2d copy GB/s" "all_reduce 64MiB fp32 busbw GB/s")

peers=${PEERS:-}
for d in "$build/../peers" /opt/hpu/peers "$root/../shared/device/peers"; do
  [ -z "$peers" ] && [ -f "$d/torch_gpu.py" ] && peers=$(cd "$d" && pwd)
done

# Our run: NAME PRECISION BATCH STEPS LIMIT [options] MODEL.so -- model args.
# Sets sps (samples/s) and mem (MaxInUse MiB of rank 0), or leaves them
# empty.
ours() {
  local name=$1 prec=$2 batch=$3 steps=$4 limit=$5
  shift 5
  sps='' mem=''
  step "$name" "$limit" "$build/bin/hpulaunch" -q --device "$device" --devices 1 --precision "$prec" \
    --batch-size "$batch" --max-steps "$steps" --throughput-warmup-steps "${WARM:-10}" --optimizer adamw \
    --lr 1e-3 --no-eval --log-every 0 --metrics "$out/$name.jsonl" "$@"
  [ "$rc" = 0 ] && [ -s "$out/$name.jsonl" ] || return 0
  read -r sps mem < <("$py" - "$out/$name.jsonl" <<'PY'
import json, sys
r = [json.loads(l) for l in open(sys.argv[1]) if l.strip()][-1]
print(round(r["samples_per_sec"], 2), round(r["device"][0]["MaxInUse"] / 2**20))
PY
  )
}

# Our cell: the number, or why there is none (after our step: rc).
cell() { # VALUE
  if [ -n "$1" ]; then printf '%s' "$1"
  elif [ "$rc" = 125 ]; then printf 'not run'
  elif [ "$rc" = 124 ]; then printf 'timed out'
  else printf 'FAILED'; fi
}

# The peer's cell: the number, or why there is none, from its log.
tcell() { # VALUE LOG
  if [ -n "$1" ]; then printf '%s' "$1"
  elif grep -q '^not run' "$2" 2>/dev/null; then printf 'not run'
  elif grep -q '^timed out' "$2" 2>/dev/null; then printf 'timed out'
  else printf 'FAILED'; fi
}

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a > 0 && b > 0) printf "%.2fx", a / b }'; }
tflops() { awk -v s="$1" -v f="$2" 'BEGIN { if (s > 0) printf "%.2f", s * f / 1e12 }'; }

# The peer's samples/s (or tokens/s) for MODEL PRECISION from its log.
theirs() { sed -n "s/.*model=$1 precision=$2 .*${3:-samples_per_s}=\([0-9]*\).*/\1/p" "$out/$4.log" | tail -1; }

if [ "$ngpu" -lt 1 ]; then
  for f in "${figures[@]}"; do row "$f" "not taken" "not taken" "$nogpu"; done
else
  # Fashion-MNIST where installed (the bundle's data is copied there),
  # else synthetic IDX files of its shape.
  data=/usr/share/datasets/fashion-mnist
  if [ ! -f "$data/train-images-idx3-ubyte.gz" ]; then
    data=$out/data
    step synthetic-data 60 "$py" - "$data" <<'PY'
import gzip, os, struct, sys
d = sys.argv[1]; os.makedirs(d, exist_ok=True)
for split, n in (("train", 60000), ("t10k", 10000)):
    with gzip.open(f"{d}/{split}-images-idx3-ubyte.gz", "wb", compresslevel=1) as f:
        f.write(struct.pack(">IIII", 0x803, n, 28, 28) + os.urandom(n * 784))
    with gzip.open(f"{d}/{split}-labels-idx1-ubyte.gz", "wb", compresslevel=1) as f:
        f.write(struct.pack(">II", 0x801, n) + bytes(b % 10 for b in os.urandom(n)))
PY
  fi
  peer() { # NAME MODEL LIMIT
    if [ -z "$peers" ]; then echo "no torch_gpu.py found (PEERS)" >"$out/$1.log"; rc=1; return; fi
    step "$1" "$3" "$py" "$peers/torch_gpu.py" "$2" --batch 256 --steps 200
  }
  # MLP 784-1024-1024-10: 1,861,632 multiply-adds a sample; CNN: 11,467,776
  for m in mlp cnn; do
    declare -A got=()
    for p in fp32 bf16; do
      prec=$p; [ "$p" = bf16 ] && prec=bf16-mixed
      HPU_CUDNN_LOG=1 ours "ours-$m-$p" "$prec" 256 "${STEPS:-200}" 90 "$build/lib/fmnist_$m.so" -- --data "$data"
      got[$p]=$(cell "${sps%.*}"); got[$p-mem]=$mem; got[$p-why]=$(why "$out/ours-$m-$p.log")
    done
    if [ "$m" = cnn ]; then # the convolutions' algorithms timed by cuDNN (HPU_CUDNN_FIND=1)
      for p in fp32 bf16; do
        prec=$p; [ "$p" = bf16 ] && prec=bf16-mixed
        HPU_CUDNN_FIND=1 HPU_CUDNN_LOG=1 ours "ours-cnn-$p-find" "$prec" 256 "${STEPS:-200}" 90 "$build/lib/fmnist_cnn.so" -- --data "$data"
        got[$p-find]=$(cell "${sps%.*}")
      done
    fi
    peer "torch-$m" "$m" 120
    macs=1861632; [ "$m" = cnn ] && macs=11467776
    for p in fp32 bf16; do
      t=$(theirs "$m" "$p" samples_per_s "torch-$m")
      o=${got[$p]}
      note="ratio $(ratio "$o" "$t"); TFLOP/s ours $(tflops "$o" $((6 * macs))) theirs $(tflops "$t" $((6 * macs)))"
      [ -n "${got[$p-mem]}" ] && note="$note; MaxInUse ${got[$p-mem]} MiB"
      case $o in FAILED|"not run"|"timed out") note="ours: ${got[$p-why]}";; esac
      row "$m $p samples/s" "$o" "$(tcell "$t" "$out/torch-$m.log")" "$note"
      [ -n "${got[$p-find]:-}" ] && row "$m $p samples/s, HPU_CUDNN_FIND=1" "${got[$p-find]}" "$(tcell "$t" "$out/torch-$m.log")" "ratio $(ratio "${got[$p-find]}" "$t")"
    done
    # --graphs (issue 36): the step recorded as a CUDA graph and replayed;
    # the log's "graphs:" lines say what was recorded, or why not
    for p in fp32 bf16; do
      prec=$p; [ "$p" = bf16 ] && prec=bf16-mixed
      ours "ours-$m-$p-graphs" "$prec" 256 "${STEPS:-200}" 90 --graphs --verbose \
        "$build/lib/fmnist_$m.so" -- --data "$data"
      g=$(cell "${sps%.*}")
      t=$(theirs "$m" "$p" samples_per_s "torch-$m")
      said=$(grep -a -o -E 'graphs: [^[]*(recorded the step|not recorded|steps? launched from)[^[]*' "$out/ours-$m-$p-graphs.log" | tr '\n' ';' | cut -c1-200)
      # the replays whose copies read the loader's buffer (hpu__dev_graph_rebind)
      nb=$(grep -a -o -E 'graphs: [0-9]+ replays? read the batch where the loader put it' "$out/ours-$m-$p-graphs.log" | grep -o -E '[0-9]+' | head -1)
      said="${nb:-0} replays read the loader's buffer; $said"
      case $g in FAILED|"not run"|"timed out") said="ours: $(why "$out/ours-$m-$p-graphs.log")";; esac
      row "$m $p samples/s --graphs" "$g" "$(tcell "$t" "$out/torch-$m.log")" \
        "ratio $(ratio "$g" "$t"); ours eager ${got[$p]}: $(ratio "$g" "${got[$p]}"); $said"
    done
    if [ "$m" = mlp ]; then # fp8 (its scaling state on the device: the step records)
      ours ours-mlp-fp8 fp8 256 "${STEPS:-200}" 90 "$build/lib/fmnist_mlp.so" -- --data "$data"
      e8=$(cell "${sps%.*}"); w8=$(why "$out/ours-mlp-fp8.log")
      ours ours-mlp-fp8-graphs fp8 256 "${STEPS:-200}" 90 --graphs --verbose \
        "$build/lib/fmnist_mlp.so" -- --data "$data"
      g=$(cell "${sps%.*}")
      said=$(grep -a -o -E 'graphs: [^[]*(recorded the step|not recorded|steps? launched from)[^[]*' "$out/ours-mlp-fp8-graphs.log" | tr '\n' ';' | cut -c1-200)
      case $g in FAILED|"not run"|"timed out") said="ours: $(why "$out/ours-mlp-fp8-graphs.log")";; esac
      case $e8 in FAILED|"not run"|"timed out") e8="$e8 ($w8)";; esac
      row "mlp fp8 samples/s --graphs" "$g" "" "ours eager fp8 $e8: $(ratio "$g" "${e8%% *}"); bf16 eager ${got[bf16]}; $said"
    fi
    unset got
  done

  # The GPU's device-to-device copy rate (1 GiB, read + write counted).
  step d2d-copy 60 "$py" - <<'PY'
import torch
a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda"); b = torch.empty_like(a)
for _ in range(3): b.copy_(a)
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
torch.cuda.synchronize(); s.record()
for _ in range(20): b.copy_(a)
e.record(); torch.cuda.synchronize()
print(f"d2d_GBps={2 * 20 * a.numel() / (s.elapsed_time(e) / 1e3) / 1e9:.0f}")
PY
  d2d=$(sed -n 's/^d2d_GBps=\([0-9]*\)/\1/p' "$out/d2d-copy.log")
  row "d2d copy GB/s" "" "$(tcell "$d2d" "$out/d2d-copy.log")" "PyTorch, 1 GiB copy_, read + write: the all_reduce's reference$([ -z "$d2d" ] && printf '; %s' "$(why "$out/d2d-copy.log")")"
  step allreduce-ipc 90 env HPU_BUILD_DIR="$build" "$build/bin/test_cuda_ipc" --bench
  for dt in fp32 bf16; do
    l=$(grep -a "^bench: all_reduce $dt 64 MiB" "$out/allreduce-ipc.log" | head -1)
    bus=$(printf '%s' "$l" | sed -n 's/.*busbw \([0-9.]*\) GB\/s.*/\1/p')
    cp=$(printf '%s' "$l" | sed -n 's/.*device-to-device copy of 64 MiB: \([0-9.]*\) GB\/s.*/\1/p')
    if [ -n "$bus" ]; then
      row "all_reduce 64MiB $dt busbw GB/s" "$bus" "" "2 workers sharing the GPU (test_cuda_ipc --bench)$([ -n "$cp" ] && printf '; d2d copy of 64 MiB in the same run %s GB/s, busbw/copy %s' "$cp" "$(awk -v a="$bus" -v b="$cp" 'BEGIN { printf "%.2f", a / b }')")$(printf '%s' "$l" | grep -q STAGED && printf '; STAGED: no CUDA IPC')"
    else
      row "all_reduce 64MiB $dt busbw GB/s" "$(cell "")" "" "$(why "$out/allreduce-ipc.log")"
    fi
  done

  # Fused attention's kernels at one GPT-2 layer's shape (B 16, T 1024, 12
  # heads of 64, causal): the bf16 tiles against the fp32 rows.
  step attention-kernels 60 env HPU_BUILD_DIR="$build" "$build/bin/test_cuda_ops_more" --bench
  for k in "bf16 tiles" "fp32 rows"; do
    l=$(grep -a "^bench: attention .*, $k" "$out/attention-kernels.log" | head -1)
    if [ -n "$l" ]; then
      row "attention kernels, $k: fwd / bwd ms" "$(printf '%s' "$l" | sed -n 's/.*forward \([0-9.]*\) ms.*backward \([0-9.]*\) ms.*/\1 \/ \2/p')" "" \
        "GPT-2 layer (B16 T1024 12x64 causal): $(printf '%s' "$l" | grep -o '([0-9.]* TFLOP/s)' | tr '\n' ' ')"
    else
      row "attention kernels, $k: fwd / bwd ms" "$(cell "")" "" "$(why "$out/attention-kernels.log")"
    fi
  done

  # The device's refusals and flags: more memory than the GPU has, torchrun's
  # --nproc-per-node gpu with --allow-tf32, 2 workers' all-reduce path.
  step too-much-memory 60 "$build/bin/hpulaunch" --devices 1 --device cuda --device-memory 1TiB \
    --max-steps 1 --no-eval "$build/lib/fmnist_mlp.so" -- --data "$data"
  m=$(grep -a -o 'device-memory [0-9]* bytes ([0-9.]* GiB) is more than GPU.*' "$out/too-much-memory.log" | head -1)
  row "--device-memory 1TiB" "$([ "$rc" = 1 ] && [ -n "$m" ] && echo refused || echo "rc=$rc")" "" "${m:-$(why "$out/too-much-memory.log")}"
  step nproc-gpu 60 "$build/bin/hpulaunch" --nproc-per-node gpu --allow-tf32 --verbose --max-steps 2 \
    --no-eval "$build/lib/fmnist_mlp.so" -- --data "$data"
  row "--nproc-per-node gpu --allow-tf32" "rc=$rc" "" "$(grep -a -o 'TF32[^]]*' "$out/nproc-gpu.log" | head -1 | cut -c1-100)"
  step ipc-train 60 "$build/bin/hpulaunch" --devices 2 --device cuda --strategy ddp --max-steps 5 \
    --batch-size 64 --verbose --no-eval "$build/lib/fmnist_mlp.so" -- --data "$data"
  ipc_rc=$rc
  # A custom layer written for the host (HPU_LAYER_HOST_ONLY) on the GPU:
  # staged through host memory, one warning a layer, the CPU's parameters.
  for d in cpu cuda; do
    step "host-layer-$d" 60 "$build/bin/hpulaunch" --devices 1 --device "$d" --no-eval --max-steps 3 \
      --batch-size 16 --save-params "$out/host-layer-$d.bin" "$build/lib/host_layer_model.so"
  done
  hl=$("$py" - "$out/host-layer-cpu.bin" "$out/host-layer-cuda.bin" <<'PY' 2>&1
import array, sys
a, b = array.array("f"), array.array("f")
a.frombytes(open(sys.argv[1], "rb").read()); b.frombytes(open(sys.argv[2], "rb").read())
print(f"max|diff| against cpu {max(abs(x - y) for x, y in zip(a, b)):.3g} of {len(a)} parameters" if len(a) == len(b) and a else "sizes differ")
PY
  )
  hl=$(printf '%s\n' "$hl" | tail -1) # a traceback's last line: one row
  row "host-only layers on cuda" "rc=$rc" "" "$(grep -a -c 'is host-only' "$out/host-layer-cuda.log") warnings; ${hl:0:80}"
  hd=$(mktemp -d)
  "$build/bin/hpud" --gen-key "$hd/k" >/dev/null 2>&1
  printf 'devices = auto\ndevice = cuda\nkey = %s/k\nuser = root\n' "$hd" >"$hd/c"
  step hpud-check 30 "$build/bin/hpud" --check -c "$hd/c"
  row "hpud devices = auto, device = cuda" "rc=$rc" "" "$(grep -a -o 'devices = auto, device = cuda: .*' "$out/hpud-check.log" | head -1 | cut -c1-100)"
  row "ddp 2 workers: gradients' path" "rc=$ipc_rc" "" "$(grep -a -o "gradients' all-reduce: .*" "$out/ipc-train.log" | head -1 | cut -c1-100)"

  # GPT-2 124M: synthetic tokens in llm.c's format (header of 256 int32:
  # magic, version, count; then uint16 tokens).
  tok=$out/tokens.bin
  step tokens 30 "$py" - "$tok" <<'PY'
import array, os, struct, sys
n = 1 << 20
t = array.array("H", (x % 50257 for x in array.array("H", os.urandom(2 * n))))
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)) + t.tobytes())
PY
  # 6N + 12 L T d FLOPs a token, N = 124,475,904
  gflop=$((6 * 124475904 + 12 * 12 * 1024 * 768))
  gpt=(--dim 768 --heads 12 --layers 12 --ctx 1024 --vocab 50304 --tokens "$tok" --dropout 0 --gen 0)
  declare -A g=()
  for p in bf16 fp8; do
    prec=$p; [ "$p" = bf16 ] && prec=bf16-mixed
    v=(); [ "$p" = fp8 ] && v=(--verbose) # its count of products on fp8 arithmetic
    HPU_MEMORY_PEAK="$out/mempeak-gpt2-$p" WARM=5 ours "ours-gpt2-$p" "$prec" 16 15 "${GPT_LIMIT:-150}" \
      "${v[@]}" "$build/lib/gpt_lm.so" -- "${gpt[@]}"
    g[$p]=$([ -n "$sps" ] && awk -v s="$sps" 'BEGIN { printf "%.0f", s * 1024 }'); g[$p-c]=$(cell "${g[$p]}")
    g[$p-mem]=$mem; g[$p-why]=$(why "$out/ours-gpt2-$p.log")
  done
  # fp8 on the bf16 kernels (HPU_FP8_NATIVE=0: the emulation the CPU
  # runs), beside the fp8 run above (its linear products on fp8 tensor cores)
  HPU_FP8_NATIVE=0 WARM=5 ours ours-gpt2-fp8-emul fp8 16 15 "${GPT_LIMIT:-150}" --verbose \
    "$build/lib/gpt_lm.so" -- "${gpt[@]}"
  g[fp8e]=$([ -n "$sps" ] && awk -v s="$sps" 'BEGIN { printf "%.0f", s * 1024 }'); g[fp8e-c]=$(cell "${g[fp8e]}")
  g[fp8e-why]=$(why "$out/ours-gpt2-fp8-emul.log")
  # The attention layer fused (HPU_FUSED_ATTENTION=1: cuops_flash.cu, lse
  # instead of the [B, heads, T, T] probabilities), beside the run above.
  HPU_MEMORY_PEAK="$out/mempeak-gpt2-fused" HPU_FUSED_ATTENTION=1 WARM=5 ours ours-gpt2-bf16-fused bf16-mixed 16 15 "${GPT_FUSED_LIMIT:-150}" \
    "$build/lib/gpt_lm.so" -- "${gpt[@]}"
  g[fused]=$([ -n "$sps" ] && awk -v s="$sps" 'BEGIN { printf "%.0f", s * 1024 }'); g[fused-c]=$(cell "${g[fused]}")
  g[fused-mem]=$mem; g[fused-why]=$(why "$out/ours-gpt2-bf16-fused.log")
  # With the gradient norm clipped (its sum of squares in batches of
  # chunks, 41923d5), beside the run above.
  WARM=5 ours ours-gpt2-bf16-clip bf16-mixed 16 15 "${GPT_LIMIT:-150}" --clip-grad-norm 1.0 \
    "$build/lib/gpt_lm.so" -- "${gpt[@]}"
  g[clip]=$([ -n "$sps" ] && awk -v s="$sps" 'BEGIN { printf "%.0f", s * 1024 }'); g[clip-c]=$(cell "${g[clip]}")
  g[clip-why]=$(why "$out/ours-gpt2-bf16-clip.log")
  if [ -n "$peers" ]; then
    step torch-gpt2 150 "$py" "$peers/torch_gpu.py" gpt2
  else
    echo "no torch_gpu.py found (PEERS)" >"$out/torch-gpt2.log"
  fi
  t=$(sed -n 's/.*model=gpt2-124M .*tokens_per_s=\([0-9]*\).*/\1/p' "$out/torch-gpt2.log" | tail -1)
  tmem=$(sed -n 's/.*peak_GiB=\([0-9.]*\).*/\1/p' "$out/torch-gpt2.log" | tail -1)
  note="ratio $(ratio "${g[bf16]}" "$t"); TFLOP/s ours $(tflops "${g[bf16]}" $gflop) theirs $(tflops "$t" $gflop); memory ours ${g[bf16-mem]:-?} MiB theirs ${tmem:-?} GiB"
  [ -z "${g[bf16]}" ] && note="ours: ${g[bf16-why]}"
  row "gpt2 bf16 tokens/s" "${g[bf16-c]}" "$(tcell "$t" "$out/torch-gpt2.log")" "$note"
  note="fused/unfused $(ratio "${g[fused]}" "${g[bf16]}"); TFLOP/s $(tflops "${g[fused]}" $gflop); memory ${g[fused-mem]:-?} MiB (unfused ${g[bf16-mem]:-?} MiB) theirs ${tmem:-?} GiB"
  [ -z "${g[fused]}" ] && note="ours: ${g[fused-why]}"
  row "gpt2 bf16 tokens/s, HPU_FUSED_ATTENTION=1" "${g[fused-c]}" "$(tcell "$t" "$out/torch-gpt2.log")" "$note"
  note="clipped/unclipped $(ratio "${g[clip]}" "${g[bf16]}")"
  [ -z "${g[clip]}" ] && note="ours: ${g[clip-why]}"
  row "gpt2 bf16 tokens/s, --clip-grad-norm 1" "${g[clip-c]}" "" "$note"
  n8=$(grep -a -o "fp8: rank 0's linear products: [0-9]* on fp8 arithmetic, [0-9]* on the bf16 kernels" "$out/ours-gpt2-fp8.log" | tail -1 | cut -d: -f3)
  note="fp8/bf16 ours $(ratio "${g[fp8]}" "${g[bf16]}") (the issue: >= 1.3x); TFLOP/s $(tflops "${g[fp8]}" $gflop); linear products:${n8:- not counted}"
  [ -z "${g[fp8]}" ] && note="ours: ${g[fp8-why]}"
  row "gpt2 fp8 tokens/s" "${g[fp8-c]}" "" "$note"
  note="fp8 tensor cores/bf16 kernels $(ratio "${g[fp8]}" "${g[fp8e]}"); against our bf16 $(ratio "${g[fp8e]}" "${g[bf16]}")"
  [ -z "${g[fp8e]}" ] && note="ours: ${g[fp8e-why]}"
  row "gpt2 fp8 tokens/s, HPU_FP8_NATIVE=0" "${g[fp8e-c]}" "" "$note"

  # Where a step's time goes: the profiler's traces of the MLP (20 steps),
  # the CNN (20) and GPT-2 (6), fp32 and bf16-mixed, on the GPU.
  trace() { # NAME PRECISION BATCH STEPS MODEL.so [model args]
    local name=$1 prec=$2 batch=$3 steps=$4
    shift 4
    HPU_PROFILE_KERNELS="$out/kernels-$name" WARM=1 ours "trace-$name" "$prec" "$batch" "$steps" 90 \
      --profile "$out/trace-$name" "$@"
    if [ "$rc" = 0 ]; then
      step "summary-$name" 30 "$build/bin/hpu-trace" --top 18 "$out/trace-$name"
      row "trace: $name $prec, $steps steps" written "" "hpu-trace's summary below the table"
    else
      row "trace: $name $prec, $steps steps" "$(cell "")" "" "$(why "$out/trace-$name.log")"
    fi
  }
  trace mlp fp32 256 20 "$build/lib/fmnist_mlp.so" -- --data "$data"
  trace mlp-graphs fp32 256 60 --graphs "$build/lib/fmnist_mlp.so" -- --data "$data"
  trace cnn fp32 256 20 "$build/lib/fmnist_cnn.so" -- --data "$data"
  # GPT-2 with HPU_PROFILE_SYNC=1: each range waits for the GPU, so a
  # layer's range is its kernels' time (GPU-bound: the host runs ahead)
  [ "${TRACE_GPT:-1}" = 1 ] && HPU_PROFILE_SYNC=1 trace gpt2 bf16-mixed 16 6 "$build/lib/gpt_lm.so" -- "${gpt[@]}"
fi

# ---- the examples' accuracy on the GPU (last: the slowest, cut first) ----
if [ "$ngpu" -ge 1 ] && [ -x "$build/bin/test_cuda_accuracy" ]; then
  step test_cuda_accuracy "${ACC_LIMIT:-300}" env HPU_BUILD_DIR="$build" HPU_SOURCE_DIR="$root" "$build/bin/test_cuda_accuracy"
  acc=$(grep -a -E 'accuracy [0-9.]+' "$out/test_cuda_accuracy.log" | tr '\n' ';' | cut -c1-160)
  row test_cuda_accuracy "$(case $rc in 0) echo passed;; 124) echo "timed out";; 125) echo "not run";; *) echo "FAILED rc=$rc";; esac)" "" "${acc:-$(why "$out/test_cuda_accuracy.log")}"
fi

# ---- the table ----
{
  echo
  printf '%-30s %-16s %-16s %s\n' step ours PyTorch note
  awk -F'\t' '{ printf "%-30s %-16s %-16s %s\n", $1, $2, $3, $4 }' "$table"
  for n in mlp mlp-graphs cnn gpt2; do
    [ -s "$out/summary-$n.log" ] || continue
    echo
    echo "where a step of $n goes on the GPU (hpu-trace of trace-$n):"
    sed 's/^/  /' "$out/summary-$n.log"
    k=$out/kernels-$n/kernels-rank0.txt
    if [ -s "$k" ]; then
      echo "the GPU's time by kernel in that run (HPU_PROFILE_KERNELS, CUPTI; the first ${KTOP:-16}):"
      head -$((${KTOP:-16} + 2)) "$k" | cut -c1-200 | sed 's/^/  /'
    else
      echo "no kernel times (HPU_PROFILE_KERNELS): $(grep -ah 'HPU_PROFILE_KERNELS' "$out/trace-$n.log" | head -1 | cut -c1-150)"
    fi
  done
  for f in "$out"/ours-cnn-*.log; do
    grep -q 'cudnn: ' "$f" 2>/dev/null || continue
    echo
    echo "cuDNN's candidates in $(basename "$f" .log) (HPU_CUDNN_LOG: algorithm:ms, d/n deterministic, f/t math, MiB; x: not taken by the exact rule, *: chosen):"
    grep -a -o 'cudnn: .*' "$f" | sort -u | cut -c8-300 | sed 's/^/  /'
  done
  for n in bf16 fused; do
    k=$out/mempeak-gpt2-$n/memory-peak-rank0.txt
    [ -s "$k" ] || continue
    echo
    echo "what held GPT-2's ($n) device memory at its peak (HPU_MEMORY_PEAK; the first ${MTOP:-20} names):"
    sed -n "1,$((${MTOP:-20} + 4))p" "$k" | cut -c1-160 | sed 's/^/  /'
  done
  echo "(${SECONDS}s in all; logs in $out)"
} | tee "$out/table.txt"
exit 0
